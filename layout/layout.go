package layout

import (
	"fmt"
)

// Defaults fixed when a cluster is created.
const (
	DefaultPartitions = 64
	DefaultGroups     = 4
	DefaultShards     = 16
	// MaxPartitions bounds P so a partition id always fits the wire and the
	// snapshot header comfortably.
	MaxPartitions = 1 << 16
)

// Partition returns the partition of a series hash among p partitions.
//
// It is the top 32 bits of the hash scaled to [0, p): partition i holds the hashes
// whose top 32 bits lie in [i·2³²/p, (i+1)·2³²/p). Partitions are therefore
// contiguous ranges of hash space, and so are groups (contiguous partition ranges),
// which keeps each group's hashes sharing their top bits; the low bits stay free
// for shard selection inside a group. p must be in [1, MaxPartitions].
func Partition(hash uint64, p int) int {
	return int(((hash >> 32) * uint64(p)) >> 32)
}

// GroupOf returns the raft group owning partition part when p partitions are
// split into g contiguous ranges. Group i owns partitions [GroupRange(i)).
func GroupOf(part, p, g int) int {
	return ((part+1)*g - 1) / p
}

// GroupRange returns the half-open partition range [lo, hi) owned by group i of g
// over p partitions: lo = ⌊i·p/g⌋, hi = ⌊(i+1)·p/g⌋.
func GroupRange(i, p, g int) (lo, hi int) {
	return i * p / g, (i + 1) * p / g
}

// ValidateLayout checks a partition/group/shard layout.
func ValidateLayout(p, g, s int) error {
	if p < 1 || p > MaxPartitions {
		return fmt.Errorf("partitions = %d: must be in [1, %d]", p, MaxPartitions)
	}
	if g < 1 || g > p {
		return fmt.Errorf("groups = %d: must be in [1, partitions=%d]", g, p)
	}
	if s < 1 || s > 1024 || s&(s-1) != 0 {
		return fmt.Errorf("shards = %d: must be a power of two in [1, 1024]", s)
	}
	return nil
}

// PartitionHashRange returns the first and last hash (inclusive) of partition
// part among p partitions. Load generators and tests use it to make hashes of a
// chosen partition.
func PartitionHashRange(part, p int) (first, last uint64) {
	lo := (uint64(part)<<32 + uint64(p) - 1) / uint64(p)
	hi := (uint64(part+1)<<32 + uint64(p) - 1) / uint64(p) // exclusive, in top-32 units
	return lo << 32, hi<<32 - 1
}
