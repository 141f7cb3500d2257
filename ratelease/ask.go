package ratelease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Keys whose owner enforces a sliding window (the server's Envoy rules with a
// unit longer than a second) are decided in two steps: the lease covers what
// it can, with no call (Local), and a request it does not cover is decided by
// the owner, now, with one call (Client.Ask). The owner keeps what no lease
// holds, so a low-rate key (ten a minute over three nodes) is decided
// exactly wherever its requests land, and a busy key mostly from leases.

// Local decides n tokens of key from its lease alone, and counts them when
// it admits. ask is true when the lease cannot say yes: no update yet, the
// owner silent (stale), or the lease does not cover n; the caller then asks
// the owner (Client.Ask) or settles with Refuse. A key the owner says has no
// limit is admitted. Local never admits without the owner's grant.
func (l *Limiter) Local(key string, n uint64) (d Decision, ask bool) {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	switch t.mode.Load() {
	case modeNoLimit:
		t.consumed.Add(n)
		t.decided[reasonNoLimit].Add(1)
		return Decision{Allowed: true}, false
	case modeLimited:
		for {
			c, capv := t.consumed.Load(), t.leaseCap.Load()
			if c > capv || n > capv-c {
				// Updates late (owner failover): the lease extends at
				// the client's share of the refill, as in Allow.
				capv = t.extendedCap(l.now().UnixNano(), capv)
				if c > capv || n > capv-c {
					return Decision{Limited: true}, true
				}
			}
			if t.consumed.CompareAndSwap(c, c+n) {
				t.decided[reasonWithinLimit].Add(1)
				return Decision{Allowed: true, Limited: true, Remaining: min(capv-c-n, t.burst.Load())}, false
			}
		}
	}
	return Decision{}, true
}

// Refuse counts n tokens of key refused without the owner: its lease does
// not cover them (lease_exhausted) or the owner could not be asked
// (no_grant).
func (l *Limiter) Refuse(key string, n uint64) {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	t.rejected.Add(n)
	if t.mode.Load() == modeLimited {
		t.decided[reasonLease].Add(1) // its lease did not cover n
		return
	}
	t.decided[reasonNoGrant].Add(1)
}

// Answer is the owner's decision on an Ask.
type Answer struct {
	Admitted bool
	// Remaining: what the owner could still admit in the key's window
	// beyond what leases hold; NextFree: until the oldest token admitted
	// leaves the window. Both as of the owner's answer.
	Remaining uint64
	NextFree  time.Duration
	// Cached: the owner refused less than a report period ago, and was not
	// asked again.
	Cached bool
}

// ErrNoOwner: Ask found no owner to ask (no cluster view yet, or every
// node avoided).
var ErrNoOwner = errors.New("ratelimit: no owner known for the key")

// askTimeout bounds one Ask: an owner slower than this is treated as gone.
const askTimeout = time.Second

// Ask has the key's owner decide n tokens now, for a request the lease did
// not cover (Local said ask). The owner admits it from what no lease holds
// and counts it at once; the tokens count here as offered, not as consumed
// (the owner has them already). After a refusal the owner is not asked again
// for the key for one report period (or until the owner said a token frees
// up, if sooner): the same answer is returned (Cached), so an overloaded key
// costs at most one call per period and node.
func (c *Client) Ask(ctx context.Context, key string, n uint64) (Answer, error) {
	if a, ok := c.Cached(key, n); ok {
		return a, nil
	}
	c.mu.Lock()
	if c.g == 0 {
		c.mu.Unlock()
		return Answer{}, ErrNoOwner
	}
	g := c.groupOf(key)
	addr := c.hints[g]
	if addr == "" {
		addr = c.leaders[g]
	}
	addr = c.usable(g, addr)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	req := &api.RateReport{ClientId: c.ClientID(), NewNames: []string{key}, ConsumedTotal: []uint64{n}}
	if cons, capv, ok := c.Held(key); ok {
		req.BucketConsumed = []uint64{cons, capv}
	}
	// What it admitted for the key over the last window (0: nothing): an
	// owner that has not had this client's report yet (it just took
	// over) must not decide without it.
	req.PrevBucketConsumed = []uint64{c.WindowTokens(key)}
	for try := 0; try < 2 && addr != ""; try++ {
		cc, err := c.conn(addr)
		if err != nil {
			return Answer{}, err
		}
		u, err := api.NewRateAdmitClient(cc).Admit(ctx, req)
		if err != nil {
			return Answer{}, fmt.Errorf("ratelimit: ask %s: %w", addr, err)
		}
		if len(u.Cap) >= 2 && len(u.BlockedForNanos) >= 1 {
			a := Answer{Admitted: u.Cap[0] == 1, Remaining: u.Cap[1], NextFree: time.Duration(u.BlockedForNanos[0])}
			c.Answered(key, n, a, QuietAfter(a, c.cfg.ReportEvery))
			return a, nil
		}
		// Not the owner: it names the leader it knows.
		// (One redirect, for whichever group: the owner routes by a
		// newer layout table than this client's while a raise moves
		// partitions, and names the key's group by it.)
		next := ""
		for _, r := range u.Redirects {
			if int(r.Group) == g || len(u.Redirects) == 1 {
				next = r.LeaderGrpcAddress
			}
		}
		if next == "" || next == addr {
			break
		}
		if c.redirect(addr, u.Redirects) {
			// Report to the owner named now, not at the next tick: it
			// holds this ask until this client's report is in.
			c.route()
		}
		addr = next
	}
	return Answer{}, ErrNoOwner
}

// Cached answers an Ask without asking when the owner refused key less than
// a report period ago (ok true; the refusal is counted).
func (l *Limiter) Cached(key string, n uint64) (Answer, bool) {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	now := l.now().UnixNano()
	if now >= t.noAskUntil.Load() {
		return Answer{}, false
	}
	t.rejected.Add(n)
	t.decided[reasonOwnerRefused].Add(1)
	return Answer{Remaining: t.askRemaining.Load(), NextFree: time.Duration(max(0, t.askNextFree.Load()-now)), Cached: true}, true
}

// Answered counts the owner's answer to an Ask of n tokens of key; after a
// refusal, the owner is not asked again for quiet (Cached).
func (l *Limiter) Answered(key string, n uint64, a Answer, quiet time.Duration) {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	done := l.now().UnixNano()
	t.askRemaining.Store(a.Remaining)
	t.askNextFree.Store(done + int64(a.NextFree))
	if a.Admitted {
		t.borrowed.Add(n)
		t.decided[reasonOwner].Add(1)
		// Into the window slices now, not at the next tick: a new owner
		// counts them until their slice ends, and a tick a period later
		// would keep them a period too long in a one-second window.
		l.reportMu.Lock()
		t.addSlice(done, t.windowLen(), n)
		l.reportMu.Unlock()
		return
	}
	t.rejected.Add(n)
	t.decided[reasonOwnerRefused].Add(1)
	t.noAskUntil.Store(done + int64(quiet))
}

// Held is key's consumed total and lease cap now (ok false: no lease yet),
// which an Ask sends so the owner counts what this client holds exactly.
func (l *Limiter) Held(key string) (consumed, capv uint64, ok bool) {
	t := (*l.tenants.Load())[key]
	if t == nil || t.updatedAt.Load() == 0 {
		return 0, 0, false
	}
	return t.consumed.Load(), t.leaseCap.Load(), true
}

// QuietAfter is how long a client does not ask again after the owner
// refused: a report period, or less when the owner says a token frees up
// sooner (a one-second window frees one every few milliseconds).
func QuietAfter(a Answer, period time.Duration) time.Duration {
	if a.NextFree > 0 {
		return min(period, a.NextFree)
	}
	return period
}

// Stale says whether key's owner has been silent longer than StaleAfter (the
// fail-open/closed state).
func (l *Limiter) Stale(key string) bool {
	t := (*l.tenants.Load())[key]
	return t != nil && t.mode.Load() == modeStale
}

// Peek reports what Decide would about key's lease without deciding or
// counting anything (hits_addend 0: check, don't count). It registers a key
// it has not seen, so its owner starts sending leases.
func (l *Limiter) Peek(key string) Decision {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	d := Decision{Allowed: true, Limited: t.mode.Load() == modeLimited}
	if d.Limited && l.cfg.Strategy == Lease {
		if c, capv := t.consumed.Load(), t.leaseCap.Load(); capv > c {
			d.Remaining = min(capv-c, t.burst.Load())
		}
	}
	return d
}
