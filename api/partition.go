package api

import (
	"fmt"

	"github.com/tollgate-io/tollgate/layout"
)

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

// Table is the partition → group table (see layout.Table).
type Table = layout.Table

// ArithmeticTable is the epoch-0 table of p partitions over g groups (see
// layout.ArithmeticTable).
func ArithmeticTable(p, g int) *Table { return layout.ArithmeticTable(p, g) }

// LayoutToProto is t's wire form for ClusterView.layout: nil for epoch 0,
// the arithmetic every client computes alone.
func LayoutToProto(t *Table) *PartitionLayout {
	if t == nil || t.Epoch == 0 {
		return nil
	}
	pl := &PartitionLayout{Epoch: t.Epoch, Groups: uint32(t.Groups)}
	for _, r := range t.Runs() {
		pl.RunFirst = append(pl.RunFirst, uint32(r.First))
		pl.RunGroup = append(pl.RunGroup, uint32(r.Group))
	}
	return pl
}

// ViewTable is the table a cluster view routes by: its layout when it
// carries one, else the arithmetic of its partitions and groups. An invalid
// layout is an error naming what is wrong.
func ViewTable(v *ClusterView) (*Table, error) {
	p, g := int(v.GetPartitions()), int(v.GetGroups())
	pl := v.GetLayout()
	if pl == nil {
		if err := layout.ValidateLayout(p, g, 1); err != nil {
			return nil, err
		}
		return layout.ArithmeticTable(p, g), nil
	}
	return LayoutFromProto(pl, p)
}

// LayoutFromProto is the table of p partitions pl carries (LayoutToProto's
// inverse for a non-nil pl). An invalid layout is an error naming what is
// wrong.
func LayoutFromProto(pl *PartitionLayout, p int) (*Table, error) {
	if len(pl.GetRunFirst()) != len(pl.GetRunGroup()) {
		return nil, fmt.Errorf("cluster view layout: %d run starts but %d run groups", len(pl.GetRunFirst()), len(pl.GetRunGroup()))
	}
	runs := make([]layout.Run, len(pl.GetRunFirst()))
	for i := range runs {
		runs[i] = layout.Run{First: int(pl.RunFirst[i]), Group: int(pl.RunGroup[i])}
	}
	t, err := layout.FromRuns(pl.GetEpoch(), int(pl.GetGroups()), p, runs)
	if err != nil {
		return nil, fmt.Errorf("cluster view layout (epoch %d): %w", pl.GetEpoch(), err)
	}
	return t, nil
}
