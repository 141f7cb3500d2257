package layouttable

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/layout"
)

func (g *group) applyRaise(t testing.TB, r Raise) any {
	t.Helper()
	data, err := fsm.AppendModuleEntry(nil, EntryRaise, 100, EncodeRaise(r))
	if err != nil {
		t.Fatal(err)
	}
	g.idx++
	return g.f.Apply(&raft.Log{Index: g.idx, Term: 1, Type: raft.LogCommand, Data: data})
}

func voters(k int) [][]Voter {
	out := make([][]Voter, k)
	for i := range out {
		out[i] = []Voter{{ID: "a", Addr: "127.0.0.1:1"}, {ID: "b", Addr: "127.0.0.1:2"}}
	}
	return out
}

func TestRaise(t *testing.T) {
	g := newGroup(t, 0)
	var raised []RaiseApplied
	g.m.SetOnRaise(func(r RaiseApplied) { raised = append(raised, r) })
	before := g.m.Current()

	// Voters for the wrong number of new groups: refused, nothing changes.
	if res := g.applyRaise(t, Raise{Groups: 8, Voters: voters(3)}).(RaiseResult); res.Refused == "" || g.m.Current() != before {
		t.Fatalf("raise with 3 voter sets for 4 new groups: %+v", res)
	}
	res := g.applyRaise(t, Raise{Groups: 8, Voters: voters(4)}).(RaiseResult)
	if res.Refused != "" || !res.Changed || res.Groups != 8 || res.Epoch != 1 {
		t.Fatalf("raise 4 → 8: %+v", res)
	}
	cur := g.m.Current()
	if cur.Groups != 8 || !slices.Equal(cur.Owner, before.Owner) {
		t.Fatalf("table after the raise: %d groups, owners changed: %v", cur.Groups, !slices.Equal(cur.Owner, before.Owner))
	}
	if len(raised) != 1 || raised[0].From != 4 || raised[0].Raise.Groups != 8 || !reflect.DeepEqual(raised[0].Raise.Voters, voters(4)) {
		t.Fatalf("OnRaise calls: %+v", raised)
	}
	if len(g.changes) != 1 || g.changes[0].Groups != 8 {
		t.Fatalf("onChange calls: %d", len(g.changes))
	}
	// Again to 8: a no-op (the re-run of a raise that committed).
	if res := g.applyRaise(t, Raise{Groups: 8, Voters: voters(4)}).(RaiseResult); res.Refused != "" || res.Changed || res.Epoch != 1 || len(raised) != 1 {
		t.Fatalf("raise 8 → 8: %+v (OnRaise called %d times)", res, len(raised))
	}
	// Lowering and exceeding the partitions are refused.
	if res := g.applyRaise(t, Raise{Groups: 4}).(RaiseResult); !strings.Contains(res.Refused, "only be raised") || g.m.Current().Groups != 8 {
		t.Fatalf("raise 8 → 4: %+v", res)
	}
	if res := g.applyRaise(t, Raise{Groups: testP + 1, Voters: voters(testP + 1 - 8)}).(RaiseResult); res.Refused == "" {
		t.Fatalf("raise beyond the partitions: %+v", res)
	}
	// A set may now use the raised groups, and not more.
	if res := g.apply(t, Set{Expected: 1, Table: cur.Move(5, 7)}).(SetResult); res.Refused != "" {
		t.Fatalf("move to raised group 7: %+v", res)
	}
	if res := g.apply(t, Set{Expected: 2, Table: g.m.Current().Move(5, 8)}).(SetResult); !strings.Contains(res.Refused, "runs 8") {
		t.Fatalf("move to group 8 of 8: %+v", res)
	}

	// The raised table survives a snapshot into a fresh replica.
	h := newGroup(t, 0)
	if err := h.f.Restore(io.NopCloser(bytes.NewReader(snap(t, g.f)))); err != nil {
		t.Fatal(err)
	}
	if !h.m.Current().Equal(g.m.Current()) {
		t.Fatal("restored table differs")
	}
}

// A replica of a build before cluster version 6 does not know layout-raise:
// it halts rather than skip it (the version gate keeps leaders from
// proposing it until every server runs a newer build).
func TestRaiseNeedsClusterVersion6(t *testing.T) {
	g := newGroup(t, 5)
	g.applyRaise(t, Raise{Groups: 8, Voters: voters(4)})
	if halted, _ := g.f.Halted(); !halted {
		t.Fatal("a version-5 replica applied layout-raise")
	}
	if g.m.Current().Groups != testG {
		t.Fatal("the table changed on a halted replica")
	}
}

func TestRaisePayload(t *testing.T) {
	r := Raise{Groups: 6, Voters: voters(2)}
	got, err := DecodeRaise(EncodeRaise(r))
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"zero groups":   EncodeRaise(Raise{Groups: 0}),
		"no voters":     EncodeRaise(Raise{Groups: 5, Voters: [][]Voter{{}}}),
		"new > groups":  EncodeRaise(Raise{Groups: 1, Voters: voters(2)}),
		"trailing byte": append(EncodeRaise(r), 0),
		"too many":      EncodeRaise(Raise{Groups: layout.MaxGroups + 1}),
	} {
		if _, err := DecodeRaise(b); !errors.Is(err, ErrBadPayload) {
			t.Errorf("%s: %v, want ErrBadPayload", name, err)
		}
	}
}
