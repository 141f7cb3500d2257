package admission

import "math/bits"

// Pending holds, per tenant, the hashes logged as new by entries not yet
// applied. A re-send of a pending hash is accepted without logging it again:
// the earlier entry creates it, and the reply waits for that entry because
// replies go out in log order.
//
// Each hash is stored with the sequence number of the batch that logged it
// (Begin), and batches complete in log order (Done), so a hash is pending
// while its batch's number is above the last completed one: completing a
// batch costs nothing per hash, and a hash whose batch completed is a stale
// slot, reused by the next insert or dropped when the table is rebuilt.
// The tables are open-addressed (linear probing) on the hashes themselves,
// which are uniform already: one probe sequence answers "pending?", within
// a cache line or two. A Go map here (a lookup, then an insert, per new
// series, and a delete per hash when its entry applied) cost 7 % of a
// leader's CPU creating series, mostly cache misses in maps whose capacity
// never shrank after a burst.
type Pending struct {
	seq  uint64 // the batch being decided
	done uint64 // every batch up to and including it has completed
	sets map[string]*pendingSet
}

// NewPending returns an empty Pending.
func NewPending() *Pending { return &Pending{sets: map[string]*pendingSet{}} }

// Begin starts the next batch: hashes added until the next Begin belong to
// it. It returns the batch's number, for Done.
func (p *Pending) Begin() uint64 {
	p.seq++
	return p.seq
}

// Done records that batch seq completed (applied, or failed), and with it
// every earlier batch: batches complete in log order.
func (p *Pending) Done(seq uint64) {
	p.done = max(p.done, seq)
}

// set returns tenant's table, creating it.
func (p *Pending) set(tenant string) *pendingSet {
	s := p.sets[tenant]
	if s == nil {
		s = newPendingSet(pendingMinSlots)
		p.sets[tenant] = s
	}
	return s
}

// forget drops tenant's table when the node keeps tables for more than
// keepEmptyTenants tenants and nothing of tenant is in flight (the caller
// knows). Fewer tables are kept, stale, for the tenants' next batches.
func (p *Pending) forget(tenant string) {
	if len(p.sets) > keepEmptyTenants {
		delete(p.sets, tenant)
	}
}

// keepEmptyTenants bounds how many tenants keep a table with nothing in
// flight: Decide then refills the same table instead of allocating and
// growing a new one on the tenant's next batch, while a node with many
// tenants does not keep a table for every tenant that ever created a series.
const keepEmptyTenants = 64

// pendingMinSlots is a table's least size (a power of two).
const pendingMinSlots = 64

// pendingSet is one tenant's table: keys[i] a hash (0: empty; hash 0
// itself is kept aside, in zero), seqs[i] the batch that logged it (at or
// below Pending.done: a stale slot). The probes of a new series (absent,
// the common case) read keys only: 8 bytes a slot, so a batch of 1,000
// new series probes a table of 2,048–4,096 keys (16–32 KB) rather than
// one of 16-byte slots.
type pendingSet struct {
	keys []uint64 // a power of two long
	seqs []uint64
	used int    // slots not empty (live or stale)
	adds int    // adds since the last rebuild or reset
	peak int    // the most slots used since the table was last emptied
	top  uint64 // the highest seq stored: at or below done, every slot is stale
	zero uint64 // seq of hash 0 (0: not stored)
}

func newPendingSet(n int) *pendingSet {
	return &pendingSet{keys: make([]uint64, n), seqs: make([]uint64, n)}
}

// home is h's first slot: the top bits of h times an odd constant (the
// hashes are uniform already; the multiply guards against a caller's
// hashes that are not in their high bits).
func (s *pendingSet) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> (64 - bits.TrailingZeros(uint(len(s.keys)))))
}

// has reports whether h is in the table with a batch after done.
func (s *pendingSet) has(h, done uint64) bool {
	if s.top <= done {
		return false // every slot stale (the tenant's batches all completed)
	}
	if h == 0 {
		return s.zero > done
	}
	mask := len(s.keys) - 1
	for i := s.home(h); ; i = (i + 1) & mask {
		switch s.keys[i] {
		case 0:
			return false
		case h:
			return s.seqs[i] > done
		}
	}
}

// add stores h as logged by batch seq (h not pending: the caller checked),
// reusing h's own stale slot or the first stale one on its probe. A table
// whose every slot is stale is emptied first (its size kept, the tenant's
// next batches being likely the same size, unless it is eight times what
// it held since the last emptying); one is rebuilt when half its
// slots are used, and every half-table of adds, so that stale slots do not
// lengthen the probes for ever and a burst's table shrinks back.
func (s *pendingSet) add(h, seq, done uint64) {
	if s.top <= done && s.used > 0 {
		if len(s.keys) > 8*max(s.peak, pendingMinSlots/8) {
			// Far larger than its last batches needed (a burst's): half
			// the size, so a few quiet batches bring it back.
			n := max(pendingMinSlots, len(s.keys)/2)
			s.keys, s.seqs = make([]uint64, n), make([]uint64, n)
		} else {
			clear(s.keys)
		}
		s.used, s.adds, s.zero, s.peak = 0, 0, 0, 0
	}
	s.top = max(s.top, seq)
	if h == 0 {
		s.zero = seq
		return
	}
	if s.adds++; s.adds > len(s.keys)/2 {
		s.rebuild(done)
	}
	mask := len(s.keys) - 1
	reuse := -1
	for i := s.home(h); ; i = (i + 1) & mask {
		k := s.keys[i]
		if k == 0 {
			if reuse >= 0 {
				s.keys[reuse], s.seqs[reuse] = h, seq
				return
			}
			s.keys[i], s.seqs[i] = h, seq
			s.used++
			s.peak = max(s.peak, s.used)
			if s.used*2 > len(s.keys) {
				s.rebuild(done)
			}
			return
		}
		if k == h {
			s.seqs[i] = seq // stale (the caller checked): logged again
			return
		}
		if reuse < 0 && s.seqs[i] <= done {
			reuse = i
		}
	}
}

// rebuild drops the stale slots into a table sized for the live ones: four
// slots per live hash, at least pendingMinSlots and at least half the old
// size, so a burst's table shrinks back over a few rebuilds rather than at
// once (the next batches would grow it again).
func (s *pendingSet) rebuild(done uint64) {
	live := 0
	for i, k := range s.keys {
		if k != 0 && s.seqs[i] > done {
			live++
		}
	}
	n := max(pendingMinSlots, len(s.keys)/2)
	for n < 4*live {
		n *= 2
	}
	oldK, oldS := s.keys, s.seqs
	s.keys, s.seqs, s.used, s.adds = make([]uint64, n), make([]uint64, n), 0, 0
	mask := n - 1
	for j, k := range oldK {
		if k == 0 || oldS[j] <= done {
			continue
		}
		i := s.home(k)
		for s.keys[i] != 0 {
			i = (i + 1) & mask
		}
		s.keys[i], s.seqs[i] = k, oldS[j]
		s.used++
	}
}
