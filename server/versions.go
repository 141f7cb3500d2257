package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/fsm"
)

// Rolling upgrades. Every node advertises the highest cluster version its build
// supports (serf tag "ver", Config.Cluster.MaxClusterVersion). A leader appends an entry
// of a type introduced in cluster version v only when every server of the
// group's raft configuration advertises v or more — a server that is down
// counting with the version it last advertised (see cluster.VersionLag); otherwise the
// request gets FailedPrecondition naming the nodes that lag. A replica that
// still meets an entry it cannot apply halts that group (fsm.FSM.Apply): it
// reports the group not ready, refuses to lead it, and waits to be restarted
// with a newer build.

// maxClusterVersionEnv lowers the cluster version a node supports, so that a
// current binary behaves like an older one (upgrade tests). Read only when
// Config.Cluster.MaxClusterVersion is 0.
const maxClusterVersionEnv = "TOLLGATE_MAX_CLUSTER_VERSION"

// haltTransferEvery spaces the leadership transfers a halted leader attempts.
const haltTransferEvery = 5 * time.Second

// versionState is the node's rolling-upgrade bookkeeping.
type versionState struct {
	// skipGate lets tests append an entry the group's voters cannot all
	// apply, to exercise the halt path. Never set outside tests.
	skipGate atomic.Bool
	// lastTransfer: when a halted leader last tried to hand a group off
	// (clusterLoop goroutine only).
	lastTransfer map[int]time.Time
}

// resolveClusterVersion fills cfg.Cluster.MaxClusterVersion: the field, else the
// environment switch, else everything this build supports.
func resolveClusterVersion(cfg *Config) error {
	if cfg.Cluster.MaxClusterVersion == 0 {
		if v := os.Getenv(maxClusterVersionEnv); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("config: %s=%q: want an integer in [1, %d]", maxClusterVersionEnv, v, fsm.CurrentClusterVersion)
			}
			cfg.Cluster.MaxClusterVersion = n
		} else {
			cfg.Cluster.MaxClusterVersion = fsm.CurrentClusterVersion
		}
	}
	if cfg.Cluster.MaxClusterVersion < 1 || cfg.Cluster.MaxClusterVersion > fsm.CurrentClusterVersion {
		return fmt.Errorf("config: max cluster version %d: must be in [1, %d] (this build supports up to %d)",
			cfg.Cluster.MaxClusterVersion, fsm.CurrentClusterVersion, fsm.CurrentClusterVersion)
	}
	return nil
}

// MaxClusterVersion is the highest cluster version this node applies and advertises.
func (s *Server) MaxClusterVersion() int { return s.cfg.Cluster.MaxClusterVersion }

// groupSupports reports whether every server of group g's raft configuration
// (voters and non-voters: both apply the log) supports cluster version
// `version`, as read from this node's copy of the configuration and the
// gossiped "ver" tags (cluster.VersionLag decides). lagging describes each server that
// does not, or whose version is unknown.
func (s *Server) groupSupports(g, version int) (ok bool, lagging []string) {
	fut := s.host.Raft(g).GetConfiguration()
	if err := fut.Error(); err != nil {
		return false, []string{fmt.Sprintf("group %d's configuration is not readable on %s (%v)", g, s.cfg.Node.ID, err)}
	}
	lagging = cluster.VersionLag(fut.Configuration().Servers, s.memberList(), s.recordedVersion, s.cfg.Node.ID, s.cfg.Cluster.MaxClusterVersion, version)
	return len(lagging) == 0, lagging
}

// versionGate is what an entry of cluster version `version` may do in group
// g on this node: gateOpen (every server applies it), gateClosed (a server
// advertises an older build: a rolling upgrade) or gateUnknown (only
// versions not known yet stand in the way; they usually are within a second
// of a restart).
func (s *Server) versionGate(g, version int) gate {
	if s.vers.skipGate.Load() {
		return gateOpen
	}
	fut := s.host.Raft(g).GetConfiguration()
	if fut.Error() != nil {
		return gateUnknown
	}
	lagging, unknown := cluster.VersionLagUnknown(fut.Configuration().Servers, s.memberList(), s.recordedVersion, s.cfg.Node.ID, s.cfg.Cluster.MaxClusterVersion, version)
	switch {
	case len(lagging) == 0:
		return gateOpen
	case unknown == len(lagging):
		return gateUnknown
	}
	return gateClosed
}

// recordedVersion is the cluster version member id last advertised, as this
// node's gossip peers record holds it (0: not recorded, or no gossip).
func (s *Server) recordedVersion(id string) int {
	if s.members == nil {
		return 0
	}
	return s.members.RecordedVersion(id)
}

// gate is versionGate's answer.
type gate uint8

const (
	gateOpen gate = iota
	gateClosed
	gateUnknown
)

// checkEntryType returns FailedPrecondition when group g cannot take an entry
// of type typ yet.
func (s *Server) checkEntryType(g int, typ byte) error {
	info, known := fsm.LookupEntryType(typ)
	if !known {
		return status.Errorf(codes.Internal, "group %d: entry type %d is not registered", g, typ)
	}
	if s.vers.skipGate.Load() {
		return nil
	}
	if ok, lagging := s.groupSupports(g, info.Since); !ok {
		return status.Errorf(codes.FailedPrecondition, "group %d: %s; %s needs cluster version %d: finish the rolling upgrade first",
			g, strings.Join(lagging, ", "), info.Name, info.Since)
	}
	return nil
}

// proposeVersioned appends an encoded entry of type typ to group g's log on
// this node, which must lead g, after the version check, and waits until it is
// applied here. It returns the FSM's response and the entry's raft index.
func (s *Server) proposeVersioned(ctx context.Context, g int, typ byte, data []byte) (any, uint64, error) {
	wait, err := s.appendVersioned(g, typ, data)
	if err != nil {
		return nil, 0, err
	}
	return wait(ctx)
}

// appendVersioned is proposeVersioned without the wait: the checks, then the
// entry handed to raft; wait returns the module's result and the index.
func (s *Server) appendVersioned(g int, typ byte, data []byte) (wait func(context.Context) (any, uint64, error), err error) {
	if err := s.haltedStatus(g); err != nil {
		return nil, err
	}
	r := s.host.Raft(g)
	if r.State() != raft.Leader {
		return nil, status.Errorf(codes.Unavailable, "group %d: %s no longer leads it; retry", g, s.cfg.Node.ID)
	}
	if err := s.checkEntryType(g, typ); err != nil {
		return nil, err
	}
	fut := r.Apply(data, s.cfg.Raft.ApplyTimeout)
	return func(ctx context.Context) (any, uint64, error) {
		done := make(chan error, 1)
		go func() { done <- fut.Error() }()
		select {
		case err := <-done:
			if err != nil {
				return nil, 0, raftStatus(g, "append", err)
			}
		case <-ctx.Done():
			return nil, 0, status.Errorf(codes.DeadlineExceeded, "group %d: %v before the entry applied; it may still apply (retrying is safe)", g, ctx.Err())
		}
		resp := fut.Response()
		if err, ok := resp.(error); ok {
			if errors.Is(err, fsm.ErrHalted) {
				return nil, 0, status.Errorf(codes.Unavailable, "group %d: %v", g, err)
			}
			return nil, 0, status.Errorf(codes.Internal, "group %d: apply: %v", g, err)
		}
		return resp, fut.Index(), nil
	}, nil
}

// haltedStatus is Unavailable naming the reason when group g's FSM is halted
// on this node, else nil.
func (s *Server) haltedStatus(g int) error {
	if halted, why := s.fsms[g].Halted(); halted {
		return status.Errorf(codes.Unavailable, "group %d is halted on %s and cannot serve as its leader: %s", g, s.cfg.Node.ID, why)
	}
	return nil
}

// haltedLeaderStatus refuses a write on a node that leads group g in raft but
// whose FSM is halted: its committed state is stale, so it must not decide.
// Other nodes answer normally (a follower redirects to the leader).
func (s *Server) haltedLeaderStatus(g int) error {
	if s.host.Raft(g).State() != raft.Leader {
		return nil
	}
	return s.haltedStatus(g)
}

// leads is the one definition of "this node leads group g" for everything
// that decides or writes as a group's leader (tracking, shares, runtime
// config, metering, the rate owner): raft calls this node the leader, its
// leader session has passed its barrier (everything committed under earlier
// leaders is applied here, so decisions start from current state), and the
// group is not halted here. Raft leadership alone is not enough: a leader
// that has not applied its predecessor's entries would decide from stale
// state. Its clock must be confirmed against a majority of the voters'
// clocks (clockbound): the same gate as the session's start (mayLead), read
// here too so that nothing leads in the moment between the clock losing its
// confirmation and the session stopping. One peer restarting does not
// unconfirm a leader (the other peers still confirm it).
func (s *Server) leads(g int) bool {
	if !s.servesGroup(g) {
		return false // a raise's group not served here yet (a rate owner's table may name it first)
	}
	if s.host.Raft(g).State() != raft.Leader || !s.clock.Confirmed() || !s.trackers[g].ready() {
		return false
	}
	halted, _ := s.fsms[g].Halted()
	return !halted
}

// mayLead reports whether this node may run a leader session for group g.
func (s *Server) mayLead(g int) bool {
	halted, _ := s.fsms[g].Halted()
	return !halted && s.clock.MayLeadReason() == ""
}

// enforceHalts runs on every cluster loop tick: a group halted here loses its
// leader session, and if raft still makes this node its leader, leadership is
// handed to another voter (best effort, at most every haltTransferEvery).
func (s *Server) enforceHalts() {
	for g, f := range s.servedFSMs() {
		halted, why := f.Halted()
		if !halted {
			continue
		}
		tr := s.trackers[g]
		if tr.leading() {
			s.log.Error("group halted: stopping its leader session", "group", g, "reason", why)
			tr.setLeader(false)
		}
		r := s.host.Raft(g)
		if r.State() != raft.Leader || time.Since(s.vers.lastTransfer[g]) < haltTransferEvery || !hasOtherVoter(r, s.cfg.Node.ID) {
			continue
		}
		if s.vers.lastTransfer == nil {
			s.vers.lastTransfer = map[int]time.Time{}
		}
		s.vers.lastTransfer[g] = time.Now()
		s.log.Warn("group halted on its leader: transferring leadership", "group", g, "reason", why)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := r.LeadershipTransfer().Error(); err != nil {
				s.log.Warn("leadership transfer away from a halted group failed; retrying later", "group", g, "err", err)
			}
		}()
	}
}

// haltedReason is "" or the first halted group's reason, for readiness.
func (s *Server) haltedReason() string {
	for g, f := range s.servedFSMs() {
		if halted, why := f.Halted(); halted {
			return fmt.Sprintf("group %d halted: %s", g, why)
		}
	}
	return ""
}

// hasOtherVoter reports whether r's configuration has a voter besides self
// (a single-voter group has nobody to hand leadership to).
func hasOtherVoter(r *raft.Raft, self string) bool {
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return false
	}
	for _, srv := range fut.Configuration().Servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != self {
			return true
		}
	}
	return false
}

// expireAge returns what group g's expire entries carry as the idle age. The
// age is fsm.IdleAge(timeout) = timeout+1 (a series seen within the timeout is
// active); for a 60-minute timeout that is 61, which builds before cluster
// version 2 refuse to decode. Until every server of the group supports version
// 2, such a group sends 60: those builds then expire series of age 60, as they
// always did, and nothing diverges. Checked once per minute per group.
func (s *Server) expireAge(g int) func() int {
	timeout := int(s.cfg.Tracking.IdleTimeout / time.Minute)
	age := fsm.IdleAge(timeout)
	if age <= fsm.MaxIdleMinutes {
		return nil
	}
	return func() int {
		if ok, _ := s.groupSupports(g, 2); ok {
			return age
		}
		return fsm.MaxIdleMinutes
	}
}
