package fsm

import (
	"cmp"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/seriesmap"
	"github.com/tollgate-io/tollgate/layout"
)

// Partition hand-off (docs/online-groups.md): a group gives one partition's
// series to another group. The entries that do it belong to a module
// (fsm/partmove); these are the series-side operations it calls on the apply
// goroutine, so the series leave and arrive at exact log positions.

// PartitionSeries is one tenant's series in one partition, with the minute
// each was last seen (MinuteOf: a minute of the 2-hour ring, the same on
// every group, so a series keeps its age when it moves).
type PartitionSeries struct {
	Tenant  string
	Hashes  []uint64
	Minutes []uint8
}

// TakePartition removes every series of partition p (of Config.Partitions)
// from the group, lowers each tenant's active count by its series removed,
// and returns them with the group's minute. Tenants with no series in p are
// left out; the result is ordered by tenant name and hash, so every replica
// returns the same bytes. Apply goroutine only (a module's Apply).
func (f *FSM) TakePartition(p int) (now int64, out []PartitionSeries) {
	f.regMu.RLock()
	tenants := f.tenants
	f.regMu.RUnlock()
	byTenant := make(map[uint32]*PartitionSeries)
	parts := f.cfg.Partitions
	for s := range f.shards {
		sh := &f.shards[s]
		sh.mu.Lock()
		for id, t := range sh.tables {
			if t == nil {
				continue
			}
			var keepH []uint64
			var keepM []uint8
			moved := false
			t.Range(func(h uint64, m uint8) bool {
				if layout.Partition(h, parts) == p {
					ps := byTenant[uint32(id)]
					if ps == nil {
						ps = &PartitionSeries{Tenant: tenants[id].Name}
						byTenant[uint32(id)] = ps
					}
					ps.Hashes = append(ps.Hashes, h)
					ps.Minutes = append(ps.Minutes, m)
					moved = true
				} else {
					keepH = append(keepH, h)
					keepM = append(keepM, m)
				}
				return true
			})
			if !moved {
				continue
			}
			// Rebuild the table without the partition: the old one may be
			// read by a live snapshot, which keeps its own pointer.
			if len(keepH) == 0 {
				sh.tables[id] = nil
				continue
			}
			nt := seriesmap.New(len(keepH))
			for i, h := range keepH {
				nt.Put(h, keepM[i])
			}
			sh.tables[id] = nt
			sh.gens[id] = f.snapGen
		}
		sh.mu.Unlock()
	}
	for id, ps := range byTenant {
		tenants[id].addActive(-int64(len(ps.Hashes)))
		sortSeries(ps)
		out = append(out, *ps)
	}
	slices.SortFunc(out, func(a, b PartitionSeries) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return f.now.Load(), out
}

// sortSeries orders one tenant's hashes (and their minutes) by hash.
func sortSeries(ps *PartitionSeries) {
	idx := make([]int, len(ps.Hashes))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(ps.Hashes[a], ps.Hashes[b]) })
	h := make([]uint64, len(idx))
	m := make([]uint8, len(idx))
	for i, j := range idx {
		h[i], m[i] = ps.Hashes[j], ps.Minutes[j]
	}
	ps.Hashes, ps.Minutes = h, m
}

// PutPartition installs series given by another group (TakePartition's
// result there) and raises each tenant's active count by the series it did
// not hold yet. The group's clock moves to now first if it is behind (never
// back): a series' minute is only meaningful against a clock at or after the
// minute it was stamped. Apply goroutine only.
func (f *FSM) PutPartition(now int64, in []PartitionSeries) {
	if now > f.now.Load() {
		f.setNow(now)
	}
	for _, ps := range in {
		t := f.register(ps.Tenant)
		created := 0
		for i, h := range ps.Hashes {
			sh := &f.shards[h&f.shardMask]
			sh.mu.Lock()
			if f.writableTable(sh, t.id, 0).Put(h, ps.Minutes[i]) {
				created++
			}
			sh.mu.Unlock()
		}
		t.addActive(int64(created))
	}
}
