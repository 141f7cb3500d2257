package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clockbound"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/datadir"
	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/partmove"

	"github.com/tollgate-io/tollgate/layout/layoutfile"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/nodeid"
	"github.com/tollgate-io/tollgate/nodeport"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/service/envoyrls"
	"github.com/tollgate-io/tollgate/service/layouttable"
	"github.com/tollgate-io/tollgate/service/metering"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
	pmsvc "github.com/tollgate-io/tollgate/service/partmove"
	"github.com/tollgate-io/tollgate/service/ratelimit"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
	"github.com/tollgate-io/tollgate/service/summaries"
)

// Server is one Tollgate node.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	limits  *limitsSource
	rcfg    *runtimeConfig // replicated runtime config (runtimeconfig.go)
	// base is the group count the layout was created with (cluster.json);
	// cfg.Layout.Groups is the count the node started with, servedGroups()
	// the count it serves, higher once raised (groups.go). Ranges and rate
	// groups follow base.
	base int

	host    *raftnode.Host
	members *membership.Membership // nil when gossip is disabled
	view    clusterView
	streams *access.StreamBounds // watch-stream bounds
	httpCap *access.ConnCap      // HTTP connection cap
	creds   *access.Store        // nil without any credential: no admin token, no credentials file
	guard   *access.Guard        // the access check (access.go)
	admin   *adminService
	ctl     *cluster.Controller // cluster duties: placement, learners, moves, incarnations (clusterport.go)
	peers   *nodeport.Pool      // connections to other nodes (peers.go; set with the gRPC server)
	// nodeKeys sign and verify node credentials (nodeauth.go); nil when
	// the cluster has no key.
	nodeKeys *nodeport.Keys
	proving  atomic.Bool // a round of member proofs runs (nodeauth.go)
	knownMu  sync.Mutex
	known    map[string]string // raft configurations' servers: id → raft address
	knownAt  time.Time         // last noteKnown (cluster loop)
	comps    []component       // the capabilities, in order (components.go)
	fsms     []*fsm.FSM
	trackers []*groupTracker
	vers     versionState
	rates    *ratelimit.Service // global rate limits (ratelimit.go)
	// ownerRules: Envoy rule matchers of the replicas' documents, for
	// the limits of Envoy counter keys this node owns (envoyrls.go).
	ownerRules envoyrls.Rules
	rls        *envoyrls.Service // Envoy rate limit service (envoyrls.go)
	sampling   *samplingCtl      // backlog controller (sampling.go)
	clock      *clockbound.Clock // peer clock offsets and group clocks (clockport.go)

	summaries *summaries.Hub      // near-limit summary stream (summaries.go)
	sketches  *partitionlimit.Hub // sketches.go
	shares    *sharessvc.Node     // movable per-group shares (shares.go)
	// metering (server/metering.go)
	meterMods []*fsmmeter.Module
	// meterRoute caches meterByLayout (metering.go).
	meterRoute struct {
		on      atomic.Bool
		checked atomic.Int64
		// seriesOnly (tests) makes this node's gives move series only, as
		// a version-7 build's did.
		seriesOnly atomic.Bool
	}
	meter  *metering.Service
	layout *layouttable.Service // the partition → group table (layout.go)
	grow   *cluster.Growth      // creating the groups a raise adds (groups.go)
	pmods  []*partmove.Module   // per group: the hand-off state (partmoves.go)
	moves  *pmsvc.Service       // partition hand-offs (partmoves.go)
	// served is the number of groups with the node's per-group state
	// (groups.go): fsms, trackers and the modules' tables are allocated for
	// every group the layout allows and filled in order, and an entry below
	// served is complete and never changes. A raise grows it in place.
	served atomic.Int32
	growMu sync.Mutex // serializes serveGroup
	// bootGroups is the count this start built, before raft started: the
	// node campaigns for those at once (their leader events wait in
	// leaderEvents until the trackers exist).
	bootGroups int

	grpcLis    net.Listener
	grpcCap    *access.GRPCCap // the gRPC connection bound
	grpc       *grpc.Server
	httpLis    net.Listener
	httpRoutes []string // patterns on the HTTP mux (HTTPRoutes)
	http       *http.Server

	dir        *datadir.Dir // locked for the server's lifetime
	wipeOnStop bool         // a failed start removes what it wrote to a fresh data dir

	// Node identity (identity.go; replacement: cluster/incarnation.go).
	ident       *nodeid.Identity
	refused     refusedIncarnations
	joinRefused atomic.Value // string: why the cluster refused this node's join

	leaderEvents chan leaderEvent
	closing      chan struct{} // closed when Stop begins (ends watch streams)
	stop         chan struct{}
	wg           sync.WaitGroup
	stopOnce     sync.Once
	stopErr      error
}

type leaderEvent struct {
	group  int
	leader bool
	// recheck: sent by this node, not raft (clockbound): acted on only if raft
	// still names this node leader when it is handled.
	recheck bool
}

// The range of Config.Clock.MaxOffset: below 10 ms the measurement itself
// (half a round trip on a busy network) would put correct nodes out of bound;
// above an hour a bound no longer protects group time.
const (
	MinMaxClockOffset = 10 * time.Millisecond
	MaxMaxClockOffset = time.Hour
)

// New validates cfg, opens (or creates) the data dir and starts the node: raft
// groups, gRPC and HTTP listeners. It returns once everything listens; use
// WaitReady to wait for the groups to elect and load.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := resolveClusterVersion(&cfg); err != nil {
		return nil, err
	}
	if off := cfg.Clock.TestOffset; off != 0 {
		// Shifted here, not in Validate, so validating twice shifts once.
		base := cfg.Clock.Now
		cfg.Clock.Now = func() time.Time { return base().Add(off) }
		cfg.Logger.Warn("test clock offset: this node's wall clock is shifted; for fault tests only", "offset", off)
	}
	dir, err := datadir.Open(cfg.Node.DataDir)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, dir: dir, leaderEvents: make(chan leaderEvent, 256), stop: make(chan struct{}), closing: make(chan struct{})}
	s.view.changed = make(chan struct{})
	s.grow = s.newGrowth() // groups.go
	// Every failure from here on stops what was started and, for a data dir
	// this start found empty, removes what it wrote: a retry after fixing the
	// cause (a busy port, a bad flag) then starts clean.
	fail := func(err error) (*Server, error) {
		s.wipeOnStop = true
		s.Stop(context.Background())
		if dir.Fresh {
			s.log.Info("start failed; removed what it wrote to the new data dir", "data_dir", cfg.Node.DataDir)
		}
		return nil, err
	}
	if s.base, err = startGroups(&s.cfg); err != nil { // groups.go
		return fail(err)
	}
	cfg = s.cfg
	if s.ident, err = nodeid.Load(cfg.Node.DataDir, dir.Fresh, cfg.Node.ID); err != nil {
		return fail(err)
	}
	if cfg.Cluster.Bootstrap && s.ident.ClusterID() == "" && !s.ident.Adopted {
		// --dev forms its own cluster at once.
		cid, err := nodeid.NewID()
		if err == nil {
			err = s.ident.SetClusterID(cid)
		}
		if err != nil {
			return fail(err)
		}
	}
	s.metrics = newMetrics(s.groupStats)
	s.metrics.reg.MustRegister(&clusterCollector{s: s}, &diskCollector{s: s}, filesystemCollector{dir: cfg.Node.DataDir}, certCollector{cfg: cfg.Access.TLS})
	s.metrics.initGroups(cfg.Layout.Groups)
	s.registerIdentityMetrics() // identity.go
	ls, err := newLimitsSource(cfg.Limits.File, cfg.Tracking.DefaultMaxSeries, s.log, func(ok bool) {
		res := "success"
		if !ok {
			res = "failure"
		}
		s.metrics.limitsReloads.WithLabelValues(res).Inc()
	})
	if err != nil {
		return fail(err)
	}
	s.limits = ls
	// Any credential configured (the admin token alone, or a credentials
	// file) puts every endpoint under the rule table: an admin token that
	// protected only the admin API would leave billing writes, usage reads
	// and tracking open to anyone who reaches the node.
	if cfg.Access.CredentialsFile != "" || cfg.Access.AdminToken != "" {
		if s.creds, err = access.NewStore(cfg.Access.CredentialsFile, cfg.Access.AdminToken, s.log); err != nil {
			return fail(err)
		}
		if cfg.Access.CredentialsFile != "" {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-s.closing; cancel() }()
			go s.creds.Watch(ctx, 2*time.Second)
		}
	}
	s.nodeKeys = nodeport.NewKeys(cfg.Node.ID, clusterKeys(cfg, "grpc")) // nodeauth.go
	s.guard = s.newGuard()                                               // access.go
	if cfg.Access.InsecureCluster && cfg.multiNode() && !cfg.clusterSecured() {
		s.log.Warn("INSECURE CLUSTER (--insecure-cluster): no gossip key and no TLS; gossip, raft and gRPC are plaintext and anyone who can reach these ports can read them. Give every node --gossip-keyring-file (or TLS) before this network is shared.")
	}
	if s.clock, err = newClock(s); err != nil { // clockport.go
		return fail(err)
	}
	// The capabilities, each built from the node's port with its FSM
	// modules (components.go).
	if err := s.buildComponents(); err != nil {
		return fail(err)
	}
	s.fsms = make([]*fsm.FSM, s.groupCap())
	for g := range cfg.Layout.Groups {
		f, err := s.newFSM(g, cfg.Layout.Groups) // groups.go
		if err != nil {
			return fail(err)
		}
		s.fsms[g] = f
	}
	s.bindPartMoves() // partmoves.go
	s.bootGroups = cfg.Layout.Groups
	host, err := raftnode.New(raftnode.Config{
		NodeID:        cfg.Node.ID,
		DataDir:       filepath.Join(cfg.Node.DataDir, "raft"),
		BindAddr:      cfg.Raft.Addr,
		AdvertiseAddr: cfg.Raft.Advertise,
		Groups:        cfg.Layout.Groups,
		Bootstrap:     cfg.Cluster.Bootstrap,
		NoSync:        cfg.Raft.NoSync,

		HeartbeatTimeout:   cfg.Raft.HeartbeatTimeout,
		ElectionTimeout:    cfg.Raft.ElectionTimeout,
		LeaderLeaseTimeout: cfg.Raft.LeaderLeaseTimeout,
		ServerTLS:          cfg.Access.TLS.RaftServer,
		ClientTLS:          cfg.Access.TLS.RaftClient,
		ClusterKeys:        clusterKeys(cfg, "raft"), // nodeauth.go: the connection header is authenticated
		MaxPendingConns:    cfg.Raft.MaxPendingConns,
		Identity: raftnode.Identity{Incarnation: s.ident.Incarnation, ClusterID: s.ident.ClusterID(),
			AcceptUnnamed: s.ident.Adopted, OnRefused: s.refused.note},
		Logger: s.log,
		// No votes asked and no transfer accepted while this node's clock
		// is not confirmed (clockbound): it cannot become a leader at all.
		MayCampaign:      s.clock.CampaignGate,
		GroupMayCampaign: s.groupMayCampaign, // partmoves.go
		LeaderNotify: func(group int, leader bool) {
			select {
			case s.leaderEvents <- leaderEvent{group: group, leader: leader}:
			case <-s.stop:
			}
		},
	}, func(g int) raft.FSM { return s.fsms[g] })
	if err != nil {
		return fail(fmt.Errorf("start raft: %w", err))
	}
	s.host = host
	s.ctl = newController(s)       // clusterport.go
	s.registerRaftCapMetrics(host) // portcaps.go
	s.trackers = make([]*groupTracker, s.groupCap())
	for g := range cfg.Layout.Groups {
		s.trackers[g] = s.newTracker(g)
	}
	s.served.Store(int32(cfg.Layout.Groups))
	s.goUntilStop(func(stop <-chan struct{}) { s.limits.watch(stop, cfg.Limits.Reload) })
	s.goUntilStop(s.grow.Run) // groups.go
	s.goUntilStop(func(stop <-chan struct{}) { s.layout.Follow(stop, time.Second, s.layoutChanged) })
	if err := s.openComponents(); err != nil { // components.go
		return fail(err)
	}
	if err := s.startGRPC(); err != nil {
		return fail(err)
	}
	if err := s.startHTTP(); err != nil {
		return fail(err)
	}
	if err := s.startMembership(); err != nil {
		return fail(err)
	}
	// Leadership events wait in raftnode's queue until now: acting on one
	// reads the node's addresses and members, which exist from here on (a
	// restarted single node elects itself while the listeners are still
	// being set up).
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.watchLeadership() }()
	s.publishView()
	for _, c := range s.comps { // components.go
		if c.start != nil {
			c.start()
		}
	}
	if !cfg.Cluster.Bootstrap && cfg.Cluster.BootstrapExpect == 0 {
		empty := true
		for g := range cfg.Layout.Groups {
			if has, err := host.GroupHasState(g); err != nil || has {
				empty = false
			}
		}
		if empty {
			s.log.Info("no raft state and neither --dev nor --bootstrap-expect: waiting for a cluster's group leaders to add this node (it needs --join, or another node joining it)",
				"join", cfg.Gossip.Join)
		}
	}
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.clusterLoop() }()
	go func() { defer s.wg.Done(); s.incarnationLoop() }()
	// From here the clock bound is computed from membership and the groups'
	// configurations (both exist now); until then this node asks for no
	// votes (clockbound).
	s.clock.Attach()
	go func() { defer s.wg.Done(); s.clock.Run(s.closing) }()
	s.log.Info("tollgate node started", "node", cfg.Node.ID, "zone", cfg.Node.Zone, "grpc", s.GRPCAddr(), "gossip", s.GossipAddr(),
		"http", s.HTTPAddr(), "raft", string(host.Addr()), "data_dir", cfg.Node.DataDir,
		"incarnation", s.ident.Incarnation, "cluster_id", s.ident.ClusterID(),
		"partitions", cfg.Layout.Partitions, "groups", cfg.Layout.Groups, "shards", cfg.Layout.Shards)
	return s, nil
}

// InitLayout records the layout in a new data dir, or checks it against the one
// recorded (offline restore seeds a data dir before any server starts).
func InitLayout(dataDir string, partitions, groups, shards int) error {
	if err := api.ValidateLayout(partitions, groups, shards); err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	_, err := checkLayout(Config{Node: NodeConfig{DataDir: dataDir}, Layout: LayoutConfig{Partitions: partitions, Groups: groups, Shards: shards}}, 0)
	return err
}

// checkLayout records the layout in a new data dir, or checks cfg against
// the recorded one (layoutfile.Check), and returns the recorded group count.
func checkLayout(cfg Config, raised int) (int, error) {
	return layoutfile.Check(cfg.Node.DataDir, layoutfile.Layout{Partitions: cfg.Layout.Partitions, Groups: cfg.Layout.Groups, Shards: cfg.Layout.Shards}, raised)
}

func (s *Server) watchLeadership() {
	for {
		select {
		case <-s.stop:
			return
		case ev := <-s.leaderEvents:
			if !s.servesGroup(ev.group) { // being added (groups.go): it campaigns once served
				continue
			}
			if ev.recheck && (s.host.Raft(ev.group).State() != raft.Leader || s.trackers[ev.group].leading()) {
				continue
			}
			s.log.Info("leadership changed", "group", ev.group, "leader", ev.leader)
			// A group halted here, or a node whose clock is out of bound, must
			// not lead (versions.go, clockbound). The group clock learns of the
			// change before the session stamps anything.
			lead := ev.leader && s.mayLead(ev.group)
			s.clock.Group(ev.group).SetLeader(lead)
			s.trackers[ev.group].setLeader(lead)
		}
	}
}

// WaitReady blocks until every group has a leader and, for groups led here, the
// leader has applied all earlier entries.
func (s *Server) WaitReady(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if s.Ready() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Ready reports whether this node can serve: every group has a known leader,
// every group this node is a member of has replayed what was on local disk, and
// each group led here passed its leader barrier.
func (s *Server) Ready() bool { return s.NotReadyReason() == "" }

// NotReadyReason says why the node is not ready ("" when it is), for /readyz
// and logs.
func (s *Server) NotReadyReason() string {
	v, _ := s.view.get()
	if v == nil {
		return "starting"
	}
	if why := s.haltedReason(); why != "" {
		return why
	}
	if why := s.identityReason(); why != "" {
		return why
	}
	if why := s.diskNotReady(); why != "" {
		return why
	}
	// A replica shut down while the node runs needs the operator (a
	// restart), unlike the transient states below: name it first.
	trackers := s.servedTrackers()
	for g := range trackers {
		if s.host.ReplicaDown(g) {
			return fmt.Sprintf("group %d: this node's raft replica is shut down: it neither votes nor stores the log, while the group's configuration may still count it (restart the node)", g)
		}
	}
	for g, tr := range trackers {
		if g >= len(v.GroupInfo) {
			break // served since the view was published: the next view covers it
		}
		if v.GroupInfo[g].LeaderId == "" && (g < s.base || len(s.layout.Current().Owned(g)) > 0) {
			return fmt.Sprintf("group %d: no known leader", g) // (a raised group owning nothing yet may wait for its voters to join it)
		}
		if !s.hostsGroup(g) {
			continue
		}
		if !s.host.GroupLoaded(g) {
			return fmt.Sprintf("group %d: replaying local state", g) // snapshot + log replay not finished
		}
		if s.host.Raft(g).State() == raft.Leader && !tr.ready() {
			return fmt.Sprintf("group %d: leader barrier not passed yet", g)
		}
	}
	return ""
}

// GRPCAddr is the address the gRPC API listens on.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the HTTP address, or "" when disabled.
func (s *Server) HTTPAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// NodeID and Zone are the validated identity of this node.
func (s *Server) NodeID() string { return s.cfg.Node.ID }

// Zone is this node's availability zone.
func (s *Server) Zone() string { return s.cfg.Node.Zone }

// GossipAddr is the advertised serf address ("" when gossip is off).
func (s *Server) GossipAddr() string {
	if s.members == nil {
		return ""
	}
	return s.members.GossipAddr()
}

// RaftAddr is the advertised raft address.
func (s *Server) RaftAddr() string { return string(s.host.Addr()) }

// FSM exposes a group's state machine (tests, status), nil for a group this node does not serve (yet: groups.go).
func (s *Server) FSM(group int) *fsm.FSM {
	if !s.servesGroup(group) {
		return nil
	}
	return s.fsms[group]
}

// Raft exposes a group's raft instance (tests, admin).
func (s *Server) Raft(group int) *raft.Raft { return s.host.Raft(group) }

func (s *Server) groupStats() []groupStat {
	fsms := s.servedFSMs()
	out := make([]groupStat, len(fsms))
	for g, f := range fsms {
		st := f.Stats()
		out[g] = groupStat{group: g, series: st.Series, tenants: st.Tenants, appliedIndex: st.AppliedIndex}
		out[g].halted, _ = f.Halted()
		if s.shares != nil {
			out[g].nearLimit = len(s.closeToLimit(g))
		}
		if s.host != nil {
			r := s.host.Raft(g)
			out[g].leader = r.State() == raft.Leader
			out[g].term, _ = strconv.ParseUint(r.Stats()["term"], 10, 64)
			out[g].replicaDown = s.host.ReplicaDown(g)
		}
	}
	return out
}

// Stop shuts the node down gracefully: stop accepting requests, let in-flight
// requests finish (bounded by ctx), stop leader sessions, shut raft down (which
// flushes and closes the stores), then the HTTP server.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		if s.members != nil {
			// Before the hand-off: a peer's balancer would otherwise see this
			// node lead nothing and hand it a group just before it stops.
			if err := s.members.SetDraining(); err != nil {
				s.log.Warn("gossip draining", "err", err)
			}
		}
		if s.host != nil {
			hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			s.handOffLeadership(hctx)
			cancel()
		}
		if s.members != nil {
			if err := s.members.Leave(); err != nil {
				s.log.Warn("serf leave", "err", err)
			}
		}
		close(s.closing)
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.grpc.Stop()
			}
		}
		close(s.stop)
		for i := len(s.comps) - 1; i >= 0; i-- { // components.go
			if c := s.comps[i]; c.stop != nil {
				c.stop()
			}
		}
		s.growMu.Lock() // a group being served now sees s.stop closed (groups.go)
		for _, t := range s.servedTrackers() {
			t.setLeader(false)
		}
		s.growMu.Unlock()
		var errs []error
		if s.host != nil {
			// Requests have stopped: what the log holds past each group's
			// snapshot is final, and a snapshot of it now saves the next
			// start from re-applying it (raftnode.SnapshotForRestart).
			start := time.Now()
			if err := s.host.SnapshotForRestart(ctx, restartSnapshotEntries); err != nil {
				s.log.Warn("snapshot before stopping", "err", err)
			} else if took := time.Since(start); took > 100*time.Millisecond {
				s.log.Info("snapshots taken before stopping", "took", took.Round(time.Millisecond))
			}
			if err := s.host.Shutdown(); err != nil {
				errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
			}
		}
		if s.http != nil {
			if err := s.http.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("http shutdown: %w", err))
			}
		}
		s.wg.Wait()
		if s.members != nil {
			if err := s.members.Shutdown(); err != nil {
				errs = append(errs, err)
			}
		}
		if s.admin != nil {
			s.admin.close()
		}
		// Last, after raft closed its stores: the next node on this dir may start.
		if err := s.dir.Release(s.wipeOnStop); err != nil {
			errs = append(errs, err)
		}
		s.stopErr = errors.Join(errs...)
		s.log.Info("tollgate node stopped", "node", s.cfg.Node.ID)
	})
	return s.stopErr
}
