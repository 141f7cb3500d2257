package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Log entry byte format, version 1. All integers little-endian or uvarint,
// written and read with fsm/wire (minimal encoding: a non-minimal uvarint is
// refused, so every decodable entry has exactly one byte form).
//
//	offset  size     field
//	0       1        version (1)
//	1       1        type (see the registry below)
//	2       …        uvarint now: Unix minute stamped by the leader, then the payload
//	n-4     4        CRC-32C (Castagnoli) of bytes [0, n-4)
//
// track payload (type 1, cluster version 1):
//
//	uvarint  tenant count T
//	T ×      uvarint tenant id length L, L bytes tenant id,
//	         uvarint hash count H, uvarint new count N (≤ H),
//	         H × 8 bytes hash (little-endian)
//
// expire payload (type 2, cluster version 1):
//
//	uvarint  idle age in minutes (1..MaxIdleAge): series of at least this age
//	         are idle (IdleAge(timeout) = timeout+1; builds before cluster
//	         version 2 sent the timeout itself and accepted at most 60)
//
// Types 4–21 belong to modules, which register them (RegisterModuleEntry) and
// document their payloads: runtime config 4–7 and 20 (fsm/runtimecfg/format.md),
// shares 8–10 (fsm/shares), metering 12–16 (fsm/metering's doc.go), the
// layout table 21 (fsm/layouttable/codec.go, cluster version 5, group 0 only),
// 22 (layout-raise, cluster version 6), partition moves 23–25 (fsm/partmove,
// cluster version 7), shares 26–27 (the wide give and receive, fsm/shares,
// cluster version 7).
//
// drop-tenant payload (type 3, cluster version 2):
//
//	uvarint  tenant id length L, L bytes tenant id
//
// A track entry records series created or refreshed at `now`: the FSM upserts each
// hash with the minute of `now`. The leader has already decided which hashes are
// accepted; the FSM never rejects, so replicas stay identical whatever their limits
// configuration says. Hashes are stored raw rather than delta-coded: the entry is
// written once and read once per replica, and raw copies are the cheapest encode on
// the leader's hot path. N is how many of the hashes the leader counted as new
// (reserved against the limit); applying the entry releases that reservation on the
// leader in the same step that counts the created series (see Tenant).
//
// A drop-tenant entry removes every series of the tenant in the group (all
// shards) and sets its active count to 0: an operator's way to free a tenant's
// usage. Series sent afterwards count as new again.
//
// Versioning. The entry version byte covers the envelope; what a replica can
// apply is decided per type: each type is registered with the cluster version
// that introduced it, and a replica whose build (or configuration) supports a
// lower cluster version treats the type as unknown. An unknown type halts the
// group's FSM on that replica (see FSM.Apply) instead of being skipped, because
// a skip would silently diverge from the replicas that applied it. Leaders
// propose a type only once every voter advertises support for its version, so
// a halt means a bug or an operator bypassing that check, never a normal
// rolling upgrade.

// EntryVersion is the version byte written by this code.
const EntryVersion = 1

// CurrentClusterVersion is the highest cluster version this build can apply:
// the largest Since of the registered entry types (core and modules; a test in
// the server package, which links every module, checks it). Bump it together
// with the row that needs it.
const CurrentClusterVersion = 8

// Entry types.
const (
	EntryTrack      byte = 1
	EntryExpire     byte = 2
	EntryDropTenant byte = 3
)

const entryOverhead = 2 + 4

// Bounds checked on decode so a corrupt entry can never ask for absurd memory.
const (
	maxTenantsPerEntry = 1 << 20
	maxHashesPerEntry  = 1 << 24
	maxNow             = 1 << 40
)

// ErrBadEntry is wrapped by every decode failure of a known entry type (checksum,
// envelope version, field bounds).
var ErrBadEntry = errors.New("bad log entry")

// ErrUnknownEntryType is wrapped when an entry's type is not registered, or was
// introduced in a cluster version above the one the reader supports.
var ErrUnknownEntryType = errors.New("unknown log entry type")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TenantHashes is one tenant's accepted hashes in a track entry.
type TenantHashes struct {
	Tenant string
	Hashes []uint64
	New    int // how many of Hashes the leader reserved as new series
}

// Entry is a decoded log entry.
type Entry struct {
	Type    byte
	Now     int64 // Unix minute
	Idle    int   // expire only
	Tenants []TenantHashes
	Tenant  string // drop-tenant only
	Payload []byte // module-owned types only: the module's bytes
}

// DropResult is what applying a drop-tenant entry returns through raft's
// ApplyFuture.Response on the leader.
type DropResult struct {
	Tenant  string
	Removed int64 // series the tenant held in the group
}

// entryType is one row of the registry: everything the code knows about a type
// lives here, so adding a type is adding a row (and bumping
// CurrentClusterVersion when it needs a new cluster version).
type entryType struct {
	typ   byte
	name  string
	since int // cluster version that introduced the type
	// module names the Module that owns the type ("" for core types). Its
	// payload is opaque here: encode/decode copy it, Apply hands it over.
	module string
	encode func(dst []byte, e *Entry) []byte
	decode func(d *wire.Decoder, e *Entry)
	apply  func(f *FSM, e *Entry) any
}

// registry is the table of entry types: the core rows below, and the rows
// each module registers for itself from its package's init function
// (RegisterModuleEntry), so a module's entry types are listed beside the code
// that applies them. It is written only during package initialisation and
// read-only afterwards; byType indexes it for the hot path (every entry
// encoded or decoded looks its type up).
var (
	registry []*entryType
	byType   [256]*entryType
)

func init() {
	for _, r := range []entryType{
		{typ: EntryTrack, name: "track", since: 1, encode: encodeTrack, decode: decodeTrack, apply: (*FSM).applyTrack},
		{typ: EntryExpire, name: "expire", since: 1, encode: encodeExpire, decode: decodeExpire, apply: (*FSM).applyExpire},
		{typ: EntryDropTenant, name: "drop-tenant", since: 2, encode: encodeDropTenant, decode: decodeDropTenant, apply: (*FSM).applyDropTenant},
	} {
		register(r)
	}
}

// RegisterModuleEntry registers an entry type owned by a module: its type
// byte, name and the cluster version that introduced it. The module applies
// it (see Module); its payload is opaque here. Call it from the module
// package's init function. It panics on a type or name already registered,
// a version outside [1, CurrentClusterVersion] or an empty module name: all
// programming errors that must stop the binary before it touches a log.
func RegisterModuleEntry(module string, typ byte, name string, since int) {
	if module == "" {
		panic(fmt.Sprintf("fsm: entry type %d (%s) registered without a module", typ, name))
	}
	register(entryType{typ: typ, name: name, since: since, module: module, encode: encodeModule, decode: decodeModule})
}

func register(r entryType) {
	switch {
	case r.typ == 0 || byType[r.typ] != nil:
		panic(fmt.Sprintf("fsm: entry type %d (%s) registered twice or reserved", r.typ, r.name))
	case r.name == "":
		panic(fmt.Sprintf("fsm: entry type %d registered without a name", r.typ))
	case r.since < 1 || r.since > CurrentClusterVersion:
		panic(fmt.Sprintf("fsm: entry type %d (%s) since cluster version %d, outside [1, %d]", r.typ, r.name, r.since, CurrentClusterVersion))
	}
	for _, o := range registry {
		if o.name == r.name {
			panic(fmt.Sprintf("fsm: entry type name %q registered twice (types %d and %d)", r.name, o.typ, r.typ))
		}
	}
	row := r
	registry = append(registry, &row)
	byType[r.typ] = &row
}

func lookupType(t byte) *entryType { return byType[t] }

// EntryTypeInfo describes a registered entry type.
type EntryTypeInfo struct {
	Type   byte
	Name   string
	Since  int    // cluster version that introduced it
	Module string // owning Module, "" for core types
}

// EntryTypes lists the registered entry types in type order.
func EntryTypes() []EntryTypeInfo {
	out := make([]EntryTypeInfo, 0, len(registry))
	for _, r := range byType {
		if r != nil {
			out = append(out, EntryTypeInfo{Type: r.typ, Name: r.name, Since: r.since, Module: r.module})
		}
	}
	return out
}

// LookupEntryType returns the registration of type t.
func LookupEntryType(t byte) (EntryTypeInfo, bool) {
	r := lookupType(t)
	if r == nil {
		return EntryTypeInfo{}, false
	}
	return EntryTypeInfo{Type: r.typ, Name: r.name, Since: r.since, Module: r.module}, true
}

// AppendEntry appends the encoding of e to dst. It fails only for an
// unregistered type.
func AppendEntry(dst []byte, e Entry) ([]byte, error) {
	r := lookupType(e.Type)
	if r == nil {
		return dst, fmt.Errorf("%w: %d", ErrUnknownEntryType, e.Type)
	}
	return appendEntry(dst, r, &e), nil
}

func appendEntry(dst []byte, r *entryType, e *Entry) []byte {
	start := len(dst)
	w := wire.Encoder{Buf: append(dst, EntryVersion, r.typ)}
	w.Uvarint(uint64(e.Now))
	dst = r.encode(w.Buf, e)
	return binary.LittleEndian.AppendUint32(dst, crc32Sum(dst[start:]))
}

// AppendTrack appends an encoded track entry to dst.
func AppendTrack(dst []byte, now int64, tenants []TenantHashes) []byte {
	return appendEntry(dst, lookupType(EntryTrack), &Entry{Type: EntryTrack, Now: now, Tenants: tenants})
}

// AppendExpire appends an encoded expire entry to dst.
func AppendExpire(dst []byte, now int64, idleMinutes int) []byte {
	return appendEntry(dst, lookupType(EntryExpire), &Entry{Type: EntryExpire, Now: now, Idle: idleMinutes})
}

// AppendDropTenant appends an encoded drop-tenant entry to dst.
func AppendDropTenant(dst []byte, now int64, tenant string) []byte {
	return appendEntry(dst, lookupType(EntryDropTenant), &Entry{Type: EntryDropTenant, Now: now, Tenant: tenant})
}

// maxTenantLen: a tenant id in an entry is bounded by the entry alone (the
// serving side validates ids before they are logged), as it always was.
const maxTenantLen = math.MaxInt

func encodeTrack(dst []byte, e *Entry) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(uint64(len(e.Tenants)))
	for _, t := range e.Tenants {
		w.String(t.Tenant)
		w.Uvarint(uint64(len(t.Hashes)))
		w.Uvarint(uint64(t.New))
		for _, h := range t.Hashes {
			w.Uint64(h)
		}
	}
	return w.Buf
}

func decodeTrack(d *wire.Decoder, e *Entry) {
	n := d.Count("tenant count", maxTenantsPerEntry)
	total := uint64(0)
	for i := 0; i < n && d.Err() == nil; i++ {
		name := d.String("tenant id", maxTenantLen)
		hn := d.Uvarint("hash count")
		nn := d.Uvarint("new count")
		if nn > hn {
			d.Failf("new count %d exceeds hash count %d", nn, hn)
			break
		}
		total += hn
		if total > maxHashesPerEntry {
			d.Failf("hash count exceeds %d", maxHashesPerEntry)
			break
		}
		raw := d.Raw("hashes", hn*8)
		if d.Err() != nil {
			break
		}
		hs := make([]uint64, hn)
		for j := range hs {
			hs[j] = binary.LittleEndian.Uint64(raw[j*8:])
		}
		e.Tenants = append(e.Tenants, TenantHashes{Tenant: name, Hashes: hs, New: int(nn)})
	}
}

func encodeExpire(dst []byte, e *Entry) []byte {
	return binary.AppendUvarint(dst, uint64(e.Idle))
}

func decodeExpire(d *wire.Decoder, e *Entry) {
	idle := d.Uvarint("idle")
	if d.Err() == nil && (idle < 1 || idle > MaxIdleAge) {
		d.Failf("idle age %d minutes outside [1, %d]", idle, MaxIdleAge)
	}
	e.Idle = int(idle)
}

func encodeDropTenant(dst []byte, e *Entry) []byte {
	w := wire.Encoder{Buf: dst}
	w.String(e.Tenant)
	return w.Buf
}

func decodeDropTenant(d *wire.Decoder, e *Entry) {
	e.Tenant = d.String("tenant id", maxTenantLen)
	if d.Err() == nil && e.Tenant == "" {
		d.Failf("empty tenant id")
	}
}

// DecodeEntry parses and verifies an entry of any type this build knows (up to
// CurrentClusterVersion). Hash slices are freshly allocated.
func DecodeEntry(b []byte) (Entry, error) {
	e, _, err := decodeEntry(b, CurrentClusterVersion)
	return e, err
}

// decodeEntry parses an entry as a replica supporting cluster version maxVersion
// would: a type introduced later is unknown. It also returns the raw type byte
// (0 when the envelope is unreadable) so a halt can name it.
func decodeEntry(b []byte, maxVersion int) (Entry, byte, error) {
	var e Entry
	if len(b) < entryOverhead {
		return e, 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte envelope", ErrBadEntry, len(b), entryOverhead)
	}
	body := b[:len(b)-4]
	if want, got := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32Sum(body); want != got {
		return e, 0, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrBadEntry, want, got)
	}
	if body[0] != EntryVersion {
		return e, 0, fmt.Errorf("%w: unknown version %d (this build reads %d)", ErrBadEntry, body[0], EntryVersion)
	}
	e.Type = body[1]
	r := lookupType(e.Type)
	if r == nil || r.since > maxVersion {
		return e, e.Type, fmt.Errorf("%w: type %d", ErrUnknownEntryType, e.Type)
	}
	// Offsets in errors count from the entry's first byte.
	d := wire.NewDecoder(body, ErrBadEntry)
	d.Raw("version and type", 2) // checked above
	now := d.Uvarint("now")
	if now > maxNow {
		d.Failf("now %d out of range", now)
	}
	e.Now = int64(now)
	if d.Err() == nil {
		r.decode(&d, &e)
	}
	return e, e.Type, d.Finish()
}

func crc32Sum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
