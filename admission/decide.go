package admission

import (
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/limits"
)

// Request is one request's input to Decide.
type Request struct {
	Tenant string
	Hashes []uint64
	// States holds fsm.StateAbsent/StateActive/StateFresh per hash, read from the
	// committed state at the batch's minute (len(States) == len(Hashes)).
	States []uint8
}

// Budget is a tenant's limit in this group as the batch begins.
type Budget struct {
	// Share is the group's share of the tenant's max series; 0 = unlimited,
	// negative = limited with no headroom left (NoHeadroom).
	Share int64
	Used  int64 // active + reserved: exact (see fsm.Tenant)
}

// Check is an additional admission rule (a per-partition cardinality sketch, a
// rate limit, sampling …) consulted by Decide after the committed state and the
// pending set were read and before the tenant's share is charged.
//
// Admit is called once per request that would create new series. candidates are
// those hashes in request order; Admit sets deny[i] for each candidate it
// refuses and leaves entries already set by an earlier Check set. Refused hashes
// are answered as rejected and never logged. Refreshes of active series and
// re-sends of pending ones never reach a Check, so a Check can never reject a
// series that was accepted and is still active. Admit runs on the session's
// decider goroutine with the pending set locked: it must be fast, must not block
// and does no I/O (state such as sketches or token buckets lives in memory).
type Check interface {
	Admit(tenant string, candidates []uint64, deny []bool)
}

// Decision is Decide's output for one batch.
type Decision struct {
	// Rejected holds, per request, the hashes rejected (nil when none).
	Rejected [][]uint64
	// AtShare counts, per request, the rejected hashes that no Check refused:
	// rejected only because the group's share was used up. Borrowing headroom
	// from other groups can admit them.
	AtShare []int
	// Entry lists, per tenant in order of first appearance, the hashes to log:
	// new ones and refreshes of active ones, in request order; New counts the
	// new ones. Tenants with nothing to log are left out.
	Entry []fsm.TenantHashes
	// NewBy lists per tenant the hashes logged as new (added to Pending by
	// Decide as batch Seq; the caller calls Pending.Done(Seq) once the entry
	// applied, or failed). Nil when none.
	NewBy map[string][]uint64
	// Seq is the batch's number in Pending (Pending.Begin).
	Seq uint64

	Created, Refreshed, RejectedN int
}

// NoHeadroom is the Share of a limited tenant whose group has no headroom
// left (its share was lowered or given away below zero); limits.GroupShare
// returns it.
const NoHeadroom = limits.NoHeadroom

// Decide applies the tracking rule to every hash of reqs in request order:
//   - fresh (refreshed this minute already): accepted, nothing to log;
//   - active: accepted, logged as a refresh, never counted against the share;
//   - absent but pending (logged as new by an entry not yet applied): accepted,
//     not logged again;
//   - absent, denied by a Check: rejected;
//   - absent, tenant at its share (used + new in this batch ≥ share, share > 0):
//     rejected;
//   - otherwise: accepted as new, logged, counted, and added to pending.
//
// budget is asked once per tenant, at the tenant's first request in the batch.
// Decide does no I/O and starts no goroutine; it mutates only pending.
func Decide(reqs []Request, pending *Pending, budget func(tenant string) Budget, checks []Check) Decision {
	d := Decision{Rejected: make([][]uint64, len(reqs)), AtShare: make([]int, len(reqs)), Seq: pending.Begin()}
	done := pending.done
	type tenantBatch struct {
		Budget
		newN int64 // accepted as new in this batch
		idx  int   // index in d.Entry
	}
	var tenants map[string]*tenantBatch
	var denied []bool
	for i, r := range reqs {
		if len(r.Hashes) == 0 {
			continue
		}
		tb := tenants[r.Tenant]
		if tb == nil {
			if tenants == nil {
				tenants = make(map[string]*tenantBatch, 1)
			}
			tb = &tenantBatch{Budget: budget(r.Tenant), idx: len(d.Entry)}
			tenants[r.Tenant] = tb
			d.Entry = append(d.Entry, fsm.TenantHashes{Tenant: r.Tenant})
		}
		pt := pending.sets[r.Tenant]
		if len(checks) > 0 {
			denied = deniedByChecks(r, pt, done, checks, denied)
		}
		th := &d.Entry[tb.idx]
		var rejected, created []uint64
		for j, h := range r.Hashes {
			switch r.States[j] {
			case fsm.StateFresh:
				continue
			case fsm.StateActive:
				if th.Hashes == nil {
					th.Hashes = make([]uint64, 0, len(r.Hashes)-j)
				}
				th.Hashes = append(th.Hashes, h)
				d.Refreshed++
				continue
			}
			if pt != nil && pt.has(h, done) {
				continue // created by an in-flight entry; the reply waits for it
			}
			if len(checks) > 0 && denied[j] {
				rejected = append(rejected, h)
				continue
			}
			if tb.Share != 0 && tb.Used+tb.newN >= tb.Share {
				rejected = append(rejected, h)
				d.AtShare[i]++
				continue
			}
			if pt == nil {
				pt = pending.set(r.Tenant)
			}
			pt.add(h, d.Seq, done)
			if created == nil {
				created = make([]uint64, 0, len(r.Hashes)-j)
			}
			created = append(created, h)
			if th.Hashes == nil {
				th.Hashes = make([]uint64, 0, len(r.Hashes)-j)
			}
			th.Hashes = append(th.Hashes, h)
			tb.newN++
		}
		if len(created) > 0 {
			if d.NewBy == nil {
				d.NewBy = map[string][]uint64{}
			}
			if prev := d.NewBy[r.Tenant]; prev == nil {
				d.NewBy[r.Tenant] = created
			} else {
				d.NewBy[r.Tenant] = append(prev, created...)
			}
			th.New += len(created)
			d.Created += len(created)
		}
		d.Rejected[i] = rejected
		d.RejectedN += len(rejected)
	}
	// Drop tenants with nothing to log, keeping first-appearance order.
	out := d.Entry[:0]
	for _, th := range d.Entry {
		if len(th.Hashes) > 0 {
			out = append(out, th)
		}
	}
	d.Entry = out
	return d
}

// deniedByChecks runs the checks over the request's would-be-new hashes and
// returns, per position in the request, whether a check refused it.
func deniedByChecks(r Request, pt *pendingSet, done uint64, checks []Check, buf []bool) []bool {
	buf = append(buf[:0], make([]bool, len(r.Hashes))...)
	var cand []uint64
	var pos []int
	for j, h := range r.Hashes {
		if r.States[j] == fsm.StateAbsent && (pt == nil || !pt.has(h, done)) {
			cand = append(cand, h)
			pos = append(pos, j)
		}
	}
	if len(cand) == 0 {
		return buf
	}
	deny := make([]bool, len(cand))
	for _, c := range checks {
		c.Admit(r.Tenant, cand, deny)
	}
	for k, j := range pos {
		buf[j] = deny[k]
	}
	return buf
}
