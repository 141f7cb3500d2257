package ratelimit

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Tick folds the reports absorbed since the last tick into the tenants' state,
// decides blocklists and leases, and leaves one update per session (Take).
// owns says whether this node leads a group; leaderOf names a group's leader
// for redirects, and may be called from several goroutines at once (as the
// Limits are). Calls are serialised; one goroutine is meant to make them.
//
// The shards are ticked in parallel (fold the reports, decide), then the
// sessions' updates are built in parallel, once the owner holds parallelTick
// tenants plus entries (below, one after the other on the caller's
// goroutine). A tenant's result depends neither on the shard count nor on
// that: each shard folds its tenants' entries in the order of the sessions,
// and an update reads only tenants' decided state.
func (o *Owner) Tick(now time.Time, owns func(group int) bool, leaderOf func(group int) (id, addr string)) {
	o.tickMu.Lock()
	defer o.tickMu.Unlock()
	ns := now.UnixNano()
	dt := float64(o.cfg.Period) / 1e9
	// o.mu for lastTick (Session.Close reads it to stamp carried state) and
	// the sessions, held only for the copy: the shards lock what they work.
	o.mu.Lock()
	if o.lastTick != 0 && ns > o.lastTick {
		dt = float64(ns-o.lastTick) / 1e9
	}
	o.lastTick = ns
	o.snap = append(o.snap[:0], o.sessions...)
	o.mu.Unlock()
	alpha := 1 - math.Exp2(-dt*1e9/float64(o.cfg.DemandHalfLife))
	if g := o.groups(); len(o.ownsG) != g {
		o.ownsG = make([]bool, g) // a raise's table (SetLayout)
	}
	for g := range o.ownsG {
		o.ownsG[g] = owns(g)
	}
	workers := len(o.shards)
	if o.size.Load() < o.parallelMin {
		workers = 1
	}
	parallel(len(o.shards), workers, func(k int) { o.tickShard(k, ns, dt, alpha) })

	// Active clients per strategy: a deployment runs one strategy, and a
	// benchmark running several side by side must not mix their counts.
	active := map[api.RateStrategy]map[uint64]struct{}{}
	for _, s := range o.snap {
		s.mu.Lock()
		if s.started && !s.closed && ns-s.heardAt <= int64(o.cfg.ActiveAfter) {
			if active[s.strategy] == nil {
				active[s.strategy] = map[uint64]struct{}{}
			}
			active[s.strategy][s.clientID] = struct{}{}
		}
		s.mu.Unlock()
	}
	// Closed streams' state waits ForgetAfter for its client to come back.
	o.mu.Lock()
	for id, rec := range o.clients {
		for t, c := range rec.carry {
			if ns-c.at > int64(o.cfg.ForgetAfter) {
				delete(rec.carry, t)
				o.release(t)
			}
		}
		if len(rec.live) == 0 && len(rec.carry) == 0 {
			delete(o.clients, id)
		}
	}
	o.mu.Unlock()

	// 4. sessions: updates, on as many goroutines as shards. Every shard is
	// decided; an update only reads tenants' state (and writes its own
	// session's entries).
	parallel(len(o.snap), workers, func(i int) {
		s := o.snap[i]
		s.mu.Lock()
		if !s.started || s.closed {
			s.mu.Unlock()
			return
		}
		o.buildUpdate(s, uint32(len(active[s.strategy])), ns, dt, leaderOf)
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	})
	clear(o.snap) // no closed session kept alive until the next tick
}

// tickShard runs shard k's part of a tick: its tenants' ownership, limits
// and buckets, the folds of their entries, and the decisions.
func (o *Owner) tickShard(k int, ns int64, dt, alpha float64) {
	sh := &o.shards[k]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// 1. tenants: ownership, limits, window rotation, bucket refill.
	// Backwards, so the one that takes a forgotten tenant's place has been
	// seen.
	for i := len(sh.list) - 1; i >= 0; i-- {
		t := sh.list[i]
		name := t.name
		// A sliding-window tenant is kept while its log holds admissions:
		// forgotten, its next request would start an empty window.
		if t.refs.Load() <= 0 && ns-t.lastUse > int64(o.cfg.ForgetAfter) && (len(t.sw.log) == 0 || ns-t.sw.log[len(t.sw.log)-1].at >= t.sw.win) {
			if t.hand.pending {
				o.handPending.Add(-1)
			}
			sh.forget(t)
			o.size.Add(-1)
			continue
		}
		owned := o.ownsG[t.group]
		if owned && !t.owned {
			o.reset(t, ns)
			o.startHandoff(t, ns, func(g int) bool { return g < len(o.ownsG) && o.ownsG[g] })
		}
		if o.expireHandoff(t, ns) {
			o.handoffsMissed.Add(1)
		}
		t.owned = owned
		if !owned {
			continue
		}
		rate, burst := o.limits(name)
		if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
			rate = 0
		}
		t.rate = rate
		t.burst = float64(burst)
		if t.burst <= 0 {
			t.burst = rate // one second's worth
		}
		w := int64(time.Second)
		if rate > 0 {
			w = int64(t.burst / rate * 1e9)
			w = min(max(w, int64(o.cfg.Period)), int64(time.Minute))
		}
		if limit, win, ok := slidingLimits(rate, burst); ok && o.cfg.Sliding != nil && o.cfg.Sliding(name) {
			if t.sw.win != win {
				t.sw.log, t.sw.sum = t.sw.log[:0], 0
			}
			t.sw.on, t.sw.limit, t.sw.win = true, limit, win
			t.sw.trim(ns)
			t.sw.reserve, t.sw.want = 0, 0
			w = win // the clients' buckets span the unit: a takeover seeds from them
		} else {
			t.sw.on = false
		}
		if w != t.window {
			t.window, t.cur, t.prev = w, 0, 0
			t.curStart = ns - ns%w
		}
		t.rotate(ns)
		if math.IsInf(t.level, 1) {
			t.level = t.burst // a new owner's bucket starts full; reports charge it
		}
		if t.levelAt != 0 && ns > t.levelAt {
			// A saturated tenant's bucket holds its burst plus two periods'
			// refill (the period granted ahead, and one for reports that
			// arrive a tick late): the grants that clients could not spend
			// (a lease rarely ends on a whole request; a client drew fewer
			// requests than its share) are carried into the next grants
			// instead of being cut off at the burst, which with a burst of
			// one period's refill lost a fifth of the limit. An idle
			// tenant's bucket still stops at the burst.
			top := t.burst
			if t.scarce {
				top += 2 * t.rate * dt
			}
			t.level = min(top, t.level+t.rate*float64(ns-t.levelAt)/1e9)
		}
		t.levelAt = ns
		t.sumDemand, t.nClients, t.sumLastRate, t.exposure = 0, 0, 0, 0
	}
	// 2. entries: deltas into windows and buckets, demand. Every shard
	// visits the sessions in the same order, so a tenant's sums add up in
	// the same order whatever the shard count.
	for _, s := range o.snap {
		s.mu.Lock()
		if s.entries != nil {
			es := s.entries[k]
			for i := range es {
				if e := &es[i]; !e.superseded {
					o.fold(e, s.clientID, ns, dt, alpha)
				}
			}
		}
		s.mu.Unlock()
	}
	// 3. tenants: blocklist and lease budget.
	for _, t := range sh.list {
		if !t.owned || t.rate <= 0 {
			continue
		}
		if t.sw.on {
			t.blockedTil = 0
			if t.sw.sum >= t.sw.limit {
				t.blockedTil = ns + int64(t.sw.nextFree(ns))
			}
			t.slidingDecide()
			continue
		}
		t.blockedTil = 0
		if bf := blockedFor(t.rate, float64(t.window)/1e9, float64(ns-t.curStart)/1e9, t.prev, t.cur); bf > 0 {
			t.blockedTil = ns + int64(bf*1e9)
		}
		// Debt: a negative level (admissions past the grants: fail open,
		// lease extensions while the owner was away, a takeover's charge)
		// is paid back from the refill before anything is granted, down to
		// one second's worth or the burst (debtFloor), so an outage's
		// over-admission is repaid within about a second, not forgiven.
		t.level = max(t.level, -t.debtFloor())
		t.avail = max(0, t.level+t.rate*dt)
		if t.takeover && t.guardShares >= 1-1e-9 && ns < t.guardUntil {
			// Every share of the limit has reported: no client this owner
			// has not heard from holds a lease to keep admitting on, so
			// the guard has nothing left to guard against.
			//
			// The guard kept one period's refill in the bucket for the
			// clients not heard from (level ≤ rate·dt below); they have
			// all reported now, and what they admitted meanwhile, by
			// extending their leases, is in the recent log (seeded from
			// their reports), not charged to the bucket. So the carry is
			// held to what the refill since the takeover left unspent:
			// kept whole, it was granted on top of what they had spent,
			// two periods' worth at once (1.16× the limit in the second
			// across an owner's kill, TestLeaseTakeoverOverGrant).
			// Dropping it outright instead starved the takeovers whose
			// clients had spent less (0.84–0.88×, TestLeaseChange).
			start := t.guardUntil - int64(o.cfg.TakeoverGuard) // reset's ns
			t.guardUntil = ns
			t.level = min(t.level, max(0, t.rate*float64(ns-start)/1e9-t.recentSince(start)))
		}
		t.guarding, t.tickAt = ns < t.guardUntil && t.takeover, ns
		// For a second after the guard the window cap below still holds:
		// the bucket's carry and the caps' unreported remainders would
		// otherwise come out together (1.13–1.19× the limit in a second
		// after an early end, TestSmallKeyTakeover).
		settling := t.takeover && !t.guarding && ns < t.guardUntil+int64(time.Second)
		if t.guarding || settling {
			// What the guard does not grant, the clients not seen yet may
			// be admitting: nothing accumulates in the bucket meanwhile, or
			// it would be granted as a burst when the guard ends.
			t.level = min(t.level, t.rate*dt)
			t.avail = max(0, t.level+t.rate*dt)
			// And the reporters' last second (seeded from their window
			// slices, then folded in) plus the grants stay within 1.10×
			// the larger of the burst and one second's worth, what is
			// withheld forfeited: the carry above is for clients not seen
			// yet, not for a second the reporters filled already (1.10×
			// the limit in the takeover's second without this, 1000/s at
			// 150% in TestSlidingWindowTakeover). Not spanCap's rule
			// (1.05×, unreported lease remainders counted as spent): at
			// the limit that bites every tick, and the seconds after a
			// takeover admitted 0.86× (TestLeaseChange); this one bites
			// only when the reporters' last second is full, and takes
			// only the carry, never the period's own refill (on real
			// processes withholding the refill too deepened the dip of
			// a 200/s key after an owner's SIGKILL).
			w := t.recentSince(ns + int64(dt*1e9) - int64(time.Second))
			if capped := max(t.rate*dt, 1.10*max(t.burst, t.rate)-w); capped < t.avail {
				t.avail = capped
				t.level = min(t.level, max(0, capped-t.rate*dt))
			}
		}
		// After idle the bucket is full: a token bucket alone admits the
		// burst and then the refill, up to 2× the limit in one second with
		// the default burst. So a tenant whose bucket filled up (it used
		// less than its limit) is armed, and when its clients are then
		// offered at least twice the limit (their leases will be spent at
		// once), for the next second the grants keep any second within
		// spanCap: what the last second minus one period admitted, plus
		// every cap's unreported remainder (taken as spent), plus this
		// tick's grants. What that withholds is forfeited, as in a sliding
		// window: left in the bucket it would be granted once the second
		// is over. A saturated tenant's bucket never fills, so the steady
		// state never meets this cap (it would trim the steady state's
		// random swings: the folds of a second are known only to a tick).
		if t.level >= 0.9*t.burst && t.burst > 2*t.rate*dt {
			// (A burst of two periods' refill or less adds at most that
			// to a second: nothing to cap.)
			t.idleArmed = true
		}
		if t.idleArmed && max(t.sumDemand, t.sumLastRate) >= 2*t.rate {
			if t.capSince == 0 {
				t.capSince = ns
			}
			if ns-t.capSince <= int64(time.Second) {
				w := t.recentSince(ns + int64(dt*1e9) - int64(time.Second))
				if capped := max(0, t.spanCap()-w-t.exposure); capped < t.avail {
					t.avail = capped
					t.level = min(t.level, max(0, capped-t.rate*dt))
				}
			} else {
				t.idleArmed, t.capSince = false, 0
			}
		}
		// A tenant offered at least twice its limit spends every grant at
		// once, and the carry of unspent grants (the bucket's top above)
		// then lets a second admit more than a token bucket would: with
		// requests large against a lease (a remote-write gateway's 200
		// samples against three clients' shares of a period's refill)
		// the remainders pile up on every client and come out together,
		// 1.15× the limit in a second with a burst of a tenth of it. So
		// the grants also keep any second within rate + burst, the token
		// bucket's own bound, counted as the one-second cap after idle
		// counts. Nothing is forfeited: what this withholds stays in the
		// bucket (up to its top) for the next ticks. Below 2× offered the
		// cap is left off, since the folds lag the admissions by up to a
		// period and at 1× it would trim the steady state (0.93× the
		// limit in TestLeaseGoals).
		if max(t.sumDemand, t.sumLastRate) >= 2*t.rate {
			w := t.recentSince(ns + int64(dt*1e9) - int64(time.Second))
			if capped := max(0, t.rate+t.burst-w-t.exposure); capped < t.avail {
				t.avail = capped
			}
		}
		need := t.sumDemand * dt * (1 + o.cfg.Headroom)
		t.scarce = need >= t.avail
		t.spare = 0
		if !t.scarce {
			t.spare = t.avail - need
		}
	}
}

// parallel runs f(0) … f(n-1) on up to workers goroutines, and no more than
// GOMAXPROCS (the caller's one of them), and returns when all have returned.
func parallel(n, workers int, f func(i int)) {
	w := min(n, workers, runtime.GOMAXPROCS(0))
	if w <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			f(i)
		}
	}
	var wg sync.WaitGroup
	for range w - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// fold takes one entry's last report into its tenant's window, bucket and
// demand (the tenant's shard's lock and the session's lock held).
func (o *Owner) fold(e *entry, client uint64, ns int64, dt, alpha float64) {
	t := e.t
	if !t.owned {
		e.moved = e.moved || e.reported
		e.reported = false
		return
	}
	t.lastUse = ns
	if e.reported {
		if t.hand.pending && (!e.seen || e.epoch != t.epoch) {
			return // its first report here waits for the hand-off (handoff.go)
		}
		e.reported = false
		if !e.seen || e.epoch != t.epoch {
			// First word from this client about this tenant since this
			// node owns it: its own bucket counts rebuild its share of the
			// window (failover, new client).
			e.seen, e.epoch = true, t.epoch
			if e.hasAge {
				e.seedByAge(t, ns)
			} else {
				switch e.bucketStart {
				case t.curStart:
					t.cur += float64(e.bucketCur)
					t.prev += float64(e.bucketP)
				case t.curStart - t.window:
					t.prev += float64(e.bucketCur)
				}
			}
			// The rate this client admitted at before, which it may keep
			// during a takeover guard: both buckets' counts over the time
			// from the previous bucket's start to its report. Only a
			// client that admitted in the previous bucket too has counts
			// that span a whole window; one that started within the
			// current bucket (a tenant new to the cluster: its clients
			// admitted without any lease) is not held to it.
			//
			// A client that says which part of the limit it held as its
			// lease rate (lease_share) is held to exactly that: it is
			// what an unseen client keeps admitting at, so the reporters'
			// and the unseen clients' rates add up to the limit, where
			// the counts (which span the owner's absence) can fall short
			// of it (0.8–0.9× the limit for the guard's three seconds
			// after an owner's SIGKILL, TestSmallKeyTakeover).
			e.guardRate = -1
			span := e.reportedAt - (e.bucketStart - t.window)
			if e.hasAge {
				span = e.bucketAge + t.window // by the client's own clock: no wall-clock comparison
			}
			switch {
			case e.leaseShare > 0:
				// (A share of 0 extends nothing: a sliding window's
				// client, should the tenant have changed kind, or one
				// with no demand; it is held to what it admitted.)
				e.guardRate = e.leaseShare * t.rate
			case e.bucketP > 0 && span > 0:
				e.guardRate = float64(e.bucketCur+e.bucketP) / (float64(span) / 1e9) * (1 + o.cfg.Headroom)
			}
			// Charge the bucket with what this client admitted in the
			// sliding window: at the limit, that empties it (a new client;
			// a tenant new to the cluster, whose bucket starts full). In a
			// takeover the guard holds the bucket empty instead: the
			// clients not seen yet are taken to have used their whole
			// share, and the reporters' counts are in that already.
			asked := t.askedBy[client]
			handed, isHanded := t.hand.clients[client]
			switch {
			case t.sw.on && isHanded:
				// Its admissions up to what its previous owner folded
				// are in the handed log; the rest is folded below.
			case t.sw.on:
				// Its admissions before this owner heard of it (a
				// takeover; what a client admitted failing open).
				t.sw.seed(e, ns, asked)
			case ns < t.guardUntil && e.guardRate >= 0:
				t.takeover = true
				t.seedRecent(e, ns, asked)
				t.guardShares += max(0, e.leaseShare)
			default:
				t.level -= max(0, e.windowCount(t.curStart, t.window, ns)-asked)
			}
			e.guardFrom, e.guardBase = ns, e.consumed
			e.lastConsumed, e.lastOffered = e.consumed, e.offered
			e.cap = e.consumed
			e.capHist = [1]uint64{e.consumed}
			if t.sw.on && isHanded {
				// Counted from what the previous owner had folded, and
				// holding the cap it granted (counted as held).
				e.lastConsumed = min(handed.Consumed, e.consumed)
				e.cap = max(e.consumed, handed.Cap)
				e.capHist = [1]uint64{e.cap}
			}
		}
		d := float64(e.consumed - min(e.consumed, e.lastConsumed))
		off := float64(e.offered - min(e.offered, e.lastOffered))
		e.lastConsumed, e.lastOffered = max(e.consumed, e.lastConsumed), max(e.offered, e.lastOffered)
		t.cur += d
		t.level -= d
		t.addRecent(ns, d)
		if t.sw.on {
			t.sw.add(ns, d)
		}
		e.lastRate = off / dt
		e.demand += alpha * (e.lastRate - e.demand)
	} else {
		e.demand -= alpha * e.demand
	}
	t.sumDemand += e.demand
	t.nClients++
	t.sumLastRate += e.lastRate
	if e.cap > e.lastConsumed {
		t.exposure += float64(e.cap - e.lastConsumed)
	}
	if t.sw.on {
		o.slidingFold(t, e, dt)
	}
}

// buildUpdate leaves s's update for this tick in s.pending, reusing the
// message the sender gave back (or the one it has not taken yet). Limit,
// burst and window go out only when one of them changed for some tenant of
// the stream since the last update, so a steady update carries ids, caps and
// lease rates (or blocked-for) only. s.mu held.
func (o *Owner) buildUpdate(s *Session, activeClients uint32, ns int64, dt float64, leaderOf func(int) (string, string)) {
	u := s.pending
	if u != nil {
		s.resendLimits = s.resendLimits || len(u.Limit) > 0 // replaced before the sender took it
	} else if u = s.spare; u != nil {
		s.spare = nil
	} else {
		u = &api.RateUpdate{}
	}
	u.ActiveClients = activeClients
	u.Ids, u.Limit, u.Burst, u.WindowNanos = u.Ids[:0], u.Limit[:0], u.Burst[:0], u.WindowNanos[:0]
	u.BlockedForNanos, u.Cap, u.LeaseRate, u.MovedIds, u.Redirects = u.BlockedForNanos[:0], u.Cap[:0], u.LeaseRate[:0], u.MovedIds[:0], nil
	if cap(u.Ids) < len(s.loc) {
		n := len(s.loc)
		u.Ids = make([]uint32, 0, n)
		switch s.strategy {
		case api.RateStrategy_RATE_STRATEGY_BLOCKLIST:
			u.BlockedForNanos = make([]int64, 0, n)
		case api.RateStrategy_RATE_STRATEGY_LEASE:
			u.Cap, u.LeaseRate = make([]uint64, 0, n), make([]float64, 0, n)
		}
	}
	limitsChanged := s.resendLimits
	var movedGroups []bool
	for id, l := range s.loc {
		if l.i == 0 {
			continue
		}
		e := &s.entries[l.shard][l.i-1]
		t := e.t
		if e.superseded {
			continue
		}
		if !t.owned {
			if !e.moved {
				continue
			}
			e.moved = false
			u.MovedIds = append(u.MovedIds, uint32(id))
			if movedGroups == nil {
				movedGroups = make([]bool, len(o.ownsG))
			}
			movedGroups[t.group] = true
			continue
		}
		if !e.seen || e.epoch != t.epoch {
			continue // nothing reported since this node took over
		}
		u.Ids = append(u.Ids, uint32(id))
		if !e.sentLimit || e.sentRate != t.rate || e.sentBurst != uint64(t.burst) || e.sentWindow != t.window {
			e.sentLimit, e.sentRate, e.sentBurst, e.sentWindow = true, t.rate, uint64(t.burst), t.window
			limitsChanged = true
		}
		switch s.strategy {
		case api.RateStrategy_RATE_STRATEGY_BLOCKLIST:
			var bf int64
			if t.blockedTil > ns {
				bf = t.blockedTil - ns
			}
			u.BlockedForNanos = append(u.BlockedForNanos, bf)
		case api.RateStrategy_RATE_STRATEGY_LEASE:
			switch {
			case t.sw.on:
				o.slidingGrant(t, e)
			case t.rate > 0:
				o.grant(t, e, dt)
			}
			u.Cap = append(u.Cap, e.cap)
			u.LeaseRate = append(u.LeaseRate, e.leaseRate)
		}
	}
	s.resendLimits = false
	if limitsChanged {
		for _, id := range u.Ids {
			e := s.entry(id)
			u.Limit = append(u.Limit, e.sentRate)
			u.Burst = append(u.Burst, e.sentBurst)
			u.WindowNanos = append(u.WindowNanos, e.sentWindow)
		}
	}
	for g, m := range movedGroups {
		if m {
			id, addr := leaderOf(g)
			u.Redirects = append(u.Redirects, &api.RateRedirect{Group: uint32(g), LeaderId: id, LeaderGrpcAddress: addr})
		}
	}
	s.pending = u
}
