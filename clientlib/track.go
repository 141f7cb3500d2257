package clientlib

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// maxImmediateRedirects is how many NotLeader hints in a row are followed at
// once; after that the client backs off before following the next one (a
// cluster in the middle of an election may point back and forth).
const maxImmediateRedirects = 3

// TrackSeries tracks hashes for tenant and returns the rejected ones.
//
// The hashes are split by partition (api.Partition); one TrackSeries RPC per
// non-empty partition is sent, all in parallel, each to the leader of the
// partition's group, with NotLeader redirects and retries (see Config). Within
// a partition the hashes keep their order (the leader decides in request
// order). The rejected hashes are returned grouped by partition, partitions in
// ascending order, each group in request order.
//
// In ModeAuto, a partition whose group has the tenant far from its limit is
// async: its answer is waited for at most Config.AsyncWait (from the start of
// the call); if it has not come, that part returns no rejections and the
// request goes on in the background (Stats.AsyncLate*). Every other partition
// is waited for, within ctx (or Config.Timeout when ctx has no deadline).
//
// A partition that finally fails is either failed open (Config.FailOpen and
// IsFailOpenable: no rejections, no error, Stats.FailedOpen) or reported: the
// error is a *PartitionError when one partition failed and a *TrackError when
// several did; status.Code and status.FromError see the gRPC code through both.
// The rejections of the partitions that answered are returned with the error.
// Re-sending the same call is always safe: tracking is idempotent.
func (c *Client) TrackSeries(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	if err := api.ValidateTenantID(tenant); err != nil {
		return nil, invalidArg{err}
	}
	if len(hashes) == 0 {
		return nil, nil
	}
	start := time.Now()
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	p, _, err := c.layout(ctx)
	if err != nil {
		return nil, c.layoutFailure(err)
	}
	parts := splitByPartition(hashes, p, c.table.Load())
	slots := make([]slot, len(parts))
	anyAsync := false
	for i := range slots {
		s := &slots[i]
		s.part = parts[i]
		s.sync = c.isSync(s.part.group, tenant)
		s.done = make(chan result, 1)
		c.stats.requests.Add(1)
		if s.sync {
			c.stats.syncReq.Add(1)
		} else {
			c.stats.asyncReq.Add(1)
			anyAsync = true
		}
	}
	if len(slots) == 1 && slots[0].sync {
		s := &slots[0]
		rej, err := c.send(ctx, tenant, s.part.partition, s.part.group, s.part.hashes)
		return c.settle(tenant, []*slot{s}, [][]uint64{rej}, []error{err})
	}

	for i := range slots {
		s := &slots[i]
		if s.sync {
			go func() {
				rej, err := c.send(ctx, tenant, s.part.partition, s.part.group, s.part.hashes)
				s.done <- result{rej, err}
			}()
			continue
		}
		// Async: the request outlives the call, bounded by AsyncTimeout from
		// the start of the call; it keeps ctx's values but not its cancellation,
		// and its own copy of the hashes (the caller may reuse its slice).
		if len(parts) == 1 { // splitByPartition returned the caller's slice
			s.part.hashes = slices.Clone(s.part.hashes)
		}
		actx, acancel := context.WithDeadline(context.WithoutCancel(ctx), start.Add(c.cfg.AsyncTimeout))
		started := c.background(func() {
			defer acancel()
			rej, err := c.send(actx, tenant, s.part.partition, s.part.group, s.part.hashes)
			if s.state.CompareAndSwap(pending, delivered) {
				s.done <- result{rej, err}
				return
			}
			c.late(tenant, s.part, rej, err)
		})
		if !started {
			acancel()
			s.state.Store(delivered)
			s.done <- result{nil, &PartitionError{Group: s.part.group, Partition: s.part.partition, Err: closedErr{}}}
		}
	}

	var timerC <-chan time.Time
	if anyAsync {
		t := time.NewTimer(c.cfg.AsyncWait - time.Since(start))
		defer t.Stop()
		timerC = t.C
	}
	ss := make([]*slot, len(slots))
	rejs := make([][]uint64, len(slots))
	errs := make([]error, len(slots))
	for i := range slots {
		s := &slots[i]
		ss[i] = s
		if s.sync {
			r := <-s.done
			rejs[i], errs[i] = r.rejected, r.err
		}
	}
	expired := false
	for i := range slots {
		s := &slots[i]
		if s.sync {
			continue
		}
		if !expired {
			select {
			case r := <-s.done:
				rejs[i], errs[i] = c.asyncResult(tenant, s.part, start, r)
				continue
			case <-timerC:
				expired = true
			case <-ctx.Done():
				expired = true
			}
		}
		if s.state.CompareAndSwap(pending, abandoned) {
			continue // no answer in time: no rejections for this part
		}
		r := <-s.done // delivered just now
		rejs[i], errs[i] = c.asyncResult(tenant, s.part, start, r)
	}
	return c.settle(tenant, ss, rejs, errs)
}

// asyncResult is what an async part's answer adds to the call. Its
// rejections always count (they are the leader's decision, however late
// they were read). A failure counts only when it came within AsyncWait and
// Tollgate did answer it (not IsFailOpenable: a refused token, a bad
// argument), which every part of the call would meet; any other failure —
// one that came after AsyncWait because the caller was still waiting for a
// sync part, or the background deadline (AsyncTimeout) that expired
// meanwhile — is background work: counted in Stats.AsyncLateErrors and
// dropped, never the caller's error nor a fail-open decision.
func (c *Client) asyncResult(tenant string, p part, start time.Time, r result) ([]uint64, error) {
	if r.err == nil {
		return r.rejected, nil
	}
	if time.Since(start) < c.cfg.AsyncWait && !IsFailOpenable(r.err) {
		return nil, r.err
	}
	c.late(tenant, p, nil, r.err)
	return nil, nil
}

// TrackPartition sends hashes, which must all belong to partition, to the
// leader of the partition's group and returns the rejected ones in request
// order. It always waits for the answer (whatever Config.Mode), with the same
// redirects, retries, deadline and FailOpen rules as TrackSeries; a failure is
// a *PartitionError. Load generators and tools use it to control partitions.
func (c *Client) TrackPartition(ctx context.Context, tenant string, partition int, hashes []uint64) ([]uint64, error) {
	if err := api.ValidateTenantID(tenant); err != nil {
		return nil, invalidArg{err}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	p, _, err := c.layout(ctx)
	if err != nil {
		return nil, c.layoutFailure(err)
	}
	if partition < 0 || partition >= p {
		return nil, invalidArg{fmt.Errorf("partition %d out of range [0, %d)", partition, p)}
	}
	if len(hashes) == 0 {
		return nil, nil
	}
	s := &slot{part: part{partition: partition, group: c.table.Load().GroupOf(partition), hashes: hashes}, sync: true}
	c.stats.requests.Add(1)
	c.stats.syncReq.Add(1)
	rej, err := c.send(ctx, tenant, partition, s.part.group, hashes)
	return c.settle(tenant, []*slot{s}, [][]uint64{rej}, []error{err})
}

type part struct {
	partition, group int
	hashes           []uint64
}

const (
	pending int32 = iota
	delivered
	abandoned
)

type slot struct {
	part  part
	sync  bool
	state atomic.Int32 // async: pending → delivered (answer handed to the caller) or abandoned
	done  chan result
}

type result struct {
	rejected []uint64
	err      error
}

// settle applies FailOpen, gathers rejections and builds the error.
func (c *Client) settle(tenant string, slots []*slot, rejs [][]uint64, errs []error) ([]uint64, error) {
	var rejected []uint64
	var failed []*PartitionError
	for i, s := range slots {
		if err := errs[i]; err != nil {
			if c.cfg.FailOpen && IsFailOpenable(err) {
				c.stats.failedOpen.Add(1)
				c.log.Debug("clientlib: failing open", "tenant", tenant, "group", s.part.group, "partition", s.part.partition, "err", err)
				continue
			}
			c.stats.errors.Add(1)
			pe, ok := err.(*PartitionError)
			if !ok {
				pe = &PartitionError{Group: s.part.group, Partition: s.part.partition, Err: err}
			}
			failed = append(failed, pe)
			continue
		}
		if len(rejs[i]) > 0 {
			c.markNear(s.part.group, tenant)
			rejected = append(rejected, rejs[i]...)
		}
	}
	switch len(failed) {
	case 0:
		return rejected, nil
	case 1:
		return rejected, failed[0]
	}
	return rejected, &TrackError{Failed: failed}
}

// late accounts for an async answer that came after the caller stopped waiting.
func (c *Client) late(tenant string, p part, rej []uint64, err error) {
	if err != nil {
		c.stats.asyncLateErrors.Add(1)
		c.log.Debug("clientlib: background request failed", "tenant", tenant, "group", p.group, "partition", p.partition, "err", err)
		return
	}
	c.stats.asyncLate.Add(1)
	if len(rej) > 0 {
		c.stats.asyncLateRejected.Add(uint64(len(rej)))
		c.markNear(p.group, tenant)
	}
}

// layoutFailure turns a failure to learn the layout into the call's result.
func (c *Client) layoutFailure(err error) error {
	if c.cfg.FailOpen && IsFailOpenable(err) {
		c.stats.failedOpen.Add(1)
		return nil
	}
	c.stats.errors.Add(1)
	return err
}

// background runs f on a goroutine Close waits for; false if the client is closed.
func (c *Client) background(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.Timeout)
}

// send delivers one partition's request to its group leader, following
// NotLeader hints and retrying retryable failures with jittered exponential
// backoff, never waiting past ctx's deadline. The error is a *PartitionError
// carrying the last gRPC error (or ctx's error as a status if no RPC ended).
func (c *Client) send(ctx context.Context, tenant string, partition, group int, hashes []uint64) ([]uint64, error) {
	req := &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(partition), Hashes: hashes}
	req.Group = new(uint32)
	*req.Group = uint32(group)
	backoff := c.cfg.RetryInitial
	attempts, redirects := 0, 0
	var movedEpoch uint64 // the newest layout epoch a Moved answer named
	var lastErr error
	var addr, lastAddr string
	// down: nodes that failed this request as unreachable or leaderless
	// (Unavailable, Aborted, no answer). A leader named by a hint or the
	// table counts as progress only if it is not one of them: right after a
	// leader dies, followers still name it, and treating that as news would
	// retry it in a tight loop.
	var down map[string]bool
	news := func(l string) bool { return l != "" && !down[l] }
	fail := func(err error) error {
		if err == nil {
			err = ctxStatusErr(ctx)
		}
		return &PartitionError{Group: group, Partition: partition, Attempts: attempts, Err: err}
	}
	for {
		if c.ctx.Err() != nil {
			return nil, fail(closedErr{})
		}
		if ctx.Err() != nil {
			return nil, fail(lastErr)
		}
		if addr == "" {
			if addr = c.leaderOf(group); addr == "" {
				addr = c.anyNode(lastAddr)
			}
		}
		tc, err := c.tracker(addr)
		if err != nil {
			return nil, fail(err)
		}
		if attempts > 0 {
			c.stats.retries.Add(1)
		}
		attempts++
		// Taken before the attempt, so that a leader learned while it runs
		// still cuts the backoff after it short.
		wake := c.leaderChanged(group)
		actx, acancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		resp, err := tc.TrackSeries(actx, req)
		attemptTimedOut := actx.Err() != nil && ctx.Err() == nil
		acancel()
		if err == nil {
			if c.leaderOf(group) != addr {
				c.setLeader(group, addr)
			}
			return resp.RejectedHashes, nil
		}
		if c.ctx.Err() != nil {
			return nil, fail(closedErr{})
		}
		lastErr, lastAddr = err, addr
		code := status.Code(err)
		switch {
		case movedDetail(err) != nil:
			// The partition moved to another group: route by the newer of
			// the client's table and the answer's, and go again at once
			// (nothing was decided). Not a failure of the node.
			c.stats.moved.Add(1)
			mv := movedDetail(err)
			to, hint := c.movedTo(partition, mv, movedEpoch)
			movedEpoch = max(movedEpoch, mv.LayoutEpoch)
			if to < 0 || (to == group && hint == "") {
				addr = "" // the answering node's table is older: ask the owner's leader again after a backoff
				break
			}
			c.log.Debug("clientlib: partition moved", "partition", partition, "from", group, "to", to)
			group, addr = to, hint
			*req.Group = uint32(to)
			if addr == "" {
				addr = c.leaderOf(group)
			}
			backoff = c.cfg.RetryInitial
			if redirects++; redirects <= maxImmediateRedirects {
				continue
			}
		case code == codes.FailedPrecondition:
			c.stats.notLeader.Add(1)
			hint := LeaderHint(err)
			if hint != "" && hint != addr && news(hint) {
				c.log.Debug("clientlib: following NotLeader hint", "group", group, "from", addr, "to", hint)
				c.setLeader(group, hint)
				addr = hint
				redirects++
				// A leader learned from the answer is progress: the
				// backoff starts again from RetryInitial, so a group whose
				// leadership moves often is not waited on for ever longer.
				backoff = c.cfg.RetryInitial
				if redirects <= maxImmediateRedirects {
					continue
				}
			} else {
				c.forgetLeader(group, addr)
				addr = ""
			}
		case code == codes.Unavailable || code == codes.Aborted:
			c.forgetLeader(group, addr)
			if down == nil {
				down = map[string]bool{}
			}
			down[addr] = true
			addr = ""
			// The table may name a newer leader already (the cluster
			// watch, or another partition of this group that was
			// redirected): that is progress too.
			if l := c.leaderOf(group); news(l) {
				addr = l
				backoff = c.cfg.RetryInitial
			}
		case attemptTimedOut:
			// No answer within AttemptTimeout: the node may be cut off (a
			// partitioned leader drops packets). Try another node; it knows
			// the current leader or redirects to it.
			c.stats.attemptTimeouts.Add(1)
			c.forgetLeader(group, addr)
			if down == nil {
				down = map[string]bool{}
			}
			down[addr] = true
			addr = ""
		case code == codes.DeadlineExceeded && ctx.Err() == nil:
			// A deadline shorter than the caller's (a proxy, the server): the
			// series may or may not be recorded; re-sending is safe.
		default:
			return nil, fail(err)
		}
		wait := jitter(backoff)
		if c.onBackoff != nil {
			c.onBackoff(wait)
		}
		woken, ok := c.sleepOrWake(ctx, wait, wake)
		if !ok {
			return nil, fail(lastErr)
		}
		redirects = 0
		if l := c.leaderOf(group); woken && l != "" {
			// The table changed to a new leader (the cluster watch, a
			// success or a redirect of another partition of the group): go
			// there now. What failed before may lead now (a follower that
			// had no leader won the election): forget it.
			c.stats.leaderWakes.Add(1)
			addr, backoff, down = l, c.cfg.RetryInitial, nil
			continue
		}
		backoff = min(2*backoff, c.cfg.RetryMax)
	}
}

// sleepOrWake is sleep, cut short when wake is closed (woken: true, ok:
// true).
func (c *Client) sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) (woken, ok bool) {
	if dl, has := ctx.Deadline(); has && time.Until(dl) <= d {
		return false, false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false, true
	case <-wake:
		return true, true
	case <-ctx.Done():
		return false, false
	case <-c.ctx.Done():
		return false, false
	}
}

// sleep waits d unless that would pass ctx's deadline, ctx ends or the client
// closes; it reports whether the full wait happened.
func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-c.ctx.Done():
		return false
	}
}

// splitByPartition groups hashes by partition, partitions ascending, each
// keeping request order. When all hashes share one partition the single part
// is hashes itself; otherwise the parts share one new backing array.
func splitByPartition(hashes []uint64, p int, t *api.Table) []part {
	ps := make([]int32, len(hashes))
	first := api.Partition(hashes[0], p)
	same := true
	for i, h := range hashes {
		q := api.Partition(h, p)
		ps[i] = int32(q)
		same = same && q == first
	}
	if same {
		return []part{{partition: first, group: t.GroupOf(first), hashes: hashes}}
	}
	idx := make([]int32, len(hashes))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int { return int(ps[a]) - int(ps[b]) })
	buf := make([]uint64, len(hashes))
	var out []part
	for i, j := range idx {
		buf[i] = hashes[j]
		q := int(ps[j])
		if len(out) == 0 || out[len(out)-1].partition != q {
			out = append(out, part{partition: q, group: t.GroupOf(q)})
			out[len(out)-1].hashes = buf[i:i]
		}
		last := &out[len(out)-1]
		last.hashes = last.hashes[:len(last.hashes)+1]
	}
	for i := range out {
		out[i].hashes = slices.Clip(out[i].hashes)
	}
	return out
}
