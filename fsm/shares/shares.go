package shares

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/limits"
)

// Name is the module's name: its registry rows and its snapshot section.
const Name = "shares"

// Entry types owned by the module (8–11 reserved, 11 unused), registered with
// the FSM at init.
const (
	EntryGive     byte = 8
	EntryReceive  byte = 9
	EntryComplete byte = 10
	// EntryGiveWide and EntryReceiveWide (cluster version 7) are give and
	// receive with the same payloads whose other group may be any group:
	// groups a raise added (docs/online-groups.md) exchange headroom with
	// every group. The version-3 types stay bounded by the groups this
	// module's group knew when it was created, as replicas of older builds
	// check them. Use the wide type when the other group is not Known.
	EntryGiveWide    byte = 26
	EntryReceiveWide byte = 27
)

func init() {
	fsm.RegisterModuleEntry(Name, EntryGive, "shares-give", 3)
	fsm.RegisterModuleEntry(Name, EntryReceive, "shares-receive", 3)
	fsm.RegisterModuleEntry(Name, EntryComplete, "shares-complete", 3)
	fsm.RegisterModuleEntry(Name, EntryGiveWide, "shares-give-wide", 7)
	fsm.RegisterModuleEntry(Name, EntryReceiveWide, "shares-receive-wide", 7)
}

// Known reports whether the version-3 give and receive entries of this
// module's group may name group g (else the wide types are needed).
func (m *Module) Known(g int) bool { return g >= 0 && g < m.groups }

// Bounds checked on decode.
const (
	maxTenantLen = 1 << 10
	maxAmount    = 1 << 50
	maxGroups    = 1 << 16
)

// ErrBadPayload is wrapped by every payload or section decode failure.
var ErrBadPayload = errors.New("bad shares payload")

// Split is a group's base share of limit: the group owns partitions [lo, hi)
// of p, and its base is floor(limit·hi/p) − floor(limit·lo/p). The bases of
// all groups telescope to exactly limit (unlike ceil(limit·n/p), whose sum
// can exceed it). 0 (unlimited) stays 0. The rule is limits.GroupShare's
// (limits.Movable).
func Split(limit int64, lo, hi, p int) int64 {
	base, _ := limits.GroupShare(limit, lo, hi, p, limits.Movable, 0, 0)
	return base
}

// Transfer is one outstanding give: headroom that left this group and that
// the receiver may not have yet.
type Transfer struct {
	Tenant string
	Seq    uint64 // raft index of the give entry in the giver's group
	To     int
	Amount int64
}

// Give is a give entry's payload.
type Give struct {
	Tenant string
	To     int
	Amount int64
	// Nonce names the leader-local reservation the entry releases when it
	// applies (0: none).
	Nonce uint64
}

// Receive is a receive entry's payload.
type Receive struct {
	Tenant string
	From   int
	Seq    uint64
	Amount int64
}

// Complete is a complete entry's payload.
type Complete struct {
	Tenant string
	Seq    uint64
}

// GiveResult is the response of a give entry.
type GiveResult struct {
	Seq     uint64
	Refused string // non-empty: nothing changed, and why
}

// ReceiveResult is the response of a receive entry.
type ReceiveResult struct {
	Applied bool   // the amount was added now (false: already received earlier)
	Refused string // non-empty: nothing changed, and why
}

// CompleteResult is the response of a complete entry.
type CompleteResult struct{ Found bool }

// TenantView is what the module holds for one tenant in this group.
type TenantView struct {
	Delta       int64 // received − given, committed
	Given       int64 // total ever given (committed)
	Received    int64 // total ever received
	Moves       int64 // give + receive entries applied
	Outstanding []Transfer
	ReservedOut int64 // leader-local: headroom promised to give entries in flight
}

type tenant struct {
	delta, given, received, moves int64
	out                           map[uint64]Transfer // seq → transfer
	lastIn                        map[int]uint64      // giver group → highest seq received
}

// Module is the shares state of one group.
type Module struct {
	group, groups int

	mu      sync.Mutex
	tenants map[string]*tenant
	seq     uint64 // fallback seq when applied without raft (index 0)
	// leader-local reservations: tenant → nonce → amount
	res    map[string]map[uint64]int64
	resSum map[string]int64
	nonce  uint64
	// leader-local: tenant → the limit at which this leader session saw
	// every group covered (service/shares.Mover.Admit)
	settled map[string]Settled
}

// New returns the module of group `group` of `groups`.
func New(group, groups int) (*Module, error) {
	if groups < 1 || groups > maxGroups || group < 0 || group >= groups {
		return nil, fmt.Errorf("shares: group %d of %d out of range", group, groups)
	}
	return &Module{group: group, groups: groups, tenants: map[string]*tenant{},
		res: map[string]map[uint64]int64{}, resSum: map[string]int64{}, settled: map[string]Settled{}}, nil
}

// Name implements fsm.Module.
func (m *Module) Name() string { return Name }

// Group is the group this module belongs to.
func (m *Module) Group() int { return m.group }

func (m *Module) tenantLocked(name string) *tenant {
	t := m.tenants[name]
	if t == nil {
		t = &tenant{out: map[uint64]Transfer{}, lastIn: map[int]uint64{}}
		m.tenants[name] = t
	}
	return t
}

// Apply implements fsm.Module.
func (m *Module) Apply(e fsm.ModuleEntry) (any, error) {
	switch e.Type {
	case EntryGive, EntryGiveWide:
		g, err := DecodeGive(e.Payload)
		if err != nil {
			return nil, err
		}
		return m.applyGive(g, e.Index, e.Type == EntryGiveWide), nil
	case EntryReceive, EntryReceiveWide:
		r, err := DecodeReceive(e.Payload)
		if err != nil {
			return nil, err
		}
		return m.applyReceive(r, e.Type == EntryReceiveWide), nil
	case EntryComplete:
		c, err := DecodeComplete(e.Payload)
		if err != nil {
			return nil, err
		}
		return m.applyComplete(c), nil
	}
	return nil, fmt.Errorf("%w: type %d is not a shares entry", ErrBadPayload, e.Type)
}

func (m *Module) bound(wide bool) int {
	if wide {
		return maxGroups
	}
	return m.groups
}

func (m *Module) applyGive(g Give, index uint64, wide bool) GiveResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The reservation goes in the same step that lowers the delta, so the
	// leader's effective share never counts the amount twice or not at all.
	m.releaseLocked(g.Tenant, g.Nonce)
	if g.To == m.group || g.To >= m.bound(wide) {
		return GiveResult{Refused: fmt.Sprintf("receiver group %d invalid for group %d of %d", g.To, m.group, m.bound(wide))}
	}
	t := m.tenantLocked(g.Tenant)
	for _, o := range t.out {
		if o.To == g.To {
			return GiveResult{Refused: fmt.Sprintf("a transfer to group %d (seq %d) is still outstanding", g.To, o.Seq)}
		}
	}
	seq := index
	if seq == 0 {
		m.seq++
		seq = m.seq
	}
	t.delta -= g.Amount
	t.given += g.Amount
	t.moves++
	t.out[seq] = Transfer{Tenant: g.Tenant, Seq: seq, To: g.To, Amount: g.Amount}
	return GiveResult{Seq: seq}
}

func (m *Module) applyReceive(r Receive, wide bool) ReceiveResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.From == m.group || r.From >= m.bound(wide) {
		return ReceiveResult{Refused: fmt.Sprintf("giver group %d invalid for group %d of %d", r.From, m.group, m.bound(wide))}
	}
	t := m.tenantLocked(r.Tenant)
	if r.Seq <= t.lastIn[r.From] {
		return ReceiveResult{}
	}
	t.lastIn[r.From] = r.Seq
	t.delta += r.Amount
	t.received += r.Amount
	t.moves++
	return ReceiveResult{Applied: true}
}

func (m *Module) applyComplete(c Complete) CompleteResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tenants[c.Tenant]
	if t == nil {
		return CompleteResult{}
	}
	_, ok := t.out[c.Seq]
	delete(t.out, c.Seq)
	return CompleteResult{Found: ok}
}

// Delta returns the tenant's committed delta and this node's outgoing
// reservations: the effective share is base + delta − reservedOut.
func (m *Module) Delta(tenant string) (delta, reservedOut int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.tenants[tenant]; t != nil {
		delta = t.delta
	}
	return delta, m.resSum[tenant]
}

// Received reports whether a transfer from group `from` with seq was received.
func (m *Module) Received(tenant string, from int, seq uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tenants[tenant]
	return t != nil && t.lastIn[from] >= seq
}

// Outstanding lists every outstanding transfer of the group, by tenant then seq.
func (m *Module) Outstanding() []Transfer {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Transfer
	for _, t := range m.tenants {
		for _, o := range t.out {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b Transfer) int {
		if a.Tenant != b.Tenant {
			if a.Tenant < b.Tenant {
				return -1
			}
			return 1
		}
		return int(a.Seq - b.Seq)
	})
	return out
}

// HasOutstandingTo reports whether a give of tenant to group `to` is outstanding.
func (m *Module) HasOutstandingTo(tenant string, to int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.tenants[tenant]; t != nil {
		for _, o := range t.out {
			if o.To == to {
				return true
			}
		}
	}
	return false
}

// OutstandingTo returns the seq of the tenant's outstanding give to group `to`.
func (m *Module) OutstandingTo(tenant string, to int) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.tenants[tenant]; t != nil {
		for _, o := range t.out {
			if o.To == to {
				return o.Seq, true
			}
		}
	}
	return 0, false
}

// View returns the tenant's state in this group.
func (m *Module) View(tenant string) TenantView {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := TenantView{ReservedOut: m.resSum[tenant]}
	if t := m.tenants[tenant]; t != nil {
		v.Delta, v.Given, v.Received, v.Moves = t.delta, t.given, t.received, t.moves
		for _, o := range t.out {
			v.Outstanding = append(v.Outstanding, o)
		}
		slices.SortFunc(v.Outstanding, func(a, b Transfer) int { return int(a.Seq - b.Seq) })
	}
	return v
}

// Reserve promises amount of tenant's headroom to a give entry about to be
// proposed by this node as leader; the entry carries the returned nonce and
// releases the reservation when it applies.
func (m *Module) Reserve(tenant string, amount int64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nonce++
	r := m.res[tenant]
	if r == nil {
		r = map[uint64]int64{}
		m.res[tenant] = r
	}
	r[m.nonce] = amount
	m.resSum[tenant] += amount
	return m.nonce
}

// Release drops a reservation whose give entry will never apply (it was
// never appended).
func (m *Module) Release(tenant string, nonce uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked(tenant, nonce)
}

func (m *Module) releaseLocked(tenant string, nonce uint64) {
	r := m.res[tenant]
	a, ok := r[nonce]
	if !ok {
		return
	}
	delete(r, nonce)
	if len(r) == 0 {
		delete(m.res, tenant)
		delete(m.resSum, tenant)
		return
	}
	m.resSum[tenant] -= a
}

// ResetReservations drops every outgoing reservation: a new leader session
// calls it after its barrier, when every give this node appended has applied.
func (m *Module) ResetReservations() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.res)
	clear(m.resSum)
	clear(m.settled)
}

// Settled names a tenant's limit as a group applied it: the max_series and
// the runtime config version that set it.
type Settled struct {
	Limit   int64
	Version uint64
}

// Settled returns the limit at which this leader session last saw every
// group of tenant covered (ok false: not in this session).
func (m *Module) Settled(tenant string) (Settled, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.settled[tenant]
	return s, ok
}

// SetSettled records that every group of tenant was covered at limit; it
// is leader-local and dropped with the reservations.
func (m *Module) SetSettled(tenant string, limit Settled) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settled[tenant] = limit
}

// MovesApplied reports whether this replica has applied a give or receive
// entry: every server of the group could apply share-move entries when it
// was committed, and, downgrades being unsupported, still can.
func (m *Module) MovesApplied() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.tenants {
		if t.moves > 0 {
			return true
		}
	}
	return false
}

// Tenants lists the tenants the module holds state for, sorted.
func (m *Module) Tenants() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.tenants))
	for n := range m.tenants {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// --- payloads ---

// AppendGive encodes a give payload: tenant, to, amount, nonce.
func AppendGive(dst []byte, g Give) []byte {
	w := wire.Encoder{Buf: dst}
	w.String(g.Tenant)
	w.Uvarint(uint64(g.To))
	w.Uvarint(uint64(g.Amount))
	w.Uvarint(g.Nonce)
	return w.Buf
}

// AppendReceive encodes a receive payload: tenant, from, seq, amount.
func AppendReceive(dst []byte, r Receive) []byte {
	w := wire.Encoder{Buf: dst}
	w.String(r.Tenant)
	w.Uvarint(uint64(r.From))
	w.Uvarint(r.Seq)
	w.Uvarint(uint64(r.Amount))
	return w.Buf
}

// AppendComplete encodes a complete payload: tenant, seq.
func AppendComplete(dst []byte, c Complete) []byte {
	w := wire.Encoder{Buf: dst}
	w.String(c.Tenant)
	w.Uvarint(c.Seq)
	return w.Buf
}

// DecodeGive decodes a give payload.
func DecodeGive(b []byte) (Give, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	g := Give{Tenant: readTenant(&d)}
	g.To = readGroup(&d, "to")
	g.Amount = readAmount(&d)
	g.Nonce = d.Uvarint("nonce")
	return g, d.Finish()
}

// DecodeReceive decodes a receive payload.
func DecodeReceive(b []byte) (Receive, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	r := Receive{Tenant: readTenant(&d)}
	r.From = readGroup(&d, "from")
	r.Seq = d.Uvarint("seq")
	if d.Err() == nil && r.Seq == 0 {
		d.Failf("seq 0")
	}
	r.Amount = readAmount(&d)
	return r, d.Finish()
}

// DecodeComplete decodes a complete payload.
func DecodeComplete(b []byte) (Complete, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	c := Complete{Tenant: readTenant(&d)}
	c.Seq = d.Uvarint("seq")
	return c, d.Finish()
}

// readTenant reads a tenant id: 1..maxTenantLen bytes.
func readTenant(d *wire.Decoder) string {
	s := d.String("tenant id", maxTenantLen)
	if d.Err() == nil && s == "" {
		d.Failf("empty tenant id")
	}
	return s
}

func readGroup(d *wire.Decoder, what string) int {
	v := d.Uvarint(what)
	if d.Err() == nil && v >= maxGroups {
		d.Failf("%s group %d out of range", what, v)
	}
	return int(v)
}

func readAmount(d *wire.Decoder) int64 {
	v := d.Uvarint("amount")
	if d.Err() == nil && (v == 0 || v > maxAmount) {
		d.Failf("amount %d outside [1, %d]", v, uint64(maxAmount))
	}
	return int64(v)
}

// AdjustForPartition changes the tenant's committed delta by d. A partition
// hand-off (fsm/partmove) calls it on the apply goroutine in the entry that
// moves the partition's series: the share those series use leaves the giver
// with them (d < 0) and arrives with them at the receiver (d > 0), so usage
// and share move together and the shares of all groups plus what is in
// flight stay the tenant's limit.
func (m *Module) AdjustForPartition(tenant string, d int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenantLocked(tenant).delta += d
}
