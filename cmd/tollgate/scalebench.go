package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	gproto "google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/limits"
)

// scaleOpts are the sizes of the scale benchmark; every one can be shrunk
// for a quick run (the test runs it at tiny sizes).
type scaleOpts struct {
	bin             string   // the tollgate binary the nodes run
	dataDir         string   // where the nodes keep their data ("" = temp dir, removed)
	stages          []string // which stages run
	tenants         int      // per-tenant overrides in the big node's limits file
	baseTenants     int      // the same in the baseline node's file
	idleWindow      time.Duration
	settle          time.Duration
	clients         int // simulated clients: one connection, one WatchCluster and one WatchSketches stream each
	subsPerClient   int // tenants each client's WatchSketches stream follows
	streamWindow    time.Duration
	spans           int // open metering spans
	due             int // of them stopped, so due at once
	seriesTenants   int
	seriesPerTenant int64
	concurrency     int
	serverArgs      []string // more flags for every node
	asJSON          bool
	log             io.Writer // progress lines
}

var scaleStages = []string{"idle", "streams", "metering", "series", "restart"}

func newScaleBenchCmd() *cobra.Command {
	o := scaleOpts{log: os.Stderr}
	var stages string
	cmd := &cobra.Command{
		Use:   "scalebench",
		Short: "Scale benchmark of one node: 100,000 tenants, 1,000 streaming clients, 1M open spans, 100M series",
		Long: `scalebench starts a durable single-node dev server (this binary, or --bin) in a
temporary directory and measures what one node costs at scale. Stages:

  idle      idle CPU over --idle-window with a limits file of --tenants per-tenant
            overrides, against the same node with --base-tenants (bar: ratio ≤ 1.2)
  streams   --clients simulated clients, each with its own connection, one
            WatchCluster stream and one WatchSketches stream following
            --subs-per-client tenants (sketches are pushed for every tenant, then
            every second for the followed ones and 1,000 others): bytes of the first
            message and per stream per minute after it, then of the view after one
            limits change; at --base-tenants and at --tenants
  metering  --spans open metering spans created with Metering.Events batches,
            then --due of them (one raft group) stopped at once: the sampler's
            time per pass from tollgate_metering_sampler_*_seconds (bar ≤ 10 ms)
  series    --series-tenants × --series-per-tenant active series (bench's
            prefill), then Go heap (/metrics), RssAnon and VmRSS (/proc) per series
  restart   SIGTERM, then the same data dir started again: time to the ready
            banner and to /readyz 200, and the series still there

The baseline node (--base-tenants) runs idle and streams and is removed; the
big node runs every stage in the order above, so memory and restart are
measured with the tenants, the spans and the series all on it. Each node runs
with --default-max-series 0, --metering-granularity month (no boundary passes
during a run, so only the stopped spans are due) and enough watch streams per
client for --clients; --server-arg adds flags. The final table goes to stdout
(--json: the measurements as JSON). scripts/scale-bench.sh wraps this with
environment knobs.`,
		Example: `  tollgate scalebench                                  # full sizes: ~3 GB of RAM, several minutes
  tollgate scalebench --tenants 1000 --clients 50 --spans 10000 --due 100 \
      --series-per-tenant 10000 --stream-window 5s --idle-window 3s   # a quick run`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stages = nil
			for _, s := range strings.Split(stages, ",") {
				s = strings.TrimSpace(s)
				if s == "all" {
					o.stages = slices.Clone(scaleStages)
					continue
				}
				if !slices.Contains(scaleStages, s) {
					return fmt.Errorf("--stages: %q is not one of all, %s", s, strings.Join(scaleStages, ", "))
				}
				o.stages = append(o.stages, s)
			}
			if o.bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--bin: find this binary: %w", err)
				}
				o.bin = exe
			}
			// An interrupt ends the run through its context, so the nodes it
			// started are stopped rather than left running.
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := runScaleBench(ctx, o)
			if res != nil {
				if o.asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					_ = enc.Encode(res)
				} else {
					res.print(cmd.OutOrStdout())
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.bin, "bin", "", "tollgate binary the nodes run (default: this one)")
	f.StringVar(&o.dataDir, "data-dir", "", "where the nodes keep their data (default: a temp dir, removed)")
	f.StringVar(&stages, "stages", "all", "stages to run: all, or a list of idle, streams, metering, series, restart")
	f.IntVar(&o.tenants, "tenants", 100_000, "per-tenant overrides in the big node's limits file (at most 100,000)")
	f.IntVar(&o.baseTenants, "base-tenants", 10, "per-tenant overrides in the baseline node's limits file")
	f.DurationVar(&o.idleWindow, "idle-window", 10*time.Second, "idle CPU is measured over this")
	f.DurationVar(&o.settle, "settle", 3*time.Second, "wait after start-up work before measuring idleness or memory")
	f.IntVar(&o.clients, "clients", 1000, "simulated clients (each: a connection, a WatchCluster and a WatchSketches stream)")
	f.IntVar(&o.subsPerClient, "subs-per-client", 3, "tenants each client's WatchSketches stream follows")
	f.DurationVar(&o.streamWindow, "stream-window", time.Minute, "how long streams are measured after their first message")
	f.IntVar(&o.spans, "spans", 1_000_000, "open metering spans")
	f.IntVar(&o.due, "due", 1000, "spans (of one raft group) stopped at once, so due in the same sampler pass")
	f.IntVar(&o.seriesTenants, "series-tenants", 100, "tenants of the series stage")
	f.Int64Var(&o.seriesPerTenant, "series-per-tenant", 1_000_000, "active series per tenant in the series stage")
	f.IntVar(&o.concurrency, "concurrency", 8, "concurrent calls while creating spans and series")
	f.StringArrayVar(&o.serverArgs, "server-arg", nil, "extra flag for every node, e.g. --server-arg=--groups=16 (repeat)")
	f.BoolVar(&o.asJSON, "json", false, "print the measurements as JSON instead of the table")
	return cmd
}

// ScaleResult is what a scalebench run measured (--json). Sections are nil
// for stages that did not run.
type ScaleResult struct {
	Tenants     int          `json:"tenants"`
	BaseTenants int          `json:"base_tenants"`
	IdleBase    *float64     `json:"idle_cpu_pct_base,omitempty"` // percent of one core
	IdleBig     *float64     `json:"idle_cpu_pct,omitempty"`
	IdleLoaded  *float64     `json:"idle_cpu_pct_loaded,omitempty"` // big node after metering and series
	StreamsBase *StreamStats `json:"streams_base,omitempty"`
	StreamsBig  *StreamStats `json:"streams,omitempty"`
	Metering    *MeterStats  `json:"metering,omitempty"`
	Series      *SeriesStats `json:"series,omitempty"`
	Restart     *RestartInfo `json:"restart,omitempty"`
}

// StreamStats: bytes are protobuf message bytes as received (gRPC framing
// not counted); per-stream figures are means over the streams.
type StreamStats struct {
	Clients             int     `json:"clients"`
	SubsPerClient       int     `json:"subs_per_client"` // tenants each sketch stream follows
	ConfigTenants       int     `json:"config_tenants"`  // tenants in a first WatchCluster view
	ClusterFirstBytes   float64 `json:"cluster_first_bytes"`
	SketchFirstBytes    float64 `json:"sketch_first_bytes"`
	WindowSec           float64 `json:"window_s"`
	ClusterMsgsPerMin   float64 `json:"cluster_later_msgs_per_min"`
	ClusterBytesPerMin  float64 `json:"cluster_later_bytes_per_min"`
	SketchMsgsPerMin    float64 `json:"sketch_later_msgs_per_min"`
	SketchBytesPerMin   float64 `json:"sketch_later_bytes_per_min"`
	SketchBytesPerMsg   float64 `json:"sketch_later_bytes_per_msg"`
	ConfigChangeBytes   float64 `json:"cluster_config_change_bytes"`   // the view after one limits change
	ConfigChangeStreams int     `json:"cluster_config_change_streams"` // streams that received it in time
	PushedTenantsPerSec int     `json:"pushed_tenants_per_s"`          // tenants whose sketch changed each second
}

// MeterStats: the sampler's passes while the stopped spans were sampled.
type MeterStats struct {
	Spans        int     `json:"spans"`
	CreateSec    float64 `json:"create_s"`
	Due          int     `json:"due"`
	Group        int     `json:"group"`       // the group the due spans are in
	GroupOpen    int     `json:"group_open"`  // open spans of that group when they were stopped
	Executed     float64 `json:"executed"`    // intervals executed while measuring
	WorkPasses   float64 `json:"work_passes"` // passes that proposed something
	WorkMeanMs   float64 `json:"work_mean_ms"`
	WorkMaxLeMs  float64 `json:"work_max_le_ms"` // every such pass took at most this (histogram bucket)
	ScanPasses   float64 `json:"scan_passes"`
	ScanMeanMs   float64 `json:"scan_mean_ms"`
	ScanMaxLeMs  float64 `json:"scan_max_le_ms"`
	SpansOpenEnd float64 `json:"spans_open_end"`
}

// SeriesStats: memory before and after the series were created.
type SeriesStats struct {
	Series     int64   `json:"series"` // active series the node reports
	PrefillSec float64 `json:"prefill_s"`
	Before     Memory  `json:"before"`
	After      Memory  `json:"after"`
}

// Memory of the node process: Go heap in use (go_memstats_heap_alloc_bytes),
// RssAnon and VmRSS from /proc/PID/status.
type Memory struct {
	HeapBytes    int64 `json:"heap_bytes"`
	RssAnonBytes int64 `json:"rss_anon_bytes"`
	VmRSSBytes   int64 `json:"vm_rss_bytes"`
}

// RestartInfo: SIGTERM to exit, then start to the ready banner and to /readyz.
type RestartInfo struct {
	StopSec     float64 `json:"stop_s"`
	ReadySec    float64 `json:"ready_s"`
	ReadyzSec   float64 `json:"readyz_s"`
	SeriesAfter int64   `json:"series_after"`
	// Memory once ready again: tables rebuilt from snapshots, no garbage
	// from a load yet.
	MemoryAfter Memory `json:"memory_after"`
}

func (o *scaleOpts) validate() error {
	switch {
	case o.tenants < 1 || o.tenants > 100_000:
		return fmt.Errorf("scalebench: --tenants %d: must be in [1, 100000] (the runtime config's limit)", o.tenants)
	case o.baseTenants < 1 || o.baseTenants > o.tenants:
		return fmt.Errorf("scalebench: --base-tenants %d: must be in [1, --tenants]", o.baseTenants)
	case o.clients < 1 || o.subsPerClient < 1:
		return fmt.Errorf("scalebench: --clients and --subs-per-client must be ≥ 1")
	case o.spans < 1 || o.due < 1 || o.due > o.spans:
		return fmt.Errorf("scalebench: --spans must be ≥ 1 and --due in [1, --spans]")
	case o.seriesTenants < 1 || o.seriesPerTenant < 1 || o.concurrency < 1:
		return fmt.Errorf("scalebench: --series-tenants, --series-per-tenant and --concurrency must be ≥ 1")
	case o.idleWindow <= 0 || o.streamWindow <= 0 || o.streamWindow > 3*time.Minute || o.settle < 0:
		// Each second of the stream window adds a sketch per pushed tenant
		// (up to 4,000 at 1,000 clients), kept for the node's 20-minute
		// sketch window: beyond 3 minutes a node's 1,000,000 could fill.
		return fmt.Errorf("scalebench: --idle-window must be > 0, --stream-window in (0, 3m], --settle ≥ 0")
	case len(o.stages) == 0:
		return fmt.Errorf("scalebench: --stages: none given")
	}
	return nil
}

func (o *scaleOpts) has(stage string) bool { return slices.Contains(o.stages, stage) }

func (o *scaleOpts) logf(format string, args ...any) {
	if o.log != nil {
		fmt.Fprintf(o.log, "scalebench: "+format+"\n", args...)
	}
}

// runScaleBench runs the stages; the result holds what was measured even when
// a stage failed.
func runScaleBench(ctx context.Context, o scaleOpts) (*ScaleResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	dir := o.dataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "tollgate-scalebench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res := &ScaleResult{Tenants: o.tenants, BaseTenants: o.baseTenants}
	if o.has("idle") || o.has("streams") {
		if err := o.baselineNode(ctx, dir, res); err != nil {
			return res, err
		}
	}
	return res, o.bigNode(ctx, dir, res)
}

// baselineNode measures idleness and streams with --base-tenants, then
// removes the node.
func (o *scaleOpts) baselineNode(ctx context.Context, dir string, res *ScaleResult) error {
	n, err := o.newNode(filepath.Join(dir, "base"), o.baseTenants)
	if err != nil {
		return err
	}
	defer n.kill()
	if err := o.startAndSettle(ctx, n); err != nil {
		return err
	}
	if err := o.idleAndStreams(ctx, n, o.baseTenants, &res.IdleBase, &res.StreamsBase); err != nil {
		return err
	}
	if _, err := n.stop(); err != nil {
		return err
	}
	if o.dataDir != "" {
		return nil // the caller keeps what it asked to keep
	}
	return os.RemoveAll(n.dir) // disk for the big node
}

// idleAndStreams runs the idle and streams stages (those asked for) on a
// node whose limits file holds tenants overrides, into idle and st.
func (o *scaleOpts) idleAndStreams(ctx context.Context, n *benchNode, tenants int, idle **float64, st **StreamStats) error {
	if o.has("idle") {
		v, err := n.idleCPU(ctx, o.idleWindow)
		if err != nil {
			return err
		}
		*idle = &v
		o.logf("idle CPU at %d tenants: %.2f %% of one core", tenants, v)
	}
	if o.has("streams") {
		got, err := o.streams(ctx, n, tenants)
		if err != nil {
			return fmt.Errorf("streams at %d tenants: %w", tenants, err)
		}
		*st = got
	}
	return nil
}

func (o *scaleOpts) bigNode(ctx context.Context, dir string, res *ScaleResult) error {
	n, err := o.newNode(filepath.Join(dir, "big"), o.tenants)
	if err != nil {
		return err
	}
	defer n.kill()
	if err := o.startAndSettle(ctx, n); err != nil {
		return err
	}
	if err := o.idleAndStreams(ctx, n, o.tenants, &res.IdleBig, &res.StreamsBig); err != nil {
		return err
	}
	if o.has("metering") {
		m, err := o.metering(ctx, n)
		res.Metering = m
		if err != nil {
			return fmt.Errorf("metering: %w", err)
		}
	}
	if o.has("series") {
		s, err := o.series(ctx, n)
		res.Series = s
		if err != nil {
			return fmt.Errorf("series: %w", err)
		}
	}
	if o.has("idle") && (o.has("metering") || o.has("series")) {
		if err := sleepCtx(ctx, o.settle); err != nil {
			return err
		}
		v, err := n.idleCPU(ctx, o.idleWindow)
		if err != nil {
			return err
		}
		res.IdleLoaded = &v
		o.logf("idle CPU with everything loaded: %.2f %% of one core", v)
	}
	if o.has("restart") {
		r, err := o.restart(ctx, n)
		res.Restart = r
		if err != nil {
			return fmt.Errorf("restart: %w", err)
		}
	}
	_, err = n.stop()
	return err
}

// --- the node process ---

// benchNode is one `tollgate server --dev` process on loopback ports.
type benchNode struct {
	bin, dir               string
	args                   []string
	grpc, httpAddr, raft   string
	cmd                    *exec.Cmd
	exited                 chan struct{}
	exitErr                error
	readySec, readyzSec    float64
	logFile                string
	http                   *http.Client
	procStat, procStatusFn string
}

func loopbackPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// newNode prepares a node whose limits file holds n per-tenant overrides.
func (o *scaleOpts) newNode(dir string, tenants int) (*benchNode, error) {
	// A node started on an earlier run's data would hold its spans and
	// series: the stages would fail or measure the wrong thing.
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		return nil, fmt.Errorf("scalebench: %s holds an earlier run's data: give an empty --data-dir", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lf := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(lf, scaleLimitsFile(tenants), 0o644); err != nil {
		return nil, err
	}
	n := &benchNode{bin: o.bin, dir: dir, logFile: filepath.Join(dir, "server.log"), http: &http.Client{Timeout: 30 * time.Second}}
	for _, p := range []*string{&n.grpc, &n.httpAddr, &n.raft} {
		a, err := loopbackPort()
		if err != nil {
			return nil, err
		}
		*p = a
	}
	streams := strconv.Itoa(max(10_000, 2*o.clients+100))
	n.args = append([]string{"server", "--dev", "--data-dir", filepath.Join(dir, "data"),
		"--grpc-addr", n.grpc, "--http-addr", n.httpAddr, "--raft-addr", n.raft,
		"--default-max-series", "0", "--log-level", "warn", "--limits-file", lf,
		"--max-watch-streams", streams, "--max-watch-streams-per-client", streams,
		// Every client connects from this machine's address: one peer.
		"--grpc-max-conns", streams, "--grpc-max-conns-per-peer", streams,
		"--metering-granularity", "month",
		// The clients share this machine's cores with the node: a view of
		// 100,000 tenants sent to 1,000 streams at once can take one stream
		// longer than the default 30 s to read, which would end it as a slow
		// reader.
		"--watch-send-timeout", "10m"}, o.serverArgs...)
	return n, nil
}

// scaleTenant names the i-th tenant of the limits file.
func scaleTenant(i int) string { return fmt.Sprintf("t-%06d", i) }

// scaleLimitsFile is a limits file with n per-tenant overrides; each has a
// max_series_per_partition so the node accepts its sketches.
func scaleLimitsFile(n int) []byte {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for i := range n {
		fmt.Fprintf(&b, "  %s:\n    max_series: %d\n    max_series_per_partition: %d\n", scaleTenant(i), 100_000+i, 10_000)
	}
	return []byte(b.String())
}

// start runs the node and waits for its ready banner, then for /readyz.
func (n *benchNode) start(ctx context.Context) error {
	logf, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.cmd = exec.Command(n.bin, n.args...)
	n.cmd.Stderr = logf
	out, err := n.cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	t0 := time.Now()
	if err := n.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", n.bin, err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if !said && strings.HasPrefix(sc.Text(), "tollgate node ") && strings.HasSuffix(sc.Text(), " ready") {
				said = true
				close(ready)
			}
		}
	}()
	n.exited = make(chan struct{})
	go func() {
		n.exitErr = n.cmd.Wait()
		logf.Close()
		close(n.exited)
	}()
	select {
	case <-ready:
		n.readySec = time.Since(t0).Seconds()
	case <-n.exited:
		return fmt.Errorf("node exited before it was ready (%v); log: %s", n.exitErr, n.logTail())
	case <-time.After(10 * time.Minute):
		return fmt.Errorf("node not ready after 10 minutes; log: %s", n.logTail())
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		resp, err := n.http.Get("http://" + n.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				n.readyzSec = time.Since(t0).Seconds()
				return nil
			}
		}
		select {
		case <-n.exited:
			return fmt.Errorf("node exited (%v); log: %s", n.exitErr, n.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (n *benchNode) logTail() string {
	b, _ := os.ReadFile(n.logFile)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop sends SIGTERM and waits for the process to exit.
func (n *benchNode) stop() (time.Duration, error) {
	if n.cmd == nil || n.cmd.Process == nil {
		return 0, nil
	}
	t0 := time.Now()
	select {
	case <-n.exited:
		return 0, fmt.Errorf("node had exited (%v); log: %s", n.exitErr, n.logTail())
	default:
	}
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	select {
	case <-n.exited:
	case <-time.After(5 * time.Minute):
		_ = n.cmd.Process.Kill()
		<-n.exited
		return 0, errors.New("node did not exit within 5 minutes of SIGTERM")
	}
	d := time.Since(t0)
	n.cmd = nil
	return d, nil
}

// kill ends a node still running (after a failed stage).
func (n *benchNode) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		<-n.exited
		n.cmd = nil
	}
}

// cpuTicks is the process's user + system CPU in clock ticks (USER_HZ, 100
// on Linux) from /proc/PID/stat.
func (n *benchNode) cpuTicks() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from after the last ')', where field 3 (state) is index 0.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", n.cmd.Process.Pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", n.cmd.Process.Pid, err)
	}
	return u + st, nil
}

// idleCPU is the node's CPU over window, percent of one core.
func (n *benchNode) idleCPU(ctx context.Context, window time.Duration) (float64, error) {
	c0, err := n.cpuTicks()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return 0, err
	}
	c1, err := n.cpuTicks()
	if err != nil {
		return 0, err
	}
	const userHZ = 100
	return 100 * float64(c1-c0) / userHZ / time.Since(t0).Seconds(), nil
}

// memory reads the Go heap from /metrics and RssAnon, VmRSS from /proc.
func (n *benchNode) memory(ctx context.Context) (Memory, error) {
	var m Memory
	mt, err := n.metrics(ctx)
	if err != nil {
		return m, err
	}
	heap, ok := mt["go_memstats_heap_alloc_bytes"]
	if !ok {
		return m, errors.New("/metrics has no go_memstats_heap_alloc_bytes")
	}
	m.HeapBytes = int64(heap)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "RssAnon":
			dst = &m.RssAnonBytes
		case "VmRSS":
			dst = &m.VmRSSBytes
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc status %s: %w", k, err)
		}
		*dst = kb << 10
	}
	if m.RssAnonBytes == 0 || m.VmRSSBytes == 0 {
		return m, errors.New("/proc status: no RssAnon or VmRSS")
	}
	return m, nil
}

// metrics scrapes /metrics into series → value (the series keyed as
// written: name{labels}).
func (n *benchNode) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format (no timestamps, as the Go
// client writes it).
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// sumMetric adds the values of every series of name (any labels).
func sumMetric(m map[string]float64, name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// startAndSettle starts n and waits until its limits file is the runtime
// config in every group, then --settle.
func (o *scaleOpts) startAndSettle(ctx context.Context, n *benchNode) error {
	if err := n.start(ctx); err != nil {
		return err
	}
	o.logf("node %s ready in %.2fs", filepath.Base(n.dir), n.readySec)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		m, err := n.metrics(ctx)
		if err == nil && configEverywhere(m) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("limits file not the runtime config of every group after 5 minutes (%v); log: %s", err, n.logTail())
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return sleepCtx(ctx, o.settle)
}

// sleepCtx sleeps d, or less when ctx ends (then its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// configEverywhere: a runtime config is replicated and every group's replica
// on the node holds its version.
func configEverywhere(m map[string]float64) bool {
	v := m["tollgate_config_version"]
	if v == 0 {
		return false
	}
	groups := 0
	for k, x := range m {
		if strings.HasPrefix(k, "tollgate_config_replica_version{") {
			groups++
			if x != v {
				return false
			}
		}
	}
	return groups > 0
}

// --- streams ---

// rawMsg receives a stream message without decoding it: the benchmark needs
// its size, and decoding 1,000 copies of a 2 MB view would load the machine
// it measures. keep also keeps the bytes.
type rawMsg struct {
	n    int
	keep bool
	data []byte
}

// sizeCodec marshals requests as protobuf and leaves responses raw.
type sizeCodec struct{}

func (sizeCodec) Marshal(v any) ([]byte, error) { return gproto.Marshal(v.(gproto.Message)) }
func (sizeCodec) Unmarshal(data []byte, v any) error {
	if m, ok := v.(*rawMsg); ok {
		m.n = len(data)
		if m.keep {
			m.data = append(m.data[:0], data...)
		}
		return nil
	}
	return gproto.Unmarshal(data, v.(gproto.Message))
}
func (sizeCodec) Name() string { return "proto" } // the content subtype the server decodes

// streamCount is what one stream received.
type streamCount struct {
	first atomic.Int64 // size of the first message; 0 before it
	msgs  atomic.Int64 // later messages
	bytes atomic.Int64 // their bytes
}

// streams opens --clients clients' streams on n, whose config holds tenants
// tenants, and measures their bytes.
func (o *scaleOpts) streams(ctx context.Context, n *benchNode, tenants int) (*StreamStats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dial := func() (*grpc.ClientConn, error) {
		return grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.ForceCodec(sizeCodec{})))
	}
	ctl, err := dial()
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	sk := api.NewSketchesClient(ctl)
	prec := uint32(api.DefaultHLLPrecision)

	// Every tenant has a sketch before the streams open: a stream that
	// followed every tenant would receive them all.
	all := make([]int, tenants)
	for i := range all {
		all[i] = i
	}
	if err := pushSketches(ctx, sk, prec, all, 0); err != nil {
		return nil, fmt.Errorf("push the first sketches: %w", err)
	}

	subs := func(c int) []string {
		var ts []string
		for k := range o.subsPerClient {
			t := scaleTenant((c*o.subsPerClient + k) % tenants)
			if !slices.Contains(ts, t) {
				ts = append(ts, t)
			}
		}
		return ts
	}
	clusterCounts := make([]streamCount, o.clients)
	sketchCounts := make([]streamCount, o.clients)
	var (
		errMu    sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		conns    = make([]*grpc.ClientConn, o.clients)
		view0    []byte
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil && ctx.Err() == nil {
			firstErr = err
		}
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	read := func(st grpc.ClientStream, cnt *streamCount, keepFirst bool, what string) {
		defer wg.Done()
		for first := true; ; first = false {
			m := rawMsg{keep: first && keepFirst}
			if err := st.RecvMsg(&m); err != nil {
				if ctx.Err() == nil {
					fail(fmt.Errorf("%s stream: %w", what, err))
				}
				return
			}
			if first {
				if m.keep {
					errMu.Lock()
					view0 = m.data
					errMu.Unlock()
				}
				cnt.first.Store(int64(max(m.n, 1))) // an empty message is 0 bytes; 1 marks it received
				continue
			}
			cnt.msgs.Add(1)
			cnt.bytes.Add(int64(m.n))
		}
	}
	open := func(c int) error {
		cc, err := dial()
		if err != nil {
			return err
		}
		conns[c] = cc
		cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, api.Tracker_WatchCluster_FullMethodName)
		if err != nil {
			return err
		}
		if err := cs.SendMsg(&api.WatchClusterRequest{ConfigDeltas: true}); err != nil { // as clientlib asks
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		ss, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, api.Sketches_WatchSketches_FullMethodName)
		if err != nil {
			return err
		}
		if err := ss.SendMsg(&api.WatchSketchesRequest{Precision: prec, OnlyTenants: true, Tenants: subs(c)}); err != nil {
			return err
		}
		if err := ss.CloseSend(); err != nil {
			return err
		}
		wg.Add(2)
		go read(cs, &clusterCounts[c], c == 0, "WatchCluster")
		go read(ss, &sketchCounts[c], false, "WatchSketches")
		return nil
	}
	// Clients connect in waves of 100, each once the one before has its
	// first messages, as clients of a rolling deployment would (and so this
	// process does not hold 1,000 first views at once).
	t0 := time.Now()
	const wave = 100
	for lo := 0; lo < o.clients; lo += wave {
		hi := min(lo+wave, o.clients)
		for c := lo; c < hi; c++ {
			if err := open(c); err != nil {
				return nil, fmt.Errorf("client %d: %w", c, err)
			}
		}
		if err := waitFirst(ctx, clusterCounts[:hi], sketchCounts[:hi], func() error {
			errMu.Lock()
			defer errMu.Unlock()
			return firstErr
		}); err != nil {
			return nil, err
		}
	}
	o.logf("%d clients' streams open at %d tenants in %.1fs", o.clients, tenants, time.Since(t0).Seconds())
	st := &StreamStats{Clients: o.clients, SubsPerClient: o.subsPerClient}
	var v api.ClusterView
	errMu.Lock()
	err = gproto.Unmarshal(view0, &v)
	errMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("decode a first cluster view: %w", err)
	}
	st.ConfigTenants = len(v.GetRuntimeConfig().GetTenants())
	if st.ConfigTenants != tenants {
		return nil, fmt.Errorf("the first cluster view carries %d tenants, the limits file %d", st.ConfigTenants, tenants)
	}
	for c := range o.clients {
		st.ClusterFirstBytes += float64(clusterCounts[c].first.Load())
		st.SketchFirstBytes += float64(sketchCounts[c].first.Load())
	}
	st.ClusterFirstBytes /= float64(o.clients)
	st.SketchFirstBytes /= float64(o.clients)

	// The window: every second a new register in the sketch of every
	// followed tenant and of up to 1,000 others (work for the node that no
	// stream follows), as clients pushing would.
	hot := map[int]bool{}
	for c := range o.clients {
		for k := range o.subsPerClient {
			hot[(c*o.subsPerClient+k)%tenants] = true
		}
	}
	for i, extra := 0, 0; i < tenants && extra < 1000; i++ {
		if !hot[i] {
			hot[i] = true
			extra++
		}
	}
	hotList := make([]int, 0, len(hot))
	for i := range hot {
		hotList = append(hotList, i)
	}
	slices.Sort(hotList)
	st.PushedTenantsPerSec = len(hotList)
	snap := func(cs []streamCount) (msgs, bytes int64) {
		for i := range cs {
			msgs += cs[i].msgs.Load()
			bytes += cs[i].bytes.Load()
		}
		return
	}
	cm0, cb0 := snap(clusterCounts)
	sm0, sb0 := snap(sketchCounts)
	w0 := time.Now()
	tick := time.NewTicker(time.Second)
	for round := 1; time.Since(w0) < o.streamWindow; round++ {
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if err := pushSketches(ctx, sk, prec, hotList, round); err != nil {
			tick.Stop()
			return nil, fmt.Errorf("push sketches: %w", err)
		}
	}
	tick.Stop()
	time.Sleep(200 * time.Millisecond) // the last push's batches (coalesced 20 ms)
	win := time.Since(w0)
	cm1, cb1 := snap(clusterCounts)
	sm1, sb1 := snap(sketchCounts)
	perMin := func(x int64) float64 { return float64(x) / float64(o.clients) / win.Minutes() }
	st.WindowSec = win.Seconds()
	st.ClusterMsgsPerMin, st.ClusterBytesPerMin = perMin(cm1-cm0), perMin(cb1-cb0)
	st.SketchMsgsPerMin, st.SketchBytesPerMin = perMin(sm1-sm0), perMin(sb1-sb0)
	if sm1 > sm0 {
		st.SketchBytesPerMsg = float64(sb1-sb0) / float64(sm1-sm0)
	}

	// One limits change: a new config version reaches every stream once.
	before := make([]int64, o.clients)
	beforeB := make([]int64, o.clients)
	for c := range o.clients {
		before[c], beforeB[c] = clusterCounts[c].msgs.Load(), clusterCounts[c].bytes.Load()
	}
	cfg := api.NewConfigClient(ctl)
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	_, err = cfg.SetLimits(cctx, &api.SetLimitsRequest{Tenant: scaleTenant(0), Set: map[string]string{limits.KeyMaxSeries: strconv.Itoa(7_777_777 + int(time.Now().UnixNano()%1000))}})
	ccancel()
	if err != nil {
		return nil, fmt.Errorf("limits change: %w", err)
	}
	var got int
	for deadline := time.Now().Add(2 * time.Minute); ; {
		got = 0
		for c := range o.clients {
			if clusterCounts[c].msgs.Load() > before[c] {
				got++
			}
		}
		if got == o.clients || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
	st.ConfigChangeStreams = got
	var changeBytes int64
	for c := range o.clients {
		changeBytes += clusterCounts[c].bytes.Load() - beforeB[c]
	}
	st.ConfigChangeBytes = float64(changeBytes) / float64(max(got, 1))
	errMu.Lock()
	err = firstErr
	errMu.Unlock()
	if err != nil {
		return st, err
	}
	if got < o.clients {
		return st, fmt.Errorf("%d of %d WatchCluster streams received the changed config within 2 minutes", got, o.clients)
	}
	o.logf("streams at %d tenants: first %.0f B (cluster) %.0f B (sketches); later per minute %.0f B (cluster) %.0f B (sketches); config change %.0f B",
		tenants, st.ClusterFirstBytes, st.SketchFirstBytes, st.ClusterBytesPerMin, st.SketchBytesPerMin, st.ConfigChangeBytes)
	return st, nil
}

// waitFirst waits until every stream counted has its first message.
func waitFirst(ctx context.Context, cluster, sketch []streamCount, failed func() error) error {
	for deadline := time.Now().Add(5 * time.Minute); ; {
		missing := 0
		for c := range cluster {
			if cluster[c].first.Load() == 0 || sketch[c].first.Load() == 0 {
				missing++
			}
		}
		if err := failed(); err != nil {
			return err
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d clients without their first messages after 5 minutes", missing, len(cluster))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pushSketches changes one sketch of each tenant listed. Round 0 sets eight
// registers of partition 0's sketch of this minute; round r ≥ 1 sets one
// register in partition 1 + (r-1) mod 61, a sketch no earlier round of the
// same minute touched (61 rounds are more than a minute apart). A node
// streams a changed sketch whole, so every later batch then carries one
// one-register sketch per followed tenant, wherever in the minute the
// window falls, and runs at different tenant counts compare like for like.
func pushSketches(ctx context.Context, sk api.SketchesClient, prec uint32, tenants []int, round int) error {
	m := uint32(1) << prec
	minute := time.Now().Unix() / 60
	const chunk = 5000
	for lo := 0; lo < len(tenants); lo += chunk {
		req := &api.PushSketchesRequest{Precision: prec}
		for _, i := range tenants[lo:min(lo+chunk, len(tenants))] {
			s := &api.Sketch{Tenant: scaleTenant(i), Minute: minute}
			if round == 0 {
				for k := range uint32(8) {
					s.Sparse = append(s.Sparse, api.HLLSparseEntry(k*m/8+uint32(i)%(m/8), 1))
				}
			} else {
				s.Partition = uint32(1 + (round-1)%61)
				s.Sparse = []uint32{api.HLLSparseEntry(uint32(round*37+i)%m, 2)}
			}
			req.Sketches = append(req.Sketches, s)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := sk.PushSketches(cctx, req)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// --- metering ---

// histSnap is one Prometheus histogram as scraped: cumulative bucket counts
// by upper bound, sum and count.
type histSnap struct {
	le         []float64
	cum        []float64
	sum, count float64
}

func histOf(m map[string]float64, name string) histSnap {
	var h histSnap
	prefix := name + `_bucket{le="`
	for k := range m {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(k[len(prefix):], `"}`), 64)
		if err != nil {
			continue // +Inf parses; anything else is not ours
		}
		h.le = append(h.le, le)
	}
	slices.Sort(h.le)
	for _, le := range h.le {
		h.cum = append(h.cum, m[prefix+strconv.FormatFloat(le, 'g', -1, 64)+`"}`])
	}
	h.sum, h.count = m[name+"_sum"], m[name+"_count"]
	return h
}

// since is what h observed after h0: count, mean (seconds), and the bucket
// bound every observation was within (+Inf when beyond the last).
func (h histSnap) since(h0 histSnap) (n, mean, maxLe float64) {
	n = h.count - h0.count
	if n <= 0 {
		return 0, 0, 0
	}
	mean = (h.sum - h0.sum) / n
	maxLe = math.Inf(1)
	for i, le := range h.le {
		var c0 float64
		if i < len(h0.cum) {
			c0 = h0.cum[i]
		}
		if h.cum[i]-c0 >= n {
			return n, mean, le
		}
	}
	return n, mean, maxLe
}

// metering creates --spans open spans, stops --due of one group at once, and
// reads the sampler's pass times from the node's histograms.
func (o *scaleOpts) metering(ctx context.Context, n *benchNode) (*MeterStats, error) {
	cc, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	mc := api.NewMeteringClient(cc)
	ms := &MeterStats{Spans: o.spans, Due: o.due}
	target := func(i int) *api.MeterTarget {
		return &api.MeterTarget{OrganizationId: fmt.Sprintf("org-%d", i/1000), SpaceId: "space", ConsumerId: "consumer",
			ResourceId: "scalebench", PlanId: "standard", ResourceInstanceId: fmt.Sprintf("inst-%d", i)}
	}
	startTS := time.Now().Add(-time.Minute).UnixMilli()
	groupOf := make([]int32, o.spans)
	const batch = 5000
	jobs := make(chan int)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		failed   atomic.Bool
		firstErr error
	)
	t0 := time.Now()
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := range jobs {
				if failed.Load() {
					continue // drain the queue so the producer never blocks
				}
				req := &api.MeterEventsRequest{}
				for i := lo; i < min(lo+batch, o.spans); i++ {
					req.Events = append(req.Events, &api.MeterEventItem{Event: &api.MeterEvent{Timestamp: startTS, Target: target(i),
						MeasuredUsage: []*api.MeterMeasure{{Measure: "instances", Quantity: 1}}}})
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				resp, err := mc.Events(cctx, req)
				cancel()
				if err == nil {
					for k, r := range resp.GetResults() {
						if r.GetCode() != 0 {
							err = fmt.Errorf("start of span %d: code %d: %s", lo+k, r.GetCode(), r.GetMessage())
							break
						}
						groupOf[lo+k] = int32(r.GetResponse().GetGroup())
					}
					if err == nil && len(resp.GetResults()) != len(req.Events) {
						err = fmt.Errorf("%d results for %d events", len(resp.GetResults()), len(req.Events))
					}
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Store(true)
				}
			}
		}()
	}
	for lo := 0; lo < o.spans; lo += batch {
		jobs <- lo
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return ms, fmt.Errorf("create spans: %w", firstErr)
	}
	ms.CreateSec = time.Since(t0).Seconds()
	o.logf("%d spans started in %.1fs (%.0f/s)", o.spans, ms.CreateSec, float64(o.spans)/ms.CreateSec)

	// The due spans: all in one group, so one pass of one sampler finds them.
	counts := map[int32]int{}
	for _, g := range groupOf {
		counts[g]++
	}
	g := groupOf[0]
	for k, c := range counts {
		if c > counts[g] {
			g = k
		}
	}
	ms.Group, ms.GroupOpen = int(g), counts[g]
	var due []int
	for i, gi := range groupOf {
		if gi == g && len(due) < o.due {
			due = append(due, i)
		}
	}
	ms.Due = len(due)
	// Let the start-up passes finish (the first builds the due index), then
	// take the histograms.
	time.Sleep(time.Second)
	m0, err := n.metrics(ctx)
	if err != nil {
		return ms, err
	}
	if open := sumMetric(m0, "tollgate_metering_spans_open"); open != float64(o.spans) {
		return ms, fmt.Errorf("tollgate_metering_spans_open is %v, want %d", open, o.spans)
	}
	req := &api.MeterEventsRequest{}
	stopTS := time.Now().UnixMilli()
	for _, i := range due {
		req.Events = append(req.Events, &api.MeterEventItem{Stop: true, Event: &api.MeterEvent{Timestamp: stopTS, Target: target(i)}})
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	resp, err := mc.Events(cctx, req)
	cancel()
	if err != nil {
		return ms, fmt.Errorf("stop spans: %w", err)
	}
	for k, r := range resp.GetResults() {
		if r.GetCode() != 0 {
			return ms, fmt.Errorf("stop of span %d: code %d: %s", due[k], r.GetCode(), r.GetMessage())
		}
	}
	// A scrape reads every span for the metering gauges, holding the
	// module's read lock, which would stall the sampler's entries being
	// measured: look only after the passes should be done.
	var m1 map[string]float64
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return ms, err
		}
		m1, err = n.metrics(ctx)
		if err != nil {
			return ms, err
		}
		ms.Executed = m1["tollgate_metering_intervals_executed_total"] - m0["tollgate_metering_intervals_executed_total"]
		if ms.Executed >= float64(len(due)) {
			break
		}
		if time.Now().After(deadline) {
			return ms, fmt.Errorf("%v of %d stopped spans sampled after 2 minutes", ms.Executed, len(due))
		}
	}
	// The executing pass records its time just after its counter: read
	// once more, with the sampler idle now.
	time.Sleep(200 * time.Millisecond)
	if m1, err = n.metrics(ctx); err != nil {
		return ms, err
	}
	ms.SpansOpenEnd = sumMetric(m1, "tollgate_metering_spans_open")
	const scan, pass = "tollgate_metering_sampler_scan_seconds", "tollgate_metering_sampler_pass_seconds"
	if _, ok := m1[pass+"_count"]; !ok {
		return ms, fmt.Errorf("/metrics has no %s: a node from before the sampler histograms?", pass)
	}
	var mean, le float64
	ms.WorkPasses, mean, le = histOf(m1, pass).since(histOf(m0, pass))
	ms.WorkMeanMs, ms.WorkMaxLeMs = 1000*mean, 1000*le
	ms.ScanPasses, mean, le = histOf(m1, scan).since(histOf(m0, scan))
	ms.ScanMeanMs, ms.ScanMaxLeMs = 1000*mean, 1000*le
	if ms.WorkPasses == 0 {
		return ms, errors.New("no sampler pass with work was recorded while the stopped spans were sampled")
	}
	o.logf("sampler: %.0f passes with work, mean %.2f ms, all ≤ %g ms; %.0f scans, mean %.3f ms, all ≤ %g ms",
		ms.WorkPasses, ms.WorkMeanMs, ms.WorkMaxLeMs, ms.ScanPasses, ms.ScanMeanMs, ms.ScanMaxLeMs)
	return ms, nil
}

// --- series ---

func (o *scaleOpts) series(ctx context.Context, n *benchNode) (*SeriesStats, error) {
	ss := &SeriesStats{}
	var err error
	if ss.Before, err = n.memory(ctx); err != nil {
		return ss, err
	}
	c, err := clientlib.New(clientlib.Config{Addrs: []string{n.grpc}, Mode: clientlib.ModeSync})
	if err != nil {
		return ss, err
	}
	defer c.Close()
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = c.WaitReady(lctx)
	cancel()
	if err != nil {
		return ss, err
	}
	bo := benchOpts{tenants: o.seriesTenants, seriesPerTenant: o.seriesPerTenant, requestSize: 1000,
		concurrency: o.concurrency, seed: 1, timeout: time.Minute}
	bo.partitions, _ = c.Layout()
	b := &benchState{o: bo, created: make([]atomic.Int64, bo.tenants), next: make([][]atomic.Int64, bo.tenants)}
	for t := range b.next {
		b.next[t] = make([]atomic.Int64, bo.partitions)
		b.tenants = append(b.tenants, fmt.Sprintf("bench-%d", t))
	}
	t0 := time.Now()
	if err := b.prefill(ctx, c); err != nil {
		return ss, err
	}
	ss.PrefillSec = time.Since(t0).Seconds()
	if ss.Series, err = o.seriesCount(ctx, n); err != nil {
		return ss, err
	}
	o.logf("%d series created in %.1fs", ss.Series, ss.PrefillSec)
	if want := int64(o.seriesTenants) * o.seriesPerTenant; ss.Series < want {
		return ss, fmt.Errorf("the node holds %d active series, %d were created", ss.Series, want)
	}
	if err := sleepCtx(ctx, o.settle); err != nil {
		return ss, err
	}
	ss.After, err = n.memory(ctx)
	return ss, err
}

// seriesCount adds the series tenant usage reports for the series tenants.
func (o *scaleOpts) seriesCount(ctx context.Context, n *benchNode) (int64, error) {
	var total int64
	for t := range o.seriesTenants {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/api/v1/tenants/bench-%d", n.httpAddr, t), nil)
		if err != nil {
			return 0, err
		}
		resp, err := n.http.Do(req)
		if err != nil {
			return 0, err
		}
		var u struct {
			Series int64 `json:"series"`
		}
		err = json.NewDecoder(resp.Body).Decode(&u)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("tenant bench-%d usage: HTTP %d: %v", t, resp.StatusCode, err)
		}
		total += u.Series
	}
	return total, nil
}

// --- restart ---

func (o *scaleOpts) restart(ctx context.Context, n *benchNode) (*RestartInfo, error) {
	r := &RestartInfo{}
	d, err := n.stop()
	if err != nil {
		return r, err
	}
	r.StopSec = d.Seconds()
	if err := n.start(ctx); err != nil {
		return r, err
	}
	r.ReadySec, r.ReadyzSec = n.readySec, n.readyzSec
	o.logf("restart: stopped in %.2fs, ready in %.2fs, /readyz in %.2fs", r.StopSec, r.ReadySec, r.ReadyzSec)
	if r.MemoryAfter, err = n.memory(ctx); err != nil {
		return r, err
	}
	if o.has("series") {
		if r.SeriesAfter, err = o.seriesCount(ctx, n); err != nil {
			return r, err
		}
	}
	return r, nil
}

// --- the table ---

func (r *ScaleResult) print(out io.Writer) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	base, big := fmt.Sprintf("base node, %d tenants", r.BaseTenants), fmt.Sprintf("node, %d tenants", r.Tenants)
	fmt.Fprintf(tw, "stage\tmeasure\t%s\t%s\tratio / bar\n", base, big)
	ratio := func(a, b float64) string {
		if a == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", b/a)
	}
	verdict := func(ok bool) string {
		if ok {
			return "MET"
		}
		return "NOT MET"
	}
	if r.IdleBase != nil && r.IdleBig != nil {
		q := *r.IdleBig / max(*r.IdleBase, 0.01)
		fmt.Fprintf(tw, "1 idle\tCPU over the idle window, %% of one core\t%.2f\t%.2f\t%.2f (bar ≤ 1.2: %s)\n", *r.IdleBase, *r.IdleBig, q, verdict(q <= 1.2))
	}
	if a, b := r.StreamsBase, r.StreamsBig; a != nil && b != nil {
		fmt.Fprintf(tw, "2 streams\t%d clients; WatchCluster first message, B/stream\t%.0f\t%.0f\t%s (carries the config)\n", b.Clients, a.ClusterFirstBytes, b.ClusterFirstBytes, ratio(a.ClusterFirstBytes, b.ClusterFirstBytes))
		fmt.Fprintf(tw, "2 streams\tWatchCluster later, msgs and B/stream/min\t%.2f, %.0f\t%.2f, %.0f\t%s\n", a.ClusterMsgsPerMin, a.ClusterBytesPerMin, b.ClusterMsgsPerMin, b.ClusterBytesPerMin, ratio(a.ClusterBytesPerMin, b.ClusterBytesPerMin))
		qc := b.ConfigChangeBytes / max(a.ConfigChangeBytes, 1)
		fmt.Fprintf(tw, "2 streams\tWatchCluster after one limits change, B/stream\t%.0f\t%.0f\t%.2f (a delta: independent of tenants: %s)\n", a.ConfigChangeBytes, b.ConfigChangeBytes, qc, verdict(qc >= 0.8 && qc <= 1.25))
		fmt.Fprintf(tw, "2 streams\tWatchSketches (%d tenants each) first message, B/stream\t%.0f\t%.0f\t%s\n", b.SubsPerClient, a.SketchFirstBytes, b.SketchFirstBytes, ratio(a.SketchFirstBytes, b.SketchFirstBytes))
		q := b.SketchBytesPerMin / max(a.SketchBytesPerMin, 1)
		fmt.Fprintf(tw, "2 streams\tWatchSketches later, msgs and B/stream/min\t%.1f, %.0f\t%.1f, %.0f\t%.2f (bar: independent of tenants: %s)\n", a.SketchMsgsPerMin, a.SketchBytesPerMin, b.SketchMsgsPerMin, b.SketchBytesPerMin, q, verdict(q >= 0.9 && q <= 1.1))
		fmt.Fprintf(tw, "2 streams\tWatchSketches later, B/message\t%.0f\t%.0f\t%s\n", a.SketchBytesPerMsg, b.SketchBytesPerMsg, ratio(a.SketchBytesPerMsg, b.SketchBytesPerMsg))
	}
	if m := r.Metering; m != nil {
		fmt.Fprintf(tw, "3 metering\t%d open spans created (Metering.Events), s\t\t%.1f\t%.0f spans/s\n", m.Spans, m.CreateSec, float64(m.Spans)/max(m.CreateSec, 1e-9))
		fmt.Fprintf(tw, "3 metering\tsampler: finding the due spans, %d due (group %d: %d open), ms\t\tmean %.3f, all ≤ %g\t%.0f scans (bar ≤ 10 ms: %s)\n", m.Due, m.Group, m.GroupOpen, m.ScanMeanMs, m.ScanMaxLeMs, m.ScanPasses, verdict(m.ScanMaxLeMs <= 10))
		fmt.Fprintf(tw, "3 metering\tsampler: whole pass with work (raft commit included), ms\t\tmean %.2f, all ≤ %g\t%.0f passes (≤ 10 ms: %s)\n", m.WorkMeanMs, m.WorkMaxLeMs, m.WorkPasses, verdict(m.WorkMaxLeMs <= 10))
	}
	if s := r.Series; s != nil && s.Series > 0 {
		per := func(x int64) float64 { return float64(x) / float64(s.Series) }
		fmt.Fprintf(tw, "4 series\t%d series over the series tenants, prefill s\t\t%.1f\t%.0f series/s\n", s.Series, s.PrefillSec, float64(s.Series)/max(s.PrefillSec, 1e-9))
		fmt.Fprintf(tw, "4 series\tGo heap, MB before → after; B/series\t\t%.0f → %.0f\t%.1f B/series (%.1f added)\n", mb(s.Before.HeapBytes), mb(s.After.HeapBytes), per(s.After.HeapBytes), per(s.After.HeapBytes-s.Before.HeapBytes))
		fmt.Fprintf(tw, "4 series\tRssAnon, MB before → after; B/series\t\t%.0f → %.0f\t%.1f B/series (%.1f added; bar ≤ 16: %s)\n", mb(s.Before.RssAnonBytes), mb(s.After.RssAnonBytes), per(s.After.RssAnonBytes), per(s.After.RssAnonBytes-s.Before.RssAnonBytes), verdict(per(s.After.RssAnonBytes) <= 16))
		fmt.Fprintf(tw, "4 series\tVmRSS, MB before → after; B/series\t\t%.0f → %.0f\t%.1f B/series (%.1f added)\n", mb(s.Before.VmRSSBytes), mb(s.After.VmRSSBytes), per(s.After.VmRSSBytes), per(s.After.VmRSSBytes-s.Before.VmRSSBytes))
	}
	if r.IdleLoaded != nil {
		fmt.Fprintf(tw, "4 idle\tCPU with everything above loaded, %% of one core\t\t%.2f\t\n", *r.IdleLoaded)
	}
	if x := r.Restart; x != nil {
		note := ""
		if r.Series != nil {
			note = fmt.Sprintf("%d series after (bar ≤ 5 s at 100M: %s)", x.SeriesAfter, verdict(x.ReadyzSec <= 5))
		}
		fmt.Fprintf(tw, "5 restart\tSIGTERM → exit; start → ready banner; → /readyz, s\t\t%.2f; %.2f; %.2f\t%s\n", x.StopSec, x.ReadySec, x.ReadyzSec, note)
		if s := r.Series; s != nil && s.Series > 0 {
			m := x.MemoryAfter
			fmt.Fprintf(tw, "5 restart\tonce ready: Go heap; RssAnon, MB\t\t%.0f; %.0f\t%.1f; %.1f B/series\n", mb(m.HeapBytes), mb(m.RssAnonBytes), float64(m.HeapBytes)/float64(s.Series), float64(m.RssAnonBytes)/float64(s.Series))
		}
	}
	tw.Flush()
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
