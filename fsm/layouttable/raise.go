package layouttable

import (
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// The layout-raise entry (type 22, cluster version 6) raises the group count
// and names the voters of every group it adds. Payload:
//
//	uvarint  groups N (the new count)
//	uvarint  count of new groups K (N minus the count the proposer read)
//	K ×      uvarint voter count V (1..MaxVoters), V × (string id, string raft address)
//
// The voters travel in the log so that every voter of a new group bootstraps
// it with the identical configuration (raft then treats the bootstraps as
// one), whichever member list its node sees when it applies the entry.

// MaxVoters bounds a new group's voters in a layout-raise payload.
const MaxVoters = 16

// Voter is one voter of a group a raise adds.
type Voter struct{ ID, Addr string }

// Raise is a layout-raise entry.
type Raise struct {
	Groups int
	Voters [][]Voter // per new group, from the proposer's count up
}

// RaiseResult is a layout-raise entry's response.
type RaiseResult struct {
	Epoch   uint64 // the epoch in force after the entry
	Groups  int    // the group count in force after the entry
	Changed bool   // false: the table already had that many groups
	Refused string // non-empty: nothing changed, and why
}

// RaiseApplied is what SetOnRaise's callback learns when a raise applies:
// the groups from From up to Raise.Groups were added, with their voters.
type RaiseApplied struct {
	From  int
	Raise Raise
}

// Servers is the raft configuration of each new group's voters.
func (r RaiseApplied) Servers() [][]raft.Server {
	out := make([][]raft.Server, 0, len(r.Raise.Voters))
	for _, vs := range r.Raise.Voters {
		out = append(out, Servers(vs))
	}
	return out
}

// SetOnRaise sets fn to be called on the apply goroutine after a raise is
// applied from the log (not on a restore: a node that catches up by snapshot
// creates the groups from the table, and their other voters bootstrap them).
// It must be quick. Call before the module applies anything.
func (m *Module) SetOnRaise(fn func(RaiseApplied)) { m.onRaise = fn }

// EncodeRaise is the layout-raise payload.
func EncodeRaise(r Raise) []byte {
	w := wire.Encoder{}
	w.Uvarint(uint64(r.Groups))
	w.Uvarint(uint64(len(r.Voters)))
	for _, vs := range r.Voters {
		w.Uvarint(uint64(len(vs)))
		for _, v := range vs {
			w.String(v.ID)
			w.String(v.Addr)
		}
	}
	return w.Buf
}

// DecodeRaise decodes a layout-raise payload.
func DecodeRaise(b []byte) (Raise, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	var r Raise
	n := d.Uvarint("groups")
	k := d.Uvarint("new groups")
	if d.Err() == nil && (n < 1 || n > layout.MaxGroups || k > n) {
		d.Failf("groups %d, new groups %d: want 1 ≤ new ≤ groups ≤ %d", n, k, layout.MaxGroups)
	}
	for i := uint64(0); i < k && d.Err() == nil; i++ {
		nv := d.Uvarint("voters")
		if d.Err() == nil && (nv < 1 || nv > MaxVoters) {
			d.Failf("new group %d: %d voters, want 1..%d", i, nv, MaxVoters)
		}
		vs := make([]Voter, 0, nv)
		for j := uint64(0); j < nv && d.Err() == nil; j++ {
			vs = append(vs, Voter{ID: d.String("voter id", 256), Addr: d.String("voter address", 512)})
		}
		r.Voters = append(r.Voters, vs)
	}
	if err := d.Finish(); err != nil {
		return Raise{}, err
	}
	r.Groups = int(n)
	return r, nil
}

// applyRaise applies a layout-raise: a no-op at the current count; refused
// (in the response) when it would lower the count, exceed the partitions, or
// names voters for another number of new groups than it adds (the proposer
// read an older count). Every replica decides from the replicated table
// alone.
func (m *Module) applyRaise(payload []byte) (any, error) {
	r, err := DecodeRaise(payload)
	if err != nil {
		return nil, err
	}
	cur := m.Current()
	next, changed, err := cur.Raise(r.Groups)
	switch {
	case err != nil:
		return RaiseResult{Epoch: cur.Epoch, Groups: cur.Groups, Refused: err.Error()}, nil
	case !changed:
		return RaiseResult{Epoch: cur.Epoch, Groups: cur.Groups}, nil
	case len(r.Voters) != r.Groups-cur.Groups:
		return RaiseResult{Epoch: cur.Epoch, Groups: cur.Groups, Refused: fmt.Sprintf("voters for %d new groups, raising %d to %d adds %d", len(r.Voters), cur.Groups, r.Groups, r.Groups-cur.Groups)}, nil
	}
	m.install(next)
	if m.onRaise != nil {
		m.onRaise(RaiseApplied{From: cur.Groups, Raise: r})
	}
	return RaiseResult{Epoch: next.Epoch, Groups: next.Groups, Changed: true}, nil
}

// VotersOf is the layout-raise form of a group's raft voters.
func VotersOf(servers []raft.Server) []Voter {
	out := make([]Voter, 0, len(servers))
	for _, s := range servers {
		out = append(out, Voter{ID: string(s.ID), Addr: string(s.Address)})
	}
	return out
}

// Servers is the raft configuration of a new group's voters.
func Servers(vs []Voter) []raft.Server {
	out := make([]raft.Server, 0, len(vs))
	for _, v := range vs {
		out = append(out, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.Addr)})
	}
	return out
}
