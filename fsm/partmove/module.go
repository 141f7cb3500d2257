package partmove

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// Name is the module's name: its registry rows and its snapshot section.
const Name = "partition-moves"

// Entry types.
const (
	EntryGive     byte = 23
	EntryReceive  byte = 24
	EntryComplete byte = 25
	// EntryGiveMetering is a give that takes the partition's metering
	// with its series (cluster version 8).
	EntryGiveMetering byte = 29
)

// ClusterVersion introduced the three entry types.
const ClusterVersion = 7

// MeteringClusterVersion introduced partition-give-metering.
const MeteringClusterVersion = 8

func init() {
	fsm.RegisterModuleEntry(Name, EntryGive, "partition-give", ClusterVersion)
	fsm.RegisterModuleEntry(Name, EntryReceive, "partition-receive", ClusterVersion)
	fsm.RegisterModuleEntry(Name, EntryComplete, "partition-complete", ClusterVersion)
	fsm.RegisterModuleEntry(Name, EntryGiveMetering, "partition-give-metering", MeteringClusterVersion)
}

// ErrBadPayload is wrapped by every payload or section decode failure.
var ErrBadPayload = errors.New("bad partition-moves payload")

// Series is the group's series state (fsm.FSM), used on the apply goroutine.
type Series interface {
	TakePartition(p int) (now int64, out []fsm.PartitionSeries)
	PutPartition(now int64, in []fsm.PartitionSeries)
}

// Shares moves a tenant's share with its series (fsm/shares.Module).
type Shares interface {
	AdjustForPartition(tenant string, d int64)
}

// Metering moves a partition's metering with its series (fsm/metering's
// Module).
type Metering interface {
	// TakeMetering removes partition p's metering from the group and
	// returns it encoded (a transfer that says so when the group did not
	// hold it).
	TakeMetering(p int) ([]byte, error)
	// PrepareMetering validates an encoded metering transfer; install
	// installs it, or changes nothing and says why.
	PrepareMetering(b []byte) (install func() (refused string), err error)
}

// GiveResult is a partition-give's response.
type GiveResult struct {
	Series  int64  // series taken (0 when nothing changed)
	Already bool   // the nonce was already given: nothing changed
	Refused string // non-empty: nothing changed, and why
}

// ReceiveResult is a partition-receive's response.
type ReceiveResult struct {
	Applied bool   // installed now (false: received before, or refused)
	Series  int64  // series installed
	Refused string // non-empty: nothing changed, and why
}

// CompleteResult is a partition-complete's response.
type CompleteResult struct{ Found bool }

// Module is one group's hand-off state.
type Module struct {
	group, partitions int
	lo, hi            int // the arithmetic range owned before any move

	series Series
	shares Shares
	meter  Metering

	owned atomic.Pointer[[]bool] // immutable once published

	moved atomic.Bool // anything given or received: the section is written

	mu     sync.Mutex
	outbox map[uint64][]byte // nonce → the transfer, encoded
	seen   map[uint64]bool
}

// New returns group's module in a cluster of p partitions created with base
// groups (the group owns layout.GroupSpan at first). Bind must be called
// before the first entry applies.
func New(group, p, base int) *Module {
	m := &Module{group: group, partitions: p}
	m.lo, m.hi = layout.GroupSpan(group, p, base)
	m.reset()
	return m
}

func (m *Module) reset() {
	own := make([]bool, m.partitions)
	for p := m.lo; p < m.hi; p++ {
		own[p] = true
	}
	m.owned.Store(&own)
	m.moved.Store(false)
	m.outbox = map[uint64][]byte{}
	m.seen = map[uint64]bool{}
}

// Bind gives the module the group's series, shares and metering (sh and mt
// may be nil: a group without them moves series only).
func (m *Module) Bind(series Series, sh Shares, mt Metering) {
	m.series, m.shares, m.meter = series, sh, mt
}

// Name implements fsm.Module.
func (m *Module) Name() string { return Name }

// Owns reports whether the group owns partition p at the applied state.
// Safe from any goroutine.
func (m *Module) Owns(p int) bool {
	own := *m.owned.Load()
	return p >= 0 && p < len(own) && own[p]
}

// Moved reports whether the group ever gave or received a partition (until
// then it owns its arithmetic range and Owns need not be asked). Safe from
// any goroutine.
func (m *Module) Moved() bool { return m.moved.Load() }

// Outbox returns the encoded transfer given under nonce (nil if none).
func (m *Module) Outbox(nonce uint64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.outbox[nonce]
}

// Received reports whether the transfer of nonce was installed here.
func (m *Module) Received(nonce uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[nonce]
}

// OutboxNonces lists the transfers given and not completed, rising.
func (m *Module) OutboxNonces() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint64, 0, len(m.outbox))
	for n := range m.outbox {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (m *Module) setOwned(p int, v bool) {
	own := slices.Clone(*m.owned.Load())
	own[p] = v
	m.owned.Store(&own)
}

// Apply implements fsm.Module.
func (m *Module) Apply(e fsm.ModuleEntry) (any, error) {
	if m.series == nil {
		return nil, fmt.Errorf("partition-moves of group %d: not bound to the group's series", m.group)
	}
	switch e.Type {
	case EntryGive, EntryGiveMetering:
		g, err := DecodeGive(e.Payload, m.partitions)
		if err != nil {
			return nil, err
		}
		return m.applyGive(g, e.Type == EntryGiveMetering)
	case EntryReceive:
		t, err := DecodeTransfer(e.Payload, m.partitions)
		if err != nil {
			return nil, err
		}
		var install func() string
		if t.Metering != nil {
			if m.meter == nil {
				return nil, fmt.Errorf("partition-moves of group %d: a transfer with metering, and no metering bound", m.group)
			}
			if install, err = m.meter.PrepareMetering(t.Metering); err != nil {
				return nil, fmt.Errorf("%w: transfer %d: %w", ErrBadPayload, t.Nonce, err)
			}
		}
		return m.applyReceive(t, install), nil
	case EntryComplete:
		n, err := DecodeComplete(e.Payload)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		_, ok := m.outbox[n]
		delete(m.outbox, n)
		m.mu.Unlock()
		return CompleteResult{Found: ok}, nil
	}
	return nil, fmt.Errorf("%w: type %d is not a partition-moves entry", ErrBadPayload, e.Type)
}

func (m *Module) applyGive(g Give, metering bool) (any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.outbox[g.Nonce] != nil:
		return GiveResult{Already: true}, nil
	case g.To == m.group:
		return GiveResult{Refused: fmt.Sprintf("partition %d: group %d cannot give to itself", g.Partition, g.To)}, nil
	case !m.Owns(g.Partition):
		return GiveResult{Refused: fmt.Sprintf("partition %d is not owned by group %d", g.Partition, m.group)}, nil
	}
	var meter []byte
	if metering && m.meter != nil {
		// Taken first: its only failure (a module configured for another
		// partition count) must leave the series where they are.
		var err error
		if meter, err = m.meter.TakeMetering(g.Partition); err != nil {
			return nil, fmt.Errorf("partition-moves of group %d: metering of partition %d: %w", m.group, g.Partition, err)
		}
	}
	now, series := m.series.TakePartition(g.Partition)
	t := Transfer{Nonce: g.Nonce, Partition: g.Partition, From: m.group, To: g.To, Now: now, Series: series, Metering: meter}
	var n int64
	for _, ps := range series {
		n += int64(len(ps.Hashes))
		if m.shares != nil {
			m.shares.AdjustForPartition(ps.Tenant, -int64(len(ps.Hashes)))
		}
	}
	m.setOwned(g.Partition, false)
	m.outbox[g.Nonce] = AppendTransfer(nil, t)
	m.moved.Store(true)
	return GiveResult{Series: n}, nil
}

func (m *Module) applyReceive(t Transfer, installMetering func() string) ReceiveResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.seen[t.Nonce]:
		return ReceiveResult{}
	case t.To != m.group:
		return ReceiveResult{Refused: fmt.Sprintf("transfer %d is for group %d, not group %d", t.Nonce, t.To, m.group)}
	}
	if installMetering != nil {
		// First: it may refuse (changing nothing), the series cannot.
		if why := installMetering(); why != "" {
			return ReceiveResult{Refused: "metering: " + why}
		}
	}
	m.series.PutPartition(t.Now, t.Series)
	var n int64
	for _, ps := range t.Series {
		n += int64(len(ps.Hashes))
		if m.shares != nil {
			m.shares.AdjustForPartition(ps.Tenant, int64(len(ps.Hashes)))
		}
	}
	m.setOwned(t.Partition, true)
	m.seen[t.Nonce] = true
	m.moved.Store(true)
	return ReceiveResult{Applied: true, Series: n}
}

// Snapshot implements fsm.Module.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.moved.Load() {
		return nil, nil
	}
	own := *m.owned.Load()
	outbox := make(map[uint64][]byte, len(m.outbox))
	for n, b := range m.outbox {
		outbox[n] = b // immutable once stored
	}
	seen := make([]uint64, 0, len(m.seen))
	for n := range m.seen {
		seen = append(seen, n)
	}
	p := m.partitions
	return func() ([]byte, error) {
		w := wire.Encoder{Buf: []byte{sectionVersion}}
		w.Uvarint(uint64(p))
		var owned []int
		for i, o := range own {
			if o {
				owned = append(owned, i)
			}
		}
		w.Uvarint(uint64(len(owned)))
		for _, i := range owned {
			w.Uvarint(uint64(i))
		}
		nonces := make([]uint64, 0, len(outbox))
		for n := range outbox {
			nonces = append(nonces, n)
		}
		slices.Sort(nonces)
		w.Uvarint(uint64(len(nonces)))
		for _, n := range nonces {
			w.Bytes(outbox[n])
		}
		slices.Sort(seen)
		w.Uvarint(uint64(len(seen)))
		for _, n := range seen {
			w.Uvarint(n)
		}
		return w.Buf, nil
	}, nil
}

const sectionVersion = 1

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	if data == nil {
		return func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.reset()
		}, nil
	}
	d := wire.NewDecoder(data, ErrBadPayload)
	if v := d.Byte("section version"); d.Err() == nil && v != sectionVersion {
		d.Failf("section version %d, this build reads %d", v, sectionVersion)
	}
	if p := d.Uvarint("partitions"); d.Err() == nil && p != uint64(m.partitions) {
		d.Failf("section of %d partitions restored into a cluster of %d", p, m.partitions)
	}
	own := make([]bool, m.partitions)
	k := d.Count("owned", m.partitions)
	last := -1
	for range k {
		p := int(d.Uvarint("owned partition"))
		if d.Err() == nil && (p <= last || p >= m.partitions) {
			d.Failf("owned partition %d out of order or range", p)
		}
		if d.Err() != nil {
			break
		}
		own[p], last = true, p
	}
	outbox := map[uint64][]byte{}
	o := d.Count("outbox", m.partitions*1024)
	var lastN uint64
	for i := range o {
		b := d.Bytes("transfer", 1<<40)
		if d.Err() != nil {
			break
		}
		t, err := DecodeTransfer(b, m.partitions)
		if err != nil {
			return nil, fmt.Errorf("%w: outbox transfer %d: %w", ErrBadPayload, i, err)
		}
		if i > 0 && t.Nonce <= lastN {
			d.Failf("outbox nonce %d out of order", t.Nonce)
			break
		}
		lastN = t.Nonce
		outbox[t.Nonce] = slices.Clone(b)
	}
	seen := map[uint64]bool{}
	r := d.Count("received", 1<<24)
	lastN = 0
	for i := range r {
		n := d.Uvarint("received nonce")
		if d.Err() == nil && i > 0 && n <= lastN {
			d.Failf("received nonce %d out of order", n)
		}
		if d.Err() != nil {
			break
		}
		seen[n], lastN = true, n
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.owned.Store(&own)
		m.outbox, m.seen = outbox, seen
		m.moved.Store(true)
	}, nil
}
