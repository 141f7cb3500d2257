package envoyrls

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/ratelease"
)

// Service serves envoy.service.ratelimit.v3.RateLimitService. The node is a
// lease client of the rate owners (package ratelease, the same core
// clientlib/ratelimit embeds in distributors): each request descriptor that
// matches a rule of the replicated Envoy configuration is one rate key
// (envoyrl.CounterKey), decided locally against this node's lease for it —
// no raft entry and no call to the key's owner on the request path. The
// lease client reports consumption every rate period to the leader of the
// key's rate group, which finds the limit from the rule named in the key
// (Rules.Rate), so every node deciding the same key shares one limit.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	newest func() *runtimecfg.Document
	log    *slog.Logger
	client *ratelease.Client

	idx atomic.Pointer[docIndex] // the index of the newest config this node holds

	requests *prometheus.CounterVec // domain, code
	decided  *prometheus.CounterVec // domain, rule, decision
	counters sync.Map               // domain + "\x00" + stats key → *ruleCounters
	detailed atomic.Int64           // rule label values carrying request values (detailed_metric)
}

// MaxDetailedLabels bounds the rule label values that carry request values
// (detailed_metric puts the values of key-only and prefix levels in the
// label): beyond it, further values of a rule are counted under
// "<rule path>.(overflow)", so clients sending ever new values cannot grow
// /metrics without bound (3,000 values once made 12,010 series). Label
// values without request values are bounded by the runtime config.
const MaxDetailedLabels = 1000

type docIndex struct {
	doc *runtimecfg.Document
	idx *envoyrl.Index
}

type ruleCounters struct{ ok, over, shadow, unlimited prometheus.Counter }

// Config is what the service needs of the node.
type Config struct {
	// Client is the node's lease client of the rate owners; the service
	// decides with it and does not close it.
	Client *ratelease.Client
	// Newest returns the newest runtime config this node holds (its
	// envoy rules are matched).
	Newest     func() *runtimecfg.Document
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// New returns the service and registers its metrics.
func New(cfg Config) *Service {
	client := cfg.Client
	e := &Service{newest: cfg.Newest, log: cfg.Logger, client: client,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_envoy_ratelimit_requests_total",
			Help: "ShouldRateLimit calls by domain and overall code (ok, over_limit, invalid). Domains without configuration count as \"(unconfigured)\"."},
			[]string{"domain", "code"}),
		decided: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_envoy_ratelimit_descriptor_decisions_total",
			Help: "Request descriptors that matched a rule, by domain, rule (key_value path; values of key-only levels only with detailed_metric, at most 1000 such values per node, further ones as <path>.(overflow)) and decision (ok, over_limit, shadow_over_limit: over the limit but in shadow mode, unlimited)."},
			[]string{"domain", "rule", "decision"}),
	}
	cfg.Registerer.MustRegister(e.requests, e.decided,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_envoy_ratelimit_keys",
			Help: "Rate keys (rule × descriptor values) this node's lease client has decided."},
			func() float64 { return float64(client.Keys()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_envoy_ratelimit_stale_keys",
			Help: "Rate keys whose owner sent no lease update for StaleAfter (5 s): decided fail-open until it does."},
			func() float64 { return float64(client.Stats().StaleTenant) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_envoy_ratelimit_update_age_seconds",
			Help: "Longest time since an owner stream delivered a lease update to this node's lease client."},
			func() float64 { return client.Stats().UpdateAge.Seconds() }))
	return e
}

// Client is the node's lease client (tests, status).
func (e *Service) Client() *ratelease.Client { return e.client }

// index returns the matcher of the newest runtime config this node holds.
func (e *Service) index() *envoyrl.Index {
	d := e.newest()
	if x := e.idx.Load(); x != nil && x.doc == d {
		return x.idx
	}
	x := &docIndex{doc: d, idx: envoyrl.NewIndex(d.Envoy)}
	e.idx.Store(x)
	return x.idx
}

func (e *Service) ruleCounters(domain string, r *envoyrl.Rule, key string) *ruleCounters {
	k := domain + "\x00" + key
	if c, ok := e.counters.Load(k); ok {
		return c.(*ruleCounters)
	}
	if key != r.Path {
		if e.detailed.Add(1) > MaxDetailedLabels {
			e.detailed.Add(-1)
			key = r.Path + ".(overflow)"
			k = domain + "\x00" + key
			if c, ok := e.counters.Load(k); ok {
				return c.(*ruleCounters)
			}
		}
	}
	c := &ruleCounters{ok: e.decided.WithLabelValues(domain, key, "ok"), over: e.decided.WithLabelValues(domain, key, "over_limit"),
		shadow: e.decided.WithLabelValues(domain, key, "shadow_over_limit"), unlimited: e.decided.WithLabelValues(domain, key, "unlimited")}
	got, _ := e.counters.LoadOrStore(k, c)
	return got.(*ruleCounters)
}

// maxRequestDescriptors bounds one request (Envoy sends a handful).
const maxRequestDescriptors = 64

func (e *Service) invalid(domain string, format string, args ...any) error {
	e.requests.WithLabelValues("(invalid)", "invalid").Inc()
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// ShouldRateLimit decides one request: every descriptor that matches a rule
// is counted with the request's hits against its key; the answer is
// OVER_LIMIT when any non-shadow descriptor is over its limit.
func (e *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	if domain == "" {
		return nil, e.invalid("", "domain: required")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, e.invalid(domain, "descriptors: at least one descriptor is required")
	}
	if len(ds) > maxRequestDescriptors {
		return nil, e.invalid(domain, "descriptors: %d in one request, at most %d", len(ds), maxRequestDescriptors)
	}
	x := e.index()
	if !x.HasDomain(domain) {
		// The reference service answers OK for a domain it has no
		// configuration for; so does this one, and counts it.
		e.requests.WithLabelValues("(unconfigured)", "ok").Inc()
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
		for i := range ds {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return resp, nil
	}
	hits := uint64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1 // the protocol's default
	}
	var stack [4]*envoyrl.Rule
	rules := stack[:0]
	var statsStack [4]string
	stats := statsStack[:0]
	entries := make([][]envoyrl.Entry, len(ds))
	for i, d := range ds {
		if d.GetIsNegativeHits() {
			return nil, e.invalid(domain, "descriptors[%d].is_negative_hits: not supported (a refund of hits); leave it false", i)
		}
		es := d.GetEntries()
		if len(es) == 0 {
			return nil, e.invalid(domain, "descriptors[%d].entries: at least one entry is required", i)
		}
		entries[i] = make([]envoyrl.Entry, len(es))
		for j, en := range es {
			if en.GetKey() == "" {
				return nil, e.invalid(domain, "descriptors[%d].entries[%d].key: required", i, j)
			}
			entries[i][j] = envoyrl.Entry{Key: en.GetKey(), Value: en.GetValue()}
		}
		r, sk := x.Match(domain, entries[i])
		if o := d.GetLimit(); o != nil {
			// Envoy's per-descriptor limit (from its route config): the
			// reference enforces it in place of the configured rule,
			// whether or not one matches, in a counter of its own.
			u := envoyrl.Unit(o.GetUnit()) // envoy.type.v3.RateLimitUnit numbers the units as the response does
			if u.Seconds() == 0 {
				return nil, e.invalid(domain, "descriptors[%d].limit.unit: %v: want SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR", i, o.GetUnit())
			}
			if m := o.GetUnitMultiplier(); m != nil && m.GetValue() != 1 {
				return nil, e.invalid(domain, "descriptors[%d].limit.unit_multiplier: %d: not supported (only 1: one unit)", i, m.GetValue())
			}
			keys := make([]string, len(es))
			for j, en := range es {
				keys[j] = en.GetKey()
			}
			r = envoyrl.OverrideRule(domain, u, o.GetRequestsPerUnit(), keys)
			sk = r.Path
		}
		rules = append(rules, r)
		stats = append(stats, sk)
	}
	envoyrl.Resolve(rules)

	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	tightest := -1
	var tightRemaining uint32
	for i, r := range rules {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		if r == nil {
			continue
		}
		c := e.ruleCounters(domain, r, stats[i])
		if r.Limit.Unlimited {
			st.LimitRemaining = math.MaxUint32
			c.unlimited.Inc()
			continue
		}
		h := hits
		if ha := ds[i].GetHitsAddend(); ha != nil {
			h = ha.GetValue()
		}
		rpu := r.Limit.RequestsPerUnit
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: r.Limit.Name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.Limit.Unit)}
		over, remaining, reset := e.decide(ctx, r, envoyrl.CounterKey(r, entries[i]), h)
		st.LimitRemaining = uint32(remaining)
		st.DurationUntilReset = durationpb.New(reset)
		switch {
		case over && r.ShadowMode:
			c.shadow.Inc()
		case over:
			c.over.Inc()
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		default:
			c.ok.Inc()
		}
		if tightest < 0 || st.LimitRemaining < tightRemaining {
			tightest, tightRemaining = i, st.LimitRemaining
		}
	}
	if tightest >= 0 {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses, tightest)
	}
	code := "ok"
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = "over_limit"
	}
	e.requests.WithLabelValues(domain, code).Inc()
	return resp, nil
}

// decide counts h hits of one descriptor's key under rule r: over says it is
// over the limit; remaining and reset are its limit_remaining and
// duration_until_reset.
//
//   - h = 0 (hits_addend 0: check, don't count) never consumes: it answers
//     from what the node knows (its lease, the owner's last answer).
//   - h more than requests_per_unit can never fit one unit: over, at once
//     (a huge hits_addend is refused, never wrapped).
//   - Otherwise the node's lease decides when it covers h (no call); when
//     it does not (a sliding-window rule), or the node holds none yet (a
//     cold key), the key's owner decides now (ratelease.Client.Ask), so
//     nothing is admitted that the owner did not grant. A per-second rule's
//     lease that does not cover h is over: the leases hold the bucket. The owner unreachable: over, unless the key is
//     stale (owner silent for 5 s), when the node fails open as before.
func (e *Service) decide(ctx context.Context, r *envoyrl.Rule, key string, h uint64) (over bool, remaining uint64, reset time.Duration) {
	rpu := uint64(r.Limit.RequestsPerUnit)
	unit := time.Duration(r.Limit.Unit.Seconds()) * time.Second
	if h == 0 {
		d := e.client.Peek(key)
		remaining = rpu
		if d.Limited {
			remaining = min(d.Remaining, rpu)
		}
		return false, remaining, untilFull(r, remaining)
	}
	if rpu == 0 || h > rpu {
		return true, 0, unit
	}
	d, ask := e.client.Local(key, h)
	if ask && d.Limited && !r.Sliding() {
		// A token bucket's leases hold all of it: a lease that does not
		// cover h is this node's share spent, and the owner would say no.
		e.client.Refuse(key, h)
		return true, 0, unit
	}
	if !ask {
		if d.Limited {
			remaining = min(d.Remaining, rpu)
		} else {
			remaining = rpu // no limit from the owner
		}
		return !d.Allowed, remaining, untilFull(r, remaining)
	}
	a, err := e.client.Ask(ctx, key, h)
	if err != nil {
		if e.client.Stale(key) {
			dec := e.client.Decide(key, h) // fail open, as clientlib does
			return !dec.Allowed, 0, unit
		}
		e.client.Refuse(key, h)
		e.log.Debug("envoy rate limit: owner not reachable; refused", "key", key, "err", err)
		return true, 0, unit
	}
	remaining = min(a.Remaining, rpu)
	if !a.Admitted {
		// Whole seconds, as the reference reports, at least one.
		reset = (a.NextFree + time.Second - 1).Truncate(time.Second)
		if reset <= 0 || reset > unit || !r.Sliding() {
			reset = unit
		}
		return true, 0, reset
	}
	return false, remaining, untilFull(r, remaining)
}

// untilFull is the descriptor's duration_until_reset: how long until the
// key's bucket holds a whole unit's worth again if nothing more is admitted,
// (requests_per_unit − remaining) ÷ rate, in whole seconds (at least one
// while anything is used). Tollgate enforces a rule as a token bucket
// refilling continuously at requests_per_unit per unit, not as fixed windows,
// so there is no window edge to count down to.
func untilFull(r *envoyrl.Rule, remaining uint64) time.Duration {
	rpu := uint64(r.Limit.RequestsPerUnit)
	if rpu == 0 || remaining >= rpu {
		return 0
	}
	unit := r.Limit.Unit.Seconds()
	secs := (int64(rpu-remaining)*unit + int64(rpu) - 1) / int64(rpu)
	return time.Duration(max(secs, 1)) * time.Second
}

// rateLimitHeaders are the x-ratelimit-* headers of the draft IETF RateLimit
// header fields (version 03), as Envoy's own rate limit filter emits them:
// limit "<tightest>, <n>;w=<unit seconds>" for every limited descriptor,
// remaining and reset (seconds) of the tightest.
func rateLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus, tightest int) []*corev3.HeaderValue {
	t := sts[tightest]
	limit := strconv.FormatUint(uint64(t.CurrentLimit.RequestsPerUnit), 10)
	for _, st := range sts {
		if cl := st.CurrentLimit; cl != nil {
			limit += ", " + strconv.FormatUint(uint64(cl.RequestsPerUnit), 10) + ";w=" + strconv.FormatInt(envoyrl.Unit(cl.Unit).Seconds(), 10)
		}
	}
	reset := int64(0)
	if t.DurationUntilReset != nil {
		reset = t.DurationUntilReset.Seconds
	}
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: limit},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatUint(uint64(t.LimitRemaining), 10)},
		{Key: "x-ratelimit-reset", Value: strconv.FormatInt(reset, 10)},
	}
}

// Rules keeps the Envoy matchers of the few documents the groups' replicas
// hold (one, except while a change is being installed), for the owner side
// of Envoy counter keys. The zero value is ready.
type Rules struct {
	mu sync.Mutex
	m  map[*runtimecfg.Document]*envoyrl.Index
}

// Rate is the owner-side limit of an Envoy counter key: the rule named in
// the key, read from d, the owning group's replica of the runtime config
// (the copy that group's leader decides with, as for tenants' ingestion
// rates). A rule the replica does not hold (yet) has no limit.
func (c *Rules) Rate(d *runtimecfg.Document, key string) (float64, int64) {
	id := envoyrl.RuleIDOf(key)
	if id == "" || len(d.Envoy) == 0 {
		return 0, 0
	}
	r := c.get(d).RuleByID(id)
	if r == nil {
		return 0, 0
	}
	return r.Rate()
}

// Sliding says whether an Envoy counter key's rule in d, the owning group's
// replica, is enforced as a sliding window (a unit longer than a second)
// rather than a token bucket; see docs/envoy.md.
func (c *Rules) Sliding(d *runtimecfg.Document, key string) bool {
	id := envoyrl.RuleIDOf(key)
	if id == "" || len(d.Envoy) == 0 {
		return false
	}
	r := c.get(d).RuleByID(id)
	return r != nil && r.Sliding()
}

func (c *Rules) get(d *runtimecfg.Document) *envoyrl.Index {
	c.mu.Lock()
	defer c.mu.Unlock()
	if x := c.m[d]; x != nil {
		return x
	}
	if c.m == nil || len(c.m) >= 8 {
		c.m = map[*runtimecfg.Document]*envoyrl.Index{}
	}
	x := envoyrl.NewIndex(d.Envoy)
	c.m[d] = x
	return x
}
