package ratelimit

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// scriptRun is what a deterministic script made an owner say: every update
// it built (per round, per stream, in stream order) and its metrics counts
// after every round.
type scriptRun struct {
	updates [][]*api.RateUpdate
	counts  []ownerCounts
}

// runScript drives an owner through a fixed, seeded run that reaches every
// path of the tick: clients on all three strategies reporting overlapping
// tenant sets (each tenant reported by perTenant clients), tenants
// introduced over several rounds with bucket counts (by age, and by start),
// limits that differ per tenant (some unlimited, one that changes midway),
// a group lost and regained (moved ids, redirects, a takeover), a client
// that reconnects on a new stream (carried state), one whose old stream
// lingers (superseded entries), and one that numbers its tenants downwards. The input depends on nothing but the
// arguments, so two owners given the same script must say the same thing.
func runScript(t testing.TB, o *Owner, tenants, clients, perTenant, rounds int) scriptRun {
	t.Helper()
	rng := rand.New(rand.NewPCG(20261126, uint64(tenants)))
	now := time.Unix(1_800_000_000, 37_000_000)
	lowered := false
	limits := func(name string) (float64, int64) {
		h := fnv.New64a()
		h.Write([]byte(name))
		v := h.Sum64()
		rate := []float64{0, 50, 400, 3000, 20_000}[v%5]
		if lowered && v%7 == 0 {
			rate /= 2
		}
		burst := []int64{0, 0, 1000}[(v>>8)%3]
		return rate, burst
	}
	o.limits = limits
	lost := false
	owns := func(g int) bool { return !(lost && g == 1) }
	leaderOf := func(g int) (string, string) { return fmt.Sprintf("n%d", g), fmt.Sprintf("10.0.0.%d:7001", g) }
	strategies := []api.RateStrategy{api.RateStrategy_RATE_STRATEGY_LEASE, api.RateStrategy_RATE_STRATEGY_BLOCKLIST, api.RateStrategy_RATE_STRATEGY_LOCAL}

	type client struct {
		id       uint64
		strategy api.RateStrategy
		sess     *Session
		mine     []int // tenants this client reports
		ids      map[int]uint32
		consumed map[int]uint64
		offered  map[int]uint64
	}
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = &client{id: uint64(i + 1), strategy: strategies[i%len(strategies)], sess: o.NewSession(),
			ids: map[int]uint32{}, consumed: map[int]uint64{}, offered: map[int]uint64{}}
	}
	for j := range tenants {
		for k := range perTenant {
			c := cs[(j+k)%clients]
			c.mine = append(c.mine, j)
		}
	}
	var lingering *Session // a stream replaced while still open
	var run scriptRun
	for round := range rounds {
		now = now.Add(100 * time.Millisecond)
		switch round {
		case 8:
			lost = true // group 1's tenants move away
		case 14:
			lost = false // and come back: a takeover
		case 18:
			lowered = true
		}
		for ci, c := range cs {
			if round == 11 && ci == 0 || round == 12 && ci == 1 {
				// A reconnect: client 0's old stream closes first, client
				// 1's lingers (its owner has not seen it break).
				if ci == 0 {
					c.sess.Close()
				} else {
					lingering = c.sess
				}
				c.sess, c.ids = o.NewSession(), map[int]uint32{}
			}
			// Tenants are introduced over the first rounds, a quarter at a time.
			known := min(len(c.mine), (round+1)*(len(c.mine)+3)/4)
			r := &api.RateReport{ClientId: c.id, Strategy: c.strategy}
			withBuckets := false
			for _, j := range c.mine[:known] {
				if _, ok := c.ids[j]; !ok {
					withBuckets = true
				}
			}
			for _, j := range c.mine[:known] {
				id, ok := c.ids[j]
				if !ok {
					id = uint32(len(c.ids) + 1)
					if ci == 3 {
						// This client numbers its tenants downwards:
						// each new entry goes before the others.
						id = uint32(o.cfg.MaxTenantsPerStream - len(c.ids))
					}
					c.ids[j] = id
					r.NewIds = append(r.NewIds, id)
					r.NewNames = append(r.NewNames, fmt.Sprintf("tenant-%05d", j))
				} else if !withBuckets && rng.IntN(10) < 3 {
					continue // not reported this round
				}
				d := uint64(rng.IntN(400))
				c.consumed[j] += d
				c.offered[j] += d + uint64(rng.IntN(300))
				r.Ids = append(r.Ids, id)
				r.ConsumedTotal = append(r.ConsumedTotal, c.consumed[j])
				r.OfferedTotal = append(r.OfferedTotal, c.offered[j])
				if withBuckets {
					r.BucketStartUnixNanos = append(r.BucketStartUnixNanos, now.UnixNano()-now.UnixNano()%int64(time.Second))
					r.BucketConsumed = append(r.BucketConsumed, c.consumed[j]/3)
					r.PrevBucketConsumed = append(r.PrevBucketConsumed, c.consumed[j]/5)
					if ci%2 == 0 {
						r.BucketAgeNanos = append(r.BucketAgeNanos, int64(rng.IntN(int(time.Second))))
					}
				}
			}
			if withBuckets && ci%2 == 0 && len(r.BucketAgeNanos) != len(r.Ids) {
				t.Fatalf("script: %d ages for %d ids", len(r.BucketAgeNanos), len(r.Ids))
			}
			if err := c.sess.Absorb(r, now); err != nil {
				t.Fatalf("round %d, client %d: %v", round, ci, err)
			}
		}
		if lingering != nil && round == 13 {
			// The lingering stream reports late: superseded, it must not count.
			if err := lingering.Absorb(&api.RateReport{Ids: []uint32{1}, ConsumedTotal: []uint64{1 << 40}, OfferedTotal: []uint64{1 << 40}}, now); err != nil {
				t.Fatalf("lingering stream: %v", err)
			}
		}
		o.Tick(now, owns, leaderOf)
		var us []*api.RateUpdate
		for _, c := range cs {
			if u := c.sess.Take(); u != nil {
				us = append(us, proto.Clone(u).(*api.RateUpdate))
				c.sess.Recycle(u)
			} else {
				us = append(us, nil)
			}
		}
		run.updates = append(run.updates, us)
		run.counts = append(run.counts, o.counts(now.UnixNano()))
	}
	return run
}

// dumpScript writes a run as text, for comparing runs by eye.
func dumpScript(r scriptRun) string {
	var b []byte
	for i, us := range r.updates {
		b = fmt.Appendf(b, "round %d counts %+v\n", i, r.counts[i])
		for j, u := range us {
			b = fmt.Appendf(b, "  stream %d: %s\n", j, prototext.MarshalOptions{}.Format(u))
		}
	}
	return string(b)
}

// mustNew is New for a configuration the test knows to be valid.
func mustNew(t testing.TB, cfg Config, p, g int, limits Limits) *Owner {
	t.Helper()
	o, err := New(cfg, p, g, limits)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestShardedTickMatchesOneShard: the same script gives the same updates,
// bit for bit, with the tenants in one shard (the tick as it was before it
// was sharded: every tenant on one goroutine, entries folded stream by
// stream) and in several, and the same metrics (their float sums add up
// tenants in map order, so those to within rounding). Each tenant is
// reported by three clients, so the order of a tenant's folds matters to
// its float sums: a shard that visited the streams in another order would
// show here.
func TestShardedTickMatchesOneShard(t *testing.T) {
	const tenants, clients, perTenant, rounds = 3000, 12, 3, 24
	want := runScript(t, mustNew(t, Config{Shards: 1}, 64, 4, nil), tenants, clients, perTenant, rounds)
	var grants, moved int
	for _, us := range want.updates {
		for _, u := range us {
			grants += len(u.GetCap())
			moved += len(u.GetMovedIds())
		}
	}
	if grants == 0 || moved == 0 {
		t.Fatalf("the script reached too little: %d grants, %d moved ids", grants, moved)
	}
	for _, c := range []struct {
		shards int
		serial bool // the shards one after the other, as below parallelTick
	}{{2, false}, {3, false}, {7, false}, {64, false}, {0, false}, {2, true}, {0, true}} {
		shards := c.shards
		o := mustNew(t, Config{Shards: shards}, 64, 4, nil)
		if !c.serial {
			o.parallelMin = 0 // the script is below parallelTick
		}
		got := runScript(t, o, tenants, clients, perTenant, rounds)
		for r := range want.updates {
			for i := range want.updates[r] {
				if w, g := want.updates[r][i], got.updates[r][i]; !proto.Equal(w, g) {
					gs, ws := firstDiff(g, w)
					t.Fatalf("Shards %d (%d in use, serial %v), round %d, stream %d: update differs from one shard's:\n got …%s…\nwant …%s…",
						shards, len(o.shards), c.serial, r, i, gs, ws)
				}
			}
			w, g := want.counts[r], got.counts[r]
			near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b)) }
			if w.owned != g.owned || w.blocked != g.blocked || w.limited != g.limited ||
				!near(w.limitedRate, g.limitedRate) || !near(w.limitedLimit, g.limitedLimit) {
				t.Fatalf("Shards %d, round %d: counts %+v, one shard's %+v", shards, r, g, w)
			}
		}
	}
}

// firstDiff returns the two updates' text around where they first differ.
func firstDiff(a, b *api.RateUpdate) (string, string) {
	x, y := prototext.MarshalOptions{}.Format(a), prototext.MarshalOptions{}.Format(b)
	i := 0
	for i < len(x) && i < len(y) && x[i] == y[i] {
		i++
	}
	from := max(0, i-120)
	return x[from:min(len(x), i+120)], y[from:min(len(y), i+120)]
}

// TestShardsSpread: tenant names spread over the shards, and the tenants of
// one rate group too (a node that leads one group ticks its owned tenants
// on every shard, not on a few).
func TestShardsSpread(t *testing.T) {
	o := mustNew(t, Config{Shards: 8}, 64, 4, nil)
	per := make([]int, len(o.shards))
	for j := range 8000 {
		name := fmt.Sprintf("tenant-%05d", j)
		if api.RateGroup(name, 64, 4) == 1 {
			per[o.shardOf(name)]++
		}
	}
	var n int
	for _, c := range per {
		n += c
	}
	for k, c := range per {
		if c < n/len(per)*3/4 || c > n/len(per)*5/4 {
			t.Errorf("shard %d holds %d of group 1's %d tenants (even: %d)", k, c, n, n/len(per))
		}
	}
}

// TestConfigShards: an out-of-range shard count is an error naming the
// field; 0 takes one per core.
func TestConfigShards(t *testing.T) {
	for _, n := range []int{-1, maxShards + 1} {
		if _, err := New(Config{Shards: n}, 64, 4, nil); err == nil || !strings.Contains(err.Error(), "Config.Shards") {
			t.Errorf("Shards %d: err = %v, want one naming Config.Shards", n, err)
		}
	}
	o := mustNew(t, Config{}, 64, 4, nil)
	if want := min(runtime.GOMAXPROCS(0), DefaultMaxShards); len(o.shards) != want {
		t.Errorf("default shards = %d, want %d", len(o.shards), want)
	}
}

// TestNewTenantWaitsOnlyForItsShard: a report introducing a tenant locks
// that tenant's shard only, so it goes through while another shard is in
// its tick (its lock held here); and a report of known tenants takes no
// shard lock at all. Were either to wait for the held shard, this test
// would not return.
func TestNewTenantWaitsOnlyForItsShard(t *testing.T) {
	o := mustNew(t, Config{Shards: 4}, 64, 4, func(string) (float64, int64) { return 100, 0 })
	now := time.Unix(1_800_000_000, 0)
	names := map[int]string{}
	for j := 0; len(names) < 2; j++ {
		name := fmt.Sprintf("tenant-%d", j)
		if k := o.shardOf(name); k < 2 && names[k] == "" {
			names[k] = name
		}
	}
	s := o.NewSession()
	busy := &o.shards[1].mu
	busy.Lock() // shard 1 is ticking
	if err := s.Absorb(&api.RateReport{ClientId: 1, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, NewIds: []uint32{1}, NewNames: []string{names[0]},
		Ids: []uint32{1}, ConsumedTotal: []uint64{5}, OfferedTotal: []uint64{5}}, now); err != nil {
		t.Fatal(err)
	}
	for k := range o.shards {
		if k != 1 {
			o.shards[k].mu.Lock() // every shard is ticking
		}
	}
	if err := s.Absorb(&api.RateReport{Ids: []uint32{1}, ConsumedTotal: []uint64{9}, OfferedTotal: []uint64{9}}, now); err != nil {
		t.Fatal(err)
	}
	for k := range o.shards {
		o.shards[k].mu.Unlock()
	}
	o.Tick(now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
	if u := s.Take(); len(u.GetCap()) != 1 || u.Cap[0] < 9 {
		t.Fatalf("update after the reports: %v, want one cap of at least the 9 consumed", u)
	}
}

// TestForgottenTenantsLeaveTheirShard: tenants no stream reports any more
// are forgotten after ForgetAfter (their carried state too), each shard's
// walk list stays the same set as its map, and the tenants still on a
// stream keep their state (the owner took them over once, and still folds
// their client).
func TestForgottenTenantsLeaveTheirShard(t *testing.T) {
	o := mustNew(t, Config{Shards: 4}, 64, 4, func(string) (float64, int64) { return 100, 0 })
	o.parallelMin = 0
	now := time.Unix(1_800_000_000, 0)
	all := func(int) bool { return true }
	none := func(int) (string, string) { return "", "" }
	report := func(client uint64, names []string) *Session {
		s := o.NewSession()
		r := &api.RateReport{ClientId: client, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}
		for i, n := range names {
			r.NewIds, r.NewNames = append(r.NewIds, uint32(i+1)), append(r.NewNames, n)
			r.Ids, r.ConsumedTotal, r.OfferedTotal = append(r.Ids, uint32(i+1)), append(r.ConsumedTotal, 7), append(r.OfferedTotal, 7)
		}
		if err := s.Absorb(r, now); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var gone, kept []string
	for j := range 60 {
		if j%3 == 0 {
			kept = append(kept, fmt.Sprintf("kept-%d", j))
		} else {
			gone = append(gone, fmt.Sprintf("gone-%d", j))
		}
	}
	sGone, sKept := report(1, gone), report(2, kept)
	o.Tick(now, all, none)
	sGone.Close()
	for range 3 {
		now = now.Add(o.cfg.ForgetAfter)
		o.Tick(now, all, none)
	}
	for _, n := range gone {
		if o.lookup(n) != nil {
			t.Errorf("%s kept after ForgetAfter with no stream", n)
		}
	}
	for _, n := range kept {
		if ts := o.lookup(n); ts == nil || ts.epoch != 1 || ts.nClients != 1 {
			t.Errorf("%s, still on a stream, lost its state: %+v", n, ts)
		}
	}
	total := 0
	for k := range o.shards {
		sh := &o.shards[k]
		if len(sh.list) != len(sh.tenants) {
			t.Errorf("shard %d: %d in its list, %d in its map", k, len(sh.list), len(sh.tenants))
		}
		for i, ts := range sh.list {
			if ts.pos != i || sh.tenants[ts.name] != ts || o.shardOf(ts.name) != k {
				t.Errorf("shard %d: list[%d] = %s (pos %d) does not match the map", k, i, ts.name, ts.pos)
			}
		}
		total += len(sh.list)
	}
	if total != len(kept) {
		t.Errorf("%d tenants left, want the %d still reported", total, len(kept))
	}
	if got := o.size.Load(); got != int64(2*len(kept)) {
		t.Errorf("size %d, want %d (tenants plus entries)", got, 2*len(kept))
	}
	sKept.Close()
	if got := o.size.Load(); got != int64(len(kept)) {
		t.Errorf("size after the last stream closed: %d, want the %d tenants", got, len(kept))
	}
}
