package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
)

// Tracker decides which series of a tenant may go in: clientlib.Client.
type Tracker interface {
	TrackSeries(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error)
}

// RateLimiter admits n samples of a tenant now or not: the Allow of
// clientlib/ratelimit.Client (leases from the tenant's rate owner).
type RateLimiter interface {
	Allow(tenant string, n int) bool
}

// PartitionLimiter decides a request against per-partition series limits:
// clientlib/partitionlimit.Limiter.
type PartitionLimiter interface {
	Check(tenant string, req []partitionlimit.Series) error
}

// Limits are a tenant's limits as the gateway names them in its answers.
type Limits struct {
	MaxSeries     int64   // 0: not in the runtime config (the nodes' default applies)
	IngestionRate float64 // samples/s, 0 = off
	Burst         int64
}

// Defaults of Config's zero values.
const (
	DefaultTenantHeader         = "X-Scope-OrgID"
	DefaultMaxRequestBytes      = 10 << 20
	DefaultMaxDecompressedBytes = 50 << 20
	DefaultMaxInflight          = 256
	DefaultTrackTimeout         = 5 * time.Second
	DefaultUpstreamTimeout      = 30 * time.Second
	DefaultMaxFreshSeries       = 2_000_000
)

// Config configures a Gateway. Zero values take the defaults above.
type Config struct {
	// Upstream is the remote-write URL every accepted request is posted to
	// (http://mimir:8080/api/v1/push, http://prometheus:9090/api/v1/write).
	Upstream string
	// UpstreamClient posts to Upstream (its transport carries TLS); nil: a
	// client of its own.
	UpstreamClient *http.Client
	// UpstreamTimeout bounds one forward; past it the sender gets 504.
	UpstreamTimeout time.Duration
	// UpstreamReadyURL, when set, is what /readyz GETs (2xx = ready); else
	// /readyz only checks that the upstream's host accepts a connection.
	UpstreamReadyURL string
	// UpstreamHeaders are set on every forwarded request (after the
	// pass-through ones, so they win): credentials of the backend, a fixed
	// tenant.
	UpstreamHeaders map[string]string
	// PassHeaders are copied from the incoming request when present (the
	// tenant header, Content-Type, Content-Encoding, User-Agent and the
	// remote-write version are always passed).
	PassHeaders []string

	// TenantHeader names the tenant (default X-Scope-OrgID). A request
	// without it is refused (401) unless DefaultTenant is set.
	TenantHeader  string
	DefaultTenant string

	// FailOpen: when Tollgate cannot answer (clientlib.IsFailOpenable) the
	// series it did not decide are forwarded; otherwise the request gets
	// 503 and the sender retries. FailOpenTenants overrides it per tenant.
	FailOpen        bool
	FailOpenTenants map[string]bool

	Tracker      Tracker
	TrackTimeout time.Duration
	// Rate, when set, limits samples per second per tenant (429).
	Rate RateLimiter
	// Limits, when set, gives the limits named in 400 and 429 answers.
	Limits func(tenant string) Limits

	MaxRequestBytes      int64
	MaxDecompressedBytes int64
	// MaxInflight bounds the requests being decided and forwarded at once;
	// more get 503 with Retry-After at once, before their body is read.
	MaxInflight int

	// PartitionLimit, when set, caps the distinct series a tenant writes to
	// one ingest partition of a partitioned upstream over a sliding window
	// (max_series_per_partition; clientlib/partitionlimit.Limiter): a request
	// that would take a partition over it is refused whole (429), before
	// anything is tracked. Partition maps a series id to its partition.
	PartitionLimit PartitionLimiter
	Partition      func(hash uint64) int32

	// RefreshInterval: a series Tollgate accepted is tracked again only
	// after one to two intervals, not on every request (see fresh.go for why
	// the limits stay exact); 0 tracks every series of every request. At most
	// MaxFreshSeries accepted series are remembered per interval.
	RefreshInterval time.Duration
	MaxFreshSeries  int

	// ClusterReady reports whether Tollgate can decide (nil: always).
	ClusterReady func() error

	Registerer prometheus.Registerer // nil: a registry of its own
	Gatherer   prometheus.Gatherer   // what /metrics serves (nil: that registry)
	Logger     *slog.Logger
}

// Gateway is the remote-write handler. Safe for concurrent use.
type Gateway struct {
	cfg      Config
	up       *url.URL
	client   *http.Client
	log      *slog.Logger
	sem      chan struct{}
	m        *metrics
	gatherer prometheus.Gatherer
	stopping atomic.Bool
	fresh    *fresh // nil: track every request
	// refreshing bounds the background refreshes in flight (fresh.split);
	// refreshWG waits for them (Wait).
	refreshing chan struct{}
	refreshWG  sync.WaitGroup
}

// maxRefreshes bounds the background refreshes in flight.
const maxRefreshes = 4

// refreshAhead tracks series that are still fresh but will not be within
// an interval (fresh.split), off the request's path.
func (g *Gateway) refreshAhead(tenant string, hs []uint64) {
	defer func() { <-g.refreshing; g.refreshWG.Done() }()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.TrackTimeout)
	defer cancel()
	t0 := time.Now()
	rejected, err := g.cfg.Tracker.TrackSeries(ctx, tenant, hs)
	g.m.trackDuration.Observe(time.Since(t0).Seconds())
	switch {
	case err != nil:
		// Left to go stale: a later request decides them.
		g.fresh.forget(tenant, hs)
		g.m.refreshes.WithLabelValues("failed").Inc()
	case len(rejected) > 0:
		// Not expected (an accepted, active series stays accepted), but
		// if Tollgate says so, later requests ask again.
		g.fresh.forget(tenant, rejected)
		g.m.refreshes.WithLabelValues("rejected").Inc()
		g.log.Warn("gateway: a background refresh was rejected", "tenant", tenant, "series", len(rejected))
	default:
		g.m.refreshes.WithLabelValues("ok").Inc()
	}
}

// WaitRefreshes waits for the background refreshes in flight (for a
// graceful stop, before the Tollgate client closes).
func (g *Gateway) WaitRefreshes() { g.refreshWG.Wait() }

// New checks cfg and returns a gateway.
func New(cfg Config) (*Gateway, error) {
	if cfg.Tracker == nil {
		return nil, errors.New("gateway: Config.Tracker is nil")
	}
	if (cfg.PartitionLimit == nil) != (cfg.Partition == nil) {
		return nil, errors.New("gateway: PartitionLimit and Partition go together")
	}
	up, err := url.Parse(cfg.Upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("gateway: upstream %q is not an http(s) URL", cfg.Upstream)
	}
	if cfg.TenantHeader == "" {
		cfg.TenantHeader = DefaultTenantHeader
	}
	if cfg.DefaultTenant != "" {
		if err := api.ValidateTenantID(cfg.DefaultTenant); err != nil {
			return nil, fmt.Errorf("gateway: default tenant: %w", err)
		}
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.MaxRequestBytes, DefaultMaxRequestBytes)
	def(&cfg.MaxDecompressedBytes, DefaultMaxDecompressedBytes)
	if cfg.MaxRequestBytes < 0 || cfg.MaxDecompressedBytes < 0 {
		return nil, errors.New("gateway: negative size bound")
	}
	if cfg.MaxInflight == 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.MaxInflight < 0 {
		return nil, errors.New("gateway: negative MaxInflight")
	}
	if cfg.TrackTimeout == 0 {
		cfg.TrackTimeout = DefaultTrackTimeout
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	client := cfg.UpstreamClient
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.MaxInflight
		client = &http.Client{Transport: tr}
	}
	g := &Gateway{cfg: cfg, up: up, client: client, log: cfg.Logger, sem: make(chan struct{}, cfg.MaxInflight),
		refreshing: make(chan struct{}, maxRefreshes)}
	if cfg.RefreshInterval < 0 || cfg.RefreshInterval > 30*time.Second {
		return nil, fmt.Errorf("gateway: refresh interval %v: must be in [0, 30s] (a series must be refreshed within a minute to stay active)", cfg.RefreshInterval)
	}
	if cfg.RefreshInterval > 0 {
		if cfg.MaxFreshSeries <= 0 {
			cfg.MaxFreshSeries = DefaultMaxFreshSeries
		}
		g.fresh = newFresh(cfg.RefreshInterval, cfg.MaxFreshSeries, time.Now)
	}
	reg := cfg.Registerer
	gath := cfg.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg = r
		if gath == nil {
			gath = r
		}
	}
	if gath == nil {
		gath = prometheus.DefaultGatherer
	}
	g.gatherer = gath
	g.m, err = newMetrics(reg, g)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Handler serves POST /api/v1/push and /api/v1/write (remote write),
// /metrics, /readyz and /healthz.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/push", g.servePush)
	mux.HandleFunc("/api/v1/write", g.servePush)
	mux.Handle("/metrics", promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", g.serveReady)
	return mux
}

// BeginShutdown makes /readyz fail, so load balancers stop sending while
// the HTTP server drains the requests in flight.
func (g *Gateway) BeginShutdown() { g.stopping.Store(true) }

// Ready reports why the gateway should not get traffic, or nil.
func (g *Gateway) Ready(ctx context.Context) error {
	if g.stopping.Load() {
		return errors.New("shutting down")
	}
	if g.cfg.ClusterReady != nil {
		if err := g.cfg.ClusterReady(); err != nil {
			return fmt.Errorf("tollgate: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if g.cfg.UpstreamReadyURL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.cfg.UpstreamReadyURL, nil)
		if err != nil {
			return fmt.Errorf("upstream ready URL: %w", err)
		}
		resp, err := g.client.Do(req)
		if err != nil {
			return fmt.Errorf("upstream: %w", err)
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("upstream: %s answered %s", g.cfg.UpstreamReadyURL, resp.Status)
		}
		return nil
	}
	host := g.up.Host
	if g.up.Port() == "" {
		port := "80"
		if g.up.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(g.up.Hostname(), port)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	c.Close()
	return nil
}

func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	if err := g.Ready(r.Context()); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ready\n")
}

// answer is what the sender gets.
type answer struct {
	code       int
	msg        string
	retryAfter string
	header     http.Header // from the upstream (2.0 written counts)
	// upstream: how long the forward to the upstream took (zero: not
	// forwarded); the rest of the request's time is the gateway's own.
	upstream time.Duration
}

func (g *Gateway) servePush(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	a := g.push(r)
	for _, h := range []string{headerSamplesWritten, headerHistogramsWritten, headerExemplarsWritten} {
		if v := a.header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	g.m.requests.WithLabelValues(strconv.Itoa(a.code)).Inc()
	took := time.Since(start)
	g.m.duration.Observe(took.Seconds())
	g.m.own.Observe((took - a.upstream).Seconds())
	if a.code/100 == 2 {
		w.WriteHeader(a.code)
		return
	}
	if a.code >= 500 {
		g.log.Warn("gateway: request failed", "code", a.code, "msg", a.msg)
	}
	http.Error(w, a.msg, a.code)
}

func (g *Gateway) push(r *http.Request) answer {
	if r.Method != http.MethodPost {
		return answer{code: http.StatusMethodNotAllowed, msg: "remote write needs POST"}
	}
	select {
	case g.sem <- struct{}{}:
		defer func() { <-g.sem }()
	default:
		return answer{code: http.StatusServiceUnavailable, retryAfter: "1",
			msg: fmt.Sprintf("gateway at its limit of %d requests in flight (max_inflight): retry", g.cfg.MaxInflight)}
	}
	g.m.inflight.Inc()
	defer g.m.inflight.Dec()

	tenant := r.Header.Get(g.cfg.TenantHeader)
	if tenant == "" {
		tenant = g.cfg.DefaultTenant
	}
	if tenant == "" {
		return answer{code: http.StatusUnauthorized, msg: fmt.Sprintf("no tenant: the %s header is missing and no default tenant is set", g.cfg.TenantHeader)}
	}
	if err := api.ValidateTenantID(tenant); err != nil {
		return answer{code: http.StatusBadRequest, msg: fmt.Sprintf("%s header: %v", g.cfg.TenantHeader, err)}
	}
	proto, err := negotiate(r.Header.Get("Content-Type"), r.Header.Get("Content-Encoding"))
	if err != nil {
		return answer{code: http.StatusUnsupportedMediaType, msg: err.Error()}
	}
	if r.ContentLength > g.cfg.MaxRequestBytes {
		return g.invalid(tenant, http.StatusRequestEntityTooLarge, fmt.Sprintf("body of %d bytes is over the limit of %d bytes (max_request_bytes)", r.ContentLength, g.cfg.MaxRequestBytes))
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.cfg.MaxRequestBytes+1))
	if err != nil {
		return g.invalid(tenant, http.StatusBadRequest, fmt.Sprintf("read body: %v", err))
	}
	if int64(len(body)) > g.cfg.MaxRequestBytes {
		return g.invalid(tenant, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is over the limit of %d bytes (max_request_bytes)", g.cfg.MaxRequestBytes))
	}
	raw, err := decompress(body, g.cfg.MaxDecompressedBytes)
	if tl := (*tooLargeError)(nil); errors.As(err, &tl) {
		return g.invalid(tenant, http.StatusRequestEntityTooLarge, err.Error())
	} else if err != nil {
		return g.invalid(tenant, http.StatusBadRequest, err.Error())
	}
	b, err := decode(proto, raw)
	if err != nil {
		return g.invalid(tenant, http.StatusBadRequest, err.Error())
	}
	return g.decide(r, tenant, body, b)
}

// invalid counts a request refused before any series was read from it.
func (g *Gateway) invalid(tenant string, code int, msg string) answer {
	g.m.invalid.WithLabelValues(tenant).Inc()
	return answer{code: code, msg: msg}
}

func (g *Gateway) decide(r *http.Request, tenant string, body []byte, b *batch) answer {
	m := g.m
	n := b.series()
	if n == 0 {
		// Metadata only (or nothing): nothing to limit.
		return g.forward(r, tenant, body, b, 0, 0, 0)
	}
	if g.cfg.Rate != nil && b.total > 0 && !g.cfg.Rate.Allow(tenant, b.total) {
		m.count(tenant, "rejected", "rate_limit", n, b.total)
		msg := fmt.Sprintf("user=%s: the request has been rejected because the tenant exceeded the ingestion rate limit", tenant)
		if g.cfg.Limits != nil {
			l := g.cfg.Limits(tenant)
			msg += fmt.Sprintf(", set to %g samples/s with a maximum allowed burst of %d", l.IngestionRate, l.Burst)
		}
		msg += fmt.Sprintf(" (err-mimir-tenant-max-ingestion-rate): %d samples in %d series refused; reduce the rate or raise ingestion_rate for the tenant", b.total, n)
		return answer{code: http.StatusTooManyRequests, msg: msg, retryAfter: "1"}
	}

	hashes := unique(b.hashes)
	if g.cfg.PartitionLimit != nil {
		byPart := map[int32][]uint64{}
		for _, h := range hashes {
			p := g.cfg.Partition(h)
			byPart[p] = append(byPart[p], h)
		}
		req := make([]partitionlimit.Series, 0, len(byPart))
		for p, hs := range byPart {
			req = append(req, partitionlimit.Series{Partition: p, Hashes: hs})
		}
		if err := g.cfg.PartitionLimit.Check(tenant, req); err != nil {
			if !errors.Is(err, partitionlimit.ErrLimitExceeded) {
				m.count(tenant, "rejected", "tollgate_error", n, b.total)
				return answer{code: http.StatusInternalServerError, msg: fmt.Sprintf("user=%s: per-partition limit: %v", tenant, err)}
			}
			m.count(tenant, "rejected", "partition_limit", n, b.total)
			return answer{code: http.StatusTooManyRequests, retryAfter: "60",
				msg: fmt.Sprintf("user=%s: per-partition series limit exceeded: %v", tenant, err)}
		}
	}
	if g.fresh != nil {
		var ahead []uint64
		hashes, ahead = g.fresh.split(tenant, hashes)
		if len(ahead) > 0 {
			select {
			case g.refreshing <- struct{}{}:
				g.refreshWG.Add(1)
				go g.refreshAhead(tenant, ahead)
			default:
				// Refreshes at their limit: left to a later request, not
				// waited for here. They are still fresh (the previous
				// interval holds them until its rotation), so the next
				// request that carries one tries again, and one not
				// refreshed by then is decided on its request. Waiting
				// here was the gateway's slowest path at steady load
				// (~0.8% of requests past 2 ms of their own time when
				// the series accepted together went stale together).
				g.fresh.forget(tenant, ahead)
				g.m.refreshes.WithLabelValues("deferred").Inc()
			}
		}
	}
	var rejected []uint64
	var err error
	if len(hashes) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), g.cfg.TrackTimeout)
		t0 := time.Now()
		rejected, err = g.cfg.Tracker.TrackSeries(ctx, tenant, hashes)
		cancel()
		m.trackDuration.Observe(time.Since(t0).Seconds())
		if err == nil && g.fresh != nil {
			g.fresh.accepted(tenant, hashes, rejected)
		}
	}
	failedOpen := false
	if err != nil {
		if !clientlib.IsFailOpenable(err) {
			m.count(tenant, "rejected", "tollgate_error", n, b.total)
			return answer{code: http.StatusInternalServerError, msg: fmt.Sprintf("user=%s: Tollgate refused the request: %v", tenant, err)}
		}
		if !g.failOpen(tenant) {
			m.failOpen.WithLabelValues(tenant, "closed").Inc()
			m.count(tenant, "rejected", "tollgate_unavailable", n, b.total)
			return answer{code: http.StatusServiceUnavailable, retryAfter: "1",
				msg: fmt.Sprintf("user=%s: Tollgate could not decide on the series (the tenant fails closed): %v; retry", tenant, err)}
		}
		m.failOpen.WithLabelValues(tenant, "open").Inc()
		failedOpen = true
	}
	var drop map[uint64]bool
	if len(rejected) > 0 {
		drop = make(map[uint64]bool, len(rejected))
		for _, h := range rejected {
			drop[h] = true
		}
	}
	keptSeries, keptSamples := n, b.total
	fwd := body
	if drop != nil {
		keptSeries, keptSamples = 0, 0
		for i, h := range b.hashes {
			if !drop[h] {
				keptSeries++
				keptSamples += b.samples[i]
			}
		}
		if keptSeries > 0 || b.hasMetadata() {
			fwd, keptSeries, keptSamples, err = b.filter(drop)
			if err != nil {
				return answer{code: http.StatusInternalServerError, msg: err.Error()}
			}
		} else {
			fwd = nil
		}
	}
	reason := "within_limit"
	if failedOpen {
		reason = "fail_open"
	}
	m.count(tenant, "accepted", reason, keptSeries, keptSamples)
	if drop != nil {
		m.count(tenant, "rejected", "series_limit", n-keptSeries, b.total-keptSamples)
	}
	var a answer
	if fwd != nil {
		a = g.forward(r, tenant, fwd, b, keptSeries, keptSamples, len(rejected))
	} else {
		a = answer{code: http.StatusNoContent, header: http.Header{}}
		if b.proto == protoV2 {
			for _, h := range []string{headerSamplesWritten, headerHistogramsWritten, headerExemplarsWritten} {
				a.header.Set(h, "0")
			}
		}
	}
	if drop == nil || a.code/100 == 5 || a.code == http.StatusTooManyRequests {
		return a
	}
	// Series over the limit: the rest went in; 400 so the sender does not
	// retry what would be refused again.
	msg := fmt.Sprintf("user=%s: per-user series limit", tenant)
	if g.cfg.Limits != nil {
		if l := g.cfg.Limits(tenant).MaxSeries; l > 0 {
			msg += fmt.Sprintf(" of %d", l)
		}
	}
	msg += fmt.Sprintf(" exceeded (err-mimir-max-series-per-user): %d of %d series rejected, %d accepted and forwarded; to adjust the limit raise max_series for the tenant, or contact your service administrator", n-keptSeries, n, keptSeries)
	if a.code/100 != 2 {
		msg += "; upstream: " + a.msg
	}
	a.code = http.StatusBadRequest
	a.msg = msg
	return a
}

func (g *Gateway) failOpen(tenant string) bool {
	if v, ok := g.cfg.FailOpenTenants[tenant]; ok {
		return v
	}
	return g.cfg.FailOpen
}

// forward posts body to the upstream and turns its answer into the
// sender's: 2xx and 4xx as they are, 5xx, a timeout (504) or an
// unreachable upstream (502) as 5xx so the sender retries.
func (g *Gateway) forward(r *http.Request, tenant string, body []byte, b *batch, series, samples, rejected int) answer {
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.UpstreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.cfg.Upstream, bytes.NewReader(body))
	if err != nil {
		return answer{code: http.StatusInternalServerError, msg: err.Error()}
	}
	for _, h := range append([]string{"Content-Type", "Content-Encoding", "User-Agent", headerVersion}, g.cfg.PassHeaders...) {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	if req.Header.Get("Content-Encoding") == "" {
		req.Header.Set("Content-Encoding", "snappy")
	}
	req.Header.Set(g.cfg.TenantHeader, tenant)
	for k, v := range g.cfg.UpstreamHeaders {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := g.client.Do(req)
	if err != nil {
		class := "unreachable"
		code := http.StatusBadGateway
		if ctx.Err() != nil && r.Context().Err() == nil {
			class, code = "timeout", http.StatusGatewayTimeout
		}
		up := time.Since(t0)
		g.m.upstream.WithLabelValues(class).Observe(up.Seconds())
		return answer{code: code, msg: fmt.Sprintf("upstream %s: %v; retry", class, err), upstream: up}
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	up := time.Since(t0)
	g.m.upstream.WithLabelValues(strconv.Itoa(resp.StatusCode/100) + "xx").Observe(up.Seconds())
	a := answer{code: resp.StatusCode, header: resp.Header, upstream: up}
	if resp.StatusCode/100 != 2 {
		a.msg = fmt.Sprintf("upstream answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			a.retryAfter = ra
		}
	}
	if resp.StatusCode/100 == 2 {
		g.m.forwarded.WithLabelValues(tenant).Add(float64(samples))
	}
	return a
}

// unique returns the distinct hashes in first-seen order: the input itself
// when nothing repeats, which is the usual case.
func unique(hs []uint64) []uint64 {
	seen := make(map[uint64]struct{}, len(hs))
	var out []uint64 // nil until the first repeat
	for i, h := range hs {
		if _, dup := seen[h]; dup {
			if out == nil {
				out = append(make([]uint64, 0, len(hs)), hs[:i]...)
			}
			continue
		}
		seen[h] = struct{}{}
		if out != nil {
			out = append(out, h)
		}
	}
	if out == nil {
		return hs
	}
	return out
}
