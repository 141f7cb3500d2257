package faulttest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/checker"
)

// tenantView is the part of /api/v1/tenants/T the share checks read.
type tenantView struct {
	MaxSeries  int64   `json:"max_series"`
	PerGroup   []int64 `json:"series_per_group"`
	ShareMoves []struct {
		Group       int               `json:"group"`
		Base        int64             `json:"base"`
		Delta       int64             `json:"delta"`
		Share       int64             `json:"share"`
		Given       int64             `json:"given"`
		Received    int64             `json:"received"`
		Outstanding []json.RawMessage `json:"outstanding"`
	} `json:"share_moves"`
}

var httpClient = &http.Client{Timeout: time.Second, Transport: tokenTransport{}}

// tenantOn reads tenant's view from n's own replicas (nil: no answer, e.g.
// the node is down or frozen).
func tenantOn(n *node, tenant string) *tenantView {
	resp, err := httpClient.Get("http://" + n.httpAddr + "/api/v1/tenants/" + tenant)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var v tenantView
	if json.NewDecoder(resp.Body).Decode(&v) != nil || len(v.ShareMoves) != groups || len(v.PerGroup) != groups {
		return nil
	}
	return &v
}

// shareObserver polls /api/v1/tenants/T on every usable node and checks, at
// every observation:
//
//	(s1) the algebraic sum of shares ≤ limit. Σ_g share_g = Σ_g (base_g +
//	     delta_g) = limit + Σ received − Σ given (bases telescope to the
//	     limit), so the check is Σ_g received_g ≤ Σ_g given_g, which does
//	     not depend on which limit each replica has applied. Replicas of
//	     different groups are read at different instants, so received is
//	     read first and given after it (both only grow): any receive seen
//	     was committed before the given read, and its give before it. A
//	     replica may not have applied a committed give yet, so a shortfall
//	     is re-read for up to 2 s before it is a violation.
//	(s2) the series the servers accepted ≤ the tenant's highest limit since
//	     the start (= its limit while it was only raised): Σ_g of the
//	     largest per-group count any replica reports (counts only grow
//	     during the test).
//
// The sum of positive shares is NOT checked at every instant: after a
// lowering, a group that gave headroom away can be below zero while its
// receivers keep what they received (docs/shares.md).
type shareObserver struct {
	t       *testing.T
	c       *cluster
	tenants []string

	mu        sync.Mutex
	bound     map[string]int64
	checks    int64
	retried   int64
	maxDebt   map[string]int64 // most negative share seen per tenant
	violation []string

	stop chan struct{}
	done chan struct{}
}

func startShareObserver(t *testing.T, c *cluster, tenants []checker.Tenant) *shareObserver {
	o := &shareObserver{t: t, c: c, bound: map[string]int64{}, maxDebt: map[string]int64{},
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, tn := range tenants {
		o.tenants = append(o.tenants, tn.Name)
		o.bound[tn.Name] = tn.MaxSeries
	}
	go o.run()
	t.Cleanup(o.halt)
	return o
}

// raise must be called before a limit is raised (the bound is the highest).
func (o *shareObserver) raise(tenant string, n int64) {
	o.mu.Lock()
	o.bound[tenant] = max(o.bound[tenant], n)
	o.mu.Unlock()
}

func (o *shareObserver) halt() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	<-o.done
}

func (o *shareObserver) fail(format string, args ...any) {
	o.mu.Lock()
	if len(o.violation) < 20 {
		o.violation = append(o.violation, fmt.Sprintf(time.Now().Format("15:04:05.000 ")+format, args...))
	}
	o.mu.Unlock()
}

func (o *shareObserver) run() {
	defer close(o.done)
	for {
		for _, tenant := range o.tenants {
			select {
			case <-o.stop:
				return
			default:
			}
			o.observe(tenant)
		}
		select {
		case <-o.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// read returns, per group, the largest value of f over the usable nodes'
// answers, and how many nodes answered.
func (o *shareObserver) read(tenant string, f func(v *tenantView, g int) int64, also func(*tenantView)) ([]int64, int) {
	out := make([]int64, groups)
	answered := 0
	for _, n := range o.c.nodes {
		if !n.usable() {
			continue
		}
		v := tenantOn(n, tenant)
		if v == nil {
			continue
		}
		answered++
		for g := range groups {
			out[g] = max(out[g], f(v, g))
		}
		if also != nil {
			also(v)
		}
	}
	return out, answered
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

func (o *shareObserver) observe(tenant string) {
	var debt int64
	recv, n := o.read(tenant, func(v *tenantView, g int) int64 { return v.ShareMoves[g].Received }, func(v *tenantView) {
		for _, sm := range v.ShareMoves {
			debt = min(debt, sm.Share)
		}
	})
	if n == 0 {
		return
	}
	series, _ := o.read(tenant, func(v *tenantView, g int) int64 { return v.PerGroup[g] }, nil)
	given, _ := o.read(tenant, func(v *tenantView, g int) int64 { return v.ShareMoves[g].Given }, nil)
	for try := 0; sum(recv) > sum(given) && try < 20; try++ {
		o.mu.Lock()
		o.retried++
		o.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		again, _ := o.read(tenant, func(v *tenantView, g int) int64 { return v.ShareMoves[g].Given }, nil)
		for g := range given {
			given[g] = max(given[g], again[g])
		}
	}
	o.mu.Lock()
	bound := o.bound[tenant]
	o.checks++
	o.maxDebt[tenant] = min(o.maxDebt[tenant], debt)
	o.mu.Unlock()
	if sum(recv) > sum(given) {
		o.fail("(s1) Σ SHARES ABOVE THE LIMIT: tenant %s received %v (Σ %d) > given %v (Σ %d)", tenant, recv, sum(recv), given, sum(given))
	}
	if bound > 0 && sum(series) > bound {
		o.fail("(s2) ACCEPTED ABOVE THE LIMIT: tenant %s has %v (Σ %d) series, highest limit %d", tenant, series, sum(series), bound)
	}
}

func (o *shareObserver) report() {
	o.halt()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.t.Logf("share observer: %d observations (%d given re-reads for replica lag); most negative share seen per tenant: %v", o.checks, o.retried, o.maxDebt)
	if o.checks == 0 {
		o.t.Error("share observer made no observation")
	}
	for _, v := range o.violation {
		o.t.Errorf("violation: %s", v)
	}
}

// waitSettled waits until, on every node, no transfer of tenant is
// outstanding and Σ received = Σ given in every group's replica: every
// stranded transfer was delivered and completed, so Σ shares = limit exactly.
func (c *cluster) waitSettled(t *testing.T, tenant string) {
	t.Helper()
	deadline := time.Now().Add(progressTimeout)
	var last string
	for {
		ok := true
		for _, n := range c.nodes {
			v := tenantOn(n, tenant)
			if v == nil {
				ok, last = false, n.id+": no answer"
				break
			}
			var out, recv, given, shares, base int64
			for _, sm := range v.ShareMoves {
				out += int64(len(sm.Outstanding))
				recv += sm.Received
				given += sm.Given
				shares += sm.Share
				base += sm.Base
			}
			if out != 0 || recv != given || (v.MaxSeries > 0 && (shares != v.MaxSeries || base != v.MaxSeries)) {
				ok = false
				last = fmt.Sprintf("%s: %d outstanding, received %d given %d, Σ shares %d Σ bases %d, limit %d", n.id, out, recv, given, shares, base, v.MaxSeries)
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: shares did not settle within %v: %s", tenant, progressTimeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shareMetrics sums the share counters over the nodes' /metrics.
func (c *cluster) shareMetrics() map[string]float64 {
	out := map[string]float64{}
	for _, n := range c.nodes {
		resp, err := httpClient.Get("http://" + n.httpAddr + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "tollgate_share_") || strings.Contains(line, "_bucket") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			name := line[:i]
			if j := strings.IndexByte(name, '{'); j > 0 && strings.HasPrefix(name, "tollgate_share_moves_total") {
				name = name[:j]
			}
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				out[name] += v
			}
		}
		resp.Body.Close()
	}
	return out
}

// setLimitsRetry is setLimits that also retries the codes of a frozen
// orderer (group 0's leader SIGSTOPped: the call times out until a new
// leader is elected). Setting max_series=N twice is harmless.
func setLimitsRetry(t *testing.T, c *cluster, via *node, req *api.SetLimitsRequest) {
	t.Helper()
	deadline := time.Now().Add(progressTimeout)
	for {
		ctx, cancel := adminCtx(context.Background(), 5*time.Second)
		_, err := api.NewConfigClient(c.conn(via.grpcAddr)).SetLimits(ctx, req)
		cancel()
		if err == nil {
			return
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.FailedPrecondition, codes.Canceled:
		default:
			t.Fatalf("set limits via %s: %v", via, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("set limits via %s: still failing after %v: %v", via, progressTimeout, err)
		}
		t.Logf("set limits via %s: %v (retrying)", via, err)
		time.Sleep(200 * time.Millisecond)
	}
}

// TestMovableSharesUnderFaults: a 3-node cluster with movable shares
// (--share-mode movable), tenants with small limits and rolling tenants crossing theirs
// all the time, so that groups borrow headroom constantly; meanwhile three
// rounds of: SIGKILL a group's leader, raise a tenant's limit while it is
// down, restart it, raise one tenant's limit and lower another's through
// `limits set` (SetLimits) under load once every node is back, SIGSTOP a
// leader for 2 s. Checked throughout: the checker's (a) no acknowledged
// series rejected and (b) acknowledged series ≤ the tenant's highest limit;
// the observer's (s1) Σ shares ≤ limit and (s2) accepted ≤ limit; at the end
// every transfer was delivered (outstanding 0, Σ shares = limit) on every
// node, and headroom did move.
func TestMovableSharesUnderFaults(t *testing.T) {
	fixed := []checker.Tenant{{Name: "m-200", MaxSeries: 200}, {Name: "m-1000", MaxSeries: 1000}, {Name: "m-2000", MaxSeries: 2000}}
	opts := clusterOptions{defaultMaxSeries: 300, tenantMaxSeries: map[string]int64{}, shareMode: "movable"}
	for _, tn := range fixed {
		opts.tenantMaxSeries[tn.Name] = tn.MaxSeries
	}
	c := newCluster(t, opts)
	c.waitReplicas(1) // the limits file is the runtime config
	cfg := checker.Config{Tenants: fixed, Writers: 4, NewPerReq: 6, ResendMax: 32,
		Rolling: 40, RollLimit: 300, RollEvery: 2 * time.Second,
		ReqTimeout: 2 * time.Second, MaxBackoff: 100 * time.Millisecond}
	ck := startChecker(t, c, cfg)
	obs := startShareObserver(t, c, fixed)
	ck.waitProgress("start")
	loadFor(3 * time.Second)

	limit := map[string]int64{"m-200": 200, "m-1000": 1000, "m-2000": 2000}
	setLimit := func(tenant string, n int64) {
		via := c.nodes[rand.IntN(len(c.nodes))]
		for !via.usable() {
			via = c.nodes[rand.IntN(len(c.nodes))]
		}
		if n > limit[tenant] {
			ck.SetLimit(tenant, n) // before: series the raise admits are in bound
			obs.raise(tenant, n)
		}
		t.Logf("limits set --tenant %s max_series=%d (was %d) via %s; acked now %d", tenant, n, limit[tenant], via.id, ck.Acked(tenant))
		setLimitsRetry(t, c, via, &api.SetLimitsRequest{Tenant: tenant, Set: map[string]string{"max_series": strconv.FormatInt(n, 10)}})
		if n < limit[tenant] {
			ck.SetLimit(tenant, n)
		}
		limit[tenant] = n
	}

	for round := 1; round <= 3; round++ {
		g := rand.IntN(groups)
		l := c.waitLeader(g, nil)
		t.Logf("round %d: SIGKILL %s, leader of group %d (leaders: %s)", round, l.id, g, c.describe())
		l.kill(t)
		c.waitLeader(g, l)
		ck.waitProgress("SIGKILL of " + l.id)
		loadFor(time.Second)
		// A limit change while a voter is down: the cluster-version gate
		// counts it with the version it last advertised, and it catches up
		// from the log when restarted.
		setLimit("m-1000", limit["m-1000"]+100)
		l.restart(t)
		c.waitHealthy()
		ck.waitProgress("restart of " + l.id)
		// Limit changes under load, while headroom moves: raising spreads
		// new headroom, lowering leaves givers below zero.
		setLimit("m-200", limit["m-200"]+150)
		setLimit("m-2000", limit["m-2000"]-400)
		setLimit("m-1000", limit["m-1000"]+300)
		loadFor(2 * time.Second)

		var victim *node
		for _, ld := range c.leaders() {
			if ld != nil {
				victim = ld
				break
			}
		}
		t.Logf("round %d: SIGSTOP %s (leaders: %s)", round, victim.id, c.describe())
		victim.stop(t)
		ck.waitProgress("SIGSTOP of " + victim.id)
		time.Sleep(2 * time.Second)
		victim.cont(t)
		c.waitHealthy()
		ck.waitProgress("SIGCONT of " + victim.id)
		setLimit("m-2000", limit["m-2000"]+250)
		loadFor(2 * time.Second)
	}

	ck.Stop()
	c.waitHealthy()
	obs.report()
	for i := range cfg.Rolling {
		if name := fmt.Sprintf("t-roll-%02d", i); ck.Acked(name) > 0 {
			c.waitSettled(t, name)
		}
	}
	for _, tn := range fixed {
		c.waitSettled(t, tn.Name)
	}
	m := c.shareMetrics()
	t.Logf("share metrics (Σ nodes): moves %v, moved series %v, stranded recovered %v, rejections at limit %v, at share %v",
		m["tollgate_share_moves_total"], m["tollgate_share_moved_series_total"], m["tollgate_share_stranded_recovered_series_total"],
		m[`tollgate_share_rejections_total{at="limit"}`], m[`tollgate_share_rejections_total{at="share"}`])
	// Counters restart with a killed process, so these are lower bounds.
	if m["tollgate_share_moved_series_total"] == 0 {
		t.Error("no headroom moved: the test did not exercise movable shares")
	}
	ck.Sweep()
	ck.Report()
	ck.checkHistory()
	c.checkNoCrashes()
}
