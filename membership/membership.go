package membership

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
)

// Status of a member as serf sees it.
const (
	StatusAlive   = "alive"
	StatusLeaving = "leaving"
	StatusLeft    = "left"
	StatusFailed  = "failed"
)

// verTag carries Config.ClusterVersion.
const verTag = "ver"

// diskTag is gossiped as "full" while the member's disk refuses raft writes
// (absent otherwise): leaders do not balance leadership onto it.
const diskTag = "disk"

// Identity tags (see Config.Incarnation).
const (
	incTag     = "i"  // incarnation of the member's data dir
	adoptedTag = "ia" // "1": that identity was adopted from an earlier build's data dir
	clusterTag = "c"  // cluster id, absent while the member does not know it
)

// drainTag is gossiped while the member is stopping gracefully: it has handed
// (or is handing) its leaderships away, and must not be handed new ones.
const drainTag = "drain"

// decomTag is gossiped while the member is decommissioned: its replicas are
// to move to other members (SetDecommissioning).
const decomTag = "dc"

// leadTag carries Config.LeadGroups (absent when 0).
const leadTag = "lg"

// maxLedTag bounds the "l" tag so the whole tag set stays under serf's 512-byte limit.
const maxLedTag = 300

// Config configures the serf agent. Zero values take the defaults noted.
type Config struct {
	NodeID   string // serf node name = raft server id; required
	Zone     string // required
	GRPCAddr string // advertised gRPC address; required
	RaftAddr string // advertised raft address; required

	BindAddr      string // gossip listener (TCP+UDP); default 127.0.0.1:7302
	AdvertiseAddr string // default: BindAddr (an unspecified IP is refused)

	// ClusterVersion is the highest cluster version this node's build supports,
	// gossiped in the "ver" tag so leaders know when every voter can apply a
	// new entry type. Default 1 (the version before the tag existed).
	ClusterVersion int

	// LeadGroups, when > 0, is the number of groups this node may lead
	// (groups 0..LeadGroups-1): a node leads a group a raise added only once
	// it serves it (SetLeadGroups raises the count), and a node of an
	// earlier build only from its next restart, so leaders must not hand it
	// those before.
	// Gossiped in the "lg" tag; 0 gossips none (no bound, as earlier builds).
	LeadGroups int

	// Incarnation identifies the node's data dir (server/identity.go); it is
	// gossiped, and Member.RaftAddr names it so that leaders add this
	// incarnation, not whichever data dir answers at the address later.
	// IncarnationAdopted marks an identity adopted from an earlier build's
	// data dir (whose plain raft address in configurations means this data).
	Incarnation        string
	IncarnationAdopted bool
	// ClusterID is the cluster this node belongs to ("" while unknown; see
	// SetClusterID). A member gossiping another cluster id is refused: a join
	// between two clusters fails with an error saying so.
	ClusterID string

	// DataDir, when set, holds serf's snapshot of known members and this
	// package's own record of them (peers.go), so a restarted node rejoins
	// the cluster without being told where it is.
	DataDir string

	// ProbeInterval / SuspicionMult tune failure detection (memberlist). Defaults
	// 1s and 4: a dead node is declared failed after roughly 5–10 s on a small
	// cluster, while a node paused for a GC or a slow disk is not. (Raft does
	// not wait for this: elections run on raft's own heartbeats.)
	ProbeInterval time.Duration
	SuspicionMult int

	// Keys, when set, encrypt and authenticate all gossip (AES-GCM, serf's
	// keyring): Keys[0] encrypts, every key decrypts, so a key is rotated by
	// rolling out [old, new], then [new, old], then [new]. A node without a
	// key of the ring can neither read the cluster's gossip nor join it. Each
	// key is 16, 24 or 32 bytes.
	Keys [][]byte

	// MaxStreams caps the inbound gossip TCP streams open at once (push-pull
	// state sync, TCP probes), a quarter of them from one IP address;
	// beyond, a new connection is closed as it is accepted (streamcap.go).
	// Default DefaultMaxStreams.
	MaxStreams int

	Logger *slog.Logger
}

// Member is one node of the cluster.
type Member struct {
	ID       string
	Zone     string
	GRPCAddr string
	// RaftAddr is the member's raft address naming its incarnation
	// ("host:port#<incarnation>", raftnode.WithIncarnation), or the plain
	// address for a member that gossips no incarnation (an earlier build).
	RaftAddr string
	// Incarnation, IncarnationAdopted and ClusterID are as gossiped (see
	// Config); "" / false for members of earlier builds.
	Incarnation        string
	IncarnationAdopted bool
	ClusterID          string
	Status             string // StatusAlive, StatusLeaving, StatusLeft, StatusFailed
	GroupsLed          []int  // ascending
	// ClusterVersion is the highest cluster version the member's build
	// supports ("ver" tag); 1 for members that do not gossip one (builds from
	// before the tag). For a member that is down it is what the member last
	// gossiped: serf keeps a failed member's tags until the reconnect timeout
	// and a departed one's until the tombstone timeout.
	ClusterVersion int
	// LeadGroups is the member's Config.LeadGroups ("lg" tag; 0: no bound).
	LeadGroups int
	// DiskFull: the member reports that its disk refuses raft writes
	// ("disk" tag); it should not be handed leaderships.
	DiskFull bool
	// Draining: the member is stopping gracefully ("drain" tag); it should
	// not be handed leaderships either.
	Draining bool
	// Decommissioning: an operator asked for the member's replicas to move
	// elsewhere (`tollgate node drain`, "dc" tag); placement no longer
	// chooses it, so the groups' leaders move its replicas off it.
	Decommissioning bool
}

// Membership is a running serf agent.
type Membership struct {
	cfg       Config
	log       *slog.Logger
	serf      *serf.Serf
	transport *cappedTransport

	mu   sync.Mutex
	tags map[string]string
	// clusterID is this node's cluster id (a string), read by the merge
	// delegate on serf's goroutines without taking mu.
	clusterID atomic.Value

	// saved: the peers recorded in the data dir when New ran; lastSaved:
	// what the loop last wrote there (peers.go), read under savedMu by
	// RecordedVersion.
	saved     []savedPeer
	savedMu   sync.Mutex
	lastSaved []savedPeer

	events  chan serf.Event
	changed chan struct{} // closed and replaced on every change
	chMu    sync.Mutex
	done    chan struct{}
	wg      sync.WaitGroup
}

func (c *Config) validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("membership: node id is required")
	case c.Zone == "":
		return errors.New("membership: zone is required")
	case c.GRPCAddr == "" || c.RaftAddr == "":
		return errors.New("membership: gRPC and raft addresses are required")
	}
	if c.BindAddr == "" {
		c.BindAddr = "127.0.0.1:7302"
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.BindAddr
	}
	if c.ClusterVersion == 0 {
		c.ClusterVersion = 1
	}
	if c.ClusterVersion < 1 {
		return fmt.Errorf("membership: cluster version %d must be ≥ 1", c.ClusterVersion)
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = time.Second
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = 4
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxStreams < 0 {
		return fmt.Errorf("membership: MaxStreams %d must be ≥ 0 (0: default %d)", c.MaxStreams, DefaultMaxStreams)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

func splitHostPort(what, addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("membership: %s %q: %w", what, addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("membership: %s %q: bad port", what, addr)
	}
	return host, p, nil
}

// New starts the agent (it does not join anyone; see Join).
func New(cfg Config) (*Membership, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bindHost, bindPort, err := splitHostPort("bind address", cfg.BindAddr)
	if err != nil {
		return nil, err
	}
	advHost, advPort, err := splitHostPort("advertise address", cfg.AdvertiseAddr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(advHost); ip != nil && ip.IsUnspecified() {
		if bindPort == 0 {
			return nil, fmt.Errorf("membership: advertise address %q is unspecified; set it explicitly", cfg.AdvertiseAddr)
		}
		advHost = "127.0.0.1"
		cfg.Logger.Warn("membership: gossip bind address is unspecified and no advertise address set; advertising loopback (wrong for a multi-host cluster)")
	}
	// Port 0 (tests): pick a free port now, because serf needs the same port for
	// TCP and UDP and reports it back only through memberlist.
	if bindPort == 0 {
		p, err := freePort(bindHost)
		if err != nil {
			return nil, err
		}
		bindPort = p
		if advPort == 0 {
			advPort = p
		}
	}

	endpoint, _, _ := strings.Cut(cfg.RaftAddr, "#")
	m := &Membership{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "membership"),
		events:  make(chan serf.Event, 256),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		tags: map[string]string{
			"z":    cfg.Zone,
			"g":    cfg.GRPCAddr,
			"r":    endpoint, // plain: earlier builds dial it as it is
			"l":    "",
			verTag: strconv.Itoa(cfg.ClusterVersion),
		},
	}
	if cfg.LeadGroups > 0 {
		m.tags[leadTag] = strconv.Itoa(cfg.LeadGroups)
	}
	if cfg.Incarnation != "" {
		m.tags[incTag] = cfg.Incarnation
		if cfg.IncarnationAdopted {
			m.tags[adoptedTag] = "1"
		}
	}
	m.clusterID.Store(cfg.ClusterID)
	if cfg.ClusterID != "" {
		m.tags[clusterTag] = cfg.ClusterID
	}
	logger := log.New(&logWriter{log: m.log}, "", 0)

	ml := memberlist.DefaultLANConfig()
	ml.Name = cfg.NodeID
	ml.BindAddr = bindHost
	ml.BindPort = bindPort
	ml.AdvertiseAddr = advHost
	ml.AdvertisePort = advPort
	ml.ProbeInterval = cfg.ProbeInterval
	ml.SuspicionMult = cfg.SuspicionMult
	// memberlist shortens a suspicion as other members confirm it, from
	// SuspicionMaxTimeoutMult × the base timeout down to the base. A three-node
	// cluster has too few members to confirm, so the default multiplier (6)
	// would leave a dead node "alive" for ~24 s; 2 bounds it at ~8 s.
	ml.SuspicionMaxTimeoutMult = 2
	ml.Logger = logger
	ml.LogOutput = nil
	// memberlist's own transport, with its inbound streams capped.
	tr, err := newCappedTransport(bindHost, bindPort, cfg.MaxStreams, logger, m.log)
	if err != nil {
		return nil, fmt.Errorf("membership: listen on %s: %w", cfg.BindAddr, err)
	}
	m.transport = tr
	ml.Transport = tr
	started := false
	defer func() {
		if !started {
			_ = tr.Shutdown()
		}
	}()
	if len(cfg.Keys) > 0 {
		kr, err := memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("membership: gossip keyring: %w", err)
		}
		// GossipVerifyIncoming/Outgoing stay at their default (true): with a
		// keyring, plaintext gossip is refused, not merely tolerated.
		ml.Keyring = kr
	}

	sc := serf.DefaultConfig()
	sc.NodeName = cfg.NodeID
	sc.Tags = m.copyTags()
	sc.EventCh = m.events
	sc.MemberlistConfig = ml
	sc.Logger = logger
	sc.LogOutput = nil
	sc.EnableNameConflictResolution = true
	sc.Merge = clusterGuard{m}
	// A leaving node's intent must reach the others before it goes quiet.
	sc.LeavePropagateDelay = time.Second
	// Failed members are kept (and retried) for a day, then reaped; members that
	// left are forgotten after the tombstone timeout.
	sc.ReconnectTimeout = 24 * time.Hour
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("membership: data dir: %w", err)
		}
		sc.SnapshotPath = filepath.Join(cfg.DataDir, "serf.snapshot")
		sc.RejoinAfterLeave = true
		saved, err := readPeers(cfg.DataDir)
		if err != nil {
			m.log.Warn("membership: the recorded members cannot be read; ignoring them (the node waits for --join seeds or to be contacted)", "err", err)
		}
		m.saved, m.lastSaved = saved, saved
	}
	s, err := serf.Create(sc)
	if err != nil {
		return nil, fmt.Errorf("membership: start serf on %s: %w", cfg.BindAddr, err)
	}
	m.serf = s
	started = true
	m.wg.Add(1)
	go m.loop()
	return m, nil
}

func freePort(host string) (int, error) {
	// The port must be free for both TCP and UDP.
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("membership: pick a port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(p)))
		_ = l.Close()
		if err == nil {
			_ = u.Close()
			return p, nil
		}
	}
	return 0, errors.New("membership: no free TCP+UDP port")
}

func (m *Membership) loop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.done:
			return
		case ev := <-m.events:
			if me, ok := ev.(serf.MemberEvent); ok {
				for _, mem := range me.Members {
					lvl := slog.LevelDebug
					switch me.Type {
					case serf.EventMemberJoin, serf.EventMemberLeave, serf.EventMemberFailed, serf.EventMemberReap:
						lvl = slog.LevelInfo
					}
					if me.Type == serf.EventMemberFailed {
						lvl = slog.LevelWarn
					}
					m.log.Log(context.Background(), lvl, "member "+me.Type.String(), "member", mem.Name,
						"zone", mem.Tags["z"], "addr", net.JoinHostPort(mem.Addr.String(), strconv.Itoa(int(mem.Port))))
				}
				m.recordPeers() // an update may carry a new version tag
				m.notify()
			}
		}
	}
}

func (m *Membership) notify() {
	m.chMu.Lock()
	close(m.changed)
	m.changed = make(chan struct{})
	m.chMu.Unlock()
}

// Changed returns a channel closed at the next membership change (join, leave,
// failure, tag update). Call it again after each wake-up.
func (m *Membership) Changed() <-chan struct{} {
	m.chMu.Lock()
	defer m.chMu.Unlock()
	return m.changed
}

// Join contacts the given gossip addresses; it succeeds if at least one answered.
func (m *Membership) Join(addrs []string) (int, error) {
	n, err := m.serf.Join(addrs, true)
	if n > 0 {
		return n, nil
	}
	if err == nil {
		err = errors.New("nobody answered")
	}
	return 0, fmt.Errorf("membership: join %v: %w", addrs, err)
}

// Members lists every member serf knows, sorted by ID, including itself.
func (m *Membership) Members() []Member {
	ms := m.serf.Members()
	out := make([]Member, 0, len(ms))
	for _, sm := range ms {
		led, _ := ParseGroups(sm.Tags["l"])
		raftAddr := sm.Tags["r"]
		if inc := sm.Tags[incTag]; inc != "" && raftAddr != "" {
			raftAddr += "#" + inc
		}
		out = append(out, Member{
			ID:                 sm.Name,
			Zone:               sm.Tags["z"],
			GRPCAddr:           sm.Tags["g"],
			RaftAddr:           raftAddr,
			Incarnation:        sm.Tags[incTag],
			IncarnationAdopted: sm.Tags[adoptedTag] == "1",
			ClusterID:          sm.Tags[clusterTag],
			Status:             statusString(sm.Status),
			GroupsLed:          led,
			ClusterVersion:     ParseClusterVersion(sm.Tags[verTag]),
			LeadGroups:         parseLeadGroups(sm.Tags[leadTag]),
			DiskFull:           sm.Tags[diskTag] == "full",
			Draining:           sm.Tags[drainTag] != "",
			Decommissioning:    sm.Tags[decomTag] != "",
		})
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// parseLeadGroups reads an "lg" tag: missing or unreadable means no bound.
func parseLeadGroups(tag string) int {
	n, err := strconv.Atoi(tag)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// MayLead reports whether the member may be handed group g's leadership as
// far as its build and start go: a group below its LeadGroups, or any group
// when it gossips no bound. (Whether it is alive, draining or full is
// separate.)
func (m Member) MayLead(g int) bool { return m.LeadGroups == 0 || g < m.LeadGroups }

// ParseClusterVersion reads a "ver" tag: a missing or unreadable tag means 1,
// the cluster version of builds that did not gossip one.
func ParseClusterVersion(tag string) int {
	v, err := strconv.Atoi(tag)
	if err != nil || v < 1 {
		return 1
	}
	return v
}

func statusString(s serf.MemberStatus) string {
	switch s {
	case serf.StatusAlive:
		return StatusAlive
	case serf.StatusLeaving:
		return StatusLeaving
	case serf.StatusLeft:
		return StatusLeft
	case serf.StatusFailed:
		return StatusFailed
	}
	return "unknown"
}

// GossipAddr is the advertised gossip address (for others' --join).
func (m *Membership) GossipAddr() string {
	lm := m.serf.LocalMember()
	return net.JoinHostPort(lm.Addr.String(), strconv.Itoa(int(lm.Port)))
}

// SetLed gossips the set of groups this node leads.
func (m *Membership) SetLed(groups []int) error {
	enc := FormatGroups(groups)
	if len(enc) > maxLedTag {
		return fmt.Errorf("membership: led-groups tag %d bytes > %d; too many scattered groups to gossip", len(enc), maxLedTag)
	}
	return m.setTag("l", enc)
}

// SetLeadGroups gossips that this node may lead groups 0..n-1 (Config.
// LeadGroups): a node raises it as it serves a group a raise added.
func (m *Membership) SetLeadGroups(n int) error {
	v := ""
	if n > 0 {
		v = strconv.Itoa(n)
	}
	return m.setTag(leadTag, v)
}

// SetDiskFull gossips whether this node's disk refuses raft writes.
func (m *Membership) SetDiskFull(full bool) error {
	return m.setTag(diskTag, map[bool]string{true: "full"}[full])
}

// SetDraining gossips that this node is stopping: peers stop balancing
// leadership onto it while it hands its own leaderships away.
func (m *Membership) SetDraining() error { return m.setTag(drainTag, "1") }

// SetDecommissioning gossips whether this node's replicas are to move
// elsewhere (on) or it may hold replicas again (off).
func (m *Membership) SetDecommissioning(on bool) error {
	return m.setTag(decomTag, map[bool]string{true: "1"}[on])
}

// setTag sets tag k to v ("" removes it) and gossips the tags when that
// changed them.
func (m *Membership) setTag(k, v string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, set := m.tags[k]; cur == v && (set || v == "") {
		return nil
	}
	if v == "" {
		delete(m.tags, k)
	} else {
		m.tags[k] = v
	}
	if err := m.serf.SetTags(m.copyTagsLocked()); err != nil {
		return fmt.Errorf("membership: set tags: %w", err)
	}
	return nil
}

func (m *Membership) copyTags() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.copyTagsLocked()
}

func (m *Membership) copyTagsLocked() map[string]string {
	t := make(map[string]string, len(m.tags))
	for k, v := range m.tags {
		t[k] = v
	}
	return t
}

// StreamStats reports the gossip port's inbound stream counts.
func (m *Membership) StreamStats() StreamStats { return m.transport.stats() }

// Leave announces a graceful departure (others see "left", not "failed").
func (m *Membership) Leave() error {
	if err := m.serf.Leave(); err != nil {
		return fmt.Errorf("membership: leave: %w", err)
	}
	return nil
}

// Shutdown stops the agent without leaving (others will see the node fail).
func (m *Membership) Shutdown() error {
	err := m.serf.Shutdown()
	select {
	case <-m.done:
	default:
		close(m.done)
	}
	m.wg.Wait()
	if err != nil {
		return fmt.Errorf("membership: shutdown: %w", err)
	}
	return nil
}

// FormatGroups encodes ascending group ids as ranges: [0 1 2 3 7] → "0-3,7".
func FormatGroups(groups []int) string {
	gs := slices.Clone(groups)
	slices.Sort(gs)
	gs = slices.Compact(gs)
	var b strings.Builder
	for i := 0; i < len(gs); {
		j := i
		for j+1 < len(gs) && gs[j+1] == gs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(gs[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(gs[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ParseGroups decodes FormatGroups' encoding.
func ParseGroups(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("membership: bad group list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<16 {
				return nil, fmt.Errorf("membership: bad group list %q", s)
			}
		}
		for g := a; g <= b; g++ {
			out = append(out, g)
		}
	}
	return out, nil
}

// logWriter routes serf/memberlist's "[LEVEL] msg" lines to slog: errors and
// warnings as such, the rest at debug (serf's own join/leave lines are repeated
// by loop at info with structure).
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		lvl := slog.LevelDebug
		switch {
		case strings.Contains(line, "[ERR]"):
			lvl = slog.LevelError
		case strings.Contains(line, "[WARN]"):
			lvl = slog.LevelWarn
		}
		w.log.Log(context.Background(), lvl, line)
	}
	return len(p), nil
}

// ErrOtherCluster is wrapped by the error a join (or a member's gossip) gets
// when the two sides belong to different clusters.
var ErrOtherCluster = errors.New("belongs to another cluster")

// clusterGuard refuses to merge with members of another cluster: serf calls
// it for every member state received by a join's push/pull and for every
// member announcing itself alive.
type clusterGuard struct{ m *Membership }

func (g clusterGuard) NotifyMerge(members []*serf.Member) error {
	mine := g.m.ClusterID()
	if mine == "" {
		return nil
	}
	for _, sm := range members {
		if c := sm.Tags[clusterTag]; c != "" && c != mine {
			return fmt.Errorf("membership: node %s %w (cluster id %s; this node %s is in cluster %s): a node keeps the cluster of its data dir; to move it, remove it from its cluster and start it with an empty data dir",
				sm.Name, ErrOtherCluster, c, g.m.cfg.NodeID, mine)
		}
	}
	return nil
}

// ClusterID is this node's cluster id ("" while unknown).
func (m *Membership) ClusterID() string {
	id, _ := m.clusterID.Load().(string)
	return id
}

// SetClusterID records and gossips the cluster id once the node learns it
// (bootstrap, or adoption from the members it joined).
func (m *Membership) SetClusterID(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tags[clusterTag] == id {
		return nil
	}
	m.clusterID.Store(id)
	m.tags[clusterTag] = id
	if err := m.serf.SetTags(m.copyTagsLocked()); err != nil {
		return fmt.Errorf("membership: set tags: %w", err)
	}
	return nil
}
