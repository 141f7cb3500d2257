package server

import (
	"context"
	"crypto/tls"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/service/envoyrls"
	"github.com/tollgate-io/tollgate/tlsutil"
)

func rlsClient(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

func rlsReq(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &commonrl.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonrl.RateLimitDescriptor{d}}
}

// applyEnvoy replaces the runtime config with one holding the given Envoy
// configurations (domain → YAML) and waits until every node decides with it.
func applyEnvoy(t *testing.T, nodes []*Server, cfgs map[string]string) {
	t.Helper()
	cc, err := grpc.NewClient(nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := api.NewConfigClient(cc).ApplyLimits(adminCtx(t), &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{Envoy: cfgs}})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	waitFor(t, "every node and group holds the Envoy config", func() bool {
		for _, s := range nodes {
			for g := range s.servedGroups() {
				if s.rcfg.mods[g].Current().Version < resp.Version {
					return false
				}
			}
		}
		return true
	})
}

func counterValue(t *testing.T, s *Server, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			sum += metricValue(m)
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

const rlsDecisionsConfig = `
domain: shop
descriptors:
  - key: tier
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: team
    value: a
    descriptors:
      - key: op
        rate_limit: {name: team_op, unit: hour, requests_per_unit: 1}
  - key: team
    value: b
    descriptors:
      - key: op
        rate_limit:
          replaces: [{name: team_op}]
          unit: hour
          requests_per_unit: 100
`

// One node, the format's decisions through the real service: nested default
// values count per value, a limit of 0 rejects, unlimited answers MaxUint32,
// replaces drops the replaced rule, a hits_addend spends that many, bad
// requests are InvalidArgument naming the field.
func TestEnvoyRLSDecisions(t *testing.T) {
	s, _ := startServer(t, filepath.Join(t.TempDir(), "data"), func(c *Config) { c.Access.AdminToken = testToken })
	defer stop(t, s)
	applyEnvoy(t, []*Server{s}, map[string]string{"shop": rlsDecisionsConfig})
	c := rlsClient(t, s.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Leases arrive within a report period or two of a key's first use;
	// until then a key is admitted (fail open, like clientlib). Warm each
	// key with a call that spends nothing (hits_addend 0 on the descriptor).
	warm := func(kv ...string) {
		req := rlsReq("shop", kv...)
		req.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
		call(req)
	}
	warm("tier", "free", "user", "joe")
	warm("tier", "free", "user", "ann")
	warm("team", "a", "op", "read")
	waitFor(t, "leases for the warmed keys", func() bool { return s.rls.Client().Stats().Owners > 0 && leased(s) >= 3 })

	// Nested default value: 2/minute per user; joe's third request is over,
	// ann still has hers.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r := call(rlsReq("shop", "tier", "free", "user", "joe"))
		if r.OverallCode != want || r.Statuses[0].Code != want {
			t.Fatalf("joe request %d: %v, want %v", i+1, r.OverallCode, want)
		}
		cl := r.Statuses[0].CurrentLimit
		if cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current limit %v", cl)
		}
		if want == rlsv3.RateLimitResponse_OVER_LIMIT {
			st := r.Statuses[0]
			if st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() != time.Minute {
				t.Fatalf("over limit status: remaining %d reset %v", st.LimitRemaining, st.DurationUntilReset.AsDuration())
			}
			hdr := map[string]string{}
			for _, h := range r.ResponseHeadersToAdd {
				hdr[h.Key] = h.Value
			}
			if hdr["x-ratelimit-limit"] != "2, 2;w=60" || hdr["x-ratelimit-remaining"] != "0" || hdr["x-ratelimit-reset"] != "60" {
				t.Fatalf("headers %v", hdr)
			}
		}
	}
	if r := call(rlsReq("shop", "tier", "free", "user", "ann")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ann shares joe's counter: %v", r.OverallCode)
	}
	// A limit of 0 rejects from the first request.
	if r := call(rlsReq("shop", "user", "banned")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("requests_per_unit 0: %v", r.OverallCode)
	}
	// Unlimited.
	r := call(rlsReq("shop", "path", "/health"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != math.MaxUint32 {
		t.Fatalf("unlimited: %v remaining %d", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	// No rule: OK without a limit; an unconfigured domain likewise.
	for _, req := range []*rlsv3.RateLimitRequest{rlsReq("shop", "nope", "x"), rlsReq("shop", "tier", "free"), rlsReq("elsewhere", "user", "joe")} {
		r := call(req)
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("%v: %v", req, r)
		}
	}
	// replaces: team a's 1/hour rule alone, then with team b's descriptor in
	// the same request, where only b's 100/hour counts.
	if r := call(rlsReq("shop", "team", "a", "op", "read")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("team a first: %v", r.OverallCode)
	}
	if r := call(rlsReq("shop", "team", "a", "op", "read")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("team a second: %v", r.OverallCode)
	}
	both := rlsReq("shop", "team", "a", "op", "read")
	both.Descriptors = append(both.Descriptors, rlsReq("shop", "team", "b", "op", "read").Descriptors[0])
	r = call(both)
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 100 {
		t.Fatalf("replaces: %v", r)
	}
	// hits_addend: 2 hits on a fresh 2/minute key spend it at once.
	warm("tier", "free", "user", "bo")
	waitFor(t, "lease for bo", func() bool { return leased(s) >= 4 })
	req := rlsReq("shop", "tier", "free", "user", "bo")
	req.HitsAddend = 2
	if r := call(req); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bo 2 hits: %v", r.OverallCode)
	}
	if r := call(rlsReq("shop", "tier", "free", "user", "bo")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("bo after 2 hits: %v", r.OverallCode)
	}

	// Bad requests name the field.
	for _, tc := range []struct {
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{rlsReq("", "a", "b"), "domain"},
		{&rlsv3.RateLimitRequest{Domain: "shop"}, "descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*commonrl.RateLimitDescriptor{{}}}, "descriptors[0].entries"},
		{rlsReq("shop", "", "x"), "descriptors[0].entries[0].key"},
	} {
		_, err := c.ShouldRateLimit(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+":") {
			t.Errorf("%v: %v, want InvalidArgument naming %s", tc.req, err, tc.field)
		}
	}
	// A bad configuration is refused naming the field, and changes nothing.
	cc, _ := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	defer cc.Close()
	_, err := api.NewConfigClient(cc).ApplyLimits(adminCtx(t), &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{
		Envoy: map[string]string{"shop": "domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[0].rate_limit.unit") {
		t.Fatalf("bad config: %v", err)
	}
	if r := call(rlsReq("shop", "user", "banned")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal("a refused config changed the rules")
	}

	// A changed limit is a new rule: joe, over 2/minute above, gets the new
	// 3/minute afresh, decided and owned under the new rule.
	applyEnvoy(t, []*Server{s}, map[string]string{"shop": strings.Replace(rlsDecisionsConfig, "{unit: minute, requests_per_unit: 2}", "{unit: minute, requests_per_unit: 3}", 1)})
	warm("tier", "free", "user", "joe")
	waitFor(t, "lease for joe under the new rule", func() bool { return hasLease(s, "shop", "tier", "free", "user", "joe") })
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r := call(rlsReq("shop", "tier", "free", "user", "joe"))
		if r.OverallCode != want || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
			t.Fatalf("joe under 3/minute, request %d: %v limit %v, want %v", i+1, r.OverallCode, r.Statuses[0].CurrentLimit, want)
		}
	}
}

const rlsClusterConfig = `
domain: edge
descriptors:
  - key: api
    value: ingest
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: api
    value: canary
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 100}
`

// Thirty simulated Envoys, ten per node of a real 3-node cluster, each with
// its own connection, offer 5× a 1,000/s limit on one descriptor: what the
// cluster admits over 5 s after the leases settle is the limit within 5%.
// A shadow-mode rule offered far over its limit never answers OVER_LIMIT
// but counts the excess.
func TestEnvoyRLSClusterSharesOneLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster under 5,000 requests/s for ~10 s; run without -short")
	}
	// The admitted ÷ limit ratio is a measurement of a loaded cluster, not a
	// property that holds on any machine (under the race detector or a busy
	// CI host the generator starves and nodes fail open): it runs when asked,
	// as the other figures in BENCHMARKS.md do.
	if os.Getenv("TOLLGATE_ENVOY_EXACTNESS") == "" {
		t.Skip("measurement: TOLLGATE_ENVOY_EXACTNESS=1 go test -run TestEnvoyRLSClusterSharesOneLimit -v ./server (BENCHMARKS.md)")
	}
	tc := startCluster(t, 3, nil)
	nodes := tc.live()
	applyEnvoy(t, nodes, map[string]string{"edge": rlsClusterConfig})

	const (
		envoys  = 30
		limit   = 1000.0
		offered = 5 * limit
		warmup  = 2 * time.Second
		window  = 5 * time.Second
	)
	clients := make([]rlsv3.RateLimitServiceClient, envoys)
	for i := range clients {
		clients[i] = rlsClient(t, nodes[i%len(nodes)].GRPCAddr())
	}
	// Admitted and offered are read from the nodes' decision counters at
	// the window's edges, so they count decisions by when the node made
	// them, whatever the calls' latency. One gather per node, timed at its
	// middle: a slow gather on a busy machine does not stretch the span.
	sample := func() (ok, over float64, at time.Time) {
		begin := time.Now()
		for _, s := range nodes {
			mfs, err := s.metrics.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() != "tollgate_envoy_ratelimit_descriptor_decisions_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					l := map[string]string{}
					for _, lp := range m.GetLabel() {
						l[lp.GetName()] = lp.GetValue()
					}
					if l["rule"] != "api_ingest" {
						continue
					}
					switch l["decision"] {
					case "ok":
						ok += metricValue(m)
					case "over_limit":
						over += metricValue(m)
					}
				}
			}
		}
		return ok, over, begin.Add(time.Since(begin) / 2)
	}
	var errs, badStatus atomic.Int64
	start := time.Now()
	stopAt := start.Add(warmup + window + time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * envoys / offered) // each Envoy's share of the offered rate
	// Like a real Envoy, each one has many requests in flight on its one
	// connection: a call starts on schedule, not when the previous ended.
	const inflight = 32
	for i := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := rlsReq("edge", "api", "ingest")
			sem := make(chan struct{}, inflight)
			var calls sync.WaitGroup
			defer calls.Wait()
			// Spread the Envoys' phases over one interval.
			next := start.Add(interval * time.Duration(i) / envoys)
			for next.Before(stopAt) {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(interval)
				sem <- struct{}{}
				calls.Add(1)
				go func() {
					defer calls.Done()
					defer func() { <-sem }()
					r, err := clients[i].ShouldRateLimit(ctx, req)
					if err != nil {
						if errs.Add(1) == 1 {
							t.Logf("envoy %d → %s: %v", i, nodes[i%len(nodes)].cfg.Node.ID, err)
						}
						return
					}
					st := r.Statuses[0]
					if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && (st.Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
						st.CurrentLimit.GetRequestsPerUnit() != 1000 || st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() != time.Second) {
						badStatus.Add(1)
					}
				}()
			}
		}()
	}
	time.Sleep(time.Until(start.Add(warmup)))
	ok0, over0, t0 := sample()
	time.Sleep(window)
	ok1, over1, t1 := sample()
	span := t1.Sub(t0).Seconds()
	wg.Wait()
	admitted, sent := ok1-ok0, ok1-ok0+over1-over0
	ratio := admitted / (limit * span)
	offRatio := sent / (limit * span)
	t.Logf("offered %.2f× the limit, admitted %.0f in %.2fs = %.3f× the limit; %d errors", offRatio, admitted, span, ratio, errs.Load())
	for _, s := range nodes {
		for _, ts := range s.rls.Client().TenantStats() {
			t.Logf("%s lease client since start: allowed %v, blocked %v", s.cfg.Node.ID, ts.AllowedBy, ts.BlockedBy)
		}
		st := s.rls.Client().Stats()
		t.Logf("%s: reroutes %d, stream errors %d, stale keys %d", s.cfg.Node.ID, st.Reroutes, st.StreamErrors, st.StaleTenant)
	}
	if errs.Load() > 0 || badStatus.Load() > 0 {
		t.Fatalf("%d calls failed, %d OVER_LIMIT statuses without the limit, 0 remaining and 1 s to reset", errs.Load(), badStatus.Load())
	}
	// The test means something only if the load really was ~5×: on a
	// machine too busy to make 5,000 calls a second it fails saying so.
	if offRatio < 4.5 {
		t.Fatalf("offered only %.2f× the limit: the machine did not keep up with the schedule", offRatio)
	}
	if ratio < 0.95 || ratio > 1.05 {
		t.Fatalf("admitted %.3f× the limit, want within [0.95, 1.05]", ratio)
	}
	// Every node decided some of it, with its own lease.
	for _, s := range nodes {
		if v := counterValue(t, s, "tollgate_envoy_ratelimit_descriptor_decisions_total", map[string]string{"rule": "api_ingest", "decision": "ok"}); v == 0 {
			t.Fatalf("%s admitted nothing", s.cfg.Node.ID)
		}
	}

	// Shadow mode: 10× a 100/s rule for 1.5 s, never OVER_LIMIT.
	shadowEnd := time.Now().Add(1500 * time.Millisecond)
	var over atomic.Int64
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := rlsReq("edge", "api", "canary")
			for time.Now().Before(shadowEnd) {
				r, err := clients[i].ShouldRateLimit(ctx, req)
				if err != nil {
					errs.Add(1)
				} else if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
					over.Add(1)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if over.Load() > 0 || errs.Load() > 0 {
		t.Fatalf("shadow mode: %d answers were not OK, %d errors", over.Load(), errs.Load())
	}
	shadowed := 0.0
	for _, s := range nodes {
		shadowed += counterValue(t, s, "tollgate_envoy_ratelimit_descriptor_decisions_total", map[string]string{"rule": "api_canary", "decision": "shadow_over_limit"})
	}
	if shadowed == 0 {
		t.Fatal("shadow mode counted no request over the limit")
	}
	t.Logf("shadow mode: %v requests over the limit answered OK", shadowed)
}

// hasLease says whether the node holds a limit for the key of a descriptor
// under the rule it matches now.
func hasLease(s *Server, domain string, kv ...string) bool {
	var es []envoyrl.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, envoyrl.Entry{Key: kv[i], Value: kv[i+1]})
	}
	r, _ := envoyrl.NewIndex(s.RuntimeConfig().Envoy).Match(domain, es)
	if r == nil {
		return false
	}
	key := envoyrl.CounterKey(r, es)
	for _, ts := range s.rls.Client().TenantStats() {
		if ts.Tenant == key {
			return ts.HasUpdate && ts.Limit > 0 && !ts.Stale
		}
	}
	return false
}

// leased counts the keys the node's lease client holds a limit for.
func leased(s *Server) int {
	n := 0
	for _, ts := range s.rls.Client().TenantStats() {
		if ts.HasUpdate && ts.Limit > 0 && !ts.Stale {
			n++
		}
	}
	return n
}

// Under mutual TLS the service follows the Tracker's rule: a client needs a
// valid certificate (others are refused by TLS) and, on a node with an admin
// token, a credential; the node's own lease client reaches the owner over
// TLS and gets a lease.
func TestEnvoyRLSUnderMutualTLS(t *testing.T) {
	f := testPKI(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.TLS = nodeTLS(t, f, "n1", tlsutil.ClientAuthRequire)
		c.Access.AdminToken = testToken
	})
	defer stop(t, s)
	good := clientTLS(t, f.Client, f.ClientKey, f.CA)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	yaml := "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if _, err := api.NewConfigClient(tlsDial(t, s.GRPCAddr(), good)).ApplyLimits(
		metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken),
		&api.ApplyLimitsRequest{Config: &api.RuntimeConfig{Envoy: map[string]string{"edge": yaml}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Envoy config", func() bool { return len(s.RuntimeConfig().Envoy) == 1 })
	c := rlsv3.NewRateLimitServiceClient(tlsDial(t, s.GRPCAddr(), good))
	req := rlsReq("edge", "ip", "10.1.2.3")
	warm := rlsReq("edge", "ip", "10.1.2.3")
	warm.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	// A certificate alone is not a credential (unless the credentials file
	// maps it to scopes): on a node with an admin token Envoy sends a token
	// (its grpc_service initial_metadata).
	if _, err := c.ShouldRateLimit(ctx, warm); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("with a client certificate and no token: %v, want Unauthenticated", err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
	if _, err := c.ShouldRateLimit(ctx, warm); err != nil {
		t.Fatalf("with a client certificate and the token: %v", err)
	}
	waitFor(t, "a lease over TLS", func() bool { return hasLease(s, "edge", "ip", "10.1.2.3") })
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r, err := c.ShouldRateLimit(ctx, req)
		if err != nil || r.OverallCode != want {
			t.Fatalf("call %d: %v %v, want %v", i+1, r.GetOverallCode(), err, want)
		}
	}
	for name, cfg := range map[string]*tls.Config{"no client certificate": clientTLS(t, "", "", f.CA), "plaintext": nil} {
		_, err := rlsv3.NewRateLimitServiceClient(tlsDial(t, s.GRPCAddr(), cfg)).ShouldRateLimit(ctx, req)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (refused by TLS)", name, err)
		}
	}
}

// TestEnvoyRLSDetailedMetricBounded: a detailed_metric rule puts request
// values in the rule label; 3,000 distinct values (which once made 12,010
// series) leave at most envoyrls.MaxDetailedLabels values of the label on /metrics,
// the rest counted under the rule's "(overflow)" value, and no decision is
// lost from the counts.
func TestEnvoyRLSDetailedMetricBounded(t *testing.T) {
	s, _ := startServer(t, filepath.Join(t.TempDir(), "data"), func(c *Config) { c.Access.AdminToken = testToken })
	defer stop(t, s)
	applyEnvoy(t, []*Server{s}, map[string]string{"api": `
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unlimited: true}
`})
	c := rlsClient(t, s.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 3000
	for i := range n {
		if _, err := c.ShouldRateLimit(ctx, rlsReq("api", "user", "u"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]bool{}
	series := 0
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_envoy_ratelimit_descriptor_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "rule" {
					rules[lp.GetValue()] = true
				}
			}
		}
	}
	t.Logf("%d distinct values: %d rule label values, %d series", n, len(rules), series)
	if len(rules) > envoyrls.MaxDetailedLabels+1 || !rules["user.(overflow)"] {
		t.Fatalf("%d rule label values (bound %d plus the overflow value; overflow present: %v)", len(rules), envoyrls.MaxDetailedLabels, rules["user.(overflow)"])
	}
	if got := counterValue(t, s, "tollgate_envoy_ratelimit_descriptor_decisions_total", map[string]string{"domain": "api", "decision": "unlimited"}); got != n {
		t.Fatalf("decisions counted %v, want %d", got, n)
	}
}
