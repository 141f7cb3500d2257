package fsm

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestEntryRoundTrip(t *testing.T) {
	tenants := []TenantHashes{
		{Tenant: "a", Hashes: []uint64{0, 1, math.MaxUint64, 42}},
		{Tenant: "tenant-b", Hashes: []uint64{7}},
		{Tenant: "c", Hashes: []uint64{}},
	}
	e, err := DecodeEntry(AppendTrack(nil, 29_000_000, tenants))
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != EntryTrack || e.Now != 29_000_000 || len(e.Tenants) != 3 {
		t.Fatalf("decoded %+v", e)
	}
	for i := range tenants {
		if e.Tenants[i].Tenant != tenants[i].Tenant || len(e.Tenants[i].Hashes) != len(tenants[i].Hashes) ||
			(len(tenants[i].Hashes) > 0 && !reflect.DeepEqual(e.Tenants[i].Hashes, tenants[i].Hashes)) {
			t.Fatalf("tenant %d: got %+v want %+v", i, e.Tenants[i], tenants[i])
		}
	}
	x, err := DecodeEntry(AppendExpire(nil, 123, 20))
	if err != nil || x.Type != EntryExpire || x.Now != 123 || x.Idle != 20 {
		t.Fatalf("expire round trip: %+v %v", x, err)
	}
}

func TestEntryCorruptionDetected(t *testing.T) {
	good := AppendTrack(nil, 1000, []TenantHashes{{Tenant: "t", Hashes: []uint64{1, 2, 3}}})
	for i := range good {
		for _, bit := range []byte{1, 0x80} {
			b := append([]byte(nil), good...)
			b[i] ^= bit
			if _, err := DecodeEntry(b); !errors.Is(err, ErrBadEntry) {
				t.Fatalf("flip bit %#x of byte %d: err = %v, want ErrBadEntry", bit, i, err)
			}
		}
	}
	for n := 0; n < len(good); n++ {
		if _, err := DecodeEntry(good[:n]); !errors.Is(err, ErrBadEntry) {
			t.Fatalf("truncated to %d bytes: err = %v", n, err)
		}
	}
}

func TestEntryRejectsBadFields(t *testing.T) {
	if _, err := DecodeEntry(AppendExpire(nil, 1, 0)); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("idle 0 accepted: %v", err)
	}
	if _, err := DecodeEntry(AppendExpire(nil, 1, MaxIdleAge+1)); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("idle age > max accepted: %v", err)
	}
	if e, err := DecodeEntry(AppendExpire(nil, 1, MaxIdleAge)); err != nil || e.Idle != MaxIdleAge {
		t.Fatalf("idle age %d (a 60m timeout) refused: %v", MaxIdleAge, err)
	}
	b := AppendExpire(nil, 1, 20)
	b[0] = 9 // unknown version; fix the checksum so only the version is wrong
	b = reseal(b)
	if _, err := DecodeEntry(b); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("unknown version accepted: %v", err)
	}
}

func reseal(b []byte) []byte {
	body := b[:len(b)-4]
	out := append([]byte(nil), body...)
	c := crc32Sum(out)
	return append(out, byte(c), byte(c>>8), byte(c>>16), byte(c>>24))
}

// FuzzDecodeEntry: decoding never panics, every failure wraps ErrBadEntry or
// ErrUnknownEntryType, and every input that decodes re-encodes to exactly the
// same bytes (the format has one byte form per entry: minimal uvarints, fixed
// version byte, checksum over everything), so what a replica applied is what
// the leader wrote.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(AppendTrack(nil, 1000, []TenantHashes{{Tenant: "t", Hashes: []uint64{1, 2, 3}, New: 2}}))
	f.Add(AppendTrack(nil, 1000, []TenantHashes{{Tenant: "a", Hashes: []uint64{}}, {Tenant: "b", Hashes: []uint64{9}}}))
	f.Add(AppendExpire(nil, 1000, 20))
	f.Add(AppendDropTenant(nil, 1000, "t"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Also try with a valid checksum so the fuzzer reaches the field parser.
		for _, in := range [][]byte{b, resealRaw(b)} {
			e, err := DecodeEntry(in)
			if err != nil {
				if !errors.Is(err, ErrBadEntry) && !errors.Is(err, ErrUnknownEntryType) {
					t.Fatalf("error wraps neither ErrBadEntry nor ErrUnknownEntryType: %v", err)
				}
				continue
			}
			again, err := AppendEntry(nil, e)
			if err != nil {
				t.Fatalf("decoded entry of type %d does not encode: %v", e.Type, err)
			}
			if !bytes.Equal(again, in) {
				t.Fatalf("re-encoding differs:\n in    %x\n again %x\n entry %+v", in, again, e)
			}
		}
	})
}

func resealRaw(b []byte) []byte {
	c := crc32Sum(b)
	return append(append([]byte(nil), b...), byte(c), byte(c>>8), byte(c>>16), byte(c>>24))
}
