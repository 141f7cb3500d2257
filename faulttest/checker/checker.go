// Package checker is the fault tests' independent judge of the consistency
// promise. It talks raw api.TrackerClient gRPC (not clientlib),
// routes each request to the believed leader of its group (learnt from
// WatchCluster and NotLeader hints), and records every acknowledged (tenant,
// hash): a hash of a successful response that is not in rejected_hashes. It
// keeps re-sending acknowledged hashes mixed with new ones, and checks:
//
//	(a) no acknowledged hash is ever rejected afterwards;
//	(b) per tenant, distinct acknowledged hashes ≤ the highest max_series
//	    the tenant had since the start (see SetLimit), for the server's
//	    default movable shares; with Config.StaticShares (--share-mode
//	    static), per (tenant, group), distinct acknowledged hashes ≤ the
//	    group's fixed share;
//	(c) after each fault, every group it writes to accepts writes again
//	    (WaitProgress, bounded generously);
//	(d) a node the harness cut off from its peers acknowledges no new series
//	    (ForbidAcks): that needs a commit, hence a quorum. Answers that
//	    create nothing (fresh re-sends, rejections at the limit) need no log
//	    entry; a leader gives them from committed state until its lease
//	    runs out, and the checker counts them (Report) without failing.
//
// It is shared by the fault tests on loopback processes (faulttest) and on
// docker-compose containers (faulttest/netpart); it knows nothing of either
// harness beyond the Cluster interface. Only tests import it.
package checker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/history"
	"github.com/tollgate-io/tollgate/limits"
)

const (
	partitions = api.DefaultPartitions
	groups     = api.DefaultGroups
)

// DefaultProgressTimeout bounds WaitProgress and the final sweep. Generous: it
// only catches hangs, it is not a timing assertion.
const DefaultProgressTimeout = 60 * time.Second

// Cluster is what the checker needs from a test's cluster.
type Cluster interface {
	// Conn returns a client connection to a node's advertised gRPC address
	// (the addresses given to Start and those in NotLeader hints and
	// WatchCluster views). A harness whose nodes are reached through other
	// addresses (published container ports) translates here.
	Conn(addr string) *grpc.ClientConn
	// Describe is a one-line picture of the groups' leaders, for failures.
	Describe() string
}

// Tenant is one tenant the checker writes for, with the limit the cluster
// was configured with.
type Tenant struct {
	Name      string
	MaxSeries int64 // 0 = unlimited
}

// Config shapes the load.
type Config struct {
	Tenants []Tenant
	// Rolling tenants (limit RollLimit, which must be the cluster default)
	// are brought in one after the other, every RollEvery, so that some
	// tenant is crossing its limit at almost any moment, faults included.
	Rolling         int
	RollLimit       int64
	RollEvery       time.Duration
	Groups          []int // groups written to; nil = all
	Writers         int
	PinGroups       bool          // writer i writes only to Groups[i % len(Groups)] (per-group gaps without head-of-line blocking)
	NewPerReq       int           // new hashes per request
	ResendMax       int           // acknowledged hashes re-sent per request (at most)
	ReqTimeout      time.Duration // per attempt
	MaxBackoff      time.Duration // sleep between failed attempts grows up to this
	ProgressTimeout time.Duration // WaitProgress bound; 0 = DefaultProgressTimeout
	// StaticShares checks (b) per group against the static split (servers
	// run with --share-mode static). Otherwise (the server default, movable)
	// headroom moves between groups, and (b) is checked per tenant.
	StaticShares bool
	// History, when set, records every attempt (one operation each, its
	// outcome unknown when no answer came) for CheckHistory.
	History *history.Recorder
}

type ackRec struct {
	at   time.Time
	node string
}

// Probe resolves (Done is closed) at the first successful write to group G
// that was sent after `after` and answered by a node other than `exclude`.
type Probe struct {
	G       int
	after   time.Time
	exclude string
	Done    chan struct{}
	At      time.Time // when the write was acknowledged
	Node    string    // who acknowledged it
}

// forbid makes any successful answer from addr to a request sent after
// `after` a violation: a node cut off from its peers cannot commit anything.
type forbid struct {
	addr  string
	after time.Time
	why   string
}

// Checker is one running checker.
type Checker struct {
	t     testing.TB
	c     Cluster
	cfg   Config
	addrs []string

	leaderMu sync.Mutex
	leader   []string // believed leader gRPC address per group

	mu         sync.Mutex
	acked      []map[uint64]ackRec // per tenant
	byPart     [][][]uint64        // per tenant, per partition: acked hashes (for re-sends)
	groupCount [][]int64           // per tenant, per group: distinct acked hashes
	overShare  [][]bool            // (b) reported once per (tenant, group)
	limitMax   []int64             // per tenant: highest max_series since the start (0: unlimited at some point)
	overLimit  []bool              // (b) per tenant, reported once
	violations []string
	nViol      int
	rejections int64 // new hashes rejected (expected at the limit)
	unexpected []string
	errCodes   map[codes.Code]int64
	probes     []*Probe
	forbids    []*forbid
	ackTimes   [][]time.Time // per group: when each successful response arrived

	requests     atomic.Int64
	okRequests   atomic.Int64
	hints        atomic.Int64
	sweepChecked int64
	leaseReads   int64         // successes without new series from cut-off nodes
	leaseReadMax time.Duration // latest such answer after its cut

	base    int // tenants[:base] are always written; the rest are rolling
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Share is a tenant's static share of maxSeries in group g (0: unlimited), as
// a server with --share-mode static computes it: proportional to the group's
// partitions, rounded up.
func Share(maxSeries int64, g int) int64 {
	lo, hi := api.GroupRange(g, partitions, groups)
	base, _ := limits.GroupShare(maxSeries, lo, hi, partitions, limits.Static, 0, 0)
	return base
}

// DefaultTenants: two tenants with a small limit (4000, i.e. 1000 per group
// before any headroom moves; reached within seconds, then most of their new
// series are rejected while their acknowledged ones keep being re-sent), one
// whose limit is reached a few seconds into a test, and one that keeps
// creating series during every fault (limit far away). The cluster's default limit must be
// DefaultMaxSeries (the rolling tenants use it).
var DefaultTenants = []Tenant{{"t-small-a", 4000}, {"t-small-b", 4000}, {"t-mid", 40000}, {"t-big", 4000000}}

// DefaultMaxSeries is the cluster default limit DefaultConfig expects.
const DefaultMaxSeries = 4000

// DefaultConfig is the load of the fault tests.
func DefaultConfig() Config {
	return Config{Tenants: slices.Clone(DefaultTenants), Writers: 3, NewPerReq: 24, ResendMax: 64,
		Rolling: 40, RollLimit: DefaultMaxSeries, RollEvery: 3 * time.Second,
		ReqTimeout: 2 * time.Second, MaxBackoff: 100 * time.Millisecond}
}

// Start starts the writers and the WatchCluster follower. addrs are the
// nodes' advertised gRPC addresses (c.Conn reaches them).
func Start(t testing.TB, c Cluster, addrs []string, cfg Config) *Checker {
	t.Helper()
	if cfg.Groups == nil {
		for g := range groups {
			cfg.Groups = append(cfg.Groups, g)
		}
	}
	ck := &Checker{t: t, c: c, cfg: cfg, addrs: slices.Clone(addrs), leader: make([]string, groups),
		errCodes: map[codes.Code]int64{}, base: len(cfg.Tenants), started: time.Now()}
	ck.cfg.Tenants = slices.Clone(cfg.Tenants)
	for i := range cfg.Rolling {
		ck.cfg.Tenants = append(ck.cfg.Tenants, Tenant{fmt.Sprintf("t-roll-%02d", i), cfg.RollLimit})
	}
	cfg = ck.cfg
	for range cfg.Tenants {
		ck.acked = append(ck.acked, map[uint64]ackRec{})
		ck.byPart = append(ck.byPart, make([][]uint64, partitions))
		ck.groupCount = append(ck.groupCount, make([]int64, groups))
		ck.overShare = append(ck.overShare, make([]bool, groups))
		ck.limitMax = append(ck.limitMax, ck.cfg.Tenants[len(ck.limitMax)].MaxSeries)
		ck.overLimit = append(ck.overLimit, false)
	}
	ck.ackTimes = make([][]time.Time, groups)
	ck.ctx, ck.cancel = context.WithCancel(context.Background())
	t.Cleanup(ck.Stop) // idempotent; stops the goroutines even if the test fails early
	ck.wg.Add(1)
	go ck.watch()
	for i := range cfg.Writers {
		ck.wg.Add(1)
		go ck.writer(i)
	}
	return ck
}

// Stop stops the writers and waits for them; idempotent.
func (ck *Checker) Stop() {
	ck.cancel()
	ck.wg.Wait()
}

func (ck *Checker) progressTimeout() time.Duration {
	if ck.cfg.ProgressTimeout > 0 {
		return ck.cfg.ProgressTimeout
	}
	return DefaultProgressTimeout
}

func (ck *Checker) stopping() bool { return ck.ctx.Err() != nil }

// ---------------------------------------------------------------------------
// Routing.

func (ck *Checker) leaderGuess(g int) string {
	ck.leaderMu.Lock()
	defer ck.leaderMu.Unlock()
	if ck.leader[g] == "" {
		ck.leader[g] = ck.addrs[rand.IntN(len(ck.addrs))]
	}
	return ck.leader[g]
}

func (ck *Checker) setLeader(g int, addr string) {
	ck.leaderMu.Lock()
	ck.leader[g] = addr
	ck.leaderMu.Unlock()
}

// rotate moves group g's guess away from a node that failed to answer.
func (ck *Checker) rotate(g int, failed string) {
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
func (ck *Checker) watch() {
	defer ck.wg.Done()
	i := rand.IntN(len(ck.addrs))
	for !ck.stopping() {
		addr := ck.addrs[i%len(ck.addrs)]
		i++
		ctx, cancel := context.WithCancel(ck.ctx)
		stream, err := api.NewTrackerClient(ck.c.Conn(addr)).WatchCluster(ctx, &api.WatchClusterRequest{})
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

func (ck *Checker) writer(id int) {
	defer ck.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(id)))
	for !ck.stopping() {
		ti := ck.pickTenant(rng)
		g := ck.cfg.Groups[rng.IntN(len(ck.cfg.Groups))]
		if ck.cfg.PinGroups {
			g = ck.cfg.Groups[id%len(ck.cfg.Groups)]
		}
		lo, hi := api.GroupRange(g, partitions, groups)
		p := lo + rng.IntN(hi-lo)
		batch := ck.makeBatch(rng, ti, p)
		ck.send(rng, id, ti, g, p, batch)
	}
}

// pickTenant picks one of the base tenants or a rolling tenant.
func (ck *Checker) pickTenant(rng *rand.Rand) int {
	if ck.cfg.Rolling == 0 {
		return rng.IntN(ck.base)
	}
	ti := rng.IntN(ck.base + 1)
	if ti == ck.base {
		// Mostly the newest rolling tenant (it is filling up); sometimes an
		// earlier one (at its limit: re-sends and rejections).
		cur := min(int(time.Since(ck.started)/ck.cfg.RollEvery), ck.cfg.Rolling-1)
		if rng.IntN(3) == 0 {
			cur = rng.IntN(cur + 1)
		}
		ti += cur
	}
	return ti
}

// makeBatch mixes up to resendMax acknowledged hashes of (tenant, partition)
// with newPerReq fresh hashes of the partition, shuffled.
func (ck *Checker) makeBatch(rng *rand.Rand, ti, p int) []uint64 {
	first, last := api.PartitionHashRange(p, partitions)
	span := last - first
	batch := make([]uint64, 0, ck.cfg.ResendMax+ck.cfg.NewPerReq)
	seen := map[uint64]bool{}
	ck.mu.Lock()
	acked := ck.byPart[ti][p]
	if n := len(acked); n > 0 {
		k := min(ck.cfg.ResendMax, n)
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

// send delivers one batch for client (a writer, or the sweep), re-sending it
// (always safe) until a node answers successfully or the checker stops. It
// returns false if it gave up.
func (ck *Checker) send(rng *rand.Rand, client, ti, g, p int, batch []uint64) bool {
	req := &api.TrackSeriesRequest{Tenant: ck.cfg.Tenants[ti].Name, Partition: uint32(p), Hashes: batch}
	fails := 0
	for !ck.stopping() {
		addr := ck.leaderGuess(g)
		ctx, cancel := context.WithTimeout(ck.ctx, ck.cfg.ReqTimeout)
		ck.requests.Add(1)
		sent := time.Now()
		var call *history.Call
		if ck.cfg.History != nil {
			call = ck.cfg.History.Begin(client, history.Op{Kind: history.KindTrack, Key: history.TrackKey(req.Tenant, p), Hashes: batch})
		}
		resp, err := api.NewTrackerClient(ck.c.Conn(addr)).TrackSeries(ctx, req)
		cancel()
		if call != nil {
			call.EndTrack(resp.GetRejectedHashes(), err)
		}
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
			if nl := NotLeader(err); nl != nil && nl.LeaderGrpcAddress != "" && nl.LeaderGrpcAddress != addr {
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
		sleep := min(ck.cfg.MaxBackoff, time.Duration(fails)*10*time.Millisecond)
		sleep = sleep/2 + time.Duration(rng.Int64N(int64(sleep/2)+1))
		select {
		case <-ck.ctx.Done():
		case <-time.After(sleep):
		}
	}
	return false
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// NotLeader returns the NotLeader detail of a FailedPrecondition error, or nil.
func NotLeader(err error) *api.NotLeader {
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

func (ck *Checker) violation(format string, args ...any) {
	ck.nViol++
	if len(ck.violations) < 50 {
		ck.violations = append(ck.violations, fmt.Sprintf(format, args...))
	}
}

// record applies one successful response: checks (a) and (b), records the acks.
func (ck *Checker) record(ti, g int, batch, rejected []uint64, addr string, sent time.Time) {
	now := time.Now()
	tenant := ck.cfg.Tenants[ti].Name
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
	limit := Share(ck.cfg.Tenants[ti].MaxSeries, g)
	if !ck.cfg.StaticShares {
		limit = 0
	}
	newly := 0 // hashes this response acknowledged for the first time
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
		newly++
		p := api.Partition(h, partitions)
		ck.byPart[ti][p] = append(ck.byPart[ti][p], h)
		ck.groupCount[ti][g]++
		if limit > 0 && ck.groupCount[ti][g] > limit && !ck.overShare[ti][g] {
			ck.overShare[ti][g] = true
			ck.violation("(b) OVER SHARE: tenant %s group %d has %d distinct acknowledged series, share is %d (max_series %d); last ack at %s by %s",
				tenant, g, ck.groupCount[ti][g], limit, ck.cfg.Tenants[ti].MaxSeries, now.Format("15:04:05.000000"), addr)
		}
		if lm := ck.limitMax[ti]; !ck.cfg.StaticShares && lm > 0 && int64(len(ck.acked[ti])) > lm && !ck.overLimit[ti] {
			ck.overLimit[ti] = true
			ck.violation("(b) OVER LIMIT: tenant %s has %d distinct acknowledged series, its highest max_series so far is %d; last ack at %s by %s (group %d)",
				tenant, len(ck.acked[ti]), lm, now.Format("15:04:05.000000"), addr, g)
		}
	}
	ck.ackTimes[g] = append(ck.ackTimes[g], now)
	for _, f := range ck.forbids {
		if addr != f.addr || !sent.After(f.after) {
			continue
		}
		if newly > 0 {
			ck.violation("(d) NEW SERIES ACKNOWLEDGED BY A CUT-OFF NODE: %s acknowledged %d new series of tenant %s in group %d, request sent at %s, after %s at %s",
				addr, newly, tenant, g, sent.Format("15:04:05.000000"), f.why, f.after.Format("15:04:05.000000"))
			continue
		}
		// Nothing new: only series already acknowledged (and fresh, so the
		// leader logs nothing for them) and new ones rejected at the limit.
		// The leader answers those from its committed state without a log
		// entry while its lease lasts: a read, counted and reported.
		ck.leaseReads++
		ck.leaseReadMax = max(ck.leaseReadMax, now.Sub(f.after))
	}
	kept := ck.probes[:0]
	for _, pr := range ck.probes {
		if pr.G == g && sent.After(pr.after) && addr != pr.exclude {
			pr.At, pr.Node = now, addr
			close(pr.Done)
			continue
		}
		kept = append(kept, pr)
	}
	ck.probes = kept
}

// SetLimit tells the checker that the test is changing tenant's max_series
// to n (0: unlimited). Call it BEFORE proposing a raise, so that series the
// raise admits are within the bound. The bound for (b) is the highest limit
// since the start: after a lowering, series already accepted stay (only new
// ones are refused) and a group may still admit new series up to its own
// share, so the tenant's total is bounded by the earlier, higher limit
// until its usage falls (docs/shares.md, limit changes).
func (ck *Checker) SetLimit(tenant string, n int64) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for ti, ts := range ck.cfg.Tenants {
		if ts.Name != tenant {
			continue
		}
		ck.cfg.Tenants[ti].MaxSeries = n
		if n == 0 || ck.limitMax[ti] == 0 {
			ck.limitMax[ti] = 0
		} else {
			ck.limitMax[ti] = max(ck.limitMax[ti], n)
		}
		return
	}
	ck.t.Errorf("checker: SetLimit of unknown tenant %q", tenant)
}

// Acked returns how many distinct series of tenant were acknowledged.
func (ck *Checker) Acked(tenant string) int64 {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for ti, ts := range ck.cfg.Tenants {
		if ts.Name == tenant {
			return int64(len(ck.acked[ti]))
		}
	}
	return 0
}

// AckedHashes returns, per tenant name, every hash acknowledged so far: a
// test that loses nodes for good checks which of them the survivors kept.
func (ck *Checker) AckedHashes() map[string][]uint64 {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	out := make(map[string][]uint64, len(ck.cfg.Tenants))
	for ti, ts := range ck.cfg.Tenants {
		hs := make([]uint64, 0, len(ck.acked[ti]))
		for h := range ck.acked[ti] {
			hs = append(hs, h)
		}
		out[ts.Name] = hs
	}
	return out
}

// AddProbe registers a probe on group g (see Probe).
func (ck *Checker) AddProbe(g int, after time.Time, exclude string) *Probe {
	pr := &Probe{G: g, after: after, exclude: exclude, Done: make(chan struct{})}
	ck.mu.Lock()
	ck.probes = append(ck.probes, pr)
	ck.mu.Unlock()
	return pr
}

// DropProbe forgets a probe that will not be waited for.
func (ck *Checker) DropProbe(pr *Probe) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for i, p := range ck.probes {
		if p == pr {
			ck.probes = append(ck.probes[:i], ck.probes[i+1:]...)
			return
		}
	}
}

// MaxGap is the longest time group g went without a successful response
// between from and to (counting from `from` to the first one and from the
// last one to `to`), and when that gap ended. It measures how long a fault
// interrupted writes as clients saw it.
func (ck *Checker) MaxGap(g int, from, to time.Time) (gap time.Duration, endedAt time.Time) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	prev := from
	for _, at := range ck.ackTimes[g] {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		if !at.After(prev) {
			continue // appended a little out of order (taken before the lock)
		}
		if d := at.Sub(prev); d > gap {
			gap, endedAt = d, at
		}
		prev = at
	}
	if d := to.Sub(prev); d > gap {
		gap, endedAt = d, to
	}
	return gap, endedAt
}

// ForbidAcks makes every new series acknowledged by the node at addr in
// answer to a request sent after `after` a violation (d), until the returned
// function is called. A harness calls it once it has cut the node off from
// every peer: such a node can commit nothing, and a new series is
// acknowledged only after its entry committed. why names the cut.
func (ck *Checker) ForbidAcks(addr string, after time.Time, why string) (lift func()) {
	f := &forbid{addr: addr, after: after, why: why}
	ck.mu.Lock()
	ck.forbids = append(ck.forbids, f)
	ck.mu.Unlock()
	return func() {
		ck.mu.Lock()
		defer ck.mu.Unlock()
		ck.forbids = slices.DeleteFunc(ck.forbids, func(x *forbid) bool { return x == f })
	}
}

// WaitProgress asserts (c): every group the checker writes to acknowledges a
// write started after this call, within ck.progressTimeout(). what names the fault.
func (ck *Checker) WaitProgress(what string) {
	ck.t.Helper()
	start := time.Now()
	var prs []*Probe
	for _, g := range ck.cfg.Groups {
		prs = append(prs, ck.AddProbe(g, start, ""))
	}
	deadline := time.After(ck.progressTimeout())
	for _, pr := range prs {
		select {
		case <-pr.Done:
		case <-deadline:
			var stuck []string
			for _, p := range prs {
				if !isClosed(p.Done) {
					stuck = append(stuck, fmt.Sprint(p.G))
				}
				ck.DropProbe(p)
			}
			ck.t.Fatalf("(c) NO PROGRESS after %s: groups %s accepted no write within %v; leaders now: %s; errors so far: %s",
				what, strings.Join(stuck, ","), ck.progressTimeout(), ck.c.Describe(), ck.ErrSummary())
		}
	}
	ck.t.Logf("progress after %s: every group accepted writes within %v", what, time.Since(start).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// End of test.

// Sweep re-sends every acknowledged hash once the writers have stopped and
// the cluster is healthy: each must be accepted (a), which also proves every
// acknowledged series survived all the faults.
func (ck *Checker) Sweep() {
	ck.t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	sweepCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The writers' context is cancelled by now; the sweep uses its own.
	saved := ck.ctx
	ck.ctx = sweepCtx
	defer func() { ck.ctx = saved }()
	deadline := time.Now().Add(2 * ck.progressTimeout())
	for ti := range ck.cfg.Tenants {
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
				go func() { done <- ck.send(rng, ck.cfg.Writers, ti, g, p, chunk) }()
				select {
				case ok := <-done:
					if !ok {
						ck.t.Fatalf("final sweep: gave up on tenant %s partition %d", ck.cfg.Tenants[ti].Name, p)
					}
					ck.sweepChecked += int64(n)
				case <-time.After(time.Until(deadline)):
					cancel()
					<-done
					ck.t.Fatalf("final sweep: no answer for tenant %s partition %d (hang?)", ck.cfg.Tenants[ti].Name, p)
				}
			}
		}
	}
}

// Config returns the checker's configuration (rolling tenants included).
func (ck *Checker) Config() Config {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return ck.cfg
}

// CheckHistory closes Config.History and checks it with the tracking model,
// each tenant against the highest limit it had (see SetLimit); an illegal
// history writes porcupine's visualisation to htmlPath. Call it after Sweep,
// so that the sweep's re-sends are part of the history.
func (ck *Checker) CheckHistory(htmlPath string, timeout time.Duration) error {
	h := ck.cfg.History
	if h == nil {
		return nil
	}
	if err := h.Close(); err != nil {
		return err
	}
	ck.mu.Lock()
	limits := map[string]int{}
	for ti, ts := range ck.cfg.Tenants {
		limits[ts.Name] = int(ck.limitMax[ti])
		if ck.cfg.StaticShares && ck.limitMax[ti] > 0 {
			// Each group's share is rounded up: their sum may pass the limit.
			limits[ts.Name] = 0
			for g := range groups {
				limits[ts.Name] += int(Share(ck.limitMax[ti], g))
			}
		}
	}
	ck.mu.Unlock()
	// Keyed per partition, the limit checked apart (history.TrackKey).
	return errors.Join(
		history.Check(history.TrackingModel(func(string) int { return 0 }), h.Ops(), htmlPath, timeout),
		history.OverLimit(h.Ops(), func(tenant string) int { return limits[tenant] }))
}

// ErrSummary counts the failed attempts by gRPC code, for logs.
func (ck *Checker) ErrSummary() string {
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

// Report logs the counts and fails the test on any violation (a), (b), (d)
// or unexpected error code. A harness calls Stop, waits until its cluster is
// healthy, calls Sweep, then Report.
func (ck *Checker) Report() {
	ck.t.Helper()
	ck.mu.Lock()
	defer ck.mu.Unlock()
	var acked int64
	var perTenant []string
	rollUsed, rollFull, rollCells := 0, 0, 0
	for ti, ts := range ck.cfg.Tenants {
		acked += int64(len(ck.acked[ti]))
		if ti >= ck.base {
			if len(ck.acked[ti]) > 0 {
				rollUsed++
				if !ck.cfg.StaticShares {
					rollCells++
					if int64(len(ck.acked[ti])) == ts.MaxSeries {
						rollFull++
					}
					continue
				}
				for _, g := range ck.cfg.Groups {
					rollCells++
					if ck.groupCount[ti][g] == Share(ts.MaxSeries, g) {
						rollFull++
					}
				}
			}
			continue
		}
		var gs []string
		for _, g := range ck.cfg.Groups {
			gs = append(gs, fmt.Sprintf("g%d=%d/%d", g, ck.groupCount[ti][g], Share(ts.MaxSeries, g)))
		}
		perTenant = append(perTenant, fmt.Sprintf("%s[%d/%d: %s]", ts.Name, len(ck.acked[ti]), ts.MaxSeries, strings.Join(gs, " ")))
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
	if ck.cfg.Rolling > 0 {
		ck.t.Logf("checker: rolling tenants (limit %d, one more every %v): %d written, %d of their %d cells (tenant, or (tenant, group) with static shares) reached the limit/share exactly",
			ck.cfg.RollLimit, ck.cfg.RollEvery, rollUsed, rollFull, rollCells)
	}
	if ck.leaseReads > 0 {
		ck.t.Logf("checker: %d answers from cut-off nodes created nothing (fresh re-sends, rejections at the limit: answered from committed state within the lease, no log entry), the last %v after its cut",
			ck.leaseReads, ck.leaseReadMax.Round(time.Millisecond))
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
