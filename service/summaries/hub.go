package summaries

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Source reads this node's replicas.
type Source interface {
	// Replica returns group g's applied index, or why this node cannot serve
	// the group's summary now (no replica here, no contact with the leader,
	// halted…): a non-empty why.
	Replica(g int) (applied uint64, why string)
	// Near lists group g's near-limit tenants, sorted, from the local replica.
	Near(g int) []string
}

// Defaults for zero Config fields.
const (
	DefaultPeriod    = 100 * time.Millisecond
	DefaultHeartbeat = time.Second
	DefaultBuffer    = 64
)

// Config configures a Hub.
type Config struct {
	Groups    int // groups at start; AddGroup adds more
	Source    Source
	NodeID    string        // served_by in every update
	Period    time.Duration // how often the replicas are looked at; default 100ms
	Heartbeat time.Duration // heartbeat period, also the forced recompute period; default 1s
	Buffer    int           // updates queued per subscriber before it is dropped; default 64
	Logger    *slog.Logger
}

// Hub computes the per-group near-limit sets and fans them out.
type Hub struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// groups is indexed by group; AddGroup appends. Read and written only
	// under mu, like the subscribers, so a Tick or a Subscribe sees one
	// count from start to end.
	groups    []groupState
	subs      map[*Subscription]struct{}
	lastBeat  time.Time
	lastForce time.Time

	dropped, updates atomic.Uint64
}

// groupState is what this node last computed for one group.
type groupState struct {
	valid   bool // computed at least once since subscribers appeared
	why     string
	applied uint64
	near    []string // sorted
}

// New validates cfg and returns a Hub; start it with Run.
func New(cfg Config) (*Hub, error) {
	if cfg.Groups <= 0 || cfg.Source == nil {
		return nil, errors.New("summaries: Config needs Groups > 0 and a Source")
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{cfg: cfg, log: cfg.Logger, groups: make([]groupState, cfg.Groups), subs: map[*Subscription]struct{}{}}, nil
}

// Run looks at the replicas every Period until ctx ends, then drops every
// subscriber with Unavailable.
func (h *Hub) Run(ctx context.Context) {
	t := time.NewTicker(h.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			h.mu.Lock()
			for s := range h.subs {
				h.dropLocked(s, status.Error(codes.Unavailable, "node is shutting down; reconnect to another node"))
			}
			h.mu.Unlock()
			return
		case now := <-t.C:
			h.Tick(now)
		}
	}
}

// Tick looks at the replicas once (Run calls it every Period) and sends what
// changed, plus a heartbeat when one is due.
func (h *Hub) Tick(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) == 0 {
		// Nothing computed while nobody listens; the next subscriber
		// recomputes everything.
		for g := range h.groups {
			h.groups[g].valid = false
		}
		return
	}
	force := now.Sub(h.lastForce) >= h.cfg.Heartbeat
	if force {
		h.lastForce = now
	}
	if changes := h.refreshLocked(force); len(changes) > 0 {
		h.broadcastLocked(changes, false)
	}
	if now.Sub(h.lastBeat) >= h.cfg.Heartbeat {
		h.lastBeat = now
		beat := make([]*api.GroupSummary, 0, len(h.groups))
		for g, st := range h.groups {
			if st.why == "" {
				beat = append(beat, &api.GroupSummary{Group: uint32(g), AppliedIndex: st.applied})
			}
		}
		h.broadcastLocked(beat, true)
	}
}

// refreshLocked recomputes the groups whose applied index moved (all of them
// when force) and returns one change per group that changed.
func (h *Hub) refreshLocked(force bool) []*api.GroupSummary {
	var out []*api.GroupSummary
	for g := range h.groups {
		st := &h.groups[g]
		applied, why := h.cfg.Source.Replica(g)
		if why != "" {
			if !st.valid || st.why != why {
				*st = groupState{valid: true, why: why}
				out = append(out, &api.GroupSummary{Group: uint32(g), Unavailable: why})
			}
			continue
		}
		if st.valid && st.why == "" && applied == st.applied && !force {
			continue
		}
		near := h.cfg.Source.Near(g)
		switch {
		case !st.valid || st.why != "":
			// First computation, or available again: the whole set.
			out = append(out, &api.GroupSummary{Group: uint32(g), AppliedIndex: applied, Full: true, Added: near})
		default:
			added, removed := diff(st.near, near)
			if len(added) > 0 || len(removed) > 0 {
				out = append(out, &api.GroupSummary{Group: uint32(g), AppliedIndex: applied, Added: added, Removed: removed})
			}
		}
		*st = groupState{valid: true, applied: applied, near: near}
	}
	return out
}

// diff returns what is in b and not in a, and what is in a and not in b; both
// inputs and outputs are sorted.
func diff(a, b []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			removed = append(removed, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			added = append(added, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

// broadcastLocked sends each subscriber the changes about its groups. A
// subscriber whose buffer is full is dropped: it must not hold back the others.
func (h *Hub) broadcastLocked(changes []*api.GroupSummary, heartbeat bool) {
	for s := range h.subs {
		var mine []*api.GroupSummary
		for _, c := range changes {
			if s.wants(int(c.Group)) {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			continue
		}
		// Messages are shared between subscribers: gRPC only reads them.
		u := &api.SummaryUpdate{ServedBy: h.cfg.NodeID, Groups: mine, Heartbeat: heartbeat}
		select {
		case s.c <- u:
			h.updates.Add(1)
		default:
			h.dropLocked(s, status.Errorf(codes.ResourceExhausted,
				"summary subscriber too slow: %d updates unread; dropped, reconnect for the full state", cap(s.c)))
		}
	}
}

func (h *Hub) dropLocked(s *Subscription, err error) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	s.err = err
	close(s.done)
	if status.Code(err) == codes.ResourceExhausted {
		h.dropped.Add(1)
		h.log.Warn("summaries: dropped a slow subscriber", "err", err)
	}
}

// Subscription is one subscriber's queue of updates.
type Subscription struct {
	h *Hub
	// groups is nil for every group, those added later included; else
	// indexed by group and as long as the hub's groups were at Subscribe:
	// a group added since is not one the subscriber asked for.
	groups []bool
	c      chan *api.SummaryUpdate
	done   chan struct{} // closed when the hub dropped the subscriber
	err    error         // why; set before done is closed
}

func (s *Subscription) wants(g int) bool {
	return s.groups == nil || (g < len(s.groups) && s.groups[g])
}

// Updates delivers the updates, the full state first.
func (s *Subscription) Updates() <-chan *api.SummaryUpdate { return s.c }

// Done is closed when the hub dropped the subscriber; Err then says why.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err is why the hub dropped the subscriber (valid once Done is closed).
func (s *Subscription) Err() error { return s.err }

// Close unsubscribes.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if _, ok := s.h.subs[s]; ok {
		delete(s.h.subs, s)
		close(s.done)
	}
}

// Subscribe registers a subscriber to groups (empty = all) and queues the full
// state of those groups as its first update.
func (h *Hub) Subscribe(groups []uint32) (*Subscription, error) {
	s := &Subscription{h: h, c: make(chan *api.SummaryUpdate, h.cfg.Buffer), done: make(chan struct{})}
	// Under mu: the groups checked here are those the full state below
	// covers, whatever AddGroup does meanwhile.
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(groups) > 0 {
		n := len(h.groups)
		s.groups = make([]bool, n)
		for _, g := range groups {
			if int(g) >= n {
				return nil, status.Errorf(codes.InvalidArgument, "group %d out of range: this cluster has %d groups", g, n)
			}
			s.groups[g] = true
		}
	}
	if len(h.subs) == 0 {
		// The full state below is as good as a heartbeat and a forced
		// recompute.
		h.lastBeat = time.Now()
		h.lastForce = h.lastBeat
	}
	if changes := h.refreshLocked(false); len(changes) > 0 {
		// Others must see these changes too, or their sets would drift from
		// the state the new subscriber starts from.
		h.broadcastLocked(changes, false)
	}
	var full []*api.GroupSummary
	for g, st := range h.groups {
		if !s.wants(g) {
			continue
		}
		if st.why != "" {
			full = append(full, &api.GroupSummary{Group: uint32(g), Unavailable: st.why})
		} else {
			full = append(full, &api.GroupSummary{Group: uint32(g), AppliedIndex: st.applied, Full: true, Added: slices.Clone(st.near)})
		}
	}
	s.c <- &api.SummaryUpdate{ServedBy: h.cfg.NodeID, Groups: full}
	h.subs[s] = struct{}{}
	return s, nil
}

// AddGroup adds group g, which must be the next group (the count so far).
// Call it once the Source answers for g. The next Tick with subscribers
// computes g like any other group: a subscriber to every group gets its full
// state, then its changes and heartbeats; one that listed its groups does
// not, it asked for those only.
func (h *Hub) AddGroup(g int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.groups); g != n {
		return fmt.Errorf("summaries: AddGroup: group %d: groups are added in order and the next one here is %d", g, n)
	}
	// Not valid yet: its first computation goes out as a full set, which
	// is what a subscriber that never heard of the group needs.
	h.groups = append(h.groups, groupState{})
	return nil
}

// Stats are the hub's gauges and counters.
type Stats struct {
	Subscribers int
	Dropped     uint64 // slow subscribers dropped
	Updates     uint64 // updates queued to subscribers
}

// Stats returns the current figures.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	n := len(h.subs)
	h.mu.Unlock()
	return Stats{Subscribers: n, Dropped: h.dropped.Load(), Updates: h.updates.Load()}
}

// String names the hub in logs.
func (h *Hub) String() string {
	h.mu.Lock()
	n := len(h.groups)
	h.mu.Unlock()
	return fmt.Sprintf("summaries.Hub{node: %s, groups: %d}", h.cfg.NodeID, n)
}
