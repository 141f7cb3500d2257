package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Golden byte forms of the entries and of the snapshot meta, recorded from
// the encoders as they were before the decoders moved to fsm/wire. Log
// entries and snapshots outlive builds: a change here is a format change
// (a new entry version, a new meta version), never a refactor.
func TestGoldenEntryBytes(t *testing.T) {
	mod, err := AppendModuleEntry(nil, testCounterType, 29_000_123, []byte{0x05})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		b          []byte
	}{
		{"track", "0101c082ea0d030161040200000000000000000100000000000000ffffffffffffffff2a000000000000000874656e616e742d620100efcdab896745230101630000cd5ba6e9", AppendTrack(nil, 29_000_000, []TenantHashes{
			{Tenant: "a", Hashes: []uint64{0, 1, math.MaxUint64, 42}, New: 2},
			{Tenant: "tenant-b", Hashes: []uint64{0x0123456789abcdef}},
			{Tenant: "c", Hashes: []uint64{}},
		})},
		{"track empty", "0101000001736330", AppendTrack(nil, 0, nil)},
		{"expire", "0102c182ea0d3db1835b11", AppendExpire(nil, 29_000_001, MaxIdleAge)},
		{"drop-tenant", "01038080808080200461636d65187bb139", AppendDropTenant(nil, 1<<40, "acme")},
		{"module", "01fabb83ea0d0505804857", mod},
	} {
		if got := hex.EncodeToString(c.b); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
			continue
		}
		e, err := DecodeEntry(c.b)
		if err != nil {
			t.Errorf("%s: golden bytes do not decode: %v", c.name, err)
			continue
		}
		if again, err := AppendEntry(nil, e); err != nil || !bytes.Equal(again, c.b) {
			t.Errorf("%s: re-encoded %x, %v", c.name, again, err)
		}
	}
}

func TestGoldenSnapshotBytes(t *testing.T) {
	f := newTestFSM(t, 1)
	for _, e := range randomLog(f, 7, 40, 30) {
		if res := f.Apply(&raft.Log{Index: e.index, Term: 1, Type: raft.LogCommand, Data: e.data}); res != nil {
			if err, ok := res.(error); ok {
				t.Fatal(err)
			}
		}
	}
	const wantMeta = "01c382ea0dc382ea0d05"
	if got := hex.EncodeToString(f.encodeMeta()); got != wantMeta {
		t.Errorf("meta %s, want %s", got, wantMeta)
	}
	snap := snapBytes(t, f)
	const wantSum = "f817243eb0ace1e8e58e0d81325b4c0b8ac84624eabd7087146973405fc1aa4b"
	if got := sha256.Sum256(snap); hex.EncodeToString(got[:]) != wantSum {
		t.Errorf("snapshot sha256 %x, want %s", got, wantSum)
	}
	g := newTestFSM(t, 1)
	if err := g.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapBytes(t, g), snap) {
		t.Error("restored FSM writes other bytes")
	}
}

// The snapshot meta refuses a padded (non-minimal) uvarint, like entries.
func TestMetaPaddedUvarintRefused(t *testing.T) {
	if _, _, idle, err := decodeMeta([]byte{metaVersion, 5, 5, 5}); err != nil || idle != 5 {
		t.Fatalf("reference meta: %v", err)
	}
	if _, _, _, err := decodeMeta([]byte{metaVersion, 5, 5, 0x85, 0x00}); !errors.Is(err, snapfmt.ErrCorrupt) || !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded idle: %v", err)
	}
}
