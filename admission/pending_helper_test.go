package admission

import "slices"

// benchDecide decides a batch on s as decideAndLog does (the pending sets'
// bookkeeping, no log).
func benchDecide(s *session, in []Request) *batch {
	d := Decide(in, s.pending, func(string) Budget { return Budget{} }, nil)
	for tenant := range d.NewBy {
		s.batchesWith[tenant]++
	}
	return &batch{newBy: d.NewBy, seq: d.Seq}
}

// hashesBy is hashes per tenant, for tests.
type hashesBy map[string][]uint64

// pendingOf returns a Pending holding hs as logged by one batch in flight.
func pendingOf(hs hashesBy) *Pending {
	p := NewPending()
	seq := p.Begin()
	for tenant, list := range hs {
		for _, h := range list {
			p.set(tenant).add(h, seq, p.done)
		}
	}
	return p
}

// livePending is p's pending hashes per tenant, each list sorted (an empty
// map when none).
func livePending(p *Pending) hashesBy {
	out := hashesBy{}
	for tenant, s := range p.sets {
		if s.zero > p.done {
			out[tenant] = append(out[tenant], 0)
		}
		for i, k := range s.keys {
			if k != 0 && s.seqs[i] > p.done {
				out[tenant] = append(out[tenant], k)
			}
		}
		slices.Sort(out[tenant])
	}
	return out
}

// pendingHas reports whether h is pending for tenant.
func pendingHas(p *Pending, tenant string, h uint64) bool {
	s := p.sets[tenant]
	return s != nil && s.has(h, p.done)
}
