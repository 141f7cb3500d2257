package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// Change scenarios of `tollgate ratebench --change`: what a rate limit does
// while something changes, measured as the largest 1-second window of
// admissions (10 ms steps) and the mean, both ÷ the limit.
const (
	changeSteady   = "steady"   // 5× offered throughout
	changeChurn    = "churn"    // 5× offered; every 2 s, 10 of the clients are replaced by new ones
	changeOnOff    = "onoff"    // 5× for 2 s, nothing for 2 s, and again
	changeBurst    = "burst"    // 5× offered to a tenant whose ingestion_burst is a tenth of its limit
	changeFailover = "failover" // 5× offered; after 2 s the owner of the tenants' rate group stops abruptly
	changeLower    = "lower"    // 5× offered; after 2 s the tenant's limit is halved (limits file)
)

var changeScenarios = []string{changeSteady, changeChurn, changeOnOff, changeBurst, changeLower, changeFailover}

func parseChangeScenarios(s string) ([]string, error) {
	if s == "all" {
		return changeScenarios, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		ok := false
		for _, c := range changeScenarios {
			ok = ok || c == f
		}
		if !ok {
			return nil, fmt.Errorf("ratebench: --change %q: want all or a list of %s", f, strings.Join(changeScenarios, ", "))
		}
		out = append(out, f)
	}
	// The failover stops a node: it runs last.
	for i, f := range out {
		if f == changeFailover && i != len(out)-1 {
			out = append(append(out[:i:i], out[i+1:]...), changeFailover)
			break
		}
	}
	return out, nil
}

// changeCell is one measured (scenario, strategy).
type changeCell struct {
	mean, maxWindow, onMean float64 // ÷ the limit; onMean only for on/off
}

// runChangeBench runs the change scenarios on one fresh 3-node cluster, the
// strategies side by side on separate tenants of the same raft group (so the
// failover stops the owner of all of them).
func runChangeBench(ctx context.Context, out io.Writer, o rateBenchOpts, scenarios []string) error {
	dir, cleanup, err := benchDataDir(o.dataDir)
	if err != nil {
		return err
	}
	defer cleanup()
	n := 60
	if len(o.clients) > 0 {
		n = o.clients[0]
	}
	// Tenants, per scenario and strategy, all in rate group 0.
	tenants := map[string][]string{}
	suffix := 0
	for _, sc := range scenarios {
		for _, st := range o.strategies {
			var name string
			for {
				suffix++
				name = fmt.Sprintf("rc-%s-%s-%d", sc, st, suffix)
				if api.RateGroup(name, api.DefaultPartitions, api.DefaultGroups) == 0 {
					break
				}
			}
			tenants[sc] = append(tenants[sc], name)
		}
	}
	limitsFile := filepath.Join(dir, "limits.yaml")
	// writeLimits writes every tenant's limit; lowered: the lower
	// scenario's tenants get half.
	writeLimits := func(lowered bool) error {
		var yaml strings.Builder
		fmt.Fprintf(&yaml, "defaults:\n  ingestion_rate: %g\ntenants:\n", o.limit)
		for _, sc := range scenarios {
			for _, name := range tenants[sc] {
				rate := o.limit
				if sc == changeLower && lowered {
					rate = o.limit / 2
				}
				burst := ""
				if sc == changeBurst {
					burst = fmt.Sprintf("    ingestion_burst: %d\n", int64(o.limit/10))
				}
				fmt.Fprintf(&yaml, "  %s:\n    ingestion_rate: %g\n%s", name, rate, burst)
			}
		}
		// Written whole, then renamed: the reload never reads half a file.
		tmp := limitsFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(yaml.String()), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, limitsFile)
	}
	if err := writeLimits(false); err != nil {
		return err
	}
	nodes, err := startBenchCluster(ctx, dir, limitsFile)
	stopped := make([]bool, len(nodes))
	defer func() {
		for i, s := range nodes {
			if stopped[i] {
				continue
			}
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_ = s.Stop(sctx)
			cancel()
		}
	}()
	if err != nil {
		return err
	}
	var addrs []string
	for _, s := range nodes {
		addrs = append(addrs, s.GRPCAddr())
	}
	fmt.Fprintf(out, "ratebench --change: 3 nodes %v, limit %g tokens/s, %d tokens/request, %d clients per strategy, 5× offered (Poisson)\n",
		addrs, o.limit, o.tokens, n)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\t")
	for _, st := range o.strategies {
		fmt.Fprintf(tw, "%s mean\t%s max 1s\t%s on-mean\t", st, st, st)
	}
	fmt.Fprintln(tw)
	pool := &connPool{conns: map[string]*grpc.ClientConn{}}
	defer pool.close()
	for _, sc := range scenarios {
		cells := make([]changeCell, len(o.strategies))
		sets := make([]*clientSet, len(o.strategies))
		for si, st := range o.strategies {
			cs, err := newClientSet(n, addrs, st, pool)
			if err != nil {
				return err
			}
			sets[si] = cs
		}
		var stopAt func()
		if sc == changeLower {
			stopAt = func() { _ = writeLimits(true) }
		}
		if sc == changeFailover {
			stopAt = func() {
				for i, s := range nodes {
					if s.Raft(0).State() == raft.Leader {
						stopped[i] = true
						cctx, cancel := context.WithCancel(context.Background())
						cancel() // abrupt: no leadership hand-off, streams cut at once
						_ = s.Stop(cctx)
						return
					}
				}
			}
		}
		var wg sync.WaitGroup
		var stopOnce sync.Once
		for si := range o.strategies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cells[si] = runChangeCase(sc, sets[si], tenants[sc][si], o, func() {
					if stopAt != nil {
						stopOnce.Do(stopAt)
					}
				}, uint64(si+1))
			}()
		}
		wg.Wait()
		for _, cs := range sets {
			cs.close()
		}
		fmt.Fprintf(tw, "%s\t", sc)
		for _, c := range cells {
			on := "-"
			if sc == changeOnOff {
				on = fmt.Sprintf("%.3f", c.onMean)
			}
			fmt.Fprintf(tw, "%.3f\t%.3f\t%s\t", c.mean, c.maxWindow, on)
		}
		fmt.Fprintln(tw)
		time.Sleep(500 * time.Millisecond)
	}
	return tw.Flush()
}

// clientSet is the clients of one strategy; churn replaces some of them.
type clientSet struct {
	mu    sync.Mutex
	cs    []*ratelimit.Client
	addrs []string
	st    ratelimit.Strategy
	pool  *connPool
}

func newClientSet(n int, addrs []string, st ratelimit.Strategy, pool *connPool) (*clientSet, error) {
	s := &clientSet{addrs: addrs, st: st, pool: pool}
	for range n {
		c, err := s.newClient()
		if err != nil {
			s.close()
			return nil, err
		}
		s.cs = append(s.cs, c)
	}
	return s, nil
}

func (s *clientSet) newClient() (*ratelimit.Client, error) {
	return ratelimit.New(ratelimit.Config{Addrs: s.addrs, Strategy: s.st, Conn: s.pool.get,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func (s *clientSet) pick(r *rand.Rand) *ratelimit.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cs[r.IntN(len(s.cs))]
}

// replace closes k random clients and starts k new ones (fresh ids).
func (s *clientSet) replace(k int, r *rand.Rand) error {
	var old []*ratelimit.Client
	s.mu.Lock()
	for range k {
		i := r.IntN(len(s.cs))
		nc, err := s.newClient()
		if err != nil {
			s.mu.Unlock()
			return err
		}
		old = append(old, s.cs[i])
		s.cs[i] = nc
	}
	s.mu.Unlock()
	for _, c := range old {
		_ = c.Close()
	}
	return nil
}

func (s *clientSet) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cs {
		_ = c.Close()
	}
	s.cs = nil
}

// runChangeCase offers 5× the limit (Poisson, o.tokens per request) for the
// scenario's span and measures after a 2 s warm-up. event runs once, 2 s into
// the measured span (failover).
func runChangeCase(sc string, cs *clientSet, tenant string, o rateBenchOpts, event func(), seed uint64) changeCell {
	const (
		bin    = 10 * time.Millisecond
		warmup = 2 * time.Second
	)
	span := 6 * time.Second
	if sc == changeLower {
		span = 7 * time.Second
	}
	if sc == changeOnOff {
		span = 10 * time.Second
	}
	// on/off: on for the warm-up and then off 2 s, on 2 s, …
	on := func(el time.Duration) bool {
		if sc != changeOnOff || el < warmup {
			return true
		}
		return ((el-warmup)/(2*time.Second))%2 == 1
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	churnRng := rand.New(rand.NewPCG(seed, 13))
	reqPerSec := 5 * o.limit / float64(o.tokens)
	bins := make([]float64, int(span/bin))
	onBins := make([]bool, len(bins))
	start := time.Now()
	end := start.Add(warmup + span)
	next := start
	nextChurn := warmup
	evented := false
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / reqPerSec * 1e9))
		if next.After(end) {
			break
		}
		if d := time.Until(next); d > time.Millisecond {
			time.Sleep(d)
		}
		el := next.Sub(start)
		if sc == changeChurn && el >= nextChurn {
			_ = cs.replace(10, churnRng)
			nextChurn += 2 * time.Second
		}
		if !evented && el >= warmup+2*time.Second {
			evented = true
			go event()
		}
		if !on(el) {
			continue
		}
		ok := cs.pick(rng).Allow(tenant, o.tokens)
		if el >= warmup {
			b := int((el - warmup) / bin)
			if b < len(bins) {
				onBins[b] = true
				if ok {
					bins[b] += float64(o.tokens)
				}
			}
		}
	}
	time.Sleep(time.Until(end))
	// lower: only from 1 s after the change (the file is read within
	// 200 ms, then committed through raft), against the new limit.
	limit := o.limit
	if sc == changeLower {
		from := int((2*time.Second + time.Second) / bin)
		bins, onBins = bins[from:], onBins[from:]
		limit = o.limit / 2
	}
	var c changeCell
	var total, onTotal float64
	onCount := 0
	per := int(time.Second / bin)
	var win float64
	for i, v := range bins {
		total += v
		if onBins[i] {
			onTotal += v
			onCount++
		}
		win += v
		if i >= per {
			win -= bins[i-per]
		}
		c.maxWindow = max(c.maxWindow, win/limit)
	}
	c.mean = total / (limit * float64(len(bins)) * bin.Seconds())
	if onCount > 0 {
		c.onMean = onTotal / (limit * float64(onCount) * bin.Seconds())
	}
	return c
}
