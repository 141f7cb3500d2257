package metering

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/metering/interval"
)

// Name is the module's name: its registry rows and snapshot section.
const Name = "metering"

// Entry types owned by the module (12–19 reserved), registered with the FSM
// at init; doc.go documents their payloads.
const (
	EntryEvents  byte = 12 // batch of start/stop events
	EntryPlan    byte = 13 // batch of planned intervals
	EntryExecute byte = 14 // batch of executed (or dead-lettered) intervals
	EntryTick    byte = 15 // housekeeping: dedup expiry, ledger retention
	EntrySeries  byte = 16 // per-tenant active-series sample of one minute
	EntryTargets byte = 28 // the switch: dedup records keep their target's hash from here on
)

func init() {
	fsm.RegisterModuleEntry(Name, EntryEvents, "meter-events", 3)
	fsm.RegisterModuleEntry(Name, EntryPlan, "meter-plan", 3)
	fsm.RegisterModuleEntry(Name, EntryExecute, "meter-execute", 3)
	fsm.RegisterModuleEntry(Name, EntryTick, "meter-tick", 3)
	fsm.RegisterModuleEntry(Name, EntrySeries, "meter-series", 3)
	fsm.RegisterModuleEntry(Name, EntryTargets, "meter-targets", TargetsClusterVersion)
}

// Code is the outcome of one event, as the receiver reports it (the HTTP codes
// of a metering receiver).
type Code uint8

// TargetsClusterVersion introduced meter-targets and the section's version 2
// (move.go): a build below it cannot read what the switch makes a replica
// write.
const TargetsClusterVersion = 8

// Outcomes of an event.
const (
	Created       Code = iota + 1 // accepted: 201
	Duplicate                     // same id, same content as an accepted event: 201
	Conflict                      // start on an active target, or an id reused for other content: 409
	Unprocessable                 // stop without an active span, stop before start, outside the slack window: 422
	Moved                         // the target's partition was given to another group: route again (move.go)
)

// Result is what applying one event returns.
type Result struct {
	Code   Code
	Span   uint64 // the span started or stopped (0 when refused)
	Reason string // why, for refusals
}

// Span is one continuous usage: immutable target, measures and
// start; the end once stopped; the sampling progress.
type Span struct {
	ID       uint64
	Target   Target
	Measures []Measure
	Start    int64
	End      int64
	Stopped  bool
	// Cursor is the point up to which the span is sampled (a metering
	// receiver's last_interval.end); it starts at Start.
	Cursor  int64
	Version uint64 // bumped by every plan and execution
	Seq     uint64 // intervals planned so far; the planned one's number
	Planned *interval.Interval
	StartID string
	StopID  string
	// OriginGroup and OriginSpan name the span in the group that started
	// it, once it moved to another group with its partition (OriginSpan 0:
	// it never moved). Its usage ids keep naming that group and span, so an
	// interval posted before the move and posted again after it carries the
	// same idempotency key.
	OriginGroup int
	OriginSpan  uint64
}

// UsageID is the planned interval's usage id, fixed when it was planned:
// "<group>-<span>-<seq>" of the group and span that started it.
func (s *Span) UsageID(group int) string {
	if s.OriginSpan != 0 {
		return usageID(s.OriginGroup, s.OriginSpan, s.Seq)
	}
	return usageID(group, s.ID, s.Seq)
}

func usageID(group int, span, seq uint64) string { return fmt.Sprintf("%d-%d-%d", group, span, seq) }

// Record is one discrete usage: what the ledger stores and the HTTP sink
// receives.
type Record struct {
	UsageID   string
	Span      uint64
	Target    Target
	Timestamp int64 // the interval's midpoint, ms
	Start     int64
	End       int64
	Backward  bool
	// Measures are the span's measures followed by "duration" (ms, signed).
	Measures []Measure
}

// DeadLetter is a record the HTTP sink refused for good.
type DeadLetter struct {
	Record Record
	Code   int
	Reason string
	At     int64
}

type dedupKey struct {
	kind Kind
	id   string
}

type dedupRec struct {
	fp      uint64
	expires int64
	// th is the event's target hash, kept only for records created after
	// the switch (known): a record created before it is unknown on every
	// replica alike, since one restored from an older snapshot never had it.
	th    uint64
	known bool
}

type sample struct {
	minute int64
	active int64
}

// Module is the metering state of one group. Apply, Snapshot and
// PrepareRestore run on raft's apply goroutine; the read methods take mu.
type Module struct {
	group int

	mu       sync.RWMutex
	nextSpan uint64
	spans    map[uint64]*Span
	open     map[string]uint64 // target key → open span
	dedup    map[dedupKey]dedupRec
	ledger   map[string][]Record // target key → records in execution order
	nrec     int
	dead     []DeadLetter
	series   map[string]*tenantSeries // tenant → samples by minute (series.go)
	// openMonth is the first minute of the open billing period: the UTC
	// calendar month of the latest time an entry carried (its now, or a
	// series entry's minute).
	// Samples before it are compacted (series.go). It only moves forward.
	openMonth int64
	// compactQ lists (sorted) the tenants whose samples before openMonth
	// are still at full resolution; each series or tick entry compacts
	// from its head up to compactBudget samples, so the month's turn does
	// not stall the apply goroutine for a pass over every tenant's month
	// (1–2 ms a tenant-month sampled every minute; BENCHMARKS.md).
	compactQ      []string
	compactBudget int
	lastNow       int64
	// hashes is the switch (meter-targets applied): dedup records keep
	// their target's hash and the section is written at version 2.
	hashes bool
	// The partitions whose metering this group holds (move.go). partitions,
	// homeLo and homeHi are configuration (SetHome), the same on every
	// replica: the range the created count's arithmetic gives the group
	// (empty for a group a raise added). moved and owned are replicated:
	// once a partition's metering was given or received here, owned[p]
	// says which the group holds.
	partitions, homeLo, homeHi int
	moved                      bool
	owned                      []bool
	planned                    int64 // counters since start (metrics), not replicated state
	executed                   int64
	changes                    atomic.Uint64  // bumped by every applied entry and restore
	due                        dueIndex       // derived: which spans have work when (the sampler's Due)
	observe                    func(ms int64) // SetTimeObserver; nil: none
}

// SetTimeObserver installs fn, called on the apply goroutine with the time
// (Unix ms) each applied entry carries when it advances the module's now:
// the node's group clock learns the group's time from it. Set it before the
// module applies anything; fn must be quick.
func (m *Module) SetTimeObserver(fn func(ms int64)) { m.observe = fn }

// Changes counts applied entries and restores: a reader that saw the same
// count saw the same state (the sampler skips rescans on it).
func (m *Module) Changes() uint64 { return m.changes.Load() }

var _ fsm.Module = (*Module)(nil)

// New returns an empty module for group g.
func New(group int) *Module {
	m := &Module{group: group, compactBudget: defaultCompactBudget}
	m.reset()
	return m
}

func (m *Module) reset() {
	m.nextSpan = 1
	m.spans = map[uint64]*Span{}
	m.open = map[string]uint64{}
	m.dedup = map[dedupKey]dedupRec{}
	m.ledger = map[string][]Record{}
	m.nrec = 0
	m.dead = nil
	m.series = map[string]*tenantSeries{}
	m.openMonth = 0
	m.compactQ = nil
	m.lastNow = 0
	m.hashes, m.moved, m.owned = false, false, nil
	m.due.invalidate()
}

// Name implements fsm.Module.
func (m *Module) Name() string { return Name }

// Apply implements fsm.Module.
func (m *Module) Apply(e fsm.ModuleEntry) (any, error) {
	defer m.changes.Add(1)
	switch e.Type {
	case EntryEvents:
		now, slack, evs, err := DecodeEvents(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.tick(now)
		out := make([]Result, len(evs))
		for i := range evs {
			out[i] = m.applyEvent(&evs[i], now, slack)
		}
		return out, nil
	case EntryPlan:
		now, items, err := DecodePlan(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.tick(now)
		n := 0
		for _, it := range items {
			if m.applyPlan(it) {
				n++
			}
		}
		m.planned += int64(n)
		return n, nil
	case EntryExecute:
		now, items, err := DecodeExecute(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.tick(now)
		n := 0
		for _, it := range items {
			if m.applyExecute(it, now) {
				n++
			}
		}
		m.executed += int64(n)
		return n, nil
	case EntryTick:
		now, cutoff, err := DecodeTick(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.tick(now)
		m.gc(cutoff)
		m.compactSome()
		return nil, nil
	case EntrySeries:
		minute, rows, err := DecodeSeries(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, r := range rows {
			ts := m.series[r.Tenant]
			if ts == nil {
				ts = &tenantSeries{}
				m.series[r.Tenant] = ts
			}
			ts.put(sample{minute, r.Active}) // an older minute than recorded is ignored
		}
		m.advanceMonth(minute)
		m.compactSome()
		return len(rows), nil
	case EntryTargets:
		if err := DecodeTargets(e.Payload); err != nil {
			return nil, err
		}
		// No time: the switch is appended at a group's first housekeeping,
		// whatever the metering clock then says, and must not move the
		// group's now (and its open billing month) on its own.
		m.mu.Lock()
		defer m.mu.Unlock()
		was := m.hashes
		m.hashes = true
		return !was, nil
	}
	return nil, fmt.Errorf("%w: entry type %d is not a metering type", ErrBadPayload, e.Type)
}

// tick advances the module's notion of now (monotonic: a new leader whose
// clock is behind cannot move it back) and expires dedup ids.
func (m *Module) tick(now int64) {
	if now > m.lastNow {
		m.lastNow = now
		if m.observe != nil {
			m.observe(now)
		}
		// The month turning on the group's clock closes the billing
		// period even when no count changes (an idle cluster writes no
		// series entry).
		m.advanceMonth(floorDiv(now, 60_000))
	}
}

func (m *Module) gc(ledgerCutoff int64) {
	for k, d := range m.dedup {
		if d.expires < m.lastNow {
			delete(m.dedup, k)
		}
	}
	if ledgerCutoff <= 0 {
		return
	}
	for k, recs := range m.ledger {
		kept := recs[:0]
		for _, r := range recs {
			if r.Timestamp >= ledgerCutoff {
				kept = append(kept, r)
			}
		}
		m.nrec -= len(recs) - len(kept)
		if len(kept) == 0 {
			delete(m.ledger, k)
		} else {
			m.ledger[k] = kept
		}
	}
	cutMinute := ledgerCutoff / 60_000
	for t, ts := range m.series {
		if ts.dropBefore(cutMinute) {
			delete(m.series, t)
		}
	}
}

// defaultCompactBudget is how many full-resolution samples one series or
// tick entry compacts at most: about 18 ms of the apply goroutine's time on a
// loaded 2-core VM (BENCHMARKS.md). Ticks come once a minute while there
// are samples, so a month of 1,000 tenants sampled every minute (44.6M
// samples) is compacted within the first one or two hours of the next
// month.
const defaultCompactBudget = 1 << 19

// advanceMonth moves the open billing period to the month of minute when
// that is later, and queues every tenant with samples before it for
// compaction. It runs in Apply on times the entries carry, so every replica
// closes the month at the same entry; compaction changes no answer
// (series.go), only memory.
func (m *Module) advanceMonth(minute int64) {
	start := monthStart(minute)
	if start <= m.openMonth {
		return
	}
	m.openMonth = start
	m.compactQ = m.compactQ[:0]
	for t, ts := range m.series {
		if len(ts.open) > 0 && ts.open[0].minute < start {
			m.compactQ = append(m.compactQ, t)
		}
	}
	slices.Sort(m.compactQ) // the same order on every replica
}

// compactSome compacts queued tenants, in order, until compactBudget
// samples were compacted or none is left.
func (m *Module) compactSome() {
	budget := m.compactBudget
	for len(m.compactQ) > 0 && budget > 0 {
		ts := m.series[m.compactQ[0]]
		m.compactQ = m.compactQ[1:]
		if ts != nil { // else dropped by the retention since
			budget -= ts.compact(m.openMonth)
		}
	}
	if len(m.compactQ) == 0 {
		m.compactQ = nil
	}
}

// floorDiv is a / b rounded down (b > 0): times before 1970 fall in the
// minute they are in.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// fingerprint identifies an event's content, so that a retry with the same
// id is told apart from an id reused for something else.
func fingerprint(ev *Event) uint64 {
	e := wire.Encoder{}
	e.Byte(byte(ev.Kind))
	appendTarget(&e, ev.Target)
	e.Varint(ev.Timestamp)
	appendMeasures(&e, ev.Measures)
	h := fnv.New64a()
	h.Write(e.Buf)
	return h.Sum64()
}

func (m *Module) applyEvent(ev *Event, now, slack int64) Result {
	th := TargetHash(ev.Target)
	if p, ok := m.fenced(th); ok {
		// Before the dedup check: the partition's ids left with it, so an
		// answer from here would differ from its new group's.
		return Result{Code: Moved, Reason: fmt.Sprintf("the metering of this target's partition %d is not in group %d; route again", p, m.group)}
	}
	var fp uint64
	if ev.ID != "" {
		fp = fingerprint(ev)
		if d, ok := m.dedup[dedupKey{ev.Kind, ev.ID}]; ok {
			if d.fp == fp {
				return Result{Code: Duplicate}
			}
			return Result{Code: Conflict, Reason: fmt.Sprintf("id %q was already used by a different %s event", ev.ID, kindName(ev.Kind))}
		}
	}
	if ev.Timestamp < now-slack || ev.Timestamp > now+slack {
		return Result{Code: Unprocessable, Reason: fmt.Sprintf("timestamp %d is outside the slack window [%d, %d] (now ± %d ms)", ev.Timestamp, now-slack, now+slack, slack)}
	}
	key := ev.Target.key()
	var res Result
	switch ev.Kind {
	case Start:
		if id, ok := m.open[key]; ok {
			return Result{Code: Conflict, Reason: fmt.Sprintf("target already has an active span, started at %d; stop it first", m.spans[id].Start)}
		}
		s := &Span{ID: m.nextSpan, Target: ev.Target, Measures: ev.Measures, Start: ev.Timestamp, Cursor: ev.Timestamp, Version: 1, StartID: ev.ID}
		m.nextSpan++
		m.spans[s.ID] = s
		m.open[key] = s.ID
		m.due.touch(s)
		res = Result{Code: Created, Span: s.ID}
	case Stop:
		id, ok := m.open[key]
		if !ok {
			return Result{Code: Unprocessable, Reason: "no active span for this target"}
		}
		s := m.spans[id]
		if ev.Timestamp < s.Start {
			return Result{Code: Unprocessable, Reason: fmt.Sprintf("stop at %d is before its span's start at %d", ev.Timestamp, s.Start)}
		}
		s.End, s.Stopped, s.StopID = ev.Timestamp, true, ev.ID
		delete(m.open, key)
		if s.Planned == nil && s.Cursor == s.End {
			delete(m.spans, s.ID) // nothing was sampled and nothing is left: complete
		} else {
			m.due.touch(s)
		}
		res = Result{Code: Created, Span: id}
	}
	if ev.ID != "" {
		// Kept at least as long as a retry could pass the slack check: a
		// retried start after its span completed must not bill twice.
		rec := dedupRec{fp: fp, expires: max(ev.Timestamp, now) + slack}
		if m.hashes {
			rec.th, rec.known = th, true
		}
		m.dedup[dedupKey{ev.Kind, ev.ID}] = rec
	}
	return res
}

func kindName(k Kind) string {
	if k == Start {
		return "start"
	}
	return "stop"
}

// applyPlan sets a span's planned interval when the planner saw the span's
// current version and the interval continues from its cursor.
func (m *Module) applyPlan(it PlanItem) bool {
	s := m.spans[it.Span]
	if s == nil || s.Version != it.Version || s.Planned != nil || it.Start >= it.End {
		return false
	}
	from := it.Start
	if it.Backward {
		from = it.End
		if !s.Stopped || it.Start < s.End {
			return false // walking back below the end would undo real usage
		}
	}
	if from != s.Cursor {
		return false
	}
	s.Planned = &interval.Interval{Start: it.Start, End: it.End, Backward: it.Backward}
	s.Seq++
	s.Version++
	m.due.touch(s)
	return true
}

func (m *Module) applyExecute(it ExecItem, now int64) bool {
	s := m.spans[it.Span]
	if s == nil || s.Version != it.Version || s.Planned == nil {
		return false
	}
	rec := m.record(s)
	key := s.Target.key()
	m.ledger[key] = append(m.ledger[key], rec)
	m.nrec++
	if it.DeadCode != 0 {
		m.dead = append(m.dead, DeadLetter{Record: rec, Code: it.DeadCode, Reason: it.Reason, At: now})
	}
	s.Cursor = s.Planned.Cursor()
	s.Planned = nil
	s.Version++
	if s.Stopped && s.Cursor == s.End {
		delete(m.spans, s.ID)
	} else {
		m.due.touch(s)
	}
	return true
}

func (m *Module) record(s *Span) Record {
	iv := *s.Planned
	ms := make([]Measure, 0, len(s.Measures)+1)
	ms = append(ms, s.Measures...)
	ms = append(ms, Measure{Name: "duration", Quantity: float64(iv.Duration())})
	return Record{UsageID: s.UsageID(m.group), Span: s.ID, Target: s.Target, Timestamp: iv.Midpoint(), Start: iv.Start, End: iv.End, Backward: iv.Backward, Measures: ms}
}

// RecordOf returns the usage record a span's planned interval will produce
// (the HTTP sink posts it before the execution is recorded).
func (m *Module) RecordOf(s *Span) Record { return m.record(s) }
