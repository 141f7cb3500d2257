package shares

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/shares"
)

// The share model checker: a seeded, reproducible randomized simulation of
// the share protocol. It drives the real decision code — admission.Decide
// with the budget of Share, Mover.Admit/Borrow/Give/Receive/Complete/
// Redrive, and each group's real shares.Module (entries applied through
// Apply, snapshots through Snapshot/PrepareRestore) — over G simulated groups
// and interleaves requests of every shape, limit raises and lowers, tenant
// drops, leader crashes (also between a commit and its answer), lost
// best-effort completes, re-drives and snapshot restores. After every step
// it checks:
//
//	(a) accepted ≤ limit: a step that admitted new series leaves the tenant
//	    at or below its limit;
//	(b) no acknowledged active series is rejected;
//	(c) no rejection while the tenant is below its limit (a request that
//	    cannot establish the limit answers a retryable error instead), and
//	    every rejection is counted at the limit;
//	(d) Σ_g share_g ≤ limit (headroom in transit counted as given).
//
// FAKE: raft is replaced by "an appended entry commits and applies at once"
// (a crash is a group without a leader that loses its leader-local
// reservations); the real wiring is covered by the server and faulttest
// tests.

// brokenRules are deliberately wrong share rules: the checker must catch each.
type brokenRules struct {
	ceilSplit   bool // every group's base is ⌈limit/G⌉: Σ bases > limit
	ignoreGiven bool // a group's share ignores headroom it gave away
	resendAsNew bool // re-sends of active series are decided as new
}

type simGroup struct {
	mod    *shares.Module
	series map[string]map[uint64]bool
	up     bool
	index  uint64
}

type simTenant struct {
	limit   int64
	version uint64 // bumped by every limit change
	next    uint64
}

type sim struct {
	r       *rand.Rand
	rules   brokenRules
	n       int
	groups  []*simGroup
	tenants map[string]*simTenant
	names   []string
	mover   *Mover
	tasks   []func()
	// crashAfterCommit, when > 0, is the chance (in 1/1000) that a peer call
	// commits its entry and then its group's leader crashes before answering.
	crashAfterCommit int

	step       int
	trace      func(format string, args ...any)
	violations []string
	stats      simStats
}

type simStats struct {
	requests, accepted, rejected, unavailable, lowers, raises, crashes, restores, moves int
}

func newSim(seed uint64, rules brokenRules) *sim {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	s := &sim{r: r, rules: rules, n: 2 + r.IntN(4), tenants: map[string]*simTenant{}}
	for g := range s.n {
		m, err := shares.New(g, s.n)
		if err != nil {
			panic(err)
		}
		s.groups = append(s.groups, &simGroup{mod: m, series: map[string]map[uint64]bool{}, up: true})
	}
	for i := range 1 + r.IntN(2) {
		name := fmt.Sprintf("t%d", i)
		s.tenants[name] = &simTenant{limit: int64(s.n + r.IntN(40))}
		s.names = append(s.names, name)
	}
	s.crashAfterCommit = []int{0, 20, 100}[r.IntN(3)]
	s.mover = New(s, nil, nil)
	s.mover.fanout = func(n int, f func(int)) {
		for i := range n {
			f(i)
		}
	}
	s.mover.spawn = func(f func()) { s.tasks = append(s.tasks, f) }
	s.mover.sleep = func(context.Context, time.Duration) error { s.runTasks(); return nil }
	return s
}

// --- Host ---

func (s *sim) Groups() int      { return s.n }
func (s *sim) NodeID() string   { return "sim" }
func (s *sim) Hosts(g int) bool { return true }

// The simulation's groups live in one process: the mover reaches them
// through Peer, never through a connection.
func (s *sim) LeaderConn(context.Context, int) (*grpc.ClientConn, context.Context, error) {
	return nil, nil, status.Error(codes.Unavailable, "simulation: no connections")
}
func (s *sim) PeerConn(string) (*grpc.ClientConn, error) {
	return nil, status.Error(codes.Unavailable, "simulation: no connections")
}
func (s *sim) Module(g int) *shares.Module { return s.groups[g].mod }
func (s *sim) Leads(g int) bool            { return s.groups[g].up }
func (s *sim) Usage(g int, t string) (int64, int64) {
	return int64(len(s.groups[g].series[t])), 0
}

func (s *sim) Limit(_ int, tenant string) (int64, uint64) {
	return s.tenants[tenant].limit, s.tenants[tenant].version
}

func (s *sim) Base(g int, tenant string) int64 {
	limit := s.tenants[tenant].limit
	if s.rules.ceilSplit && limit > 0 {
		return (limit + int64(s.n) - 1) / int64(s.n)
	}
	return shares.Split(limit, g, g+1, s.n)
}

func (s *sim) Exclusive(g int, fn func() error) error {
	if !s.groups[g].up {
		return ErrNotLeader
	}
	return fn()
}

func (s *sim) Append(g int, typ byte, data []byte) (func(context.Context) (any, error), error) {
	sg := s.groups[g]
	if !sg.up {
		return nil, ErrNotLeader
	}
	sg.index++
	res, err := sg.mod.Apply(fsm.ModuleEntry{Type: typ, Index: sg.index, Payload: data})
	return func(context.Context) (any, error) { return res, err }, nil
}

func (s *sim) Propose(ctx context.Context, g int, typ byte, data []byte) (any, error) {
	wait, err := s.Append(g, typ, data)
	if err != nil {
		return nil, err
	}
	return wait(ctx)
}

func (s *sim) Peer(_ context.Context, g int) (api.SharesClient, error) {
	if !s.groups[g].up {
		return nil, status.Errorf(codes.Unavailable, "group %d: no leader", g)
	}
	return simPeer{s, g}, nil
}

// simPeer calls the mover as the group's leader would, and may crash the
// group between the commit and the answer.
type simPeer struct {
	s *sim
	g int
}

func (p simPeer) crash() error {
	if p.s.crashAfterCommit > 0 && p.s.r.IntN(1000) < p.s.crashAfterCommit {
		p.s.crashGroup(p.g)
		return status.Errorf(codes.Unavailable, "group %d: leader crashed before answering", p.g)
	}
	return nil
}

func (p simPeer) Give(ctx context.Context, in *api.GiveRequest, _ ...grpc.CallOption) (*api.GiveResponse, error) {
	amt, seq, reason, err := p.s.mover.Give(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Want)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := p.crash(); err != nil {
		return nil, err
	}
	return &api.GiveResponse{Amount: amt, Seq: seq, Reason: reason}, nil
}

func (p simPeer) Receive(ctx context.Context, in *api.ReceiveRequest, _ ...grpc.CallOption) (*api.ReceiveResponse, error) {
	now, err := p.s.mover.Receive(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Seq, in.Amount)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := p.crash(); err != nil {
		return nil, err
	}
	return &api.ReceiveResponse{AppliedNow: now}, nil
}

func (p simPeer) Complete(ctx context.Context, in *api.CompleteRequest, _ ...grpc.CallOption) (*api.CompleteResponse, error) {
	found, err := p.s.mover.Complete(ctx, in.Tenant, int(in.Giver), in.Seq)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &api.CompleteResponse{Found: found}, nil
}

func (p simPeer) Cover(ctx context.Context, in *api.CoverRequest, _ ...grpc.CallOption) (*api.CoverResponse, error) {
	ok, over, reason, err := p.s.mover.Cover(ctx, in.Tenant, int(in.Group), in.MaxSeries)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &api.CoverResponse{Covered: ok, Overdraft: over, Reason: reason}, nil
}

func (p simPeer) TenantShares(context.Context, *api.TenantSharesRequest, ...grpc.CallOption) (*api.TenantSharesResponse, error) {
	return nil, status.Error(codes.Unimplemented, "not simulated")
}

// --- the simulated system ---

func (s *sim) crashGroup(g int) {
	s.groups[g].up = false
	s.stats.crashes++
}

func (s *sim) restartGroup(g int) {
	sg := s.groups[g]
	sg.up = true
	sg.mod.ResetReservations() // a new leader session starts with none
}

func (s *sim) total(tenant string) int64 {
	var n int64
	for _, sg := range s.groups {
		n += int64(len(sg.series[tenant]))
	}
	return n
}

// share is the group's admission share as the server computes it, or as a
// broken rule does.
func (s *sim) share(g int, tenant string) int64 {
	if !s.mover.Settled(g, tenant) {
		return admission.NoHeadroom
	}
	delta, res := s.groups[g].mod.Delta(tenant)
	if s.rules.ignoreGiven && delta < 0 {
		delta = 0
	}
	return Share(s.tenants[tenant].limit, s.Base(g, tenant), delta, res)
}

// decide is one request's decision in group g through admission.Decide; the
// entry it would log applies at once.
func (s *sim) decide(g int, tenant string, hashes []uint64) ([]uint64, int, error) {
	sg := s.groups[g]
	if !sg.up {
		return nil, 0, admission.ErrNotLeader
	}
	set := sg.series[tenant]
	states := make([]uint8, len(hashes))
	for i, h := range hashes {
		if set[h] && !s.rules.resendAsNew {
			states[i] = fsm.StateActive
		}
	}
	budget := func(t string) admission.Budget {
		return admission.Budget{Share: s.share(g, t), Used: int64(len(sg.series[t]))}
	}
	d := admission.Decide([]admission.Request{{Tenant: tenant, Hashes: hashes, States: states}}, admission.NewPending(), budget, nil)
	if set == nil {
		set = map[uint64]bool{}
		sg.series[tenant] = set
	}
	for _, h := range d.NewBy[tenant] {
		set[h] = true
	}
	return d.Rejected[0], d.AtShare[0], nil
}

func (s *sim) failf(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf("step %d: ", s.step)+fmt.Sprintf(format, args...))
}

// request sends one request of a random shape to a group with a leader.
func (s *sim) request() {
	var up []int
	for g, sg := range s.groups {
		if sg.up {
			up = append(up, g)
		}
	}
	if len(up) == 0 {
		return
	}
	g := up[s.r.IntN(len(up))]
	tenant := s.names[s.r.IntN(len(s.names))]
	tn := s.tenants[tenant]
	var k int
	switch s.r.IntN(4) {
	case 0:
		k = 1
	case 1:
		k = 1 + s.r.IntN(4)
	case 2:
		k = 1 + s.r.IntN(int(max(1, s.Base(g, tenant)*2))) // about a share
	default:
		k = 1 + s.r.IntN(int(max(1, tn.limit+5))) // up to the whole limit and beyond
	}
	var hashes []uint64
	active := map[uint64]bool{}
	for h := range s.groups[g].series[tenant] {
		active[h] = true
	}
	// Re-sends of acknowledged active series, in a stable order.
	if len(active) > 0 && s.r.IntN(2) == 0 {
		old := slices.Sorted(func(yield func(uint64) bool) {
			for h := range active {
				if !yield(h) {
					return
				}
			}
		})
		for _, h := range old {
			if s.r.IntN(3) == 0 {
				hashes = append(hashes, h)
			}
		}
	}
	for range k {
		tn.next++
		hashes = append(hashes, uint64(g)<<56|tn.next)
	}
	s.r.Shuffle(len(hashes), func(i, j int) { hashes[i], hashes[j] = hashes[j], hashes[i] })

	before := s.total(tenant)
	s.stats.requests++
	if s.trace != nil {
		s.trace("request %s group %d: %d hashes (%d re-sent)", tenant, g, len(hashes), len(hashes)-k)
	}
	rejected, atLimit, err := s.mover.Admit(context.Background(), g, tenant, hashes, func(_ context.Context, hs []uint64) ([]uint64, int, error) {
		return s.decide(g, tenant, hs)
	})
	after := s.total(tenant)
	if after > before && tn.limit > 0 && after > tn.limit {
		s.failf("(a) %s admitted %d new in group %d: %d active, limit %d", tenant, after-before, g, after, tn.limit)
	}
	if err != nil {
		if !errors.Is(err, ErrHeadroomUnreachable) && !errors.Is(err, admission.ErrNotLeader) {
			s.failf("request error %v", err)
		}
		s.stats.unavailable++
		return
	}
	for _, h := range rejected {
		if active[h] {
			s.failf("(b) %s: acknowledged active series %#x rejected in group %d", tenant, h, g)
			break
		}
	}
	if len(rejected) > 0 {
		s.stats.rejected += len(rejected)
		if tn.limit == 0 || after < tn.limit {
			s.failf("(c) %s: %d rejected in group %d below the limit: %d active, limit %d", tenant, len(rejected), g, after, tn.limit)
		}
		if atLimit != len(rejected) {
			s.failf("(c) %s: %d rejected but %d counted at the limit", tenant, len(rejected), atLimit)
		}
	}
	s.stats.accepted += len(hashes) - len(rejected)
}

// checkShares is (d): Σ shares ≤ limit per tenant.
func (s *sim) checkShares() {
	for _, name := range s.names {
		tn := s.tenants[name]
		if tn.limit == 0 {
			continue
		}
		var sum int64
		for g, sg := range s.groups {
			d, _ := sg.mod.Delta(name)
			sum += s.Base(g, name) + d
		}
		if sum > tn.limit {
			s.failf("(d) %s: Σ shares %d > limit %d", name, sum, tn.limit)
		}
	}
}

func (s *sim) runTasks() {
	tasks := s.tasks
	s.tasks = nil
	for _, f := range tasks {
		if s.r.IntN(8) == 0 {
			continue // lost with its node
		}
		f()
	}
}

func (s *sim) stepOnce() {
	s.step++
	x := s.r.IntN(100)
	if s.trace != nil {
		var st []string
		for g, sg := range s.groups {
			for _, name := range s.names {
				d, res := sg.mod.Delta(name)
				st = append(st, fmt.Sprintf("g%d/%s up=%v base=%d delta=%d res=%d used=%d out=%v", g, name, sg.up, s.Base(g, name), d, res, len(sg.series[name]), sg.mod.View(name).Outstanding))
			}
		}
		s.trace("step %d op %d limits %v\n  %s", s.step, x, s.limits(), joinLines(st))
	}
	switch {
	case x < 60:
		s.request()
	case x < 66:
		s.runTasks()
	case x < 70:
		s.mover.Redrive(context.Background(), 0)
	case x < 76: // raise a limit (0: unlimited, rarely)
		tn := s.tenants[s.names[s.r.IntN(len(s.names))]]
		if tn.limit > 0 {
			tn.limit += int64(1 + s.r.IntN(20))
			tn.version++
			s.stats.raises++
		}
	case x < 82: // lower a limit
		if lowerLimits {
			tn := s.tenants[s.names[s.r.IntN(len(s.names))]]
			if tn.limit > int64(s.n) {
				tn.limit -= int64(1 + s.r.IntN(int(tn.limit)-s.n))
				tn.version++
				s.stats.lowers++
			}
		}
	case x < 86: // a tenant's series go idle in one group, or everywhere
		name := s.names[s.r.IntN(len(s.names))]
		if s.r.IntN(2) == 0 {
			delete(s.groups[s.r.IntN(s.n)].series, name)
		} else {
			for _, sg := range s.groups {
				delete(sg.series, name)
			}
		}
	case x < 92: // a leader crashes
		s.crashGroup(s.r.IntN(s.n))
	case x < 97: // a leader comes back
		for g, sg := range s.groups {
			if !sg.up {
				s.restartGroup(g)
				break
			}
		}
	default: // a replica restores the group's snapshot and leads it
		g := s.r.IntN(s.n)
		s.restore(g)
	}
	s.checkShares()
}

func (s *sim) limits() map[string]int64 {
	m := map[string]int64{}
	for n, t := range s.tenants {
		m[n] = t.limit
	}
	return m
}

func (s *sim) restore(g int) {
	sg := s.groups[g]
	snap, err := sg.mod.Snapshot()
	if err != nil {
		s.failf("snapshot group %d: %v", g, err)
		return
	}
	var data []byte
	if snap != nil {
		if data, err = snap(); err != nil {
			s.failf("snapshot group %d: %v", g, err)
			return
		}
	}
	m, _ := shares.New(g, s.n)
	apply, err := m.PrepareRestore(data)
	if err != nil {
		s.failf("restore group %d: %v", g, err)
		return
	}
	apply()
	sg.mod = m
	sg.up = true
	s.stats.restores++
}

// lowerLimits enables limit lowerings in the simulation.
var lowerLimits = true

// runModel runs `runs` seeded simulations of `steps` steps and returns the
// first violations found (with their seeds) and the summed stats.
func runModel(first uint64, runs, steps int, rules brokenRules) (violations []string, st simStats) {
	for seed := first; seed < first+uint64(runs); seed++ {
		s := newSim(seed, rules)
		for range steps {
			s.stepOnce()
			if len(s.violations) > 0 {
				break
			}
		}
		// Every group back, stranded transfers delivered: nothing is lost.
		for g, sg := range s.groups {
			if !sg.up {
				s.restartGroup(g)
			}
		}
		s.crashAfterCommit = 0
		s.runTasks()
		for range 3 {
			s.mover.Redrive(context.Background(), 0)
		}
		for _, name := range s.names {
			if len(s.violations) > 0 || s.tenants[name].limit == 0 {
				break
			}
			var sum int64
			for g, sg := range s.groups {
				d, _ := sg.mod.Delta(name)
				sum += s.Base(g, name) + d
				if out := sg.mod.Outstanding(); len(out) > 0 {
					s.failf("group %d: %d transfers still outstanding after the re-drives", g, len(out))
				}
			}
			if !rules.ceilSplit && sum != s.tenants[name].limit {
				s.failf("%s: Σ shares %d after every transfer was delivered, limit %d: headroom lost", name, sum, s.tenants[name].limit)
			}
		}
		for _, v := range s.violations {
			violations = append(violations, fmt.Sprintf("seed %d (%d groups): %s", seed, s.n, v))
		}
		st.requests += s.stats.requests
		st.accepted += s.stats.accepted
		st.rejected += s.stats.rejected
		st.unavailable += s.stats.unavailable
		st.lowers += s.stats.lowers
		st.raises += s.stats.raises
		st.crashes += s.stats.crashes
		st.restores += s.stats.restores
		if len(violations) >= 5 {
			break
		}
	}
	return violations, st
}

// TestShareModel: 10,000 seeded runs of the share protocol, 0 violations.
// A failing seed replays alone with a trace of every step:
// go test -run 'TestShareModel$' ./sharemove/ -seed N.
func TestShareModel(t *testing.T) {
	if *replaySeed != 0 {
		s := newSim(*replaySeed, brokenRules{})
		s.trace = t.Logf
		for range 60 {
			s.stepOnce()
			if len(s.violations) > 0 {
				t.Fatal(s.violations)
			}
		}
		return
	}
	runs := 10000
	if testing.Short() {
		runs = 1000
	}
	v, st := runModel(1, runs, 60, brokenRules{})
	t.Logf("%d runs: %d requests, %d series accepted, %d rejected at the limit, %d retryable, %d raises, %d lowers, %d crashes, %d restores",
		runs, st.requests, st.accepted, st.rejected, st.unavailable, st.raises, st.lowers, st.crashes, st.restores)
	if len(v) > 0 {
		t.Fatalf("%d+ violations:\n%s", len(v), joinLines(v))
	}
}

// TestShareModelCatchesBrokenRules: the checker finds each deliberately
// broken share rule within the same runs.
func TestShareModelCatchesBrokenRules(t *testing.T) {
	for name, rules := range map[string]brokenRules{
		"ceil split (Σ bases > limit)":      {ceilSplit: true},
		"share ignores headroom given away": {ignoreGiven: true},
		"re-sent active series decided new": {resendAsNew: true},
	} {
		v, _ := runModel(1, 10000, 60, rules)
		if len(v) == 0 {
			t.Errorf("%s: no violation found in 10,000 runs", name)
			continue
		}
		t.Logf("%s: caught: %s", name, v[0])
	}
}

func joinLines(xs []string) string {
	out := ""
	for _, x := range xs {
		out += "  " + x + "\n"
	}
	return out
}

var replaySeed = flag.Uint64("seed", 0, "TestShareModel replays this one seed with a trace")
