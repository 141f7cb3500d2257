package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
	"github.com/tollgate-io/tollgate/gateway"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// gatewaySettings is everything `tollgate gateway` reads, bound once in
// options() to a flag, a YAML key and an environment variable, like the
// server's settings (config.go).
type gatewaySettings struct {
	listen        string
	addrs         string
	upstream      string
	upstreamReady string
	upstreamTO    time.Duration
	upHeaders     []string
	passHeaders   []string
	upCA, upCert  string
	upKey         string
	tenantHeader  string
	defaultTenant string
	failOpen      bool
	openTenants   []string
	closedTenants []string
	trackMode     string
	trackTimeout  time.Duration
	refresh       time.Duration
	maxFresh      int
	rateStrategy  string
	upParts       int
	partFunc      string
	maxRequest    int64
	maxDecomp     int64
	maxInflight   int
	// Tollgate connection, as the client commands name it.
	ca, cert, key, serverName string
	token, tokenFile          string
	// Serving TLS.
	lCert, lKey, lCA, lClientAuth string
	shutdownTimeout               time.Duration
	logLevel, logFormat           string

	configFile string
	source     map[string]string
}

func newGatewaySettings() *gatewaySettings {
	return &gatewaySettings{
		listen: "127.0.0.1:7390", addrs: "127.0.0.1:7300", upstreamTO: gateway.DefaultUpstreamTimeout,
		passHeaders: []string{"Authorization"}, tenantHeader: gateway.DefaultTenantHeader,
		trackMode: "sync", trackTimeout: gateway.DefaultTrackTimeout, rateStrategy: "lease",
		refresh: 30 * time.Second, partFunc: "range", maxFresh: gateway.DefaultMaxFreshSeries,
		maxRequest: gateway.DefaultMaxRequestBytes, maxDecomp: gateway.DefaultMaxDecompressedBytes,
		maxInflight: gateway.DefaultMaxInflight, lClientAuth: "none", shutdownTimeout: 30 * time.Second,
		logLevel: "info", logFormat: "text", source: map[string]string{},
	}
}

func (s *gatewaySettings) options() []option {
	return []option{
		{"listen", &s.listen, "remote-write listen address (POST /api/v1/push and /api/v1/write; also /metrics, /readyz, /healthz)"},
		{"addr", &s.addrs, "gRPC addresses of Tollgate nodes, comma-separated (the cluster view names the rest)"},
		{"upstream", &s.upstream, "remote-write URL accepted requests are posted to (required), e.g. http://mimir:8080/api/v1/push"},
		{"upstream-ready-url", &s.upstreamReady, "URL /readyz GETs to check the upstream (2xx = ready), e.g. http://mimir:8080/ready; empty: a TCP connect to the upstream"},
		{"upstream-timeout", &s.upstreamTO, "bound of one forward; past it the sender gets 504 and retries"},
		{"upstream-header", &s.upHeaders, "header set on every forwarded request, Name=value (repeated or comma-separated); wins over a passed-through one"},
		{"pass-header", &s.passHeaders, "request headers copied to the upstream when present (the tenant header, Content-Type, Content-Encoding, User-Agent and the remote-write version always are)"},
		{"upstream-cacert", &s.upCA, "CA certificate (PEM) verifying an https upstream (default: the system's roots)"},
		{"upstream-cert", &s.upCert, "client certificate (PEM) presented to the upstream"},
		{"upstream-key", &s.upKey, "private key of --upstream-cert"},
		{"tenant-header", &s.tenantHeader, "header naming the tenant; sent to the upstream under the same name"},
		{"default-tenant", &s.defaultTenant, "tenant of requests without the tenant header; empty: such requests are refused (401)"},
		{"fail-open", &s.failOpen, "when Tollgate cannot answer, forward the undecided series (else 503, the sender retries)"},
		{"fail-open-tenants", &s.openTenants, "tenants that fail open whatever --fail-open says"},
		{"fail-closed-tenants", &s.closedTenants, "tenants that fail closed whatever --fail-open says"},
		{"track-mode", &s.trackMode, "sync (wait for every partition's answer: the limit is exact) or auto (clientlib's near-limit mode: tenants far from their limit are answered without waiting, a rare bounded overshoot)"},
		{"track-timeout", &s.trackTimeout, "bound of Tollgate's decision on one request; past it the request fails open or closed"},
		{"refresh-interval", &s.refresh, "a series Tollgate accepted is tracked again after one to two of these, not on every request (≤ 30s, so an active series is refreshed every minute); 0: track every series of every request"},
		{"max-fresh-series", &s.maxFresh, "most accepted series remembered per refresh interval (about 16 bytes each, two intervals kept); beyond, series are tracked on every request"},
		{"upstream-partitions", &s.upParts, "ingest partitions of a partitioned upstream: with N > 0, max_series_per_partition is enforced per partition over the nodes' sketch window (429 for the whole request); 0: off"},
		{"partition-function", &s.partFunc, "how a series id maps to an upstream partition: range (⌊id·N / 2^64⌋, contiguous ranges of the hash space) or modulo (id mod N)"},
		{"rate-strategy", &s.rateStrategy, "samples/s limits (ingestion_rate, ingestion_burst): lease, blocklist, local, or off"},
		{"max-request-bytes", &s.maxRequest, "largest compressed body accepted (413 beyond)"},
		{"max-decompressed-bytes", &s.maxDecomp, "largest decompressed body accepted (413 beyond)"},
		{"max-inflight", &s.maxInflight, "most requests decided and forwarded at once (503 with Retry-After beyond)"},
		{"cacert", &s.ca, "CA certificate (PEM) of the Tollgate nodes; turns TLS to Tollgate on"},
		{"cert", &s.cert, "client certificate (PEM) for Tollgate clusters that require one"},
		{"key", &s.key, "private key of --cert"},
		{"tls-server-name", &s.serverName, "name to verify in the Tollgate nodes' certificates (default: the host dialled)"},
		{"client-token", &s.token, "bearer token for Tollgate clusters with credentials (track scope); prefer TOLLGATE_CLIENT_TOKEN or --client-token-file (a flag is visible in ps)"},
		{"client-token-file", &s.tokenFile, "read --client-token from this file"},
		{"listen-tls-cert", &s.lCert, "certificate (PEM): serve HTTPS on --listen"},
		{"listen-tls-key", &s.lKey, "private key of --listen-tls-cert"},
		{"listen-tls-ca", &s.lCA, "CA verifying senders' client certificates"},
		{"listen-tls-client-auth", &s.lClientAuth, "senders' client certificates: none, request or require"},
		{"shutdown-timeout", &s.shutdownTimeout, "how long SIGTERM waits for requests in flight"},
		{"log-level", &s.logLevel, "debug, info, warn or error"},
		{"log-format", &s.logFormat, "text or json"},
	}
}

func (s *gatewaySettings) bind(f *pflag.FlagSet) {
	f.StringVar(&s.configFile, "config", "", "YAML config file; keys are the flag names with underscores (env TOLLGATE_CONFIG)")
	bindOptions(f, s.options())
}

// load fills what the command line did not set (flag > environment > file >
// default) and checks every setting, reporting every problem at once.
func (s *gatewaySettings) load(f *pflag.FlagSet, lookupEnv func(string) (string, bool)) error {
	if err := loadOptions(f, lookupEnv, &s.configFile, s.options(), s.source); err != nil {
		return err
	}
	var errs []error
	bad := func(flag, format string, args ...any) {
		from := ""
		if src := s.source[flag]; src != "" && src != "default" {
			from = " (from " + src + ")"
		}
		errs = append(errs, fmt.Errorf("%s: %s%s", strings.ReplaceAll(flag, "-", "_"), fmt.Sprintf(format, args...), from))
	}
	if _, _, err := net.SplitHostPort(s.listen); err != nil {
		bad("listen", "%q is not host:port", s.listen)
	}
	if len(splitAddrs(s.addrs)) == 0 {
		bad("addr", "no Tollgate address given")
	}
	if s.upstream == "" {
		bad("upstream", "required: the remote-write URL of the backend")
	} else if u, err := url.Parse(s.upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("upstream", "%q is not an http(s) URL", s.upstream)
	}
	for _, h := range s.upHeaders {
		if k, _, ok := strings.Cut(h, "="); !ok || strings.TrimSpace(k) == "" {
			bad("upstream-header", "%q: want Name=value", h)
		}
	}
	if s.tenantHeader == "" {
		bad("tenant-header", "empty")
	}
	if s.trackMode != "sync" && s.trackMode != "auto" {
		bad("track-mode", "%q: use sync or auto", s.trackMode)
	}
	if s.rateStrategy != "off" {
		if _, err := ratelimit.ParseStrategy(s.rateStrategy); err != nil {
			bad("rate-strategy", "%q: use lease, blocklist, local or off", s.rateStrategy)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"upstream-timeout", s.upstreamTO}, {"track-timeout", s.trackTimeout}, {"shutdown-timeout", s.shutdownTimeout}} {
		if d.v <= 0 {
			bad(d.flag, "%v: must be > 0", d.v)
		}
	}
	if s.refresh < 0 || s.refresh > 30*time.Second {
		bad("refresh-interval", "%v: must be in [0, 30s]", s.refresh)
	}
	if s.upParts < 0 {
		bad("upstream-partitions", "%d is negative (0: off)", s.upParts)
	}
	if s.partFunc != "range" && s.partFunc != "modulo" {
		bad("partition-function", "%q: use range or modulo", s.partFunc)
	}
	if s.maxFresh < 1 {
		bad("max-fresh-series", "%d: must be ≥ 1", s.maxFresh)
	}
	if s.maxRequest < 1 {
		bad("max-request-bytes", "%d: must be ≥ 1", s.maxRequest)
	}
	if s.maxDecomp < 1 {
		bad("max-decompressed-bytes", "%d: must be ≥ 1", s.maxDecomp)
	}
	if s.maxInflight < 1 {
		bad("max-inflight", "%d: must be ≥ 1", s.maxInflight)
	}
	if _, err := tlsutil.ParseClientAuth(s.lClientAuth); err != nil {
		bad("listen-tls-client-auth", "%v", err)
	}
	if (s.lCert == "") != (s.lKey == "") {
		bad("listen-tls-cert", "give both listen_tls_cert and listen_tls_key")
	}
	if s.tokenFile != "" {
		b, err := os.ReadFile(s.tokenFile)
		switch {
		case err != nil:
			bad("client-token-file", "%v", err)
		case strings.TrimSpace(string(b)) == "":
			bad("client-token-file", "%s is empty", s.tokenFile)
		case s.token != "" && s.token != strings.TrimSpace(string(b)):
			bad("client-token-file", "holds another token than client_token; give one")
		default:
			s.token = strings.TrimSpace(string(b))
		}
	}
	if _, err := newLogger(s.logLevel, s.logFormat); err != nil {
		bad("log-level", "%v", err)
	}
	if len(errs) > 0 {
		return configError(errs)
	}
	return nil
}

func newGatewayCmd() *cobra.Command {
	return newGatewayCmdWith(os.LookupEnv, runGateway)
}

func newGatewayCmdWith(lookupEnv func(string) (string, bool), run func(*cobra.Command, *gatewaySettings) error) *cobra.Command {
	s := newGatewaySettings()
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run a remote-write gateway that applies Tollgate's limits in front of any Prometheus-compatible backend",
		Long: `Run a stateless remote-write gateway: Prometheus, Grafana Agent/Alloy and the
OpenTelemetry Collector write to it (POST /api/v1/push or /api/v1/write, remote
write 1.0 or 2.0, the tenant in X-Scope-OrgID), and it forwards to --upstream
(Mimir, Cortex, Thanos Receive, VictoriaMetrics, Prometheus) what the tenant's
Tollgate limits admit: series beyond max_series are removed and the sender gets
400 naming the limit; samples beyond ingestion_rate get 429. Run as many as
needed: they hold no state. See docs/gateway.md.

Every setting is a flag, a key of the --config YAML file (the flag name with
underscores) and an environment variable (TOLLGATE_ and the key in upper case).
A flag wins over the environment, which wins over the file.`,
		Example: `  tollgate gateway --listen 0.0.0.0:7390 --addr 10.0.0.1:7300 --upstream http://mimir:8080/api/v1/push
  tollgate gateway --upstream http://127.0.0.1:9090/api/v1/write --default-tenant anonymous`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.load(cmd.Flags(), lookupEnv); err != nil {
				return err
			}
			return run(cmd, s)
		},
	}
	s.bind(cmd.Flags())
	return cmd
}

// build connects to Tollgate and returns the gateway and what must be
// closed after it.
func (s *gatewaySettings) build(ctx context.Context, log *slog.Logger, reg *prometheus.Registry) (*gateway.Gateway, func(), error) {
	topts := &clientTLSOpts{ca: s.ca, cert: s.cert, key: s.key, serverName: s.serverName, token: s.token}
	tc, err := topts.config()
	if err != nil {
		return nil, nil, err
	}
	addrs := splitAddrs(s.addrs)
	mode := clientlib.ModeSync
	if s.trackMode == "auto" {
		mode = clientlib.ModeAuto
	}
	c, err := clientlib.New(clientlib.Config{Addrs: addrs, Mode: mode, TLS: tc, Token: s.token, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	closers := []func(){func() { c.Close() }}
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	cfg := gateway.Config{
		Upstream: s.upstream, UpstreamTimeout: s.upstreamTO, UpstreamReadyURL: s.upstreamReady,
		PassHeaders: s.passHeaders, TenantHeader: s.tenantHeader, DefaultTenant: s.defaultTenant,
		FailOpen: s.failOpen, FailOpenTenants: map[string]bool{},
		Tracker: c, TrackTimeout: s.trackTimeout, RefreshInterval: s.refresh, MaxFreshSeries: s.maxFresh,
		MaxRequestBytes: s.maxRequest, MaxDecompressedBytes: s.maxDecomp, MaxInflight: s.maxInflight,
		Registerer: reg, Gatherer: reg, Logger: log,
		Limits: func(tenant string) gateway.Limits {
			l := c.RuntimeConfig().Tenant(tenant)
			return gateway.Limits{MaxSeries: l.MaxSeries, IngestionRate: l.IngestionRate, Burst: l.IngestionBurst}
		},
		ClusterReady: func() error {
			ls := c.Leaders()
			if len(ls) == 0 {
				return errors.New("cluster layout not known yet")
			}
			var none []string
			for g, l := range ls {
				if l == "" {
					none = append(none, fmt.Sprint(g))
				}
			}
			if len(none) > 0 {
				return fmt.Errorf("no known leader for group(s) %s", strings.Join(none, ","))
			}
			return nil
		},
	}
	for _, t := range s.openTenants {
		cfg.FailOpenTenants[t] = true
	}
	for _, t := range s.closedTenants {
		cfg.FailOpenTenants[t] = false
	}
	if len(s.upHeaders) > 0 {
		cfg.UpstreamHeaders = map[string]string{}
		for _, h := range s.upHeaders {
			k, v, _ := strings.Cut(h, "=")
			cfg.UpstreamHeaders[strings.TrimSpace(k)] = v
		}
	}
	if s.upCA != "" || s.upCert != "" {
		utc, err := tlsutil.ClientConfig(s.upCert, s.upKey, s.upCA, "")
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("upstream TLS: %w", err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = utc
		tr.MaxIdleConnsPerHost = s.maxInflight
		cfg.UpstreamClient = &http.Client{Transport: tr}
	}
	if s.rateStrategy != "off" {
		st, _ := ratelimit.ParseStrategy(s.rateStrategy)
		dial := tlsDial(tc)
		if s.token != "" {
			dial = append(dial, grpc.WithPerRPCCredentials(bearerCreds(s.token)))
		}
		rl, err := ratelimit.New(ratelimit.Config{Addrs: addrs, Strategy: st, DialOptions: dial, Logger: log})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		closers = append(closers, func() { rl.Close() })
		reg.MustRegister(rl.Collector())
		cfg.Rate = rl
	}
	if s.upParts > 0 {
		pl, err := partitionlimit.New(partitionlimit.Config{Addrs: addrs, Partitions: s.upParts, Limits: c,
			DialOptions: tlsDial(tc), Token: s.token, Logger: log})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("upstream_partitions: %w", err)
		}
		closers = append(closers, func() { pl.Close() })
		n := uint64(s.upParts)
		cfg.PartitionLimit = pl
		if s.partFunc == "modulo" {
			cfg.Partition = func(h uint64) int32 { return int32(h % n) }
		} else {
			cfg.Partition = func(h uint64) int32 { hi, _ := bits.Mul64(h, n); return int32(hi) }
		}
	}
	g, err := gateway.New(cfg)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return g, closeAll, nil
}

// tlsDial is the transport of the gateway's own gRPC streams (rate leases,
// sketches): TLS with the client commands' settings, or plaintext.
func tlsDial(tc *tls.Config) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(creds)}
}

// bearerCreds sends the client token on the rate limiter's streams.
type bearerCreds string

func (t bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

func runGateway(cmd *cobra.Command, s *gatewaySettings) error {
	log, err := newLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g, closeAll, err := s.build(ctx, log, reg)
	if err != nil {
		return err
	}
	defer closeAll()
	l, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if s.lCert != "" {
		tc, err := tlsutil.ServerConfig(s.lCert, s.lKey, s.lCA, s.lClientAuth)
		if err != nil {
			l.Close()
			return fmt.Errorf("listen TLS: %w", err)
		}
		l = tls.NewListener(l, tc)
		scheme = "https"
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(cmd.OutOrStdout(), "tollgate gateway: %s://%s/api/v1/push → %s (Tollgate %s)\n", scheme, l.Addr(), s.upstream, s.addrs)
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("gateway: shutting down; draining requests in flight", "timeout", s.shutdownTimeout)
	g.BeginShutdown()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	// Background refreshes finish before the Tollgate client closes (each
	// is bounded by --track-timeout).
	g.WaitRefreshes()
	return nil
}
