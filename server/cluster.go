package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// viewPoll is how often the node rebuilds its cluster view from raft and serf.
// Raft has no notification for "another node became leader of a group I
// follow", and polling G groups is cheap; 100 ms keeps clients' leader tables
// well inside the failover budget.
const viewPoll = 100 * time.Millisecond

// clusterView is the node's current picture of the cluster, published to
// WatchCluster streams.
type clusterView struct {
	mu   sync.Mutex
	view *api.ClusterView
	// encoded is view marshalled once, as two parts sent back to back:
	// the view without its runtime config (encodedBare), then the config
	// alone as field runtime_config (a message's encoding followed by a
	// field's is that message with the field set). Every stream sends these
	// bytes (sharedMsg), so a stream that never reads pins references, not a
	// copy; and the config part is encoded once per config version
	// (cfgEnc), so streams stuck on different views (a leader moved while
	// they were not reading) still share one copy of the config.
	encoded [][]byte
	// cfgEnc is runtime_config's field encoding for cfgOf (nil: none).
	cfgEnc []byte
	cfgOf  *api.RuntimeConfig
	// encodedBare is the same view without its runtime config: what a
	// stream that already carried this config version is sent, so a view
	// change (a leader moved) costs a stream a few hundred bytes whatever
	// the number of tenants.
	encodedBare []byte
	// bare is the last view given to set without its runtime config and
	// version: what the next one is compared with. The config is compared
	// by its version, never by content, so an idle node's poll does not
	// grow with the number of tenants.
	bare    *api.ClusterView
	changed chan struct{} // closed and replaced when view changes
}

func (c *clusterView) get() (*api.ClusterView, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view, c.changed
}

// getEncoded is get with the view's shared encodings, with and without its
// runtime config.
func (c *clusterView) getEncoded() (v *api.ClusterView, full [][]byte, bare []byte, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view, c.encoded, c.encodedBare, c.changed
}

// set stores v if it differs from the current view (ignoring the version;
// the runtime config counts by its version). v is not used afterwards.
func (c *clusterView) set(v *api.ClusterView) bool {
	cfg := v.RuntimeConfig
	v.RuntimeConfig, v.Version = nil, 0
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bare != nil && proto.Equal(v, c.bare) {
		return false
	}
	c.bare = v
	pub := proto.Clone(v).(*api.ClusterView) // small without the config
	if c.view != nil {
		pub.Version = c.view.Version
	}
	pub.Version++
	var full [][]byte
	bare, err := proto.Marshal(pub) // without the config: not published yet
	if err == nil && cfg != c.cfgOf {
		c.cfgEnc, c.cfgOf = nil, cfg
		if cfg != nil {
			c.cfgEnc, err = proto.Marshal(&api.ClusterView{RuntimeConfig: cfg})
		}
	}
	switch {
	case err != nil:
		bare, c.cfgOf = nil, nil // streams marshal the view themselves
	case len(c.cfgEnc) > 0:
		full = [][]byte{bare, c.cfgEnc}
	default:
		full = [][]byte{bare}
	}
	pub.RuntimeConfig = cfg
	c.view, c.encoded, c.encodedBare = pub, full, bare
	close(c.changed)
	c.changed = make(chan struct{})
	return true
}

// startMembership starts serf (unless gossip is disabled) once gRPC listens, so
// the advertised gRPC address is known.
func (s *Server) startMembership() error {
	if s.cfg.GossipAddr == "" {
		return nil
	}
	grpcAdv := s.cfg.GRPCAdvertise
	if grpcAdv == "" {
		grpcAdv = advertiseOf(s.grpcLis.Addr())
	}
	m, err := membership.New(membership.Config{
		NodeID:        s.cfg.NodeID,
		Zone:          s.cfg.Zone,
		GRPCAddr:      grpcAdv,
		RaftAddr:      string(s.host.Addr()),
		BindAddr:      s.cfg.GossipAddr,
		AdvertiseAddr: s.cfg.GossipAdvertise,
		DataDir:       s.cfg.DataDir,
		ProbeInterval: s.cfg.GossipProbeInterval,
		Keys:          s.cfg.TLS.GossipKeys,
		MaxStreams:    s.cfg.GossipMaxStreams,
		Logger:        s.log,

		Incarnation:        s.ident.Incarnation, // identity.go
		IncarnationAdopted: s.ident.Adopted,
		ClusterID:          s.ident.clusterID(),

		ClusterVersion: s.cfg.MaxClusterVersion, // gossiped as "ver" (versions.go)
	})
	if err != nil {
		return err
	}
	s.members = m
	s.registerGossipCapMetrics(m) // portcaps.go
	if s.decommissioned() {
		// Drained before this restart: stay drained (placemove.go).
		if err := m.SetDecommissioning(true); err != nil {
			return err
		}
		s.log.Info("this node is decommissioned (tollgate node drain): its replicas move to other nodes; undo with tollgate node drain --undo")
	}
	return nil
}

// advertiseOf turns a listener address into one others can dial: an unspecified
// IP becomes loopback (fine for a single host; set the advertise flag otherwise).
func advertiseOf(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if ok && tcp.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return a.String()
}

// memberList returns the members (self only when gossip is off).
//
// Members that have not proved they are nodes of this cluster are left out
// (nodeauth.go, trusted): a stranger that joined plaintext gossip gets no
// place in placement, learners, the cluster view or the status; one that
// departs leaves nothing behind.
func (s *Server) memberList() []membership.Member {
	if s.members != nil {
		all := s.members.Members()
		out := all[:0:0]
		for _, m := range all {
			if s.trusted(m) {
				out = append(out, m)
			}
		}
		return out
	}
	return []membership.Member{{ID: s.cfg.NodeID, Zone: s.cfg.Zone, GRPCAddr: s.GRPCAddr(), RaftAddr: s.RaftAddr(),
		Status: membership.StatusAlive, GroupsLed: s.ledGroups(), ClusterVersion: s.cfg.MaxClusterVersion}}
}

func (s *Server) ledGroups() []int {
	var led []int
	for g := range s.trackers {
		if s.host.Raft(g).State() == raft.Leader {
			led = append(led, g)
		}
	}
	return led
}

func alive(ms []membership.Member) []membership.Member {
	var out []membership.Member
	for _, m := range ms {
		if m.Status == membership.StatusAlive {
			out = append(out, m)
		}
	}
	return out
}

// buildView assembles the cluster view: members from serf, and for every group
// its leader (from raft when this node is a member of the group, else from the
// leader's gossiped tag) and voters (when this node knows the configuration).
func (s *Server) buildView() *api.ClusterView {
	ms := s.memberList()
	v := &api.ClusterView{Partitions: uint32(s.cfg.Partitions), Groups: uint32(s.cfg.Groups), ServedBy: s.cfg.NodeID}
	byID := map[string]membership.Member{}
	for _, m := range ms {
		byID[m.ID] = m
		pm := &api.Member{Id: m.ID, Zone: m.Zone, GrpcAddress: m.GRPCAddr, RaftAddress: m.RaftAddr, Status: m.Status,
			ClusterVersion: uint32(m.ClusterVersion), Decommissioning: m.Decommissioning}
		for _, g := range m.GroupsLed {
			pm.GroupsLed = append(pm.GroupsLed, uint32(g))
		}
		v.Members = append(v.Members, pm)
	}
	for g := range s.cfg.Groups {
		gi := &api.GroupInfo{Group: uint32(g)}
		r := s.host.Raft(g)
		var leaderID string
		if r.State() == raft.Leader {
			leaderID = s.cfg.NodeID
		} else if _, id := r.LeaderWithID(); id != "" {
			leaderID = string(id)
		} else {
			for _, m := range ms {
				if m.Status == membership.StatusAlive && slices.Contains(m.GroupsLed, g) {
					leaderID = m.ID
					break
				}
			}
		}
		if leaderID != "" {
			gi.LeaderId = leaderID
			gi.LeaderGrpcAddress = byID[leaderID].GRPCAddr
		}
		if fut := r.GetConfiguration(); fut.Error() == nil {
			for _, srv := range fut.Configuration().Servers {
				if srv.Suffrage == raft.Voter {
					gi.Voters = append(gi.Voters, string(srv.ID))
				}
			}
			slices.Sort(gi.Voters)
		}
		v.GroupInfo = append(v.GroupInfo, gi)
	}
	// Members' "groups led" follow the leaders found above (raft first), not
	// only their gossiped tags, which lag for a node that just died.
	led := map[string][]uint32{}
	for _, gi := range v.GroupInfo {
		if gi.LeaderId != "" {
			led[gi.LeaderId] = append(led[gi.LeaderId], gi.Group)
		}
	}
	for _, m := range v.Members {
		m.GroupsLed = led[m.Id]
	}
	s.setViewConfig(v) // runtimeconfig.go
	return v
}

// leaderOf returns the id and gRPC address of group g's leader, "" if unknown.
func (s *Server) leaderOf(g int) (string, string) {
	v, _ := s.view.get()
	if v == nil || g >= len(v.GroupInfo) {
		return "", ""
	}
	return v.GroupInfo[g].LeaderId, v.GroupInfo[g].LeaderGrpcAddress
}

// hostsGroup reports whether this node is in group g's raft configuration.
func (s *Server) hostsGroup(g int) bool {
	fut := s.host.Raft(g).GetConfiguration()
	if fut.Error() != nil {
		return false
	}
	for _, srv := range fut.Configuration().Servers {
		if string(srv.ID) == s.cfg.NodeID {
			return true
		}
	}
	return false
}

// clusterLoop runs the node's cluster duties until stop: rebuild the view,
// gossip the groups led here, join seeds, bootstrap a new cluster, add joining
// members to groups whose zones lack a voter, balance leadership.
func (s *Server) clusterLoop() {
	t := time.NewTicker(viewPoll)
	defer t.Stop()
	var changed <-chan struct{}
	if s.members != nil {
		changed = s.members.Changed()
	}
	// The seeds, then the members this node knew when it last ran: a node
	// restarted without --join (the cluster's first node, typically) would
	// otherwise wait to be contacted and, until a member pushed it the whole
	// member list, not see every peer alive (membership/peers.go).
	seeds := slices.Clone(s.cfg.Join)
	if s.members != nil {
		for _, a := range s.members.SavedPeers() {
			if !slices.Contains(seeds, a) {
				seeds = append(seeds, a)
			}
		}
	}
	joined := len(seeds) == 0
	joinFailures := 0
	everJoined := false
	var nextJoin, nextBalance, nextLearners time.Time
	nextBalance = time.Now().Add(2 * s.cfg.LeaderBalanceInterval)
	bootstrapped := s.cfg.BootstrapExpect == 0
	seenAlive := map[string]bool{}
	lastLed := ""
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		case <-changed:
			changed = s.members.Changed()
		}
		now := time.Now()
		if s.members != nil {
			ledGroups := s.ledGroups()
			led := membership.FormatGroups(ledGroups)
			if led != lastLed {
				if err := s.members.SetLed(ledGroups); err != nil {
					s.log.Warn("gossip led groups", "err", err)
				} else {
					lastLed = led
				}
			}
			if err := s.members.SetDiskFull(s.diskNotReady() != ""); err != nil {
				s.log.Warn("gossip disk state", "err", err)
			}
			if !joined && now.After(nextJoin) {
				n, err := s.members.Join(seeds)
				switch {
				case err == nil:
					s.joinRefused.Store("")
					lvl := slog.LevelInfo
					if everJoined {
						lvl = slog.LevelDebug // a repeat while waiting to bootstrap (below)
					}
					s.log.Log(context.Background(), lvl, "joined cluster", "contacted", n)
					joined, everJoined = true, true
					joinFailures = 0
					nextJoin = now.Add(2 * time.Second)
				case len(s.cfg.Join) == 0:
					// Only recorded members, which may all be down or
					// starting (a whole-cluster restart): they contact this
					// node when they come. Retry more and more slowly, quietly.
					joinFailures++
					lvl := slog.LevelInfo
					if joinFailures > 1 {
						lvl = slog.LevelDebug
					}
					s.log.Log(context.Background(), lvl, "the members recorded in the data dir did not answer; retrying", "members", seeds, "err", err)
					nextJoin = now.Add(min(time.Duration(joinFailures)*time.Second, 30*time.Second))
				case strings.Contains(err.Error(), membership.ErrOtherCluster.Error()):
					why := fmt.Sprintf("join refused: %v", err)
					s.joinRefused.Store(why)
					s.log.Error("join refused: the seeds belong to another cluster; retrying", "seeds", seeds, "err", err)
					nextJoin = now.Add(time.Second)
				default:
					s.log.Warn("join failed; retrying", "seeds", seeds, "err", err)
					nextJoin = now.Add(time.Second)
				}
			}
			// While still waiting for bootstrap_expect members, contact the
			// seeds again: one seed list for every node (a StatefulSet's pods
			// all list the same names) names this node too, and a join that
			// reached only itself, because the others' names did not resolve
			// yet, would otherwise leave the nodes apart for good.
			if joined && !bootstrapped && len(s.cfg.Join) > 0 && now.After(nextJoin) &&
				len(alive(s.memberList())) < s.cfg.BootstrapExpect {
				joined = false
			}
			s.noteKnown()                       // nodeauth.go
			s.proveMembers(s.members.Members()) // nodeauth.go
			s.adoptClusterID()                  // identity.go
			if !bootstrapped {
				bootstrapped = s.tryBootstrap()
			}
			// Reconcile when a member became alive (joined or came back).
			ms := alive(s.memberList())
			fresh := false
			aliveNow := map[string]bool{}
			for _, m := range ms {
				aliveNow[m.ID] = true
				if !seenAlive[m.ID] {
					fresh = true
				}
			}
			seenAlive = aliveNow
			if fresh && !s.cfg.DisableAutoPlace {
				s.reconcileAll(ms)
			} else if !s.cfg.DisableAutoPlace && now.After(nextLearners) {
				nextLearners = now.Add(learnerResume)
				s.resumeLearners(ms)
				s.maybeMove(now) // placemove.go
			}
		}
		s.enforceHalts()
		s.publishView()
		if s.cfg.LeaderBalanceInterval > 0 && time.Now().After(nextBalance) {
			nextBalance = time.Now().Add(balanceDelay(s.cfg.LeaderBalanceInterval, rand.N[time.Duration]))
			s.balanceLeaders()
		}
	}
}

func (s *Server) publishView() {
	if s.view.set(s.buildView()) {
		v, _ := s.view.get()
		var leaders []string
		for _, gi := range v.GroupInfo {
			leaders = append(leaders, gi.LeaderId)
		}
		s.log.Debug("cluster view changed", "version", v.Version, "members", len(v.Members), "leaders", leaders)
	}
}

// tryBootstrap executes planBootstrap: once --bootstrap-expect members are
// alive it bootstraps the groups this node is a voter of. It returns true when
// nothing is left to do.
func (s *Server) tryBootstrap() bool {
	ms := s.memberList()
	if len(alive(ms)) < s.cfg.BootstrapExpect {
		return false // not yet; skip reading every group's state
	}
	hasState := make([]bool, s.cfg.Groups)
	for g := range hasState {
		has, err := s.host.GroupHasState(g)
		if err != nil {
			s.log.Error("bootstrap: check group state", "group", g, "err", err)
			return false
		}
		hasState[g] = has
	}
	plan := planBootstrap(bootstrapInput{Self: s.cfg.NodeID, Expect: s.cfg.BootstrapExpect, Replicas: s.cfg.Replicas, Members: ms, HasState: hasState})
	if plan.Wait {
		return false
	}
	// A cluster formed by other members (or by this data dir before it was
	// replaced) is joined, never bootstrapped again (identity.go).
	formed := bootstrapClusterID(aliveByID(ms)[:s.cfg.BootstrapExpect])
	if mine := s.ident.clusterID(); mine != "" && mine != formed {
		s.log.Info("not bootstrapping: this data dir belongs to an existing cluster", "cluster_id", mine)
		return true
	}
	if exists, why := clusterExists(s.cfg.NodeID, ms, formed); exists {
		s.log.Info("not bootstrapping: a cluster exists already; waiting for its leaders to add this node", "why", why)
		return true
	}
	if len(plan.Groups) > 0 && s.ident.clusterID() == "" {
		s.setClusterID(formed, "bootstrapped")
	}
	if len(plan.Ignored) > 0 {
		s.log.Warn("more members alive than --bootstrap-expect; bootstrapping with the first ones by id", "expect", s.cfg.BootstrapExpect, "left_out", plan.Ignored)
	}
	for _, gc := range plan.Groups {
		if err := s.host.BootstrapGroup(gc.Group, gc.Servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			s.log.Error("bootstrap group", "group", gc.Group, "err", err)
			return false
		}
	}
	s.log.Info("bootstrap complete", "expect", s.cfg.BootstrapExpect)
	return true
}

// ledConfig is the configuration of a group this node leads.
type ledConfig struct {
	group int
	conf  raft.Configuration
}

// ledConfigs returns, in group order, the configuration of every group this
// node leads now; a group whose configuration cannot be read (leadership
// just lost) is left out.
func (s *Server) ledConfigs() []ledConfig {
	var out []ledConfig
	for g := range s.cfg.Groups {
		r := s.host.Raft(g)
		if r.State() != raft.Leader {
			continue
		}
		fut := r.GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		out = append(out, ledConfig{group: g, conf: fut.Configuration()})
	}
	return out
}

// reconcileAll executes planReconcile for every group led here, one group at a
// time, so each plan starts from that group's current configuration.
func (s *Server) reconcileAll(ms []membership.Member) {
	targets := PlaceAll(s.cfg.Groups, placementCandidates(ms), s.cfg.Replicas)
	for _, lc := range s.ledConfigs() {
		for _, add := range planReconcile(ms, s.cfg.Replicas, targets[lc.group], groupConfig{Group: lc.group, Servers: lc.conf.Servers}) {
			s.addVoter(add)
		}
	}
}

// resumeLearners finishes the learner additions a previous leader of a group
// led here started but did not promote (it lost leadership while the server
// caught up): placement's additions of servers that are non-voters now. Other
// additions wait for a member to become alive, as in reconcileAll, so a
// server an operator removed stays out.
func (s *Server) resumeLearners(ms []membership.Member) {
	var targets [][]membership.Member
	for _, lc := range s.ledConfigs() {
		learners := map[string]bool{}
		for _, srv := range lc.conf.Servers {
			if srv.Suffrage == raft.Nonvoter {
				learners[string(srv.ID)] = true
			}
		}
		if len(learners) == 0 {
			continue
		}
		if targets == nil {
			targets = PlaceAll(s.cfg.Groups, placementCandidates(ms), s.cfg.Replicas)
		}
		for _, add := range planReconcile(ms, s.cfg.Replicas, targets[lc.group], groupConfig{Group: lc.group, Servers: lc.conf.Servers}) {
			if learners[add.Member.ID] {
				s.addVoter(add)
			}
		}
	}
}

// addVoter executes one voterAdd through the learner path (learner.go), in
// the background; a failure is logged and retried at the next reconcile (when
// a member becomes alive again).
func (s *Server) addVoter(add voterAdd) {
	s.learners.start(s, add)
}

// balanceInput gathers planBalance's snapshot: alive members with their
// gossiped leader counts, and the configuration of every group led here.
func (s *Server) balanceInput() balanceInput {
	in := balanceInput{Self: s.cfg.NodeID}
	for _, m := range s.memberList() {
		// A member whose clock is out of bound may not lead (clock.go).
		if m.ID == s.cfg.NodeID || s.clock.peerReason(m.ID) == "" {
			in.Members = append(in.Members, m)
		}
	}
	for _, g := range s.ledGroups() {
		gc := groupConfig{Group: g}
		if fut := s.host.Raft(g).GetConfiguration(); fut.Error() == nil {
			gc.Servers = fut.Configuration().Servers
		}
		in.Led = append(in.Led, gc)
	}
	return in
}

// balanceLeaders executes planBalance: at most one leadership transfer.
func (s *Server) balanceLeaders() {
	if mv, ok := planBalance(s.balanceInput()); ok {
		s.moveLeader(mv)
	}
}

// moveLeader executes one leaderMove. Raft's transfer is best effort (another
// voter's election may win); the next balance check sees the outcome.
func (s *Server) moveLeader(mv leaderMove) {
	s.log.Info("balancing leadership", "group", mv.Group, "to", mv.To.ID, "led_here", mv.LedHere, "led_there", mv.LedThere)
	if err := s.host.Raft(mv.Group).LeadershipTransferToServer(mv.To.ID, mv.To.Address).Error(); err != nil {
		s.log.Warn("leadership transfer failed", "group", mv.Group, "to", mv.To.ID, "err", err)
	}
}

// handOffLeadership transfers every group led here to another voter before a
// graceful stop, so clients see a new leader at once instead of after an
// election timeout.
func (s *Server) handOffLeadership(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range s.ledGroups() {
		r := s.host.Raft(g)
		fut := r.GetConfiguration()
		if fut.Error() != nil || len(fut.Configuration().Servers) < 2 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- r.LeadershipTransfer().Error() }()
			select {
			case err := <-done:
				if err != nil {
					s.log.Warn("leadership hand-off failed", "group", g, "err", err)
				} else {
					s.log.Info("leadership handed off", "group", g)
				}
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
}
