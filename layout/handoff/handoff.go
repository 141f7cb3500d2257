package handoff

import (
	"maps"
	"slices"
)

// Transfer is what a Give moves: one partition's series (hash → tenant) and
// the share that goes with them (tenant → number of its series in the
// partition).
type Transfer struct {
	Nonce     uint64
	Partition int
	From, To  int
	Series    map[uint64]string
	Shares    map[string]int64
}

// Group is the replicated state one group keeps for tracking and hand-offs:
// the partitions it owns with their series, each tenant's usage (series
// held) and share (what it may hold here), transfers given and not yet
// completed, and the nonces of transfers received.
type Group struct {
	ID     int
	Owned  map[int]bool
	Series map[int]map[uint64]string // partition → hash → tenant
	Usage  map[string]int64
	Share  map[string]int64
	Outbox map[uint64]Transfer
	Seen   map[uint64]bool
}

// NewGroup returns group id owning parts, with the given shares.
func NewGroup(id int, parts []int, shares map[string]int64) *Group {
	g := &Group{ID: id, Owned: map[int]bool{}, Series: map[int]map[uint64]string{}, Usage: map[string]int64{},
		Share: maps.Clone(shares), Outbox: map[uint64]Transfer{}, Seen: map[uint64]bool{}}
	if g.Share == nil {
		g.Share = map[string]int64{}
	}
	for _, p := range parts {
		g.Owned[p] = true
		g.Series[p] = map[uint64]string{}
	}
	return g
}

// Clone is a deep copy (a snapshot and its restore).
func (g *Group) Clone() *Group {
	c := &Group{ID: g.ID, Owned: maps.Clone(g.Owned), Series: map[int]map[uint64]string{}, Usage: maps.Clone(g.Usage),
		Share: maps.Clone(g.Share), Outbox: map[uint64]Transfer{}, Seen: maps.Clone(g.Seen)}
	for p, s := range g.Series {
		c.Series[p] = maps.Clone(s)
	}
	for n, t := range g.Outbox {
		c.Outbox[n] = t
	}
	return c
}

// Kind is an entry's type.
type Kind uint8

// Entry kinds.
const (
	Track    Kind = iota + 1 // series a leader accepted
	Give                     // partition leaves (payload computed at apply)
	Receive                  // partition arrives
	Complete                 // the destination has it: forget the outbox copy
)

// Entry is one log entry of the protocol.
type Entry struct {
	Kind      Kind
	Tenant    string   // Track
	Partition int      // Track, Give
	Hashes    []uint64 // Track: the accepted hashes (new and refreshed)
	To        int      // Give
	Nonce     uint64   // Give, Receive, Complete
	Transfer  Transfer // Receive
}

// Apply applies one committed entry. It never refuses: the leader decided.
// A Give of a partition no longer owned and a Receive of a nonce already
// seen are no-ops, so a re-proposed or re-delivered entry changes nothing.
func (g *Group) Apply(e Entry) {
	switch e.Kind {
	case Track:
		if !g.Owned[e.Partition] {
			return // decided before the partition left: cannot happen (the leader stops deciding at Give)
		}
		s := g.Series[e.Partition]
		for _, h := range e.Hashes {
			if _, ok := s[h]; !ok {
				s[h] = e.Tenant
				g.Usage[e.Tenant]++
			}
		}
	case Give:
		if !g.Owned[e.Partition] {
			return
		}
		tr := Transfer{Nonce: e.Nonce, Partition: e.Partition, From: g.ID, To: e.To, Series: g.Series[e.Partition], Shares: map[string]int64{}}
		for _, t := range tr.Series {
			tr.Shares[t]++
		}
		for t, n := range tr.Shares {
			g.Usage[t] -= n
			g.Share[t] -= n
		}
		delete(g.Owned, e.Partition)
		delete(g.Series, e.Partition)
		g.Outbox[e.Nonce] = tr
	case Receive:
		if g.Seen[e.Transfer.Nonce] {
			return
		}
		g.Seen[e.Transfer.Nonce] = true
		g.Owned[e.Transfer.Partition] = true
		g.Series[e.Transfer.Partition] = maps.Clone(e.Transfer.Series)
		for t, n := range e.Transfer.Shares {
			g.Usage[t] += n
			g.Share[t] += n
		}
	case Complete:
		delete(g.Outbox, e.Nonce)
	}
}

// Answer is a leader's answer to a tracking request.
type Answer uint8

// Answers.
const (
	Accepted Answer = iota + 1 // all hashes accepted (appended; acknowledged at commit)
	Rejected                   // new series over the share: the known ones are refreshed
	Moved                      // this group does not decide for the partition: refresh the layout and retry
)

// Leader is a group leader's view: the applied state plus the entries it
// appended that have not applied yet. Decisions count the pending entries, so
// a series accepted and not yet committed holds its place, and a partition
// with a pending Give is decided by nobody here.
type Leader struct {
	G       *Group
	Pending []Entry
}

// leaving reports whether a Give of p is pending.
func (l *Leader) leaving(p int) bool {
	for _, e := range l.Pending {
		if e.Kind == Give && e.Partition == p {
			return true
		}
	}
	return false
}

// Decide answers a tracking request for tenant's hashes in partition p and
// returns the entry to append (nil when nothing is appended).
func (l *Leader) Decide(tenant string, p int, hashes []uint64) (Answer, *Entry) {
	if !l.G.Owned[p] || l.leaving(p) {
		return Moved, nil
	}
	// The tenant's usage counts its series appended and not yet applied, in
	// every partition of the group (the share is per group), each once.
	known := map[uint64]bool{} // in p
	for h, t := range l.G.Series[p] {
		if t == tenant {
			known[h] = true
		}
	}
	usage := l.G.Usage[tenant]
	pendingNew := map[[2]uint64]bool{}
	for _, e := range l.Pending {
		if e.Kind != Track || e.Tenant != tenant {
			continue
		}
		for _, h := range e.Hashes {
			k := [2]uint64{uint64(e.Partition), h}
			if _, applied := l.G.Series[e.Partition][h]; applied || pendingNew[k] {
				continue
			}
			pendingNew[k] = true
			usage++
			if e.Partition == p {
				known[h] = true
			}
		}
	}
	var fresh, old []uint64
	for _, h := range hashes {
		if known[h] {
			old = append(old, h)
		} else if !slices.Contains(fresh, h) {
			fresh = append(fresh, h)
		}
	}
	if usage+int64(len(fresh)) > l.G.Share[tenant] {
		if len(old) == 0 {
			return Rejected, nil
		}
		return Rejected, &Entry{Kind: Track, Tenant: tenant, Partition: p, Hashes: old}
	}
	return Accepted, &Entry{Kind: Track, Tenant: tenant, Partition: p, Hashes: append(old, fresh...)}
}

// Move is one planned hand-off.
type Move struct {
	Nonce     uint64 // fixed when the move is planned: a restarted coordinator reuses it
	Partition int
	From, To  int
}

// StepKind is what the coordinator does next for a move.
type StepKind uint8

// Steps.
const (
	ProposeGive     StepKind = iota + 1 // at the source
	DeliverReceive                      // the transfer from the source's outbox, at the destination
	Route                               // point the layout at the destination
	ProposeComplete                     // at the source
	Done
)

// Step is the coordinator's next action for a move.
type Step struct {
	Kind     StepKind
	Transfer Transfer // DeliverReceive
}

// Next is the coordinator's decision for move m from the applied states of
// the source and destination and the layout's owner of the partition. It
// reads only replicated state, so a coordinator that restarts (a new group 0
// leader) picks up where the last one was.
func Next(m Move, src, dst *Group, owner int) Step {
	tr, inOutbox := src.Outbox[m.Nonce]
	switch {
	case !dst.Seen[m.Nonce] && !inOutbox:
		return Step{Kind: ProposeGive}
	case !dst.Seen[m.Nonce]:
		return Step{Kind: DeliverReceive, Transfer: tr}
	case owner != m.To:
		return Step{Kind: Route}
	case inOutbox:
		return Step{Kind: ProposeComplete}
	}
	return Step{Kind: Done}
}
