package ratelimit

import (
	"errors"
	"math"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
)

// Planned moves (a raise's partition moves, SetLayout): a sliding-window key
// whose group changed is owned by the new group's leader while its previous
// owner is alive. Left to the takeover path, the new owner rebuilds the
// key's window from the clients' reports as they arrive, while the nodes that
// have not seen the new table yet still ask the previous owner: for a few
// hundred milliseconds two owners decide the key, each with part of its
// window (a 20/s key admitted up to 1.30× its limit in the second of its
// move). So the new owner holds such a key (Admit answers Unseen, the tick
// grants nothing and folds no first report) until the previous owner has
// handed it over: Release, on the previous owner once its own table has
// moved the key away, marks the key released (it decides it no more) and
// returns its window's log, what it admitted for each client on request, and
// each client's folded consumption and cap; Import seeds them here, and a
// handed client's first report here then counts only what it admitted since
// (no re-seeding of what the log holds already). If no hand-off comes within
// handoffWait (the previous owner died, or cannot be reached), the key
// falls back to the takeover path. Token-bucket keys are not held: their
// leases bound a move's overlap (0.84–1.11× in the same runs).

// handoffFor is how long after a table change a key it moved is fetched
// from its previous owner when this node first owns it.
const handoffFor = 30 * time.Second

// handoffWait bounds how long a key waits for its hand-off.
const handoffWait = time.Second

// ErrStillOwner: Release asked of a node whose table still has it own a key.
var ErrStillOwner = errors.New("rateowner: this node's layout table still has it own the key")

// HandedClient is one client of a handed-over key as its previous owner
// knew it.
type HandedClient struct {
	ID       uint64
	Consumed uint64  // the consumed total folded into the log
	Cap      uint64  // the highest cap granted (what it may admit without asking)
	Asked    float64 // tokens admitted for it on request
}

// HandoffKey is a key's state as Release hands it over.
type HandoffKey struct {
	Key   string
	Known bool
	// Ages[i] before Release's now, Tokens[i] counted; oldest first.
	Ages    []int64
	Tokens  []float64
	Clients []HandedClient
}

// handState is a key's hand-off on its new owner (shard lock).
type handState struct {
	pending bool
	from    int   // the group the key moved from
	until   int64 // unix ns: pending ends here without a hand-off
	clients map[uint64]HandedClient
}

// noteMove records, for each partition whose group the table next moves
// away from prev's, the group it left and when
// (tickMu held). A raise moves partitions one table epoch at a time, so
// what a key moved from is kept per partition, not as one previous table.
func (o *Owner) noteMove(prev, next *layout.Table, ns int64) {
	old := o.moves.Load()
	mv := &partMoves{from: make([]int32, o.p), at: make([]int64, o.p)}
	if old != nil {
		copy(mv.from, old.from)
		copy(mv.at, old.at)
	}
	for q := range o.p {
		if g0, g1 := prev.GroupOf(q), next.GroupOf(q); g0 != g1 {
			mv.from[q], mv.at[q] = int32(g0), ns
		}
	}
	o.moves.Store(mv)
}

// partMoves is, per partition, the group it last moved from and when
// (unix ns; 0: never moved while this node ran).
type partMoves struct {
	from []int32
	at   []int64
}

// previousGroup is the group name's partition last moved from, when it
// moved less than handoffFor before ns.
func (o *Owner) previousGroup(name string, ns int64) (int, bool) {
	mv := o.moves.Load()
	if mv == nil {
		return 0, false
	}
	q := api.RatePartition(name, o.p)
	if mv.at[q] == 0 || ns-mv.at[q] >= int64(handoffFor) {
		return 0, false
	}
	g := int(mv.from[q])
	if g == o.groupOf(name) {
		return 0, false
	}
	return g, true
}

// startHandoff marks a tenant this node just took (reset) as waiting for
// its previous owner's hand-off when a recent table change moved it (the
// shard's lock held). ownsOld says whether this node led the group it moved
// from (then it has the state already, or none was kept).
func (o *Owner) startHandoff(t *tenantState, ns int64, ownsOld func(g int) bool) {
	if t.hand.pending {
		o.handPending.Add(-1)
	}
	t.hand = handState{}
	t.released = false
	if o.cfg.Sliding == nil || !o.cfg.Sliding(t.name) {
		return // a token bucket's leases bound the overlap
	}
	g, ok := o.previousGroup(t.name, ns)
	if !ok || (ownsOld != nil && ownsOld(g)) {
		return
	}
	t.hand = handState{pending: true, from: g, until: ns + int64(handoffWait)}
	o.handPending.Add(1)
}

// HandoffPending is the group a key waits for a hand-off from, if it does.
func (o *Owner) HandoffPending(name string) (from int, pending bool) {
	sh := &o.shards[o.shardOf(name)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if t := sh.tenants[name]; t != nil && t.hand.pending {
		return t.hand.from, true
	}
	return 0, false
}

// PendingHandoffs lists the keys waiting for a hand-off, by the group they
// moved from.
func (o *Owner) PendingHandoffs() map[int][]string {
	var out map[int][]string
	if o.handPending.Load() <= 0 {
		return nil
	}
	for k := range o.shards {
		sh := &o.shards[k]
		sh.mu.Lock()
		for _, t := range sh.list {
			if t.hand.pending {
				if out == nil {
					out = map[int][]string{}
				}
				out[t.hand.from] = append(out[t.hand.from], t.name)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Release hands keys over to their new owner: each key this node's table
// no longer has it own (owns says which groups it leads; ErrStillOwner
// when one is still its own) is marked released, so Admit decides it no
// more, and its state is returned.
func (o *Owner) Release(keys []string, now time.Time, owns func(g int) bool) ([]HandoffKey, error) {
	for _, k := range keys {
		if owns(o.groupOf(k)) {
			return nil, ErrStillOwner
		}
	}
	ns := now.UnixNano()
	out := make([]HandoffKey, 0, len(keys))
	for _, k := range keys {
		sh := &o.shards[o.shardOf(k)]
		sh.mu.Lock()
		t := sh.tenants[k]
		if t == nil {
			sh.mu.Unlock()
			out = append(out, HandoffKey{Key: k})
			continue
		}
		t.released = true
		hk := HandoffKey{Key: k, Known: true}
		if t.sw.on {
			t.sw.trim(ns)
			for _, e := range t.sw.log {
				hk.Ages = append(hk.Ages, ns-e.at)
				hk.Tokens = append(hk.Tokens, e.tokens)
			}
		}
		clients := map[uint64]HandedClient{}
		for id, n := range t.askedBy {
			clients[id] = HandedClient{ID: id, Asked: n}
		}
		o.mu.Lock()
		for id, rec := range o.clients {
			for _, s := range rec.live {
				s.mu.Lock()
				if s.entries != nil {
					es := s.entries[t.shard]
					for i := range es {
						if e := &es[i]; e.t == t && !e.superseded && e.seen && e.epoch == t.epoch {
							c := clients[id]
							c.ID = id
							c.Consumed = max(c.Consumed, e.lastConsumed)
							c.Cap = max(c.Cap, e.cap, e.capHist[0])
							clients[id] = c
						}
					}
				}
				s.mu.Unlock()
			}
		}
		o.mu.Unlock()
		for _, c := range clients {
			hk.Clients = append(hk.Clients, c)
		}
		sh.mu.Unlock()
		out = append(out, hk)
	}
	return out, nil
}

// Import seeds a key waiting for its hand-off with what its previous owner
// handed over (Release) and ends the wait; a key not waiting is left
// alone (its wait ended, and the takeover path seeds it).
func (o *Owner) Import(hk HandoffKey, now time.Time) bool {
	ns := now.UnixNano()
	sh := &o.shards[o.shardOf(hk.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tenants[hk.Key]
	if t == nil || !t.hand.pending {
		return false
	}
	t.hand.pending = false
	o.handPending.Add(-1)
	if !hk.Known {
		return true
	}
	rate, burst := o.limits(hk.Key)
	limit, win, ok := slidingLimits(rate, burst)
	if !ok || math.IsNaN(rate) || o.cfg.Sliding == nil || !o.cfg.Sliding(hk.Key) {
		return true
	}
	if !t.sw.on || t.sw.win != win {
		t.sw.log, t.sw.sum = t.sw.log[:0], 0
	}
	t.sw.on, t.sw.limit, t.sw.win = true, limit, win
	for i := range min(len(hk.Ages), len(hk.Tokens)) {
		if at := ns - hk.Ages[i]; at > ns-win {
			t.sw.insert(at, hk.Tokens[i])
		}
	}
	t.hand.clients = make(map[uint64]HandedClient, len(hk.Clients))
	for _, c := range hk.Clients {
		t.hand.clients[c.ID] = c
		if c.Asked > 0 {
			t.noteAsked(c.ID, 0)
			t.askedBy[c.ID] += c.Asked
		}
	}
	return true
}

// expireHandoff ends a wait that outlived handoffWait (the shard's lock
// held): the key is decided as after a takeover. It reports whether it did.
func (o *Owner) expireHandoff(t *tenantState, ns int64) bool {
	if t.hand.pending && ns >= t.hand.until {
		t.hand.pending = false
		o.handPending.Add(-1)
		return true
	}
	return false
}
