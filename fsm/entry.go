package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Log entry byte format, version 1. All integers little-endian or uvarint.
//
//	offset  size     field
//	0       1        version (1)
//	1       1        type: 1 = track, 2 = expire
//	2       …        payload (below)
//	n-4     4        CRC-32C (Castagnoli) of bytes [0, n-4)
//
// track payload:
//
//	uvarint  now: Unix minute stamped by the leader
//	uvarint  tenant count T
//	T ×      uvarint tenant id length L, L bytes tenant id,
//	         uvarint hash count H, uvarint new count N (≤ H),
//	         H × 8 bytes hash (little-endian)
//
// expire payload:
//
//	uvarint  now: Unix minute stamped by the leader
//	uvarint  idle timeout in minutes (1..MaxIdleMinutes)
//
// A track entry records series created or refreshed at `now`: the FSM upserts each
// hash with the minute of `now`. The leader has already decided which hashes are
// accepted; the FSM never rejects, so replicas stay identical whatever their limits
// configuration says. Hashes are stored raw rather than delta-coded: the entry is
// written once and read once per replica, and raw copies are the cheapest encode on
// the leader's hot path. N is how many of the hashes the leader counted as new
// (reserved against the limit); applying the entry releases that reservation on the
// leader in the same step that counts the created series (see Tenant).

// EntryVersion is the version byte written by this code.
const EntryVersion = 1

// Entry types.
const (
	EntryTrack  byte = 1
	EntryExpire byte = 2
)

const entryOverhead = 2 + 4

// Bounds checked on decode so a corrupt entry can never ask for absurd memory.
const (
	maxTenantsPerEntry = 1 << 20
	maxHashesPerEntry  = 1 << 24
)

// ErrBadEntry is wrapped by every decode failure.
var ErrBadEntry = errors.New("bad log entry")

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
}

// AppendTrack appends an encoded track entry to dst.
func AppendTrack(dst []byte, now int64, tenants []TenantHashes) []byte {
	start := len(dst)
	dst = append(dst, EntryVersion, EntryTrack)
	dst = binary.AppendUvarint(dst, uint64(now))
	dst = binary.AppendUvarint(dst, uint64(len(tenants)))
	for _, t := range tenants {
		dst = binary.AppendUvarint(dst, uint64(len(t.Tenant)))
		dst = append(dst, t.Tenant...)
		dst = binary.AppendUvarint(dst, uint64(len(t.Hashes)))
		dst = binary.AppendUvarint(dst, uint64(t.New))
		for _, h := range t.Hashes {
			dst = binary.LittleEndian.AppendUint64(dst, h)
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32Sum(dst[start:]))
}

// AppendExpire appends an encoded expire entry to dst.
func AppendExpire(dst []byte, now int64, idleMinutes int) []byte {
	start := len(dst)
	dst = append(dst, EntryVersion, EntryExpire)
	dst = binary.AppendUvarint(dst, uint64(now))
	dst = binary.AppendUvarint(dst, uint64(idleMinutes))
	return binary.LittleEndian.AppendUint32(dst, crc32Sum(dst[start:]))
}

// DecodeEntry parses and verifies an entry. Hash slices are freshly allocated.
func DecodeEntry(b []byte) (Entry, error) {
	var e Entry
	if len(b) < entryOverhead {
		return e, fmt.Errorf("%w: %d bytes, shorter than the %d-byte envelope", ErrBadEntry, len(b), entryOverhead)
	}
	body := b[:len(b)-4]
	if want, got := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32Sum(body); want != got {
		return e, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrBadEntry, want, got)
	}
	if body[0] != EntryVersion {
		return e, fmt.Errorf("%w: unknown version %d (this build reads %d)", ErrBadEntry, body[0], EntryVersion)
	}
	e.Type = body[1]
	d := decoder{b: body[2:]}
	now := d.uvarint("now")
	if now > 1<<40 {
		d.fail("now %d out of range", now)
	}
	e.Now = int64(now)
	switch e.Type {
	case EntryTrack:
		n := d.uvarint("tenant count")
		if n > maxTenantsPerEntry {
			d.fail("tenant count %d exceeds %d", n, maxTenantsPerEntry)
		}
		total := uint64(0)
		for i := uint64(0); i < n && d.err == nil; i++ {
			l := d.uvarint("tenant length")
			name := d.bytes(l, "tenant id")
			hn := d.uvarint("hash count")
			nn := d.uvarint("new count")
			if nn > hn {
				d.fail("new count %d exceeds hash count %d", nn, hn)
				break
			}
			total += hn
			if total > maxHashesPerEntry {
				d.fail("hash count exceeds %d", maxHashesPerEntry)
				break
			}
			raw := d.bytes(hn*8, "hashes")
			if d.err != nil {
				break
			}
			hs := make([]uint64, hn)
			for j := range hs {
				hs[j] = binary.LittleEndian.Uint64(raw[j*8:])
			}
			e.Tenants = append(e.Tenants, TenantHashes{Tenant: string(name), Hashes: hs, New: int(nn)})
		}
	case EntryExpire:
		idle := d.uvarint("idle")
		if d.err == nil && (idle < 1 || idle > MaxIdleMinutes) {
			d.fail("idle timeout %d minutes outside [1, %d]", idle, MaxIdleMinutes)
		}
		e.Idle = int(idle)
	default:
		return e, fmt.Errorf("%w: unknown type %d", ErrBadEntry, e.Type)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return e, d.err
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadEntry}, args...)...)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s needs %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func crc32Sum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
