package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"
)

// model is what a group's log must hold: entries first..last.
type model struct {
	first, last uint64
	terms       map[uint64]uint64
}

func modelData(g uint16, i, term uint64) []byte {
	return []byte(fmt.Sprintf("g%d/i%d/t%d/%s", g, i, term, bytes.Repeat([]byte{byte(i)}, int(i%200))))
}

// runModel applies random appends, compactions, truncations, whole-log
// removals and reopens to a log with tiny segments (so files rotate and are
// deleted all the time) and checks every group against a model after each
// reopen and at the end.
func runModel(t *testing.T, seed uint64, steps int) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	opts := Options{SegmentSize: 2 << 10, NoSync: true}
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w.Close() }()
	const groups = 3
	ms := make([]model, groups)
	for g := range ms {
		ms[g].terms = map[uint64]uint64{}
	}
	check := func(when string) {
		t.Helper()
		for g := uint16(0); g < groups; g++ {
			m := ms[g]
			l := w.Group(g)
			f, _ := l.FirstIndex()
			la, _ := l.LastIndex()
			wantLast := m.last
			if m.first == 0 {
				wantLast = 0 // an empty log reports 0..0
			}
			if f != m.first || la != wantLast {
				t.Fatalf("seed %d %s: group %d log %d..%d, model %d..%d", seed, when, g, f, la, m.first, wantLast)
			}
			for i := m.first; m.first != 0 && i <= m.last; i++ {
				var e raft.Log
				if err := l.GetLog(i, &e); err != nil {
					t.Fatalf("seed %d %s: group %d GetLog(%d): %v", seed, when, g, i, err)
				}
				if e.Term != m.terms[i] || !bytes.Equal(e.Data, modelData(g, i, m.terms[i])) {
					t.Fatalf("seed %d %s: group %d entry %d: term %d data %q, model term %d", seed, when, g, i, e.Term, e.Data, m.terms[i])
				}
			}
		}
	}
	term := uint64(1)
	for step := 0; step < steps; step++ {
		g := uint16(rng.IntN(groups))
		m := &ms[g]
		l := w.Group(g)
		switch op := rng.IntN(20); {
		case op < 12: // append
			start := m.last + 1
			if m.first == 0 {
				start = m.last + 1 + uint64(rng.IntN(5)) // an empty log starts anywhere
			}
			n := 1 + rng.IntN(6)
			if rng.IntN(4) == 0 {
				term++
			}
			var ls []*raft.Log
			for i := start; i < start+uint64(n); i++ {
				ls = append(ls, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: modelData(g, i, term)})
			}
			if err := l.StoreLogs(ls); err != nil {
				t.Fatalf("seed %d step %d: StoreLogs: %v", seed, step, err)
			}
			if m.first == 0 {
				m.first = start
			}
			for i := start; i < start+uint64(n); i++ {
				m.terms[i] = term
			}
			m.last = start + uint64(n) - 1
		case op < 15 && m.first != 0: // compaction: a prefix
			to := m.first + uint64(rng.IntN(int(m.last-m.first+1)))
			if err := l.DeleteRange(m.first, to); err != nil {
				t.Fatalf("seed %d step %d: compact: %v", seed, step, err)
			}
			if to == m.last {
				m.first = 0 // last stays: the next append continues from it (raft's own rule after removing all)
			} else {
				m.first = to + 1
			}
		case op < 17 && m.first != 0: // conflict: a suffix
			from := m.first + uint64(rng.IntN(int(m.last-m.first+1)))
			if err := l.DeleteRange(from, m.last); err != nil {
				t.Fatalf("seed %d step %d: truncate: %v", seed, step, err)
			}
			if from == m.first {
				m.first = 0
			}
			m.last = from - 1
		case op < 18 && m.first != 0: // snapshot installed: the whole log
			if err := l.DeleteRange(m.first, m.last); err != nil {
				t.Fatalf("seed %d step %d: remove all: %v", seed, step, err)
			}
			m.first = 0
			m.last += uint64(rng.IntN(50)) // the next entry follows the snapshot
		case op == 19: // restart
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if w, err = Open(dir, opts); err != nil {
				t.Fatalf("seed %d step %d: reopen: %v", seed, step, err)
			}
			check(fmt.Sprintf("after reopen at step %d", step))
		}
		if m.first == 0 {
			// An empty log reports 0..0.
			for i := range m.terms {
				delete(m.terms, i)
			}
		}
	}
	check("at the end")
	// Segments are reclaimed: what is on disk is bounded by what is live.
	live := 0
	for g := range ms {
		if ms[g].first != 0 {
			live += int(ms[g].last - ms[g].first + 1)
		}
	}
	if segs, _ := listSegments(dir); len(segs) > 2+live {
		t.Fatalf("seed %d: %d segment files for %d live entries", seed, len(segs), live)
	}
}

func TestModel(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		runModel(t, seed, 600)
	}
}
