package server

import (
	"context"
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
	"github.com/tollgate-io/tollgate/cluster"
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
	// bytes (strictcodec.Shared), so a stream that never reads pins references, not a
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
	if s.cfg.Gossip.Addr == "" {
		return nil
	}
	grpcAdv := s.cfg.Node.GRPCAdvertise
	if grpcAdv == "" {
		grpcAdv = advertiseOf(s.grpcLis.Addr())
	}
	m, err := membership.New(membership.Config{
		NodeID:        s.cfg.Node.ID,
		Zone:          s.cfg.Node.Zone,
		GRPCAddr:      grpcAdv,
		RaftAddr:      string(s.host.Addr()),
		BindAddr:      s.cfg.Gossip.Addr,
		AdvertiseAddr: s.cfg.Gossip.Advertise,
		DataDir:       s.cfg.Node.DataDir,
		ProbeInterval: s.cfg.Gossip.ProbeInterval,
		Keys:          s.cfg.Access.TLS.GossipKeys,
		MaxStreams:    s.cfg.Gossip.MaxStreams,
		Logger:        s.log,

		Incarnation:        s.ident.Incarnation, // identity.go
		IncarnationAdopted: s.ident.Adopted,
		ClusterID:          s.ident.ClusterID(),

		ClusterVersion: s.cfg.Cluster.MaxClusterVersion, // gossiped as "ver" (versions.go)
		LeadGroups:     s.servedGroups(),                // groups.go: raised by serveGroup
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
	return []membership.Member{{ID: s.cfg.Node.ID, Zone: s.cfg.Node.Zone, GRPCAddr: s.GRPCAddr(), RaftAddr: s.RaftAddr(),
		Status: membership.StatusAlive, GroupsLed: s.ledGroups(), ClusterVersion: s.cfg.Cluster.MaxClusterVersion, LeadGroups: s.servedGroups()}}
}

func (s *Server) ledGroups() []int {
	var led []int
	if s.host == nil {
		return nil
	}
	for g := range s.host.Groups() { // a raise's new groups too (groups.go)
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
	// Groups is the count the cluster was created with, fixed for its
	// life: clients take it for the arithmetic of an epoch-0 table and fail
	// over a change. A raised count travels in the layout table.
	v := &api.ClusterView{Partitions: uint32(s.cfg.Layout.Partitions), Groups: uint32(s.base), ServedBy: s.cfg.Node.ID}
	byID := map[string]membership.Member{}
	for _, m := range ms {
		byID[m.ID] = m
		pm := &api.Member{Id: m.ID, Zone: m.Zone, GrpcAddress: m.GRPCAddr, RaftAddress: m.RaftAddr, Status: m.Status,
			ClusterVersion: uint32(m.ClusterVersion), Decommissioning: m.Decommissioning, LeadGroups: uint32(m.LeadGroups)}
		for _, g := range m.GroupsLed {
			pm.GroupsLed = append(pm.GroupsLed, uint32(g))
		}
		v.Members = append(v.Members, pm)
	}
	for g := range s.servedGroups() { // a raise's groups from when they are served (groups.go)
		gi := &api.GroupInfo{Group: uint32(g)}
		r := s.host.Raft(g)
		member := s.hostsGroup(g) // a replica removed from the group knows a stale leader and voters
		var leaderID string
		if r.State() == raft.Leader {
			leaderID = s.cfg.Node.ID
		} else if _, id := r.LeaderWithID(); id != "" && member {
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
		if fut := r.GetConfiguration(); fut.Error() == nil && member {
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
	v.Layout = s.layout.View()
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

// hostsGroup reports whether this node is in group g's raft configuration
// (one its leader removed it from unbeknown to the replica is not: stale.go).
func (s *Server) hostsGroup(g int) bool {
	fut := s.host.Raft(g).GetConfiguration()
	if fut.Error() != nil || (s.ctl != nil && s.ctl.Removed(g)) {
		return false
	}
	for _, srv := range fut.Configuration().Servers {
		if string(srv.ID) == s.cfg.Node.ID {
			return true
		}
	}
	return false
}

// clusterLoop runs the node's cluster duties until stop: gossip the groups
// led here, join seeds, rebuild the view; and, through the controller
// (package cluster), bootstrap a new cluster, place replicas and balance
// leadership.
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
	seeds := slices.Clone(s.cfg.Gossip.Join)
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
	var nextJoin, nextBalance time.Time
	nextBalance = time.Now().Add(2 * s.cfg.Cluster.LeaderBalanceInterval)
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
				case len(s.cfg.Gossip.Join) == 0:
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
			if joined && !s.ctl.Bootstrapped() && len(s.cfg.Gossip.Join) > 0 && now.After(nextJoin) &&
				len(alive(s.memberList())) < s.cfg.Cluster.BootstrapExpect {
				joined = false
			}
			s.noteKnown()                       // nodeauth.go
			s.proveMembers(s.members.Members()) // nodeauth.go
			// Cluster id, bootstrap, placement repairs, learners and
			// replica moves (package cluster).
			s.ctl.Place(now)
		}
		s.enforceHalts()
		s.publishView()
		if s.cfg.Cluster.LeaderBalanceInterval > 0 && time.Now().After(nextBalance) {
			nextBalance = time.Now().Add(cluster.BalanceDelay(s.cfg.Cluster.LeaderBalanceInterval, rand.N[time.Duration]))
			s.ctl.BalanceLeaders()
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

// handOffLeadership hands every group led here to another voter before a
// graceful stop (cluster.Controller.HandOffLeadership).
func (s *Server) handOffLeadership(ctx context.Context) { s.ctl.HandOffLeadership(ctx) }

// incarnationLoop runs the leaders' side of incarnation replacement until
// the node stops (cluster/incarnation.go).
func (s *Server) incarnationLoop() { s.ctl.RunIncarnations() }

// logIncarnationOnce logs a repeating warning about member id at most every
// 30 s per (group, member) (cluster.Controller.LogOnce).
func (s *Server) logIncarnationOnce(g int, id, msg string, args ...any) {
	s.ctl.LogOnce(g, id, msg, args...)
}

// untilClosing is a context for background work of the node: cancelled when
// the node starts stopping, or by cancel.
func (s *Server) untilClosing() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
