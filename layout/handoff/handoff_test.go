package handoff

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The hand-off simulation: a seeded, reproducible randomized run of the
// protocol over two groups that each hand half of their partitions to a new
// group (G = 2 → 4), under tracking load from clients that route by a cached
// layout. It interleaves requests, commits of appended entries, leader
// crashes (appended, uncommitted entries are lost; nothing of theirs was
// acknowledged), coordinator restarts (it keeps nothing), lost and
// duplicated deliveries, and after every step checks:
//
//	(a) one decider: no partition is owned by two groups, and no two leaders
//	    would decide for the same partition;
//	(b) no acknowledged series is lost: each is in the series of the group
//	    that owns its partition, or in a transfer in flight;
//	(c) the limit: per tenant, usage in every group plus series in flight
//	    never exceeds the limit, and shares plus shares in flight equal it;
//	(d) each group's usage is the count of its series.
//
// Once faults stop, every move finishes (liveness). FAKE: raft is "an
// appended entry commits when the simulation says so, in order"; the layout
// lives in group 0 and is modelled as always reachable.

type broken struct {
	payloadAtPropose   bool // the transfer is read from the source when Give is proposed, not computed at its index
	noDedup            bool // a re-delivered Receive is applied again
	completeEarly      bool // Complete is proposed as soon as Give applied, before the destination has it
	decideWhileLeaving bool // the source's leader keeps deciding for a partition with a Give pending
}

type simGroup struct {
	st      *Group
	up      bool
	pending []Entry
	reqs    []int                     // per pending entry: the request id (-1 for a protocol entry)
	stale   map[int]map[uint64]string // payloadAtPropose: partition → series read at propose time
}

type request struct {
	tenant string
	p      int
	hashes []uint64
}

type sim struct {
	t       *testing.T
	rng     *rand.Rand
	b       broken
	limit   int64
	tenants []string
	groups  []*simGroup
	owner   []int // the layout: partition → group
	cache   []int // what clients route by
	moves   []Move
	reqs    []request
	acked   map[uint64]string // hash → tenant of every acknowledged series
	parts   int
}

func newSim(t *testing.T, seed uint64, b broken) *sim {
	const parts, limit = 8, 30
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, 0x4a4d)), b: b, limit: limit, tenants: []string{"t0", "t1", "t2"},
		acked: map[uint64]string{}, parts: parts}
	half := map[string]int64{}
	rest := map[string]int64{}
	for _, tn := range s.tenants {
		half[tn], rest[tn] = limit/2, limit-limit/2
	}
	s.groups = []*simGroup{
		{st: NewGroup(0, []int{0, 1, 2, 3}, half), up: true},
		{st: NewGroup(1, []int{4, 5, 6, 7}, rest), up: true},
		{st: NewGroup(2, nil, nil), up: true},
		{st: NewGroup(3, nil, nil), up: true},
	}
	s.owner = []int{0, 0, 0, 0, 1, 1, 1, 1}
	s.cache = append([]int(nil), s.owner...)
	s.moves = []Move{{Nonce: 101, Partition: 2, From: 0, To: 2}, {Nonce: 102, Partition: 3, From: 0, To: 2},
		{Nonce: 103, Partition: 6, From: 1, To: 3}, {Nonce: 104, Partition: 7, From: 1, To: 3}}
	return s
}

func (s *sim) leader(g int) *Leader {
	sg := s.groups[g]
	pend := sg.pending
	if s.b.decideWhileLeaving {
		pend = nil
		for _, e := range sg.pending {
			if e.Kind != Give {
				pend = append(pend, e)
			}
		}
	}
	return &Leader{G: sg.st, Pending: pend}
}

func (s *sim) appendEntry(g int, e Entry, req int) {
	sg := s.groups[g]
	if s.b.payloadAtPropose && e.Kind == Give {
		if sg.stale == nil {
			sg.stale = map[int]map[uint64]string{}
		}
		cp := map[uint64]string{}
		for h, t := range sg.st.Series[e.Partition] {
			cp[h] = t
		}
		sg.stale[e.Partition] = cp
	}
	sg.pending = append(sg.pending, e)
	sg.reqs = append(sg.reqs, req)
}

// commit applies group g's oldest appended entry and acknowledges its request.
func (s *sim) commit(g int) {
	sg := s.groups[g]
	e, req := sg.pending[0], sg.reqs[0]
	sg.pending, sg.reqs = sg.pending[1:], sg.reqs[1:]
	if s.b.noDedup && e.Kind == Receive {
		delete(sg.st.Seen, e.Transfer.Nonce)
	}
	owned := sg.st.Owned[e.Partition]
	sg.st.Apply(e)
	if s.b.payloadAtPropose && e.Kind == Give && owned {
		// The transfer as read when proposed: what was committed since is
		// dropped with the partition.
		tr := sg.st.Outbox[e.Nonce]
		tr.Series = sg.stale[e.Partition]
		tr.Shares = map[string]int64{}
		for _, tn := range tr.Series {
			tr.Shares[tn]++
		}
		sg.st.Outbox[e.Nonce] = tr
	}
	if req >= 0 && e.Kind == Track {
		for _, h := range e.Hashes {
			s.acked[h] = e.Tenant
		}
	}
}

// request sends one tracking request the way a client does: to the cached
// owner; Moved refreshes the cache.
func (s *sim) request() {
	ti := s.rng.IntN(len(s.tenants))
	tn := s.tenants[ti]
	p := s.rng.IntN(s.parts)
	var hs []uint64
	for range 1 + s.rng.IntN(4) {
		if s.rng.IntN(2) == 0 {
			// a re-send of an acknowledged series of this tenant and partition
			for h, t := range s.acked {
				if t == tn && int(h>>32) == p {
					hs = append(hs, h)
					break
				}
			}
		}
		// A series is (tenant, hash): hashes differ per tenant here.
		hs = append(hs, uint64(p)<<32|uint64(ti)<<16|uint64(s.rng.IntN(40)))
	}
	g := s.cache[p]
	if !s.groups[g].up {
		return // no leader: the client retries later
	}
	ans, e := s.leader(g).Decide(tn, p, hs)
	if ans == Moved {
		copy(s.cache, s.owner)
		return
	}
	if e != nil {
		s.reqs = append(s.reqs, request{tn, p, hs})
		s.appendEntry(g, *e, len(s.reqs)-1)
	}
}

// coordinate runs one step of a random unfinished move; lossy deliveries are
// sometimes lost or doubled.
func (s *sim) coordinate(lossy bool) {
	m := s.moves[s.rng.IntN(len(s.moves))]
	src, dst := s.groups[m.From], s.groups[m.To]
	st := Next(m, src.st, dst.st, s.owner[m.Partition])
	if s.b.completeEarly && st.Kind == DeliverReceive && src.up {
		s.appendEntry(m.From, Entry{Kind: Complete, Nonce: m.Nonce}, -1)
	}
	switch st.Kind {
	case ProposeGive:
		if src.up {
			s.appendEntry(m.From, Entry{Kind: Give, Partition: m.Partition, To: m.To, Nonce: m.Nonce}, -1)
		}
	case DeliverReceive:
		if !dst.up || (lossy && s.rng.IntN(3) == 0) {
			return // lost
		}
		s.appendEntry(m.To, Entry{Kind: Receive, Transfer: st.Transfer}, -1)
		if lossy && s.rng.IntN(4) == 0 {
			s.appendEntry(m.To, Entry{Kind: Receive, Transfer: st.Transfer}, -1) // doubled
		}
	case Route:
		s.owner[m.Partition] = m.To
	case ProposeComplete:
		if src.up {
			s.appendEntry(m.From, Entry{Kind: Complete, Nonce: m.Nonce}, -1)
		}
	}
}

func (s *sim) step(faults bool) {
	switch op := s.rng.IntN(20); {
	case op < 8:
		s.request()
	case op < 14:
		var ready []int
		for g, sg := range s.groups {
			if sg.up && len(sg.pending) > 0 {
				ready = append(ready, g)
			}
		}
		if len(ready) > 0 {
			s.commit(ready[s.rng.IntN(len(ready))])
		}
	case op < 18:
		s.coordinate(faults)
	case faults && op == 18:
		sg := s.groups[s.rng.IntN(len(s.groups))]
		sg.up, sg.pending, sg.reqs = false, nil, nil // leader crash: uncommitted entries lost
	default:
		for _, sg := range s.groups {
			sg.up = true // a new leader is elected
		}
	}
}

// check returns the first violated property, or "".
func (s *sim) check() string {
	for p := range s.parts {
		owners, deciders := 0, 0
		for g, sg := range s.groups {
			if sg.st.Owned[p] {
				owners++
			}
			if sg.up {
				if ans, _ := s.leader(g).Decide("probe", p, nil); ans != Moved {
					deciders++
				}
			}
		}
		if owners > 1 || deciders > 1 {
			return fmt.Sprintf("(a) partition %d owned by %d groups, decided by %d leaders", p, owners, deciders)
		}
	}
	inFlight := map[uint64]Transfer{}
	for _, sg := range s.groups {
		for n, tr := range sg.st.Outbox {
			if !s.groups[tr.To].st.Seen[n] {
				inFlight[n] = tr
			}
		}
	}
	for h, tn := range s.acked {
		p := int(h >> 32)
		found := false
		for _, sg := range s.groups {
			if sg.st.Owned[p] && sg.st.Series[p][h] == tn {
				found = true
			}
		}
		for _, tr := range inFlight {
			if tr.Partition == p && tr.Series[h] == tn {
				found = true
			}
		}
		if !found {
			return fmt.Sprintf("(b) acknowledged series %x of %s is in no group and no transfer", h, tn)
		}
	}
	for _, tn := range s.tenants {
		var usage, share int64
		for _, sg := range s.groups {
			usage += sg.st.Usage[tn]
			share += sg.st.Share[tn]
		}
		for _, tr := range inFlight {
			usage += tr.Shares[tn]
			share += tr.Shares[tn]
		}
		if usage > s.limit || share != s.limit {
			return fmt.Sprintf("(c) %s: usage %d and shares %d with the limit %d", tn, usage, share, s.limit)
		}
	}
	for g, sg := range s.groups {
		count := map[string]int64{}
		for _, ser := range sg.st.Series {
			for _, tn := range ser {
				count[tn]++
			}
		}
		for _, tn := range s.tenants {
			if count[tn] != sg.st.Usage[tn] {
				return fmt.Sprintf("(d) group %d: %s usage %d, series %d", g, tn, sg.st.Usage[tn], count[tn])
			}
		}
	}
	return ""
}

// run returns the first violation of a seeded run, or "" when the run held
// and every move finished once faults stopped.
func run(t *testing.T, seed uint64, b broken) string {
	s := newSim(t, seed, b)
	for i := range 400 {
		s.step(true)
		if v := s.check(); v != "" {
			return fmt.Sprintf("step %d: %s", i, v)
		}
	}
	for _, sg := range s.groups {
		sg.up = true
	}
	for i := range 4000 {
		s.step(false)
		if v := s.check(); v != "" {
			return fmt.Sprintf("quiet step %d: %s", i, v)
		}
		done := true
		for _, m := range s.moves {
			if Next(m, s.groups[m.From].st, s.groups[m.To].st, s.owner[m.Partition]).Kind != Done {
				done = false
			}
		}
		if done {
			return ""
		}
	}
	return "liveness: moves unfinished 4,000 steps after the faults stopped"
}

// TestHandoffSimulation: a thousand seeded runs of the protocol hold every
// property and finish every move.
func TestHandoffSimulation(t *testing.T) {
	runs := 1000
	if testing.Short() {
		runs = 300
	}
	for seed := range uint64(runs) {
		if v := run(t, seed, broken{}); v != "" {
			t.Fatalf("seed %d: %s", seed, v)
		}
	}
}

// TestHandoffSimulationCatchesBrokenProtocols: each deliberately broken
// variant is caught within a few hundred seeds, so a green run above means
// something.
func TestHandoffSimulationCatchesBrokenProtocols(t *testing.T) {
	for name, b := range map[string]broken{
		"payload read at propose":      {payloadAtPropose: true},
		"receive applied twice":        {noDedup: true},
		"complete before receive":      {completeEarly: true},
		"leader decides while leaving": {decideWhileLeaving: true},
	} {
		caught := ""
		for seed := range uint64(500) {
			if v := run(t, seed, b); v != "" {
				caught = fmt.Sprintf("seed %d: %s", seed, v)
				break
			}
		}
		if caught == "" {
			t.Errorf("%s: not caught in 500 seeds", name)
		} else {
			t.Logf("%s: caught at %s", name, caught)
		}
	}
}
