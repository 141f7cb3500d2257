package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/tollgate-io/tollgate/raftnode/wal"
	"go.etcd.io/bbolt"
)

// ErrShutdown is returned by WaitReady once Shutdown has been called.
var ErrShutdown = errors.New("raftnode: host is shut down")

// Host runs the G raft groups of one node over one shared TCP port.
type Host struct {
	cfg  Config
	log  *slog.Logger
	mux  *Mux
	addr raft.ServerAddress
	// groups is the published group list, in id order (list()[g].id == g).
	// AddGroup replaces it with a longer copy, so a reader that loaded it
	// once sees a consistent list without a lock.
	groups atomic.Pointer[[]*group]
	// addMu serialises AddGroup, and Shutdown with it: a group is either
	// published before Shutdown looks at the list, or released by AddGroup.
	addMu sync.Mutex

	closing chan struct{} // closed when Shutdown starts
	// life is cancelled when Shutdown starts, for calls that take a
	// context (the dead-leader probe's dials).
	life         context.Context
	endLife      context.CancelFunc
	down         *downProbe // dead leaders found by a refused connection (leaderdown.go)
	disk         *diskState // write health of DataDir (disk.go)
	wal          *wal.WAL   // every group's raft log (package wal)
	fs           wal.FS     // the log's and the snapshots' file layer
	bg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
}

// group is one raft group and everything it owns.
type group struct {
	id    int
	dir   string
	layer *GroupLayer
	trans *gatedTransport
	store *raftboltdb.BoltStore // raft.db: term and vote (the stable store)
	logs  raft.LogStore         // LogCache in front of the group's WAL log (watched: disk.go)
	// held is set while raft's loop is parked in a stable-store write that
	// the disk refuses (disk.go); Shutdown does not wait for such a group.
	held      atomic.Bool
	abandoned bool       // Shutdown gave up on it (held); set by shutdown only
	snaps     *snapStore // <dir>/snapshots, on the log's file layer
	fsm       *trackingFSM
	raft      *raft.Raft

	// startIndex is the last index (log or snapshot) found on local disk
	// when the group was opened.
	startIndex uint64
	ready      atomic.Bool // latched by WaitReady
	// transferring: watchDisk is handing this group's leadership away.
	transferring atomic.Bool

	notifyCh   chan bool     // raft Config.NotifyCh
	stopNotify chan struct{} // closed after raft shut down
	notifyDone sync.WaitGroup
}

// New opens (or creates) every group's stores under cfg.DataDir, starts the
// shared listener on cfg.BindAddr and starts every group's raft. The groups
// are 0..n-1 with n = max(cfg.Groups, ListedGroups(cfg.DataDir)): groups
// added at runtime (AddGroup) come back. fsmFor is
// called once per group, in order, before that group's raft starts; raft
// restores the group's latest snapshot into the FSM (synchronously, inside
// New) and then replays the committed log on top of it as the commit index
// becomes known (see WaitReady).
//
// If cfg.Bootstrap is set, every group without existing state is
// bootstrapped with this node as its only voter. Otherwise groups without
// state wait to be bootstrapped (BootstrapCluster, here or on another node)
// or added to a cluster by its leader.
func New(cfg Config, fsmFor func(group int) raft.FSM) (*Host, error) {
	if fsmFor == nil {
		return nil, errors.New("raftnode: New: fsmFor is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("raftnode: create data dir: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("raftnode: listen on %s: %w", cfg.BindAddr, err)
	}
	adv := cfg.AdvertiseAddr
	if adv == "" {
		adv = ln.Addr().String()
		tcp, ok := ln.Addr().(*net.TCPAddr)
		if ok && tcp.IP.IsUnspecified() {
			adv = net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
			cfg.Logger.Warn("raftnode: bind address is unspecified and no AdvertiseAddr set; advertising loopback (fine for one node, wrong for a cluster)",
				"bind", cfg.BindAddr, "advertise", adv)
		}
	}
	adv = WithIncarnation(adv, cfg.Identity.Incarnation)
	mux, err := NewMux(ln, MuxConfig{
		AdvertiseAddr:    adv,
		Identity:         cfg.Identity,
		ServerTLS:        cfg.ServerTLS,
		ClusterKeys:      cfg.ClusterKeys,
		ClientTLS:        cfg.ClientTLS,
		HandshakeTimeout: cfg.HandshakeTimeout,
		MaxPendingConns:  cfg.MaxPendingConns,
		Logger:           cfg.Logger,
	})
	if err != nil {
		_ = ln.Close()
		return nil, err
	}

	h := &Host{
		cfg:     cfg,
		log:     cfg.Logger,
		mux:     mux,
		addr:    raft.ServerAddress(adv),
		closing: make(chan struct{}),
		down:    newDownProbe(),
		disk:    newDiskState(cfg.DataDir),
	}
	h.life, h.endLife = context.WithCancel(context.Background())
	wo := walOptions(cfg.DataDir, cfg.NoSync)
	h.fs = wo.FS
	if h.fs == nil {
		h.fs = wal.OSFS{}
	}
	w, err := wal.Open(walDir(cfg.DataDir), wo)
	if err != nil {
		_ = h.Shutdown()
		return nil, fmt.Errorf("raftnode: open the raft log: %w", err)
	}
	h.wal = w
	if rec := w.Recovered(); rec.TornBytes > 0 {
		h.log.Warn("raftnode: cut off a torn write at the end of the raft log (a crash during a write that was never acknowledged)",
			"file", rec.TornFile, "offset", rec.TornOffset, "bytes", rec.TornBytes)
	}
	// Groups added at runtime (AddGroup) are opened again however many
	// Config.Groups names (grouplist.go).
	n := cfg.Groups
	listed, err := ListedGroups(cfg.DataDir)
	if err != nil {
		_ = h.Shutdown()
		return nil, err
	}
	if listed > n {
		h.log.Info("raftnode: opening the groups added at runtime too", "config_groups", cfg.Groups, "groups", listed)
		n = listed
	}
	fsms := make([]raft.FSM, n)
	for g := range fsms {
		if fsms[g] = fsmFor(g); fsms[g] == nil {
			_ = h.Shutdown()
			return nil, fmt.Errorf("raftnode: fsmFor(%d) returned nil", g)
		}
	}
	// The groups open in parallel, as many at a time as there are CPUs:
	// opening one restores its newest snapshot into its FSM, which on a
	// large node is most of the time to start, and groups share nothing
	// while doing it.
	opened := make([]*group, n)
	errs := make([]error, n)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for g := range fsms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			opened[g], errs[g] = h.openGroup(g, fsms[g])
			if errs[g] != nil {
				errs[g] = fmt.Errorf("raftnode: group %d: %w", g, errs[g])
			}
		}()
	}
	wg.Wait()
	var list []*group
	for _, g := range opened {
		if g != nil {
			list = append(list, g) // in id order: list[g].id == g
		}
	}
	h.groups.Store(&list)
	if err := errors.Join(errs...); err != nil {
		_ = h.Shutdown()
		return nil, err
	}
	// Accept only now that every group is registered: a peer's connection
	// for a group we have not registered yet would be rejected.
	mux.Start()
	removeStaleProbes(cfg.DataDir, h.log)
	h.bg.Add(1)
	go h.watchDisk()

	h.log.Info("raftnode: started", "node", cfg.NodeID, "addr", adv, "bind", mux.ListenAddr().String(),
		"groups", n, "data_dir", cfg.DataDir, "tls", cfg.ServerTLS != nil, "nosync", cfg.NoSync)
	return h, nil
}

// openGroup builds group g's stores, transport and raft. It returns the
// group even with an error, holding whatever was created, so that Shutdown
// releases it.
func (h *Host) openGroup(id int, inner raft.FSM) (*group, error) {
	g := &group{
		id:         id,
		dir:        filepath.Join(h.cfg.DataDir, fmt.Sprintf("group-%d", id)),
		fsm:        newTrackingFSM(inner),
		notifyCh:   make(chan bool, 8),
		stopNotify: make(chan struct{}),
	}
	return g, h.buildGroup(g)
}

func (h *Host) buildGroup(g *group) error {
	cfg := &h.cfg
	id := g.id
	hlog := newHCLogAdapter(h.log.With("group", id), cfg.RaftLogLevel, "raft")

	if err := os.MkdirAll(g.dir, 0o750); err != nil {
		return err
	}
	layer, err := h.mux.Register(id)
	if err != nil {
		return err
	}
	g.layer = layer
	inner := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  layer,
		MaxPool: cfg.TransportMaxPool,
		Timeout: cfg.TransportTimeout,
		Logger:  hlog.Named("transport"),
		// 1 = no pipelined replication: every AppendEntries waits for its
		// answer (and carries every entry pending for that follower, so
		// batching is unchanged). raft v1.8's pipeline can deadlock when a
		// follower answers Success=false (after a leader change or a user
		// restore leaves a log hole): the send parks on an unbuffered channel
		// whose reader has exited, the replication goroutine never returns,
		// that follower silently stops receiving entries and Shutdown hangs.
		// We hit it in TestSnapshotRestoreRollsBackOnEveryReplica (goroutine
		// dump: replicate → pipelineSend → netPipeline.AppendEntries).
		// HashiCorp measured pipelining to bring little benefit (raft#541).
		MaxRPCsInFlight: 1,
	})
	succ := newSuccession(id, raft.ServerID(cfg.NodeID), cfg.HeartbeatTimeout, cfg.ElectionTimeout, h.log)
	var groupOnly func() error
	if cfg.GroupMayCampaign != nil {
		groupOnly = func() error { return cfg.GroupMayCampaign(id) }
	}
	g.trans = newGatedTransport(inner, groupGate(cfg.MayCampaign, cfg.GroupMayCampaign, id), groupOnly, succ)
	layer.onPeerClosed(func() { h.connEnded(succ) })

	boltOpts := *bbolt.DefaultOptions
	boltOpts.Timeout = boltOpenTimeout
	store, err := raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(g.dir, "raft.db"),
		BoltOptions: &boltOpts,
		NoSync:      cfg.NoSync,
	})
	if err != nil {
		return fmt.Errorf("open raft.db (is another process using %s?): %w", g.dir, err)
	}
	g.store = store
	groupLogs, err := groupLog(h.wal, id, store, h.log)
	if err != nil {
		return err
	}
	// Every write to the stores is watched (disk.go): a full disk makes the
	// node not ready and hands its leaderships away instead of crashing it.
	cache, err := raft.NewLogCache(logCacheSize, groupLogs)
	if err != nil {
		return err
	}
	logs := &watchedLogs{LogStore: cache, g: id, disk: h.disk}
	g.logs = logs
	var stableInner raft.StableStore = store
	if stableFaultsForTest != nil {
		stableInner = stableFaultsForTest(h.cfg.NodeID, id, store)
	}
	stable := &heldStable{StableStore: stableInner, g: id, disk: h.disk, closing: h.closing, held: &g.held, log: h.log}
	// The snapshot store uses <dir>/snapshots, on the same file layer as
	// the log (the OS in production; tests put a power-cut disk there).
	snaps, err := newSnapStore(g.dir, cfg.SnapshotRetain, h.fs, hlog.Named("snapshot"))
	if err != nil {
		return err
	}
	g.snaps = snaps
	if err := snaps.removeTemporary(); err != nil {
		return err
	}

	rc := cfg.raftConfig()
	rc.Logger = hlog
	rc.NotifyCh = g.notifyCh

	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("inspect state: %w", err)
	}
	if !existing && cfg.Bootstrap {
		conf := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter,
			ID:       raft.ServerID(cfg.NodeID),
			Address:  h.addr,
		}}}
		if err := raft.BootstrapCluster(rc, logs, stable, snaps, g.trans, conf); err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		h.log.Info("raftnode: bootstrapped group as single voter", "group", id)
	}

	var raftSnaps raft.SnapshotStore = snaps
	if existing {
		// raft would panic, not fail, on a damaged newest snapshot whose
		// predecessor the log no longer reaches (snapcheck.go).
		verified, err := checkSnapshots(id, snaps, logs)
		if err != nil {
			h.log.Error("raftnode: cannot open group", "group", id, "err", err)
			return err
		}
		if verified != nil {
			raftSnaps = &checkedSnapshots{snapStore: snaps, verified: verified}
		}
	}
	r, err := raft.NewRaft(rc, g.fsm, logs, stable, raftSnaps, g.trans)
	if err != nil {
		return err
	}
	g.raft = r
	succ.raft.Store(r)
	g.startIndex = r.LastIndex()

	cb := h.cfg.LeaderNotify
	q := newLeaderQueue()
	g.notifyDone.Add(2)
	go func() { // drain raft's NotifyCh promptly: raft blocks on it
		defer g.notifyDone.Done()
		defer q.close()
		for {
			select {
			case v := <-g.notifyCh:
				if v {
					succ.led()
				}
				q.push(v)
			case <-g.stopNotify:
				for {
					select {
					case v := <-g.notifyCh:
						q.push(v)
					default:
						return
					}
				}
			}
		}
	}()
	go func() { // deliver in order, one at a time
		defer g.notifyDone.Done()
		last := false
		for {
			v, ok := q.pop()
			if !ok {
				break
			}
			h.log.Info("raftnode: leadership changed", "group", id, "leader", v)
			if cb != nil {
				cb(id, v)
			}
			last = v
		}
		if last && cb != nil {
			cb(id, false)
		}
	}()
	return nil
}

// list returns the published group list (nil before New published it).
func (h *Host) list() []*group {
	if p := h.groups.Load(); p != nil {
		return *p
	}
	return nil
}

// group returns group g; it panics if g is out of range.
func (h *Host) group(g int) *group {
	l := h.list()
	if g < 0 || g >= len(l) {
		panic(fmt.Sprintf("raftnode: group %d out of range [0, %d)", g, len(l)))
	}
	return l[g]
}

// Groups returns G: the groups opened at start plus those added since
// (AddGroup). Their ids are 0..G-1.
func (h *Host) Groups() int { return len(h.list()) }

// Raft returns group g's raft instance (Apply, Barrier, State, Leader,
// AddVoter, RemoveServer, Snapshot, ...). It panics if g is out of range.
func (h *Host) Raft(g int) *raft.Raft { return h.group(g).raft }

// ReplicaDown reports whether group g's raft replica on this node is shut
// down while the host itself is not: it takes no part in its group any more
// (no votes, no log) although the group's configuration may still count it.
// Only Shutdown does that on purpose; raft is configured not to shut a
// replica down when it is removed (see Config), so true means a fault the
// operator must see.
func (h *Host) ReplicaDown(g int) bool {
	select {
	case <-h.closing:
		return false
	default:
	}
	return h.Raft(g).State() == raft.Shutdown
}

// Probe checks that address answers group g's raft transport: a TCP
// connection, the TLS handshake when the raft port uses TLS, and the group
// header, closed again before any raft message is sent (the peer's transport
// sees a connection that ends before its first request, which it drops
// silently). A node that is not listening, or speaks neither TLS with this
// cluster's CA nor Tollgate's raft framing up to the handshake, fails here.
func (h *Host) Probe(g int, address raft.ServerAddress, timeout time.Duration) error {
	gr := h.group(g)
	if gr.layer == nil {
		return fmt.Errorf("raftnode: group %d: no transport", g)
	}
	c, err := gr.layer.Dial(address, timeout)
	if err != nil {
		return err
	}
	return c.Close()
}

// MuxStats reports the raft port's connection counts (Mux.Stats).
func (h *Host) MuxStats() MuxStats { return h.mux.Stats() }

// Addr returns this node's advertised raft address (shared by all groups).
func (h *Host) Addr() raft.ServerAddress { return h.addr }

// NodeID returns this node's raft server ID.
func (h *Host) NodeID() raft.ServerID { return raft.ServerID(h.cfg.NodeID) }

// WaitReady blocks until every group is ready, ctx is done, or Shutdown is
// called. A group is ready when both hold:
//
//  1. a leader is known to this node (Raft(g).Leader() is not empty: this
//     node won an election, or heard from the current leader);
//  2. the FSM has applied (or restored from a snapshot) every entry up to
//     T = min(S, current last index), where S is the last log/snapshot
//     index that was on local disk when New opened the group. The min
//     matters only when this node's log ended in entries that were never
//     committed and the new leader overwrote them.
//
// "Applied" means the FSM's Apply/ApplyBatch/StoreConfiguration returned,
// not merely that raft queued the entry for the FSM (raft's AppliedIndex).
// So after WaitReady the FSM reflects at least everything this node had
// persisted before the restart (every entry it acknowledged), i.e. restart
// recovery is finished. It does not mean the FSM has caught up with the
// rest of the cluster (a follower may still be behind its leader), nor that
// this node leads anything; the leader of a group should still run
// Raft(g).Barrier() before serving reads that must see every earlier term.
//
// Readiness is latched per group: once reached it is not re-evaluated
// (WaitReady is a startup gate, not a health check; use Raft(g).State() and
// Leader() for live status). On a node that was never bootstrapped and not
// yet added to a cluster, no leader is known and WaitReady waits for ctx.
func (h *Host) WaitReady(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-h.closing:
			return ErrShutdown
		default:
		}
		var waiting []int
		for _, g := range h.list() {
			if !g.ready.Load() {
				if h.groupReady(g) {
					g.ready.Store(true)
				} else {
					waiting = append(waiting, g.id)
				}
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("raftnode: groups %v not ready: %w", waiting, ctx.Err())
		case <-h.closing:
			return ErrShutdown
		case <-t.C:
		}
	}
}

// Loaded reports, without blocking, whether every group has reached the
// readiness WaitReady waits for (latched the same way).
func (h *Host) Loaded() bool {
	ok := true
	for _, g := range h.list() {
		if !g.ready.Load() {
			if h.groupReady(g) {
				g.ready.Store(true)
			} else {
				ok = false
			}
		}
	}
	return ok
}

func (h *Host) groupReady(g *group) bool {
	r := g.raft
	if _, id := r.LeaderWithID(); id == "" {
		return false
	}
	target := min(g.startIndex, r.LastIndex())
	if r.AppliedIndex() < target {
		return false
	}
	if g.fsm.seen.Load() >= target {
		return true
	}
	// raft has dispatched everything up to target. The FSM has consumed it
	// once it has consumed the last FSM-visible entry (command or
	// configuration) in (lastSnapshot, target]; entries at or below the
	// last snapshot are in the FSM via snapshot or restore.
	snap, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
	if err != nil {
		return false
	}
	for i := target; i > snap; i-- {
		var l raft.Log
		if err := g.logs.GetLog(i, &l); err != nil {
			return false // e.g. compacted by a concurrent snapshot: retry
		}
		if fsmVisible(l.Type) {
			return g.fsm.seen.Load() >= i
		}
	}
	return true
}

// BootstrapCluster bootstraps every group that has no existing state with
// the given configuration (normally one voter per zone). It is meant to be
// called on exactly one node of a new cluster; the others start without
// state and receive the configuration from the elected leader. Groups that
// already have state are skipped, so calling it again is harmless. This node
// must be a voter in servers.
func (h *Host) BootstrapCluster(servers []raft.Server) error {
	if len(servers) == 0 {
		return errors.New("raftnode: BootstrapCluster: no servers")
	}
	conf := raft.Configuration{Servers: append([]raft.Server(nil), servers...)}
	var errs []error
	for _, g := range h.list() {
		err := g.raft.BootstrapCluster(conf).Error()
		switch {
		case err == nil:
			h.log.Info("raftnode: bootstrapped group", "group", g.id, "servers", len(servers))
		case errors.Is(err, raft.ErrCantBootstrap):
			h.log.Info("raftnode: group already has state; not bootstrapping", "group", g.id)
		default:
			errs = append(errs, fmt.Errorf("raftnode: bootstrap group %d: %w", g.id, err))
		}
	}
	return errors.Join(errs...)
}

// Shutdown stops the node: every group's raft shuts down in parallel (each
// waits for its FSM goroutine; pending Applies fail with ErrRaftShutdown),
// pending leadership notifications are delivered, then the transports and
// the shared listener close (with every open raft connection), then the
// bolt stores close. Idempotent: later calls return the first call's result.
func (h *Host) Shutdown() error {
	h.shutdownOnce.Do(func() {
		close(h.closing)
		h.endLife()
		h.shutdownErr = h.shutdown()
	})
	return h.shutdownErr
}

func (h *Host) shutdown() error {
	// An AddGroup in flight finishes first: its group is then in the list,
	// or released by AddGroup itself, and later calls see closing.
	h.addMu.Lock()
	defer h.addMu.Unlock()
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, g := range h.list() {
		if g.raft == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- g.raft.Shutdown().Error() }()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case err := <-done:
					if err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("group %d: raft shutdown: %w", g.id, err))
						mu.Unlock()
					}
					return
				case <-t.C:
					if g.held.Load() {
						// Parked in a term/vote write the disk refuses
						// (disk.go): it cannot stop, and its store stays
						// open under it.
						h.log.Error("raftnode: group stopped while waiting for the disk; its last term/vote change is not persisted", "group", g.id)
						g.abandoned = true
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	h.bg.Wait()

	for _, g := range h.list() {
		if g.raft != nil && !g.abandoned {
			close(g.stopNotify)
			g.notifyDone.Wait()
		}
	}
	for _, g := range h.list() {
		if g.trans != nil {
			_ = g.trans.Close() // raft's shutdown closed it already; idempotent
		}
	}
	if err := h.mux.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close listener: %w", err))
	}
	for _, g := range h.list() {
		if g.store != nil && !g.abandoned {
			if err := g.store.Close(); err != nil {
				errs = append(errs, fmt.Errorf("group %d: close raft.db: %w", g.id, err))
			}
		}
	}
	if h.wal != nil {
		if err := h.wal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the raft log: %w", err))
		}
	}
	if len(errs) == 0 {
		h.log.Info("raftnode: stopped", "node", h.cfg.NodeID)
	}
	return errors.Join(errs...)
}

// leaderQueue is an unbounded FIFO of leadership transitions between the
// goroutine draining raft's NotifyCh and the one calling LeaderNotify.
type leaderQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	q      []bool
	closed bool
}

func newLeaderQueue() *leaderQueue {
	q := &leaderQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *leaderQueue) push(v bool) {
	q.mu.Lock()
	q.q = append(q.q, v)
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *leaderQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// pop returns the next transition; ok is false once closed and drained.
func (q *leaderQueue) pop() (v, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.q) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.q) == 0 {
		return false, false
	}
	v = q.q[0]
	q.q = q.q[1:]
	return v, true
}

// groupGate is group id's campaign gate: the node's and the group's.
func groupGate(node func() error, group func(int) error, id int) func() error {
	if group == nil {
		return node
	}
	return func() error {
		if err := group(id); err != nil {
			return err
		}
		if node != nil {
			return node()
		}
		return nil
	}
}
