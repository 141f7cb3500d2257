package ratelimit

import (
	"slices"

	"github.com/tollgate-io/tollgate/api"
)

// clientRec is a client's live sessions and what its closed sessions knew.
type clientRec struct {
	live  []*Session
	carry map[*tenantState]carried
}

type carried struct {
	tickState
	at int64 // unix ns the session closed
}

// Recycle gives back an update taken and sent, so the next tick fills it
// instead of allocating (the sender must not touch it afterwards).
func (s *Session) Recycle(u *api.RateUpdate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare == nil && u != s.pending {
		s.spare = u
	}
}

func (o *Owner) release(t *tenantState) {
	t.refs.Add(-1)
}

// carryOver gives a tenant newly introduced on s the tick state its client
// had for it on an earlier stream to this node (still open, or closed less
// than ForgetAfter ago). Counts are cumulative per client process, so the new
// stream continues from the last folded count: a reconnecting client is not
// counted twice (its bucket counts re-seed only a client this node never
// heard about the tenant). o.mu and s.mu held.
func (o *Owner) carryOver(s *Session, e *entry) {
	rec := o.clients[s.clientID]
	if rec == nil {
		rec = &clientRec{}
		o.clients[s.clientID] = rec
	}
	if !slices.Contains(rec.live, s) {
		rec.live = append(rec.live, s)
	}
	for _, old := range rec.live {
		if old == s || old.strategy != s.strategy {
			continue
		}
		// o.mu serialises every path that holds two session locks.
		old.mu.Lock()
		var olds []entry
		if old.entries != nil {
			olds = old.entries[e.t.shard]
		}
		for i := range olds {
			oe := &olds[i]
			if oe.t == e.t && !oe.superseded {
				if oe.seen {
					e.tickState = oe.tickState
				}
				oe.superseded = true
			}
		}
		old.mu.Unlock()
	}
	if c, ok := rec.carry[e.t]; ok {
		if !e.seen {
			e.tickState = c.tickState
		}
		delete(rec.carry, e.t)
		o.release(e.t)
	}
}

// forget drops a tenant no entry or carried state points to (sh.mu held).
func (sh *shard) forget(t *tenantState) {
	delete(sh.tenants, t.name)
	last := sh.list[len(sh.list)-1]
	sh.list[t.pos], last.pos = last, t.pos
	sh.list[len(sh.list)-1] = nil
	sh.list = sh.list[:len(sh.list)-1]
}
