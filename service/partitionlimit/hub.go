package partitionlimit

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultWindowMinutes = api.DefaultHLLWindowMinutes // the clients' default too
	DefaultPartitions    = 4096
	DefaultMaxSketches   = 1_000_000
)

// ErrInvalid is wrapped by every refusal of a push's content (InvalidArgument).
var ErrInvalid = errors.New("invalid sketches")

// ErrFull is wrapped when a push would exceed MaxSketches (ResourceExhausted).
var ErrFull = errors.New("sketch capacity reached")

// Config configures a Hub.
type Config struct {
	NodeID        string
	Precision     int // 0 = 11; every client and node must agree
	WindowMinutes int // 0 = 20
	Partitions    int // ingest partitions accepted: 0 ≤ p < Partitions; 0 = 4096
	MaxSketches   int // (tenant, partition, minute) sketches held at most; 0 = 1,000,000
	// TenantKnown says whether a tenant may have sketches (the server: it has
	// a max_series_per_partition); nil = every valid tenant id.
	TenantKnown func(tenant string) bool
	Clock       func() time.Time
	Logger      *slog.Logger
}

func (c *Config) validate() error {
	if c.Precision == 0 {
		c.Precision = api.DefaultHLLPrecision
	}
	if err := api.ValidateHLLPrecision(c.Precision); err != nil {
		return fmt.Errorf("sketches: %w", err)
	}
	if c.WindowMinutes == 0 {
		c.WindowMinutes = DefaultWindowMinutes
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.MaxSketches == 0 {
		c.MaxSketches = DefaultMaxSketches
	}
	if c.WindowMinutes < 1 || c.WindowMinutes > 1440 || c.Partitions < 1 || c.MaxSketches < 1 {
		return fmt.Errorf("sketches: window %d minutes (1..1440), partitions %d and max sketches %d (≥ 1)", c.WindowMinutes, c.Partitions, c.MaxSketches)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

type key struct {
	tenant    string
	partition uint32
	minute    int64
}

// entry is one merged sketch: sparse entries (index<<6|value, sorted) while
// few registers are set, then one byte per register.
type entry struct {
	sparse []uint32
	dense  []uint8
}

// Hub holds a node's merged sketches. Safe for concurrent use.
type Hub struct {
	cfg         Config
	p           uint8
	m           uint32
	incarnation string

	mu       sync.Mutex
	sketches map[key]*entry
	cursors  map[*Cursor]struct{}
	sparseN  int // sketches held sparse

	st counters
}

type counters struct {
	pushes, merges, changed, expired          atomic.Uint64
	bytesPushed, bytesStreamed, bytesToPeers  atomic.Uint64
	rejectedInvalid, rejectedFull, peerErrors atomic.Uint64
	subscribers                               atomic.Int64
}

// New validates cfg and returns an empty Hub.
func New(cfg Config) (*Hub, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return &Hub{
		cfg: cfg, p: uint8(cfg.Precision), m: uint32(1) << cfg.Precision,
		incarnation: hex.EncodeToString(nonce[:]),
		sketches:    map[key]*entry{}, cursors: map[*Cursor]struct{}{},
	}, nil
}

// Precision and WindowMinutes are the hub's configuration.
func (h *Hub) Precision() int { return h.cfg.Precision }

// WindowMinutes is the sliding window the hub keeps.
func (h *Hub) WindowMinutes() int { return h.cfg.WindowMinutes }

// Incarnation identifies this hub instance (a restart changes it).
func (h *Hub) Incarnation() string { return h.incarnation }

func (h *Hub) now() int64 { return h.cfg.Clock().Unix() / 60 }

// acceptMinute: the window [now−W+1, now], with one minute of clock skew
// allowed on either side (a client's clock a few seconds off must not have a
// push refused around a minute boundary).
func (h *Hub) acceptMinute(minute, now int64) bool {
	return minute >= now-int64(h.cfg.WindowMinutes) && minute <= now+1
}

// validate checks a whole push before anything is merged, so a refused push
// changes nothing.
func (h *Hub) validate(req *api.PushSketchesRequest, now int64) error {
	if req.Precision != uint32(h.p) {
		return fmt.Errorf("%w: precision %d, this node uses %d (every client and node must use the same --sketch-precision)", ErrInvalid, req.Precision, h.p)
	}
	for i, s := range req.Sketches {
		if err := api.ValidateTenantID(s.Tenant); err != nil {
			return fmt.Errorf("%w: sketch %d: %w", ErrInvalid, i, err)
		}
		if h.cfg.TenantKnown != nil && !h.cfg.TenantKnown(s.Tenant) {
			return fmt.Errorf("%w: sketch %d: tenant %q is unknown here: it has no max_series_per_partition", ErrInvalid, i, s.Tenant)
		}
		if s.Partition >= uint32(h.cfg.Partitions) {
			return fmt.Errorf("%w: sketch %d: partition %d out of range [0, %d)", ErrInvalid, i, s.Partition, h.cfg.Partitions)
		}
		if !h.acceptMinute(s.Minute, now) {
			return fmt.Errorf("%w: sketch %d: minute %d is outside this node's %d-minute window [%d, %d] (clocks more than a minute apart?)",
				ErrInvalid, i, s.Minute, h.cfg.WindowMinutes, now-int64(h.cfg.WindowMinutes)+1, now)
		}
		if err := api.ValidateSketchRegisters(s, h.p); err != nil {
			return fmt.Errorf("sketch %d (tenant %q, partition %d, minute %d): %w", i, s.Tenant, s.Partition, s.Minute, err)
		}
	}
	return nil
}

// Merge merges a push: all of it, or (any sketch invalid, or the capacity
// would be exceeded) none of it. origin is the pushing node's id ("" for a
// client); cursors of that origin are not told, it has the data already.
// It returns the number of sketches whose registers rose.
func (h *Hub) Merge(req *api.PushSketchesRequest) (int, error) {
	now := h.now()
	if err := h.validate(req, now); err != nil {
		h.st.rejectedInvalid.Add(1)
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	fresh := 0
	for _, s := range req.Sketches {
		if h.sketches[key{s.Tenant, s.Partition, s.Minute}] == nil {
			fresh++ // duplicates within a push are counted twice: harmless
		}
	}
	if len(h.sketches)+fresh > h.cfg.MaxSketches {
		h.expireLocked(now)
		if len(h.sketches)+fresh > h.cfg.MaxSketches {
			h.st.rejectedFull.Add(1)
			return 0, fmt.Errorf("%w: this node holds %d of at most %d (tenant, partition, minute) sketches and the push adds %d; raise --sketch-max or lower the number of limited tenants × partitions × window minutes",
				ErrFull, len(h.sketches), h.cfg.MaxSketches, fresh)
		}
	}
	changed := 0
	for _, s := range req.Sketches {
		k := key{s.Tenant, s.Partition, s.Minute}
		e := h.sketches[k]
		if e == nil {
			e = &entry{}
			h.sketches[k] = e
			h.sparseN++
		}
		wasDense := e.dense != nil
		if !h.mergeEntry(e, s) {
			continue
		}
		if !wasDense && e.dense != nil {
			h.sparseN--
		}
		changed++
		for c := range h.cursors {
			if c.skip == "" || c.skip != req.Origin {
				c.mark(k)
			}
		}
	}
	h.st.pushes.Add(1)
	h.st.merges.Add(uint64(len(req.Sketches)))
	h.st.changed.Add(uint64(changed))
	return changed, nil
}

// mergeEntry raises e's registers to s's; it reports whether any rose.
func (h *Hub) mergeEntry(e *entry, s *api.Sketch) bool {
	changed := false
	if e.dense == nil && len(s.Dense) > 0 {
		h.toDense(e)
	}
	if e.dense != nil {
		api.ForEachSketchRegister(s, func(idx uint32, v uint8) {
			if v > e.dense[idx] {
				e.dense[idx] = v
				changed = true
			}
		})
		return changed
	}
	a, b := e.sparse, s.Sparse
	out := make([]uint32, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		switch {
		case len(b) == 0 || (len(a) > 0 && a[0]>>6 < b[0]>>6):
			out = append(out, a[0])
			a = a[1:]
		case len(a) == 0 || b[0]>>6 < a[0]>>6:
			out = append(out, b[0])
			b = b[1:]
			changed = true
		default: // same register
			if b[0]&63 > a[0]&63 {
				out = append(out, b[0])
				changed = true
			} else {
				out = append(out, a[0])
			}
			a, b = a[1:], b[1:]
		}
	}
	e.sparse = out
	if uint32(len(e.sparse)) >= h.m/4 {
		h.toDense(e)
	}
	return changed
}

func (h *Hub) toDense(e *entry) {
	e.dense = make([]uint8, h.m)
	for _, x := range e.sparse {
		idx, v := api.HLLSparseSplit(x)
		e.dense[idx] = v
	}
	e.sparse = nil
}

// encode returns the wire form of an entry (sparse while it is sparse).
func (h *Hub) encode(k key, e *entry) *api.Sketch {
	s := &api.Sketch{Tenant: k.tenant, Partition: k.partition, Minute: k.minute}
	if e.dense != nil {
		s.Dense = slices.Clone(e.dense)
	} else {
		s.Sparse = slices.Clone(e.sparse)
	}
	return s
}

// Expire drops the sketches of minutes that left the window; the server calls
// it every second.
func (h *Hub) Expire() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.expireLocked(h.now())
}

func (h *Hub) expireLocked(now int64) int {
	n := 0
	for k, e := range h.sketches {
		if !h.acceptMinute(k.minute, now) || k.minute <= now-int64(h.cfg.WindowMinutes) {
			delete(h.sketches, k)
			if e.dense == nil {
				h.sparseN--
			}
			n++
		}
	}
	h.st.expired.Add(uint64(n))
	return n
}

// Stats is a snapshot of a hub's counters (monotonic) and gauges.
type Stats struct {
	Sketches, SparseSketches, MaxSketches int
	Subscribers                           int64
	Pushes, Merges, Changed, Expired      uint64
	BytesPushed, BytesStreamed            uint64 // received from pushes; sent on watch streams
	BytesToPeers, PeerErrors              uint64
	RejectedInvalid, RejectedFull         uint64
	Precision, WindowMinutes              int
}

// Stats returns the current counters.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	n, sp := len(h.sketches), h.sparseN
	h.mu.Unlock()
	c := &h.st
	return Stats{
		Sketches: n, SparseSketches: sp, MaxSketches: h.cfg.MaxSketches, Subscribers: c.subscribers.Load(),
		Pushes: c.pushes.Load(), Merges: c.merges.Load(), Changed: c.changed.Load(), Expired: c.expired.Load(),
		BytesPushed: c.bytesPushed.Load(), BytesStreamed: c.bytesStreamed.Load(),
		BytesToPeers: c.bytesToPeers.Load(), PeerErrors: c.peerErrors.Load(),
		RejectedInvalid: c.rejectedInvalid.Load(), RejectedFull: c.rejectedFull.Load(),
		Precision: h.cfg.Precision, WindowMinutes: h.cfg.WindowMinutes,
	}
}

// PartitionEstimate is one (tenant, partition)'s estimated distinct series
// over the window, as merged on this node.
type PartitionEstimate struct {
	Tenant    string  `json:"tenant"`
	Partition uint32  `json:"partition"`
	Estimate  float64 `json:"estimate"`
	Minutes   int     `json:"minutes"` // minute sketches held
}

// Top returns the n largest per-partition estimates (all when n ≤ 0), largest
// first. It merges every minute of every partition: O(sketches × m), for
// status pages, not for a hot path.
func (h *Hub) Top(n int) []PartitionEstimate {
	type tp struct {
		tenant    string
		partition uint32
	}
	h.mu.Lock()
	now := h.now()
	byPart := map[tp][]*entry{}
	for k, e := range h.sketches {
		if k.minute > now-int64(h.cfg.WindowMinutes) {
			byPart[tp{k.tenant, k.partition}] = append(byPart[tp{k.tenant, k.partition}], e)
		}
	}
	win := make([]uint8, h.m)
	out := make([]PartitionEstimate, 0, len(byPart))
	for p, es := range byPart {
		clear(win)
		for _, e := range es {
			if e.dense != nil {
				for i, v := range e.dense {
					win[i] = max(win[i], v)
				}
			} else {
				for _, x := range e.sparse {
					idx, v := api.HLLSparseSplit(x)
					win[idx] = max(win[idx], v)
				}
			}
		}
		out = append(out, PartitionEstimate{Tenant: p.tenant, Partition: p.partition, Estimate: estimate(win, h.p), Minutes: len(es)})
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionEstimate) int {
		if c := cmp.Compare(b.Estimate, a.Estimate); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Partition, b.Partition))
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Estimate returns this node's merged estimate of (tenant, partition) over the
// window and its window registers (tests compare clients' views with them).
func (h *Hub) Estimate(tenant string, partition uint32) (float64, []uint8) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	win := make([]uint8, h.m)
	for k, e := range h.sketches {
		if k.tenant != tenant || k.partition != partition || k.minute <= now-int64(h.cfg.WindowMinutes) || k.minute > now+1 {
			continue
		}
		if e.dense != nil {
			for i, v := range e.dense {
				win[i] = max(win[i], v)
			}
		} else {
			for _, x := range e.sparse {
				idx, v := api.HLLSparseSplit(x)
				win[idx] = max(win[idx], v)
			}
		}
	}
	return estimate(win, h.p), win
}

func estimate(regs []uint8, p uint8) float64 {
	var hist api.HLLHistogram
	for _, v := range regs {
		hist[v]++
	}
	return api.HLLEstimate(&hist, p)
}

// Cursor follows the changes of a hub for one consumer (a watch stream, a
// peer): the keys changed since its last Take.
type Cursor struct {
	h      *Hub
	skip   string          // origin whose pushes this cursor ignores (the peer itself)
	only   map[string]bool // nil: every tenant; else the tenants it follows
	dirty  map[key]struct{}
	notify chan struct{}
}

// NewCursor registers a cursor. With full, its first Take returns every
// sketch held; skipOrigin ("" = none) names a peer whose own pushes it skips.
func (h *Hub) NewCursor(skipOrigin string, full bool) *Cursor {
	return h.NewTenantCursor(skipOrigin, full, nil)
}

// NewTenantCursor is NewCursor following only the tenants in only (nil:
// every tenant): a client's subscription, so what a stream carries grows
// with the tenants its client checks, not with every tenant of the cluster.
func (h *Hub) NewTenantCursor(skipOrigin string, full bool, only map[string]bool) *Cursor {
	c := &Cursor{h: h, skip: skipOrigin, only: only, dirty: map[key]struct{}{}, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cursors[c] = struct{}{}
	if full {
		c.markAllLocked()
	}
	return c
}

func (c *Cursor) markAllLocked() {
	for k := range c.h.sketches {
		if c.follows(k.tenant) {
			c.dirty[k] = struct{}{}
		}
	}
	c.signal()
}

// MarkAll makes the next Take return every sketch (a peer restarted or a send
// failed).
func (c *Cursor) MarkAll() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	c.markAllLocked()
}

// follows reports whether the cursor carries the tenant's sketches.
func (c *Cursor) follows(tenant string) bool { return c.only == nil || c.only[tenant] }

func (c *Cursor) mark(k key) {
	if !c.follows(k.tenant) {
		return
	}
	c.dirty[k] = struct{}{}
	c.signal()
}

func (c *Cursor) signal() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// C is signalled when the cursor has changes.
func (c *Cursor) C() <-chan struct{} { return c.notify }

// Take returns the current registers of up to max changed sketches (all when
// max ≤ 0) and forgets them; sketches that expired meanwhile are skipped.
func (c *Cursor) Take(max int) []*api.Sketch {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	var out []*api.Sketch
	for k := range c.dirty {
		if max > 0 && len(out) == max {
			c.signal() // more to come
			break
		}
		delete(c.dirty, k)
		if e := c.h.sketches[k]; e != nil {
			out = append(out, c.h.encode(k, e))
		}
	}
	return out
}

// Close unregisters the cursor.
func (c *Cursor) Close() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	delete(c.h.cursors, c)
}
