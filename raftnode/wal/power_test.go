package wal_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode/wal"
	"github.com/tollgate-io/tollgate/raftnode/wal/powerfs"
)

// pmodel is what a group's log must hold: entries first..last (first 0:
// empty; last stays, as raft continues from it).
type pmodel struct {
	first, last uint64
	terms       map[uint64]uint64
}

func (m pmodel) clone() pmodel {
	m.terms = maps.Clone(m.terms)
	return m
}

func pdata(g uint16, i, term uint64) []byte {
	return []byte(fmt.Sprintf("g%d/i%d/t%d/%s", g, i, term, bytes.Repeat([]byte{byte(i)}, int(i%200))))
}

// matches says how l differs from m, or nil.
func (m pmodel) matches(l *wal.Log, g uint16) error {
	f, _ := l.FirstIndex()
	la, _ := l.LastIndex()
	wantLast := m.last
	if m.first == 0 {
		wantLast = 0
	}
	if f != m.first || la != wantLast {
		return fmt.Errorf("group %d log %d..%d, model %d..%d", g, f, la, m.first, wantLast)
	}
	for i := m.first; m.first != 0 && i <= m.last; i++ {
		var e raft.Log
		if err := l.GetLog(i, &e); err != nil {
			return fmt.Errorf("group %d GetLog(%d): %v", g, i, err)
		}
		if e.Term != m.terms[i] || !bytes.Equal(e.Data, pdata(g, i, m.terms[i])) {
			return fmt.Errorf("group %d entry %d: term %d, model term %d", g, i, e.Term, m.terms[i])
		}
	}
	return nil
}

// TestPowerCutModel runs random appends, compactions, truncations and
// whole-log removals on a log with tiny segments (so segments are created
// and removed all the time) on the power-loss disk, and cuts the power
// after a random number of changes of any kind: between a frame's write
// and its sync, between creating a segment and syncing the directory,
// between two segment removals. After every cut (the unsynced writes
// dropped, kept, or a random subset; unsynced directory entries each lost
// or kept) the log must open, and hold every acknowledged operation; the
// one in flight when the power went off may or may not be there, whole.
//
// This is the test that fails if the log removes a segment without
// syncing the directory before it removes the next: a cut then brings an
// older segment back while a newer stays removed.
func TestPowerCutModel(t *testing.T) {
	seeds := uint64(30)
	if testing.Short() {
		seeds = 8
	}
	var all powerfs.CutReport
	for seed := uint64(1); seed <= seeds; seed++ {
		rep := runPowerModel(t, seed, 500)
		all.Unsynced += rep.Unsynced
		all.Resurrected += rep.Resurrected
		all.Vanished += rep.Vanished
	}
	t.Logf("%d seeds: %d unsynced writes at the cuts, %d removed segments back, %d created segments lost", seeds, all.Unsynced, all.Resurrected, all.Vanished)
	// The cuts must land where directory entries are not yet durable, or
	// this test proves nothing about them.
	if all.Resurrected == 0 || all.Vanished == 0 {
		t.Errorf("no cut brought a removed segment back (%d) or lost a created one (%d)", all.Resurrected, all.Vanished)
	}
}

func runPowerModel(t *testing.T, seed uint64, steps int) powerfs.CutReport {
	dir := filepath.Join(t.TempDir(), "wal")
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed27))
	disk := powerfs.New()
	opts := wal.Options{SegmentSize: 2 << 10, FS: disk}
	w, err := wal.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if w != nil {
			w.Close()
		}
	}()
	const groups = 3
	ms := make([]pmodel, groups)
	for g := range ms {
		ms[g].terms = map[uint64]uint64{}
	}
	term := uint64(1)
	var fired <-chan struct{}
	cuts, unknown := 0, 0
	var totals powerfs.CutReport
	for step := 0; step < steps; step++ {
		if fired == nil && rng.IntN(8) == 0 {
			fired = disk.CutAfterOps(1 + rng.IntN(12))
		}
		g := uint16(rng.IntN(groups))
		before := ms[g].clone()
		next := ms[g].clone()
		l := w.Group(g)
		var opErr error
		switch op := rng.IntN(20); {
		case op < 12 || next.first == 0: // append
			start := next.last + 1
			if next.first == 0 {
				start += uint64(rng.IntN(5))
			}
			n := 1 + rng.IntN(6)
			if rng.IntN(4) == 0 {
				term++
			}
			var ls []*raft.Log
			for i := start; i < start+uint64(n); i++ {
				ls = append(ls, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: pdata(g, i, term)})
				next.terms[i] = term
			}
			if next.first == 0 {
				next.first = start
			}
			next.last = start + uint64(n) - 1
			opErr = l.StoreLogs(ls)
		case op < 15: // compaction: a prefix
			to := next.first + uint64(rng.IntN(int(next.last-next.first+1)))
			opErr = l.DeleteRange(next.first, to)
			if to == next.last {
				next.first = 0
			} else {
				next.first = to + 1
			}
		case op < 18: // conflict: a suffix
			from := next.first + uint64(rng.IntN(int(next.last-next.first+1)))
			opErr = l.DeleteRange(from, next.last)
			if from == next.first {
				next.first = 0
			}
			next.last = from - 1
		default: // snapshot installed: the whole log
			opErr = l.DeleteRange(next.first, next.last)
			next.first = 0
			next.last += uint64(rng.IntN(50))
		}
		if next.first == 0 {
			clear(next.terms)
		}
		off := false
		if fired != nil {
			select {
			case <-fired:
				off = true
			default:
			}
		}
		if !off {
			if opErr != nil {
				t.Fatalf("seed %d step %d: %v (the power is on)", seed, step, opErr)
			}
			ms[g] = next
			continue
		}
		// The power is off: restart on what the disk holds.
		fired = nil
		cuts++
		_ = w.Close()
		mode := []powerfs.Mode{powerfs.DropAll, powerfs.KeepAll, powerfs.Random, powerfs.Random}[rng.IntN(4)]
		rep, err := disk.Cut(mode, rng)
		if err != nil {
			t.Fatal(err)
		}
		totals.Unsynced += rep.Unsynced
		totals.Resurrected += rep.Resurrected
		totals.Vanished += rep.Vanished
		if w, err = wal.Open(dir, opts); err != nil {
			t.Fatalf("seed %d step %d: reopen after a %v cut (%+v): %v\nsegments: %s", seed, step, mode, rep, err, segments(dir))
		}
		for o := uint16(0); o < groups; o++ {
			if o == g {
				continue
			}
			if err := ms[o].matches(w.Group(o), o); err != nil {
				t.Fatalf("seed %d step %d: after a %v cut (%+v): %v", seed, step, mode, rep, err)
			}
		}
		switch errAfter := next.matches(w.Group(g), g); {
		case opErr == nil && errAfter != nil:
			t.Fatalf("seed %d step %d: acknowledged operation lost in a %v cut (%+v): %v", seed, step, mode, rep, errAfter)
		case errAfter == nil:
			ms[g] = next
		default:
			if errBefore := before.matches(w.Group(g), g); errBefore != nil {
				t.Fatalf("seed %d step %d: the operation in flight (%v) is neither done nor undone after a %v cut: %v / %v", seed, step, opErr, mode, errAfter, errBefore)
			}
			if !errors.Is(opErr, powerfs.ErrPowerCut) {
				t.Fatalf("seed %d step %d: failed with %v, want the power cut", seed, step, opErr)
			}
			unknown++
		}
	}
	for g := uint16(0); g < groups; g++ {
		if err := ms[g].matches(w.Group(g), g); err != nil {
			t.Fatalf("seed %d at the end: %v", seed, err)
		}
	}
	if cuts == 0 {
		t.Fatalf("seed %d: no power cut in %d steps", seed, steps)
	}
	t.Logf("seed %d: %d cuts, %d operations in flight undone", seed, cuts, unknown)
	return totals
}

func segments(dir string) string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
