package partmove

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	fsmpm "github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/layout"
)

const testP = 16

var errMoved = errors.New("moved")

func hashIn(p int) uint64 {
	first, _ := layout.PartitionHashRange(p, testP)
	return first + 12345
}

// The fence passes everything until the group takes part in a hand-off;
// then it answers Moved for a partition being given (the leaving mark, this
// node's) and for every partition the group does not own (replicated).
func TestFence(t *testing.T) {
	mod := fsmpm.New(0, testP, 2) // owns 0..7
	f, err := fsm.New(fsm.Config{Partitions: testP, Groups: 3, Shards: 2, Group: 0, Base: 2, Modules: []fsm.Module{mod}})
	if err != nil {
		t.Fatal(err)
	}
	mod.Bind(f, nil, nil)
	s := New(Config{Partitions: testP, Module: func(int) *fsmpm.Module { return mod },
		MovedErr: func(p, g int) error { return errMoved }})
	fence := s.Fence(0)
	for _, p := range []int{3, 9} {
		if err := fence("t", []uint64{hashIn(p)}); err != nil {
			t.Fatalf("partition %d before any hand-off: %v", p, err)
		}
	}
	s.setLeaving(0, 3, true)
	if err := fence("t", []uint64{hashIn(4), hashIn(3)}); !errors.Is(err, errMoved) {
		t.Fatalf("a request with a series in a leaving partition: %v", err)
	}
	if err := fence("t", []uint64{hashIn(4)}); err != nil {
		t.Fatalf("another partition while one leaves: %v", err)
	}
	s.setLeaving(0, 3, false)
	if err := fence("t", []uint64{hashIn(3)}); err != nil {
		t.Fatalf("after the mark went (the give refused or lost): %v", err)
	}
	data, err := fsm.AppendModuleEntry(nil, fsmpm.EntryGive, 1, fsmpm.AppendGive(nil, fsmpm.Give{Nonce: 1, Partition: 5, To: 2}))
	if err != nil {
		t.Fatal(err)
	}
	if res := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: data}); res.(fsmpm.GiveResult).Refused != "" {
		t.Fatalf("give: %+v", res)
	}
	for p, want := range map[int]error{4: nil, 5: errMoved, 9: errMoved} {
		if err := fence("t", []uint64{hashIn(p)}); !errors.Is(err, want) && err != want {
			t.Fatalf("partition %d after partition 5 was given: %v, want %v", p, err, want)
		}
	}
}

// Nonces of distinct moves differ.
func TestNonce(t *testing.T) {
	seen := map[uint64]bool{}
	for p := range 64 {
		for _, mv := range [][3]int{{0, 4, 8}, {4, 0, 8}, {0, 8, 16}, {1, 4, 8}} {
			n := Nonce(p, mv[0], mv[1], mv[2])
			if seen[n] {
				t.Fatalf("nonce %#x twice", n)
			}
			seen[n] = true
		}
	}
}
