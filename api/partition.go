package api

import "github.com/tollgate-io/tollgate/layout"

// The layout math lives in package layout, which links nothing of gRPC so that
// fsm and backup can use it; these wrappers keep clients depending on api alone.

// Defaults fixed when a cluster is created.
const (
	DefaultPartitions = layout.DefaultPartitions
	DefaultGroups     = layout.DefaultGroups
	DefaultShards     = layout.DefaultShards
	MaxPartitions     = layout.MaxPartitions
)

// Partition returns the partition of a series hash among p partitions (see
// layout.Partition for the function's definition).
func Partition(hash uint64, p int) int { return layout.Partition(hash, p) }

// GroupOf returns the raft group owning partition part (see layout.GroupOf).
func GroupOf(part, p, g int) int { return layout.GroupOf(part, p, g) }

// GroupRange returns group i's half-open partition range (see layout.GroupRange).
func GroupRange(i, p, g int) (lo, hi int) { return layout.GroupRange(i, p, g) }

// ValidateLayout checks a partition/group/shard layout (see layout.ValidateLayout).
func ValidateLayout(p, g, s int) error { return layout.ValidateLayout(p, g, s) }

// PartitionHashRange returns the first and last hash of a partition (see
// layout.PartitionHashRange).
func PartitionHashRange(part, p int) (first, last uint64) { return layout.PartitionHashRange(part, p) }
