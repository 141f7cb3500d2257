package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// The checker is an independent judge of the consistency promise: it talks raw
// api.TrackerClient gRPC (not clientlib), routes each request to the believed
// leader of its group (learnt from WatchCluster and NotLeader hints), and
// records every acknowledged (tenant, hash): a hash of a successful response
// that is not in rejected_hashes. It keeps re-sending acknowledged hashes
// mixed with new ones, and checks:
//
//	(a) no acknowledged hash is ever rejected afterwards;
//	(b) per (tenant, group), distinct acknowledged hashes ≤ the group share;
//	(c) after each fault, every group it writes to accepts writes again
//	    (waitProgress, bounded generously).

type tenantSpec struct {
	name      string
	maxSeries int64 // 0 = unlimited
}

type checkerConfig struct {
	tenants []tenantSpec
	// rolling tenants (limit: the cluster default) are brought in one after
	// the other, every rollEvery, so that some tenant is crossing its limit
	// at almost any moment, faults included.
	rolling    int
	rollLimit  int64
	rollEvery  time.Duration
	groups     []int // groups written to; nil = all
	writers    int
	newPerReq  int           // new hashes per request
	resendMax  int           // acknowledged hashes re-sent per request (at most)
	reqTimeout time.Duration // per attempt
	maxBackoff time.Duration // sleep between failed attempts grows up to this
}

type ackRec struct {
	at   time.Time
	node string
}

// probe resolves at the first successful write to group g that was sent
// after `after` and answered by a node other than `exclude`.
type probe struct {
	g       int
	after   time.Time
	exclude string
	done    chan struct{}
	at      time.Time
	node    string
}

type checker struct {
	t     *testing.T
	c     *cluster
	cfg   checkerConfig
	addrs []string

	leaderMu sync.Mutex
	leader   []string // believed leader gRPC address per group

	mu         sync.Mutex
	acked      []map[uint64]ackRec // per tenant
	byPart     [][][]uint64        // per tenant, per partition: acked hashes (for re-sends)
	groupCount [][]int64           // per tenant, per group: distinct acked hashes
	overShare  [][]bool            // (b) reported once per (tenant, group)
	violations []string
	nViol      int
	rejections int64 // new hashes rejected (expected at the limit)
	unexpected []string
	errCodes   map[codes.Code]int64
	probes     []*probe

	requests     atomic.Int64
	okRequests   atomic.Int64
	hints        atomic.Int64
	sweepChecked int64

	base    int // tenants[:base] are always written; the rest are rolling
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func share(maxSeries int64, g int) int64 {
	lo, hi := api.GroupRange(g, partitions, groups)
	if maxSeries <= 0 {
		return 0
	}
	return (maxSeries*int64(hi-lo) + partitions - 1) / partitions
}

// defaultTenants: two tenants with a small limit (4000 → share 1000 per group,
// reached within seconds, then most of their new series are rejected while
// their acknowledged ones keep being re-sent), one whose limit is reached a
// few seconds into a test, and one that keeps creating series during every
// fault (limit far away).
var defaultTenants = []tenantSpec{{"t-small-a", 4000}, {"t-small-b", 4000}, {"t-mid", 40000}, {"t-big", 4000000}}

func defaultClusterOptions() clusterOptions {
	return clusterOptions{defaultMaxSeries: 4000, tenantMaxSeries: map[string]int64{"t-mid": 40000, "t-big": 4000000}}
}

func defaultCheckerConfig() checkerConfig {
	return checkerConfig{tenants: defaultTenants, writers: 3, newPerReq: 24, resendMax: 64,
		rolling: 40, rollLimit: 4000, rollEvery: 3 * time.Second,
		reqTimeout: 2 * time.Second, maxBackoff: 100 * time.Millisecond}
}

// startChecker starts the writers and the WatchCluster follower.
func startChecker(t *testing.T, c *cluster, cfg checkerConfig) *checker {
	t.Helper()
	if cfg.groups == nil {
		for g := range groups {
			cfg.groups = append(cfg.groups, g)
		}
	}
	ck := &checker{t: t, c: c, cfg: cfg, addrs: c.grpcAddrs(), leader: make([]string, groups),
		errCodes: map[codes.Code]int64{}, base: len(cfg.tenants), started: time.Now()}
	ck.cfg.tenants = slices.Clone(cfg.tenants)
	for i := range cfg.rolling {
		ck.cfg.tenants = append(ck.cfg.tenants, tenantSpec{fmt.Sprintf("t-roll-%02d", i), cfg.rollLimit})
	}
	cfg = ck.cfg
	for range cfg.tenants {
		ck.acked = append(ck.acked, map[uint64]ackRec{})
		ck.byPart = append(ck.byPart, make([][]uint64, partitions))
		ck.groupCount = append(ck.groupCount, make([]int64, groups))
		ck.overShare = append(ck.overShare, make([]bool, groups))
	}
	ck.ctx, ck.cancel = context.WithCancel(context.Background())
	t.Cleanup(ck.stop) // idempotent; stops the goroutines even if the test fails early
	ck.wg.Add(1)
	go ck.watch()
	for i := range cfg.writers {
		ck.wg.Add(1)
		go ck.writer(i)
	}
	return ck
}

func (ck *checker) stop() {
	ck.cancel()
	ck.wg.Wait()
}

func (ck *checker) stopping() bool { return ck.ctx.Err() != nil }

// ---------------------------------------------------------------------------
// Routing.

func (ck *checker) leaderGuess(g int) string {
	ck.leaderMu.Lock()
	defer ck.leaderMu.Unlock()
	if ck.leader[g] == "" {
		ck.leader[g] = ck.addrs[rand.IntN(len(ck.addrs))]
	}
	return ck.leader[g]
}

func (ck *checker) setLeader(g int, addr string) {
	ck.leaderMu.Lock()
	ck.leader[g] = addr
	ck.leaderMu.Unlock()
}

// rotate moves group g's guess away from a node that failed to answer.
func (ck *checker) rotate(g int, failed string) {
	ck.leaderMu.Lock()
	defer ck.leaderMu.Unlock()
	if ck.leader[g] != failed && ck.leader[g] != "" {
		return // already moved by a hint or the watch stream
	}
	for i, a := range ck.addrs {
		if a == failed {
			ck.leader[g] = ck.addrs[(i+1+rand.IntN(len(ck.addrs)-1))%len(ck.addrs)]
			return
		}
	}
	ck.leader[g] = ck.addrs[rand.IntN(len(ck.addrs))]
}

// watch follows WatchCluster on one node at a time, moving to another node
// when the stream breaks.
func (ck *checker) watch() {
	defer ck.wg.Done()
	i := rand.IntN(len(ck.addrs))
	for !ck.stopping() {
		addr := ck.addrs[i%len(ck.addrs)]
		i++
		ctx, cancel := context.WithCancel(ck.ctx)
		stream, err := api.NewTrackerClient(ck.c.conn(addr)).WatchCluster(ctx, &api.WatchClusterRequest{})
		for err == nil {
			var v *api.ClusterView
			v, err = stream.Recv()
			if err != nil {
				break
			}
			for g, gi := range v.GroupInfo {
				if g < groups && gi.LeaderGrpcAddress != "" {
					ck.setLeader(g, gi.LeaderGrpcAddress)
				}
			}
		}
		cancel()
		select {
		case <-ck.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ---------------------------------------------------------------------------
// Writing.

func (ck *checker) writer(id int) {
	defer ck.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(id)))
	for !ck.stopping() {
		ti := ck.pickTenant(rng)
		g := ck.cfg.groups[rng.IntN(len(ck.cfg.groups))]
		lo, hi := api.GroupRange(g, partitions, groups)
		p := lo + rng.IntN(hi-lo)
		batch := ck.makeBatch(rng, ti, p)
		ck.send(rng, ti, g, p, batch)
	}
}

// pickTenant picks one of the base tenants or a rolling tenant.
func (ck *checker) pickTenant(rng *rand.Rand) int {
	if ck.cfg.rolling == 0 {
		return rng.IntN(ck.base)
	}
	ti := rng.IntN(ck.base + 1)
	if ti == ck.base {
		// Mostly the newest rolling tenant (it is filling up); sometimes an
		// earlier one (at its limit: re-sends and rejections).
		cur := min(int(time.Since(ck.started)/ck.cfg.rollEvery), ck.cfg.rolling-1)
		if rng.IntN(3) == 0 {
			cur = rng.IntN(cur + 1)
		}
		ti += cur
	}
	return ti
}

// makeBatch mixes up to resendMax acknowledged hashes of (tenant, partition)
// with newPerReq fresh hashes of the partition, shuffled.
func (ck *checker) makeBatch(rng *rand.Rand, ti, p int) []uint64 {
	first, last := api.PartitionHashRange(p, partitions)
	span := last - first
	batch := make([]uint64, 0, ck.cfg.resendMax+ck.cfg.newPerReq)
	seen := map[uint64]bool{}
	ck.mu.Lock()
	acked := ck.byPart[ti][p]
	if n := len(acked); n > 0 {
		k := min(ck.cfg.resendMax, n)
		for range k {
			h := acked[rng.IntN(n)]
			if !seen[h] {
				seen[h] = true
				batch = append(batch, h)
			}
		}
	}
	for len(batch) < cap(batch) {
		h := first + rng.Uint64N(span+1)
		if _, dup := ck.acked[ti][h]; dup || seen[h] {
			continue
		}
		seen[h] = true
		batch = append(batch, h)
	}
	ck.mu.Unlock()
	rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
	return batch
}

// send delivers one batch, re-sending it (always safe) until a node answers
// successfully or the checker stops. It returns false if it gave up.
func (ck *checker) send(rng *rand.Rand, ti, g, p int, batch []uint64) bool {
	req := &api.TrackSeriesRequest{Tenant: ck.cfg.tenants[ti].name, Partition: uint32(p), Hashes: batch}
	fails := 0
	for !ck.stopping() {
		addr := ck.leaderGuess(g)
		ctx, cancel := context.WithTimeout(ck.ctx, ck.cfg.reqTimeout)
		ck.requests.Add(1)
		sent := time.Now()
		resp, err := api.NewTrackerClient(ck.c.conn(addr)).TrackSeries(ctx, req)
		cancel()
		if err == nil {
			ck.okRequests.Add(1)
			ck.record(ti, g, batch, resp.RejectedHashes, addr, sent)
			return true
		}
		if ck.stopping() {
			return false
		}
		code := status.Code(err)
		ck.mu.Lock()
		ck.errCodes[code]++
		ck.mu.Unlock()
		fails++
		switch code {
		case codes.FailedPrecondition:
			if nl := notLeader(err); nl != nil && nl.LeaderGrpcAddress != "" && nl.LeaderGrpcAddress != addr {
				ck.hints.Add(1)
				ck.setLeader(g, nl.LeaderGrpcAddress)
				if fails%4 != 0 { // follow a fresh hint at once; back off if they go round in circles
					continue
				}
			} else {
				ck.rotate(g, addr)
			}
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
			ck.rotate(g, addr)
		default:
			// InvalidArgument would be a checker bug, Internal/Unknown a server bug.
			ck.mu.Lock()
			if len(ck.unexpected) < 20 {
				ck.unexpected = append(ck.unexpected, fmt.Sprintf("%s tenant %s partition %d from %s: %v",
					time.Now().Format(time.RFC3339Nano), req.Tenant, p, addr, err))
			}
			ck.mu.Unlock()
			ck.rotate(g, addr)
		}
		sleep := min(ck.cfg.maxBackoff, time.Duration(fails)*10*time.Millisecond)
		sleep = sleep/2 + time.Duration(rng.Int64N(int64(sleep/2)+1))
		select {
		case <-ck.ctx.Done():
		case <-time.After(sleep):
		}
	}
	return false
}

func notLeader(err error) *api.NotLeader {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if nl, ok := d.(*api.NotLeader); ok {
			return nl
		}
	}
	return nil
}

func (ck *checker) violation(format string, args ...any) {
	ck.nViol++
	if len(ck.violations) < 50 {
		ck.violations = append(ck.violations, fmt.Sprintf(format, args...))
	}
}

// record applies one successful response: checks (a) and (b), records the acks.
func (ck *checker) record(ti, g int, batch, rejected []uint64, addr string, sent time.Time) {
	now := time.Now()
	tenant := ck.cfg.tenants[ti].name
	rej := make(map[uint64]bool, len(rejected))
	for _, h := range rejected {
		rej[h] = true
	}
	ck.mu.Lock()
	defer ck.mu.Unlock()
	inBatch := make(map[uint64]bool, len(batch))
	for _, h := range batch {
		inBatch[h] = true
	}
	for h := range rej {
		if !inBatch[h] {
			ck.violation("tenant %s: %s answered with rejected hash %#016x that was not in the request", tenant, addr, h)
		}
	}
	limit := share(ck.cfg.tenants[ti].maxSeries, g)
	for _, h := range batch {
		rec, wasAcked := ck.acked[ti][h]
		if rej[h] {
			if wasAcked {
				ck.violation("(a) ACKED SERIES REJECTED: tenant %s hash %#016x (group %d) acknowledged at %s by %s, rejected at %s by %s",
					tenant, h, g, rec.at.Format("15:04:05.000000"), rec.node, now.Format("15:04:05.000000"), addr)
			} else {
				ck.rejections++
			}
			continue
		}
		if wasAcked {
			continue
		}
		ck.acked[ti][h] = ackRec{at: now, node: addr}
		p := api.Partition(h, partitions)
		ck.byPart[ti][p] = append(ck.byPart[ti][p], h)
		ck.groupCount[ti][g]++
		if limit > 0 && ck.groupCount[ti][g] > limit && !ck.overShare[ti][g] {
			ck.overShare[ti][g] = true
			ck.violation("(b) OVER SHARE: tenant %s group %d has %d distinct acknowledged series, share is %d (max_series %d); last ack at %s by %s",
				tenant, g, ck.groupCount[ti][g], limit, ck.cfg.tenants[ti].maxSeries, now.Format("15:04:05.000000"), addr)
		}
	}
	kept := ck.probes[:0]
	for _, pr := range ck.probes {
		if pr.g == g && sent.After(pr.after) && addr != pr.exclude {
			pr.at, pr.node = now, addr
			close(pr.done)
			continue
		}
		kept = append(kept, pr)
	}
	ck.probes = kept
}

// addProbe registers a probe on group g (see probe).
func (ck *checker) addProbe(g int, after time.Time, exclude string) *probe {
	pr := &probe{g: g, after: after, exclude: exclude, done: make(chan struct{})}
	ck.mu.Lock()
	ck.probes = append(ck.probes, pr)
	ck.mu.Unlock()
	return pr
}

func (ck *checker) dropProbe(pr *probe) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for i, p := range ck.probes {
		if p == pr {
			ck.probes = append(ck.probes[:i], ck.probes[i+1:]...)
			return
		}
	}
}

// waitProgress asserts (c): every group the checker writes to acknowledges a
// write started after this call, within progressTimeout. what names the fault.
func (ck *checker) waitProgress(what string) {
	ck.t.Helper()
	start := time.Now()
	var prs []*probe
	for _, g := range ck.cfg.groups {
		prs = append(prs, ck.addProbe(g, start, ""))
	}
	deadline := time.After(progressTimeout)
	for _, pr := range prs {
		select {
		case <-pr.done:
		case <-deadline:
			var stuck []string
			for _, p := range prs {
				if !isClosed(p.done) {
					stuck = append(stuck, fmt.Sprint(p.g))
				}
				ck.dropProbe(p)
			}
			ck.t.Fatalf("(c) NO PROGRESS after %s: groups %s accepted no write within %v; leaders now: %s; errors so far: %s",
				what, strings.Join(stuck, ","), progressTimeout, ck.c.describe(), ck.errSummary())
		}
	}
	ck.t.Logf("progress after %s: every group accepted writes within %v", what, time.Since(start).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// End of test.

// sweep re-sends every acknowledged hash once the writers have stopped and
// the cluster is healthy: each must be accepted (a), which also proves every
// acknowledged series survived all the faults.
func (ck *checker) sweep() {
	ck.t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	sweepCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The writers' context is cancelled by now; the sweep uses its own.
	saved := ck.ctx
	ck.ctx = sweepCtx
	defer func() { ck.ctx = saved }()
	deadline := time.Now().Add(2 * progressTimeout)
	for ti := range ck.cfg.tenants {
		for p := range partitions {
			ck.mu.Lock()
			hashes := append([]uint64(nil), ck.byPart[ti][p]...)
			ck.mu.Unlock()
			g := api.GroupOf(p, partitions, groups)
			for len(hashes) > 0 {
				n := min(len(hashes), 5000)
				chunk := hashes[:n]
				hashes = hashes[n:]
				done := make(chan bool, 1)
				go func() { done <- ck.send(rng, ti, g, p, chunk) }()
				select {
				case ok := <-done:
					if !ok {
						ck.t.Fatalf("final sweep: gave up on tenant %s partition %d", ck.cfg.tenants[ti].name, p)
					}
					ck.sweepChecked += int64(n)
				case <-time.After(time.Until(deadline)):
					cancel()
					<-done
					ck.t.Fatalf("final sweep: no answer for tenant %s partition %d (hang?)", ck.cfg.tenants[ti].name, p)
				}
			}
		}
	}
}

func (ck *checker) errSummary() string {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	var parts []string
	for code, n := range ck.errCodes {
		parts = append(parts, fmt.Sprintf("%s=%d", code, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// finish stops the writers, sweeps every acknowledged hash through the
// (healthy) cluster, logs the counts and asserts 0 violations.
func (ck *checker) finish() {
	ck.t.Helper()
	ck.stop()
	ck.c.waitHealthy()
	ck.sweep()
	ck.report()
	ck.c.checkNoCrashes()
}

func (ck *checker) report() {
	ck.t.Helper()
	ck.mu.Lock()
	defer ck.mu.Unlock()
	var acked int64
	var perTenant []string
	rollUsed, rollFull, rollCells := 0, 0, 0
	for ti, ts := range ck.cfg.tenants {
		acked += int64(len(ck.acked[ti]))
		if ti >= ck.base {
			if len(ck.acked[ti]) > 0 {
				rollUsed++
				for _, g := range ck.cfg.groups {
					rollCells++
					if ck.groupCount[ti][g] == share(ts.maxSeries, g) {
						rollFull++
					}
				}
			}
			continue
		}
		var gs []string
		for _, g := range ck.cfg.groups {
			gs = append(gs, fmt.Sprintf("g%d=%d/%d", g, ck.groupCount[ti][g], share(ts.maxSeries, g)))
		}
		perTenant = append(perTenant, fmt.Sprintf("%s[%s]", ts.name, strings.Join(gs, " ")))
	}
	var codesOut []string
	for code, n := range ck.errCodes {
		codesOut = append(codesOut, fmt.Sprintf("%s=%d", code, n))
	}
	sort.Strings(codesOut)
	errs := "none"
	if len(codesOut) > 0 {
		errs = strings.Join(codesOut, " ")
	}
	ck.t.Logf("checker: requests=%d ok=%d acked_series=%d rejections(new series at limit)=%d errors_by_code={%s} notleader_hints_followed=%d final_sweep_resent=%d violations=%d",
		ck.requests.Load(), ck.okRequests.Load(), acked, ck.rejections, errs, ck.hints.Load(), ck.sweepChecked, ck.nViol)
	ck.t.Logf("checker: acked/share per tenant and group: %s", strings.Join(perTenant, "; "))
	if ck.cfg.rolling > 0 {
		ck.t.Logf("checker: rolling tenants (limit %d, one more every %v): %d written, %d of their %d (tenant, group) cells reached the share exactly",
			ck.cfg.rollLimit, ck.cfg.rollEvery, rollUsed, rollFull, rollCells)
	}
	for _, v := range ck.violations {
		ck.t.Errorf("violation: %s", v)
	}
	if ck.nViol > 0 {
		ck.t.Errorf("%d invariant violations (must be 0)", ck.nViol)
	}
	for _, u := range ck.unexpected {
		ck.t.Errorf("unexpected error (not a fault-time code): %s", u)
	}
}
