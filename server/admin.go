package server

import (
	"cmp"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/membership"
)

const (
	// restartSnapshotEntries: a group whose log holds this many entries past
	// its snapshot is snapshotted when the node stops gracefully. Each entry
	// is a batch of up to thousands of series; re-applying 1,024 of them
	// costs well under a second, a snapshot of a large group more.
	restartSnapshotEntries = 1024
	snapshotChunkSize      = 1 << 20
	membershipTimeout      = 10 * time.Second
	maxRestoreBytes        = 64 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// adminService implements api.AdminServer. Calls that must run on a group's
// leader are forwarded to it (peers.go) by the node that received them; the
// token check runs before any handler (auth.go).
type adminService struct {
	api.UnimplementedAdminServer
	s        *Server
	peerPool // connections to other nodes, for forwarding

	restoreMu sync.Mutex // one restore at a time per node
}

func newAdminService(s *Server) *adminService {
	return &adminService{s: s, peerPool: peerPool{s.peers}}
}

func (a *adminService) checkGroup(g uint32) (int, error) {
	if n := a.s.servedGroups(); int(g) >= n {
		return 0, status.Errorf(codes.InvalidArgument, "group %d out of range: this node serves %d groups", g, n)
	}
	return int(g), nil
}

func peersOf(r *raft.Raft) ([]*api.Peer, uint64, error) {
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, 0, err
	}
	_, leaderID := r.LeaderWithID()
	var out []*api.Peer
	for _, srv := range fut.Configuration().Servers {
		out = append(out, &api.Peer{Id: string(srv.ID), Address: string(srv.Address), Suffrage: srv.Suffrage.String(), Leader: srv.ID == leaderID})
	}
	return out, fut.Index(), nil
}

func (a *adminService) ListPeers(ctx context.Context, req *api.ListPeersRequest) (*api.ListPeersResponse, error) {
	g, err := a.checkGroup(req.Group)
	if err != nil {
		return nil, err
	}
	if c, fctx, err := a.leaderClient(ctx, g); err == nil && c != nil {
		return c.ListPeers(fctx, req)
	}
	// This node leads the group, or no leader is reachable: answer with the
	// configuration this replica knows.
	peers, idx, err := peersOf(a.s.host.Raft(g))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "group %d: read configuration: %v", g, err)
	}
	return &api.ListPeersResponse{Group: uint32(g), Peers: peers, ConfigurationIndex: idx}, nil
}

func (a *adminService) AddVoter(ctx context.Context, req *api.AddVoterRequest) (*api.MembershipResponse, error) {
	g, err := a.checkGroup(req.Group)
	if err != nil {
		return nil, err
	}
	if req.Id == "" {
		return nil, status.Error(codes.InvalidArgument, "add-voter: server id is required")
	}
	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.AddVoter(fctx, req)
	}
	// A plain address that matches the member's gossiped endpoint names its
	// current incarnation (cluster/incarnation.go).
	addr := req.Address
	if addr != "" {
		addr = a.s.ctl.IncarnationAddr(req.Id, addr)
	}
	res, err := a.s.ctl.AddLearner(ctx, cluster.LearnerRequest{
		Group: g, ID: req.Id, Addr: addr, Force: req.Force,
		CatchUp: time.Duration(req.CatchUpTimeoutMillis) * time.Millisecond, Reason: "admin add-voter",
	})
	if err != nil {
		return nil, err
	}
	peers, _, _ := peersOf(a.s.host.Raft(g))
	return &api.MembershipResponse{Group: uint32(g), Index: res.Index, Peers: peers,
		CatchUpMillis: uint64(res.CatchUp.Milliseconds()), LagEntries: res.Lag, AlreadyVoter: res.AlreadyVoter}, nil
}

func (a *adminService) RemoveServer(ctx context.Context, req *api.RemoveServerRequest) (*api.MembershipResponse, error) {
	g, err := a.checkGroup(req.Group)
	if err != nil {
		return nil, err
	}
	if req.Id == "" {
		return nil, status.Error(codes.InvalidArgument, "remove-server: server id is required")
	}
	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.RemoveServer(fctx, req)
	}
	r := a.s.host.Raft(g)
	peers, _, err := peersOf(r)
	if err != nil {
		return nil, raftStatus(g, "read configuration", err)
	}
	found, voters := false, 0
	for _, p := range peers {
		found = found || p.Id == req.Id
		if p.Suffrage == raft.Voter.String() {
			voters++
		}
	}
	if !found {
		return nil, status.Errorf(codes.NotFound, "remove-server: %q is not in group %d's configuration", req.Id, g)
	}
	if voters <= 1 {
		return nil, status.Errorf(codes.FailedPrecondition, "remove-server: %q is the last voter of group %d", req.Id, g)
	}
	if !req.Force {
		if err := a.s.ctl.RemovalKeepsQuorum(g, peers, req.Id); err != nil {
			return nil, err
		}
	}
	if req.Id == a.s.cfg.Node.ID {
		return a.removeLeader(ctx, g, req)
	}
	a.s.log.Info("admin: remove server", "group", g, "id", req.Id)
	fut := r.RemoveServer(raft.ServerID(req.Id), 0, membershipTimeout)
	if err := fut.Error(); err != nil {
		return nil, raftStatus(g, "remove server", err)
	}
	peers, _, _ = peersOf(r)
	return &api.MembershipResponse{Group: uint32(g), Index: fut.Index(), Peers: peers}, nil
}

// removeLeader removes this node, the group's leader: it hands leadership to
// another voter first and lets the new leader remove it, so the group never
// waits for an election and this replica leaves as an ordinary follower.
func (a *adminService) removeLeader(ctx context.Context, g int, req *api.RemoveServerRequest) (*api.MembershipResponse, error) {
	s := a.s
	r := s.host.Raft(g)
	s.log.Info("admin: remove server: this node leads the group; handing leadership off first", "group", g, "id", req.Id)
	if err := r.LeadershipTransfer().Error(); err != nil {
		return nil, raftStatus(g, "hand leadership off before removing the leader", err)
	}
	// The new leader as raft knows it (the view may still name the previous
	// one from gossip for a moment). Its first answers may be Unavailable
	// while it settles; retry those until the deadline.
	deadline := time.Now().Add(membershipTimeout)
	var lastErr error
	for {
		if _, lid := r.LeaderWithID(); lid != "" && string(lid) != s.cfg.Node.ID && r.State() != raft.Leader {
			if addr := s.grpcAddrOf(string(lid)); addr != "" {
				resp, err := a.forwardRemove(ctx, addr, req)
				if err == nil {
					resp.HandedOffTo = string(lid)
					return resp, nil
				}
				if c := status.Code(err); c != codes.Unavailable && c != codes.Aborted {
					return nil, err
				}
				lastErr = err
			}
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.Unavailable, "group %d: handed leadership off to remove %s, but the new leader did not take the removal within %v (last: %v); retry", g, req.Id, membershipTimeout, lastErr)
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// forwardRemove sends a RemoveServer to the node at addr (the group's new
// leader), with the caller's token or else this node's.
func (a *adminService) forwardRemove(ctx context.Context, addr string, req *api.RemoveServerRequest) (*api.MembershipResponse, error) {
	cc, fctx, err := a.s.peers.Forward(ctx, addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(fctx, membershipTimeout)
	defer cancel()
	return api.NewAdminClient(cc).RemoveServer(cctx, req)
}

// grpcAddrOf is the gossiped gRPC address of member id ("" if unknown).
func (s *Server) grpcAddrOf(id string) string {
	for _, m := range s.memberList() {
		if m.ID == id {
			return m.GRPCAddr
		}
	}
	return ""
}

// transferTimedOut: raft's leadership transfer gave up waiting for the
// target (raft returns it as a plain error, without a sentinel).
func transferTimedOut(err error) bool {
	return err != nil && strings.Contains(err.Error(), "leadership transfer timeout")
}

func (a *adminService) TransferLeadership(ctx context.Context, req *api.TransferLeadershipRequest) (*api.TransferLeadershipResponse, error) {
	g, err := a.checkGroup(req.Group)
	if err != nil {
		return nil, err
	}
	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.TransferLeadership(fctx, req)
	}
	r := a.s.host.Raft(g)
	if req.ToId == a.s.cfg.Node.ID {
		return &api.TransferLeadershipResponse{Group: uint32(g), NewLeaderId: req.ToId}, nil // already there
	}
	var fut raft.Future
	if req.ToId == "" {
		fut = r.LeadershipTransfer()
	} else {
		peers, _, err := peersOf(r)
		if err != nil {
			return nil, raftStatus(g, "read configuration", err)
		}
		var addr string
		for _, p := range peers {
			if p.Id == req.ToId && p.Suffrage == raft.Voter.String() {
				addr = p.Address
			}
		}
		if addr == "" {
			return nil, status.Errorf(codes.InvalidArgument, "transfer-leadership: %q is not a voter of group %d", req.ToId, g)
		}
		if why := a.s.clock.PeerReason(req.ToId); why != "" {
			return nil, status.Errorf(codes.FailedPrecondition, "transfer-leadership: group %d: %s, so it may not lead", g, why)
		}
		fut = r.LeadershipTransferToServer(raft.ServerID(req.ToId), raft.ServerAddress(addr))
	}
	a.s.log.Info("admin: transfer leadership", "group", g, "to", req.ToId)
	if err := fut.Error(); err != nil {
		if !transferTimedOut(err) {
			return nil, raftStatus(g, "transfer leadership", err)
		}
		if r.State() == raft.Leader {
			// The target did not take over within raft's election timeout
			// (a loaded host): nothing changed, so the caller may simply
			// ask again. Unavailable is what clients and the CLI retry.
			return nil, status.Errorf(codes.Unavailable, "group %d: transfer leadership: %v: the target did not take over in time and this node still leads; retry", g, err)
		}
		// It timed out but leadership did move (late): report the new leader.
	}
	// Report the new leader once this node has heard from it.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, id := r.LeaderWithID(); id != "" && string(id) != a.s.cfg.Node.ID {
			return &api.TransferLeadershipResponse{Group: uint32(g), NewLeaderId: string(id)}, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &api.TransferLeadershipResponse{Group: uint32(g)}, nil
}

// NodeGroups is this node's local raft state per group (not forwarded), with
// the reason of every group halted here, and the backlog controller's state
// when this node runs it.
// RaiseGroups raises the group count (groups.go); group 0's leader serves it.
func (a *adminService) RaiseGroups(ctx context.Context, req *api.RaiseGroupsRequest) (*api.RaiseGroupsResponse, error) {
	if err := a.s.raiseGate(int(req.To)); err != nil { // before forwarding: the leader may run an older build
		return nil, err
	}
	c, fctx, err := a.leaderClient(ctx, 0)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.RaiseGroups(fctx, req)
	}
	return a.s.raiseGroups(ctx, int(req.To))
}

func (a *adminService) NodeGroups(context.Context, *api.NodeGroupsRequest) (*api.NodeGroupsResponse, error) {
	return a.s.nodeGroups(), nil
}

func (s *Server) nodeGroups() *api.NodeGroupsResponse {
	out := &api.NodeGroupsResponse{NodeId: s.cfg.Node.ID, Zone: s.cfg.Node.Zone, RaftAddr: string(s.host.Addr())}
	// A group being added has its raft here before its per-group state
	// (groups.go).
	for g := range s.host.Groups() {
		r := s.host.Raft(g)
		var st fsm.Stats
		if s.servesGroup(g) {
			st = s.fsms[g].Stats()
		}
		stats := r.Stats()
		commit, _ := strconv.ParseUint(stats["commit_index"], 10, 64)
		term, _ := strconv.ParseUint(stats["term"], 10, 64)
		state := r.State().String()
		if r.State() != raft.Shutdown && !s.hostsGroup(g) {
			state = "None" // a shut-down replica stays "Shutdown": that is the fault to see
		}
		_, lid := r.LeaderWithID()
		out.Groups = append(out.Groups, &api.GroupState{
			Group: uint32(g), RaftState: state, AppliedIndex: st.AppliedIndex, LastIndex: r.LastIndex(),
			CommitIndex: commit, Term: term, Series: uint64(st.Series), Tenants: uint32(st.Tenants), LeaderId: string(lid),
		})
		if r.State() == raft.Leader {
			// The leader's configuration is the current one; Status compares
			// it with placement (cluster.PlacementStatus).
			if fut := r.GetConfiguration(); fut.Error() == nil {
				gs := out.Groups[len(out.Groups)-1]
				for _, srv := range fut.Configuration().Servers {
					if srv.Suffrage == raft.Voter {
						gs.Voters = append(gs.Voters, string(srv.ID))
					} else {
						gs.Learners = append(gs.Learners, string(srv.ID))
					}
				}
				slices.Sort(gs.Voters)
				slices.Sort(gs.Learners)
			}
		}
		if !s.servesGroup(g) {
			continue
		}
		if halted, why := s.fsms[g].Halted(); halted {
			out.Groups[len(out.Groups)-1].HaltedReason = why
		}
		if s.rcfg != nil {
			if m := s.rcfg.mods[g]; m != nil {
				out.Groups[len(out.Groups)-1].ConfigVersion = m.Current().Version
			}
		}
	}
	// Only the owner has the controller's live state (input, steps, writes);
	// the others know its configuration only, which Status falls back to.
	if s.sampling != nil {
		if sc := s.sampling.State(); sc.IsOwner {
			out.SamplingController = sc.proto()
		}
	}
	out.PartitionMoves = s.moves.StatusProto(s.leads(0)) // nil unless this node coordinates
	return out
}

// minClusterVersion is the cluster version every member of ms supports (0
// when there is none).
func minClusterVersion(ms []*api.Member) uint32 {
	var v uint32
	for i, m := range ms {
		if i == 0 || m.ClusterVersion < v {
			v = m.ClusterVersion
		}
	}
	return v
}

// Status gathers every alive member's NodeGroups in parallel, and adds the
// cluster version every member supports and the backlog controller's state.
// It reads its own writes: the view is built for this call rather than taken
// from the 100 ms poll, and the config version is the newest any replica
// reports (group 0's leader applied a change before acknowledging it).
func (a *adminService) Status(ctx context.Context, _ *api.StatusRequest) (*api.StatusResponse, error) {
	s := a.s
	v := s.buildView()
	if cached, _ := s.view.get(); cached != nil {
		v.Version = cached.Version
	}
	resp := &api.StatusResponse{View: v, ClusterVersion: minClusterVersion(v.GetMembers()), ConfigVersion: v.GetConfigVersion()}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range s.memberList() {
		if m.ID == s.cfg.Node.ID {
			mu.Lock()
			resp.Nodes = append(resp.Nodes, s.nodeGroups())
			mu.Unlock()
			continue
		}
		if m.Status != membership.StatusAlive {
			resp.Unreachable = append(resp.Unreachable, m.ID)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, fctx, err := s.peers.Forward(ctx, m.GRPCAddr)
			var ng *api.NodeGroupsResponse
			if err == nil {
				cctx, cancel := context.WithTimeout(fctx, 2*time.Second)
				ng, err = api.NewAdminClient(cc).NodeGroups(cctx, &api.NodeGroupsRequest{})
				cancel()
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				resp.Unreachable = append(resp.Unreachable, m.ID)
				return
			}
			resp.Nodes = append(resp.Nodes, ng)
		}()
	}
	wg.Wait()
	slices.SortFunc(resp.Nodes, func(a, b *api.NodeGroupsResponse) int { return strings.Compare(a.NodeId, b.NodeId) })
	for _, n := range resp.Nodes {
		for _, gs := range n.Groups {
			resp.ConfigVersion = max(resp.ConfigVersion, gs.ConfigVersion)
		}
	}
	cluster.PlacementStatus(resp, s.layout.Current().Groups, s.cfg.Cluster.Replicas)
	for _, n := range resp.Nodes {
		if n.SamplingController != nil {
			resp.SamplingController = n.SamplingController
		}
		resp.PartitionMoves = cmp.Or(n.PartitionMoves, resp.PartitionMoves)
	}
	if resp.SamplingController == nil && s.sampling != nil {
		resp.SamplingController = s.sampling.State().proto()
	}
	return resp, nil
}

// SnapshotGroup streams a snapshot of group g taken on its leader after a
// barrier, so it holds every write acknowledged before the call.
func (a *adminService) SnapshotGroup(req *api.SnapshotGroupRequest, stream grpc.ServerStreamingServer[api.SnapshotChunk]) error {
	ctx := stream.Context()
	g, err := a.checkGroup(req.Group)
	if err != nil {
		return err
	}
	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return err
	}
	if c != nil {
		up, err := c.SnapshotGroup(fctx, req)
		if err != nil {
			return err
		}
		for {
			ch, err := up.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := stream.Send(ch); err != nil {
				return err
			}
		}
	}
	s := a.s
	r := s.host.Raft(g)
	if err := r.Barrier(s.cfg.Raft.ApplyTimeout).Error(); err != nil {
		return raftStatus(g, "barrier before snapshot", err)
	}
	meta, rc, err := s.host.Snapshot(g, s.cfg.Raft.ApplyTimeout)
	if err != nil {
		return status.Errorf(codes.Unavailable, "group %d: snapshot: %v (a group that has applied nothing yet has nothing to snapshot; retry in a second)", g, err)
	}
	defer rc.Close()
	s.log.Info("admin: streaming snapshot", "group", g, "index", meta.Index, "term", meta.Term, "bytes", meta.Size)
	buf := make([]byte, snapshotChunkSize)
	first := true
	for {
		n, err := io.ReadFull(rc, buf)
		if n > 0 || first {
			ch := &api.SnapshotChunk{Group: uint32(g), Data: buf[:n]}
			if first {
				ch.Index, ch.Term = meta.Index, meta.Term
				first = false
			}
			if err := stream.Send(ch); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return status.Errorf(codes.Internal, "group %d: read snapshot: %v", g, err)
		}
	}
}

// RestoreGroup receives a group snapshot, verifies it completely (checksum,
// format, layout) before anything changes, then installs it through raft on the
// group's leader: the FSM state is replaced, followers receive it as a snapshot,
// and every write after the snapshot is rolled back.
func (a *adminService) RestoreGroup(stream grpc.ClientStreamingServer[api.RestoreChunk, api.RestoreGroupResponse]) error {
	ctx := stream.Context()
	s := a.s
	first, err := stream.Recv()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "restore: no header: %v", err)
	}
	h := first.Header
	if h == nil {
		return status.Error(codes.InvalidArgument, "restore: the first message must carry the header")
	}
	g, err := a.checkGroup(h.Group)
	if err != nil {
		return err
	}
	if h.Size == 0 || h.Size > maxRestoreBytes {
		return status.Errorf(codes.InvalidArgument, "restore: size %d out of range (1..%d)", h.Size, uint64(maxRestoreBytes))
	}
	f, err := os.CreateTemp(s.cfg.Node.DataDir, "restore-*.tmp")
	if err != nil {
		return status.Errorf(codes.Internal, "restore: temp file: %v", err)
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()
	crc := crc32.New(castagnoli)
	w := io.MultiWriter(f, crc)
	var got uint64
	write := func(b []byte) error {
		got += uint64(len(b))
		if got > h.Size {
			return status.Errorf(codes.InvalidArgument, "restore: more than the announced %d bytes", h.Size)
		}
		_, err := w.Write(b)
		return err
	}
	if err := write(first.Data); err != nil {
		return err
	}
	for {
		ch, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := write(ch.Data); err != nil {
			return err
		}
	}
	if got != h.Size {
		return status.Errorf(codes.InvalidArgument, "restore: got %d bytes, header announced %d", got, h.Size)
	}
	if crc.Sum32() != h.Crc32C {
		return status.Errorf(codes.InvalidArgument, "restore: checksum mismatch (got %08x, header %08x): the snapshot was damaged in transit", crc.Sum32(), h.Crc32C)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return status.Errorf(codes.Internal, "restore: %v", err)
	}
	sum, err := snapfmt.Inspect(f)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "restore: group %d: the snapshot is not valid: %v", g, err)
	}
	lo, hi := s.fsms[g].PartitionRange()
	sh := sum.Header
	if int(sh.Partitions) != s.cfg.Layout.Partitions || int(sh.Shards) != s.cfg.Layout.Shards || int(sh.GroupLo) != lo || int(sh.GroupHi) != hi {
		return status.Errorf(codes.FailedPrecondition, "restore: group %d: snapshot is for partitions=%d shards=%d range [%d,%d), this cluster has partitions=%d shards=%d range [%d,%d); nothing was changed",
			g, sh.Partitions, sh.Shards, sh.GroupLo, sh.GroupHi, s.cfg.Layout.Partitions, s.cfg.Layout.Shards, lo, hi)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return status.Errorf(codes.Internal, "restore: %v", err)
	}

	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return err
	}
	if c != nil {
		return a.forwardRestore(fctx, c, h, f, stream)
	}
	a.restoreMu.Lock()
	defer a.restoreMu.Unlock()
	r := s.host.Raft(g)
	tr := s.trackers[g]
	// Stop deciding while the state is replaced: the session's pending sets and
	// reservations describe the old state. A new session (with its barrier)
	// starts afterwards if this node still leads.
	tr.setLeader(false)
	defer func() {
		if r.State() == raft.Leader {
			tr.setLeader(true)
		}
	}()
	s.log.Warn("admin: restoring group from snapshot", "group", g, "snapshot_index", sh.Index, "series", sum.Series, "bytes", h.Size)
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: sh.Index, Term: sh.Term, Size: int64(h.Size)}
	if err := r.Restore(meta, f, time.Minute); err != nil {
		return raftStatus(g, "restore", err)
	}
	return stream.SendAndClose(&api.RestoreGroupResponse{Group: uint32(g), Index: r.LastIndex(), Series: uint64(s.fsms[g].Stats().Series)})
}

// forwardRestore passes the restore to the leader; fctx is the context
// leaderClient gave for calling it.
func (a *adminService) forwardRestore(fctx context.Context, c api.AdminClient, h *api.RestoreHeader, f *os.File, stream grpc.ClientStreamingServer[api.RestoreChunk, api.RestoreGroupResponse]) error {
	up, err := c.RestoreGroup(fctx)
	if err != nil {
		return err
	}
	if err := up.Send(&api.RestoreChunk{Header: h}); err != nil {
		return fmt.Errorf("restore: forward to leader: %w", err)
	}
	buf := make([]byte, snapshotChunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := up.Send(&api.RestoreChunk{Data: buf[:n]}); err != nil {
				break // the real error comes from CloseAndRecv
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return status.Errorf(codes.Internal, "restore: read temp file: %v", err)
		}
	}
	resp, err := up.CloseAndRecv()
	if err != nil {
		return err
	}
	return stream.SendAndClose(resp)
}
