package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
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
	mu      sync.Mutex
	view    *api.ClusterView
	changed chan struct{} // closed and replaced when view changes
}

func (c *clusterView) get() (*api.ClusterView, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view, c.changed
}

// set stores v if it differs from the current view (ignoring the version).
func (c *clusterView) set(v *api.ClusterView) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.view != nil {
		v.Version = c.view.Version
		if proto.Equal(v, c.view) {
			return false
		}
	}
	v.Version++
	c.view = v
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
		Logger:        s.log,

		ClusterVersion: s.cfg.MaxClusterVersion, // gossiped as "ver" (versions.go)
	})
	if err != nil {
		return err
	}
	s.members = m
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
func (s *Server) memberList() []membership.Member {
	if s.members != nil {
		return s.members.Members()
	}
	return []membership.Member{{ID: s.cfg.NodeID, Zone: s.cfg.Zone, GRPCAddr: s.GRPCAddr(), RaftAddr: s.RaftAddr(),
		Status: membership.StatusAlive, GroupsLed: s.ledGroups()}}
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
		pm := &api.Member{Id: m.ID, Zone: m.Zone, GrpcAddress: m.GRPCAddr, RaftAddress: m.RaftAddr, Status: m.Status}
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
	joined := len(s.cfg.Join) == 0
	var nextJoin, nextBalance time.Time
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
			if !joined && now.After(nextJoin) {
				if n, err := s.members.Join(s.cfg.Join); err != nil {
					s.log.Warn("join failed; retrying", "seeds", s.cfg.Join, "err", err)
					nextJoin = now.Add(time.Second)
				} else {
					s.log.Info("joined cluster", "contacted", n)
					joined = true
				}
			}
			if !bootstrapped {
				bootstrapped = s.tryBootstrap()
			}
			// Reconcile when a member became alive (joined or came back).
			ms := alive(s.members.Members())
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
			}
		}
		s.enforceHalts()
		s.publishView()
		if s.cfg.LeaderBalanceInterval > 0 && time.Now().After(nextBalance) {
			// ±25 % jitter so nodes do not decide at the same instant.
			iv := s.cfg.LeaderBalanceInterval
			nextBalance = time.Now().Add(iv*3/4 + rand.N(iv/2+1))
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

// tryBootstrap forms a new cluster once BootstrapExpect members are alive: every
// such node computes the same placement and bootstraps the groups it is a voter
// of with the identical configuration (raft makes identical bootstraps safe).
// A group that already has state, or that some member already leads (the
// cluster exists and this node will be added by its leader), is left alone.
// It returns true when nothing is left to do.
func (s *Server) tryBootstrap() bool {
	ms := alive(s.members.Members())
	if len(ms) < s.cfg.BootstrapExpect {
		return false
	}
	if len(ms) > s.cfg.BootstrapExpect {
		s.log.Warn("more members alive than --bootstrap-expect; bootstrapping with the first ones by id", "alive", len(ms), "expect", s.cfg.BootstrapExpect)
		ms = ms[:s.cfg.BootstrapExpect]
	}
	for g := range s.cfg.Groups {
		has, err := s.host.GroupHasState(g)
		if err != nil {
			s.log.Error("bootstrap: check group state", "group", g, "err", err)
			return false
		}
		if has {
			continue
		}
		ledElsewhere := false
		for _, m := range ms {
			if slices.Contains(m.GroupsLed, g) {
				ledElsewhere = true
			}
		}
		if ledElsewhere {
			continue
		}
		voters := Placement(g, ms, s.cfg.Replicas)
		var servers []raft.Server
		self := false
		for _, v := range voters {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.RaftAddr)})
			self = self || v.ID == s.cfg.NodeID
		}
		if !self {
			continue
		}
		if err := s.host.BootstrapGroup(g, servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			s.log.Error("bootstrap group", "group", g, "err", err)
			return false
		}
	}
	s.log.Info("bootstrap complete", "expect", s.cfg.BootstrapExpect)
	return true
}

// reconcileAll runs placement repair for every group led here: a zone with
// alive members but no voter gets the placement's choice for that zone, voters
// are topped up to Replicas, and a voter whose raft address changed is updated.
// It never removes a server: removal is an operator decision (raft
// remove-server), and a removed node stays out until it joins again.
func (s *Server) reconcileAll(ms []membership.Member) {
	byID := map[string]membership.Member{}
	for _, m := range ms {
		byID[m.ID] = m
	}
	for g := range s.cfg.Groups {
		r := s.host.Raft(g)
		if r.State() != raft.Leader {
			continue
		}
		fut := r.GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		conf := fut.Configuration()
		inConf := map[string]raft.Server{}
		zones := map[string]bool{}
		voters := 0
		for _, srv := range conf.Servers {
			inConf[string(srv.ID)] = srv
			if srv.Suffrage == raft.Voter {
				voters++
				if m, ok := byID[string(srv.ID)]; ok {
					zones[m.Zone] = true
					if m.RaftAddr != "" && raft.ServerAddress(m.RaftAddr) != srv.Address {
						s.addVoter(g, m, "raft address changed")
					}
				}
			}
		}
		for _, m := range Placement(g, ms, s.cfg.Replicas) {
			if _, ok := inConf[m.ID]; ok {
				continue
			}
			switch {
			case !zones[m.Zone]:
				s.addVoter(g, m, "zone has no voter")
				zones[m.Zone] = true
				voters++
			case voters < s.cfg.Replicas:
				s.addVoter(g, m, "group has fewer voters than replicas")
				voters++
			}
		}
	}
}

func (s *Server) addVoter(g int, m membership.Member, why string) {
	s.log.Info("adding voter", "group", g, "node", m.ID, "zone", m.Zone, "raft", m.RaftAddr, "reason", why)
	if err := s.host.Raft(g).AddVoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, 10*time.Second).Error(); err != nil {
		s.log.Warn("add voter failed", "group", g, "node", m.ID, "err", err)
	}
}

// balanceLeaders moves one group's leadership from this node to a voter of
// that group leading at least two fewer groups, so leader counts converge to
// within one of each other (the leader does the group's deciding and fsyncs).
// One transfer per interval per node, with the interval jittered, keeps nodes
// from all dumping on the same target at once.
func (s *Server) balanceLeaders() {
	ms := alive(s.memberList())
	if len(ms) < 2 {
		return
	}
	counts := map[string]int{}
	for _, m := range ms {
		counts[m.ID] = len(m.GroupsLed)
	}
	mine := s.ledGroups()
	counts[s.cfg.NodeID] = len(mine)
	for i := len(mine) - 1; i >= 0; i-- {
		g := mine[i]
		r := s.host.Raft(g)
		fut := r.GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		var best *raft.Server
		bestN := len(mine) - 1 // the target must lead ≤ len(mine)-2
		for _, srv := range fut.Configuration().Servers {
			n, ok := counts[string(srv.ID)]
			if srv.Suffrage != raft.Voter || string(srv.ID) == s.cfg.NodeID || !ok {
				continue
			}
			if n < bestN {
				srv := srv
				best, bestN = &srv, n
			}
		}
		if best == nil {
			continue
		}
		s.log.Info("balancing leadership", "group", g, "to", best.ID, "led_here", len(mine), "led_there", bestN)
		if err := r.LeadershipTransferToServer(best.ID, best.Address).Error(); err != nil {
			s.log.Warn("leadership transfer failed", "group", g, "to", best.ID, "err", err)
		}
		return
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
