package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
	"github.com/tollgate-io/tollgate/server"
)

// newRateBenchCmd measures the rate-limit strategies side by side against a
// real three-node cluster started in this process (real raft on disk, real
// gRPC on loopback, serf membership).
func newRateBenchCmd() *cobra.Command {
	var (
		limit          float64
		tokens         int
		warmup, span   time.Duration
		clientsList    []int
		offeredList    []float64
		strategiesFlag string
		dataDir        string
		change         string
	)
	cmd := &cobra.Command{
		Use:   "ratebench",
		Short: "Benchmark global rate-limit strategies against an in-process 3-node cluster",
		Long: `ratebench starts three Tollgate nodes in this process (loopback, real raft and
gRPC), gives every tenant ingestion_rate = --limit, and for each N in --clients
runs N clientlib rate limiters per strategy. For each offered load (× the limit)
and each routing (random over all N clients, or sticky over 4), it offers
Poisson traffic of --tokens-token requests to one fresh tenant per strategy, at
the same time, and reports admitted ÷ limit over --measure after --warmup.

With --change (all, or a list of steady, churn, onoff, burst, lower, failover) it
instead measures what happens while something changes, 5× offered to one
tenant per strategy of the same rate group, N = the first --clients value:
steady; churn (10 clients replaced every 2 s); onoff (5× for 2 s, nothing for
2 s); burst (ingestion_burst = limit/10); lower (the limit halved in the
limits file 2 s into the measured span; measured from 1 s after, against the
new limit); failover (the group's leader stops abruptly 2 s into the
measured span: no hand-off, streams cut). It reports the mean and the
largest 1-second window (10 ms steps), ÷ the limit.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var strategies []ratelimit.Strategy
			for _, s := range strings.Split(strategiesFlag, ",") {
				st, err := ratelimit.ParseStrategy(strings.TrimSpace(s))
				if err != nil {
					return err
				}
				strategies = append(strategies, st)
			}
			if limit <= 0 || tokens <= 0 || span <= 0 || warmup < 0 {
				return fmt.Errorf("ratebench: --limit, --tokens and --measure must be > 0, --warmup ≥ 0")
			}
			if change != "" {
				scs, err := parseChangeScenarios(change)
				if err != nil {
					return err
				}
				return runChangeBench(cmd.Context(), cmd.OutOrStdout(), rateBenchOpts{limit: limit, tokens: tokens,
					clients: clientsList, strategies: strategies, dataDir: dataDir}, scs)
			}
			return runRateBench(cmd.Context(), cmd.OutOrStdout(), rateBenchOpts{limit: limit, tokens: tokens, warmup: warmup, span: span,
				clients: clientsList, offered: offeredList, strategies: strategies, dataDir: dataDir})
		},
	}
	f := cmd.Flags()
	f.Float64Var(&limit, "limit", 10000, "tenant ingestion_rate, tokens/s")
	f.IntVar(&tokens, "tokens", 10, "tokens per request")
	f.DurationVar(&warmup, "warmup", time.Second, "traffic before measuring, per case")
	f.DurationVar(&span, "measure", 3*time.Second, "measured span per case")
	f.IntSliceVar(&clientsList, "clients", []int{10, 60}, "numbers of client limiters per strategy")
	f.Float64SliceVar(&offeredList, "offered", []float64{0.8, 1, 2, 5}, "offered load, × the limit")
	f.StringVar(&strategiesFlag, "strategies", "blocklist,lease,local", "strategies, side by side")
	f.StringVar(&change, "change", "", "run change scenarios instead: all, or a list of steady, churn, onoff, burst, lower, failover")
	f.StringVar(&dataDir, "data-dir", "", "where the nodes keep their data (default: a temp dir, removed)")
	return cmd
}

type rateBenchOpts struct {
	limit       float64
	tokens      int
	warmup      time.Duration
	span        time.Duration
	clients     []int
	offered     []float64
	strategies  []ratelimit.Strategy
	dataDir     string
	stickyCount int
}

// rateCell is one measured (case, strategy).
type rateCell struct {
	admitted, offered float64
}

// benchDataDir is where the benchmark's nodes keep their data: dir when
// given (kept), else a temporary directory that cleanup removes.
func benchDataDir(dir string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", "tollgate-ratebench-")
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}

func runRateBench(ctx context.Context, out io.Writer, o rateBenchOpts) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.stickyCount == 0 {
		o.stickyCount = 4
	}
	dir, cleanup, err := benchDataDir(o.dataDir)
	if err != nil {
		return err
	}
	defer cleanup()
	limitsFile := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limitsFile, fmt.Appendf(nil, "defaults:\n  ingestion_rate: %g\n", o.limit), 0o644); err != nil {
		return err
	}
	nodes, err := startBenchCluster(ctx, dir, limitsFile)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range nodes {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_ = s.Stop(sctx)
			cancel()
		}
	}()
	var addrs []string
	for _, s := range nodes {
		addrs = append(addrs, s.GRPCAddr())
	}
	fmt.Fprintf(out, "ratebench: 3 nodes %v, limit %g tokens/s, %d tokens/request, warmup %v, measure %v per case\n",
		addrs, o.limit, o.tokens, o.warmup, o.span)

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "N\trouting\toffered×\t")
	for _, st := range o.strategies {
		fmt.Fprintf(tw, "%s adm/lim\t%s rej%%\t", st, st)
	}
	fmt.Fprintln(tw)
	// All limiters of the process share one connection per node, as a
	// multi-tenant process would: 3 × N separate connections cost more CPU
	// than the benchmark measures.
	pool := &connPool{conns: map[string]*grpc.ClientConn{}}
	defer pool.close()
	var lagNotes []string
	caseNo := 0
	for ni, n := range o.clients {
		if ni > 0 {
			// Let owners forget the previous clients (active count, Local).
			time.Sleep(3500 * time.Millisecond)
		}
		sets := make([][]*ratelimit.Client, len(o.strategies))
		for si, st := range o.strategies {
			for range n {
				c, err := ratelimit.New(ratelimit.Config{Addrs: addrs, Strategy: st, Conn: pool.get,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					return err
				}
				sets[si] = append(sets[si], c)
			}
		}
		for _, routing := range []string{"random", "sticky4"} {
			for _, x := range o.offered {
				caseNo++
				cells := make([]rateCell, len(o.strategies))
				var wg sync.WaitGroup
				for si := range o.strategies {
					tenant := fmt.Sprintf("rb-%d-%s-%d", caseNo, o.strategies[si], time.Now().UnixNano()%1e6)
					active := sets[si]
					if routing == "sticky4" {
						active = active[:min(o.stickyCount, len(active))]
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						cells[si] = offerPoisson(active, tenant, x*o.limit/float64(o.tokens), o.tokens, o.warmup, o.span, uint64(caseNo*10+si))
					}()
				}
				wg.Wait()
				fmt.Fprintf(tw, "%d\t%s\t%.1f\t", n, routing, x)
				for _, c := range cells {
					rej := 0.0
					if c.offered > 0 {
						rej = 100 * (c.offered - c.admitted) / c.offered
					}
					fmt.Fprintf(tw, "%.3f\t%.2f\t", c.admitted/(o.limit*o.span.Seconds()), rej)
				}
				fmt.Fprintln(tw)
			}
		}
		for si, set := range sets {
			var ages []time.Duration
			var noState, failOpen uint64
			for _, c := range set {
				st := c.Stats()
				ages = append(ages, st.UpdateAge)
				failOpen += st.FailedOpen
				for _, ts := range c.TenantStats() {
					noState += ts.AllowedBy["no_state"]
				}
				_ = c.Close()
			}
			slices.Sort(ages)
			lagNotes = append(lagNotes, fmt.Sprintf("N=%d %s: update age at the end median %v, max %v; admitted without an update (no_state) %d requests, failed open %d",
				n, o.strategies[si], ages[len(ages)/2].Round(time.Millisecond), ages[len(ages)-1].Round(time.Millisecond), noState, failOpen))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range lagNotes {
		fmt.Fprintln(out, l)
	}
	return nil
}

// connPool hands every limiter the same connection per node.
type connPool struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func (p *connPool) get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc := p.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("ratebench: dial %s: %w", addr, err)
	}
	p.conns[addr] = cc
	return cc, nil
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cc := range p.conns {
		_ = cc.Close()
	}
}

// offerPoisson sends Poisson arrivals at reqPerSec, each of tokens tokens, to
// a random client of cs, and counts what is admitted after warmup.
func offerPoisson(cs []*ratelimit.Client, tenant string, reqPerSec float64, tokens int, warmup, span time.Duration, seed uint64) rateCell {
	rng := rand.New(rand.NewPCG(seed, 7))
	var admitted, offered atomic.Int64
	start := time.Now()
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(span)
	next := start
	for {
		// exponential inter-arrival times, sleeping in ≥1ms slices
		next = next.Add(time.Duration(rng.ExpFloat64() / reqPerSec * 1e9))
		if next.After(end) {
			break
		}
		if d := time.Until(next); d > time.Millisecond {
			time.Sleep(d)
		}
		ok := cs[rng.IntN(len(cs))].Allow(tenant, tokens)
		if !next.Before(measureFrom) {
			offered.Add(int64(tokens))
			if ok {
				admitted.Add(int64(tokens))
			}
		}
	}
	time.Sleep(time.Until(end))
	return rateCell{admitted: float64(admitted.Load()), offered: float64(offered.Load())}
}

func startBenchCluster(ctx context.Context, dir, limitsFile string) ([]*server.Server, error) {
	var nodes []*server.Server
	var seed string
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	for i := range 3 {
		cfg := server.Config{
			Node: server.NodeConfig{
				ID:       fmt.Sprintf("rb%d", i+1),
				Zone:     fmt.Sprintf("zone-%c", 'a'+i),
				DataDir:  filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
				GRPCAddr: "127.0.0.1:0",
				HTTPAddr: "-",
			},
			Raft:    server.RaftConfig{Addr: "127.0.0.1:0"},
			Gossip:  server.GossipConfig{Addr: "127.0.0.1:0", ProbeInterval: 200 * time.Millisecond},
			Cluster: server.ClusterConfig{BootstrapExpect: 3},
			Limits: server.LimitsConfig{
				File: limitsFile,
				// A changed limits file (ratebench --change lower) is read
				// within 200 ms, so the figures measure the limiter, not the poll.
				Reload: 200 * time.Millisecond,
			},
			Logger: logger,
		}
		if seed != "" {
			cfg.Gossip.Join = []string{seed}
		}
		s, err := server.New(cfg)
		if err != nil {
			for _, n := range nodes {
				_ = n.Stop(context.Background())
			}
			return nil, fmt.Errorf("ratebench: start node %d: %w", i+1, err)
		}
		if seed == "" {
			seed = s.GossipAddr()
		}
		nodes = append(nodes, s)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, s := range nodes {
		if err := s.WaitReady(wctx); err != nil {
			return nodes, fmt.Errorf("ratebench: cluster not ready: %w", err)
		}
	}
	return nodes, nil
}
