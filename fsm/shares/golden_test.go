package shares

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Golden byte forms of the payloads and of the snapshot section, recorded
// from the encoders as they were before the codec moved to fsm/wire. Entries
// and snapshots outlive builds: a change here is a format change.
func TestGoldenPayloadBytes(t *testing.T) {
	g := Give{Tenant: "acme", To: 3, Amount: maxAmount, Nonce: 1 << 33}
	r := Receive{Tenant: "b", From: 0, Seq: 300, Amount: 1}
	c := Complete{Tenant: "acme", Seq: 0}
	for _, x := range []struct {
		name, want string
		b          []byte
		again      func([]byte) ([]byte, error)
	}{
		{"give", "0461636d650380808080808080028080808020", AppendGive(nil, g), func(b []byte) ([]byte, error) { v, err := DecodeGive(b); return AppendGive(nil, v), err }},
		{"receive", "016200ac0201", AppendReceive(nil, r), func(b []byte) ([]byte, error) { v, err := DecodeReceive(b); return AppendReceive(nil, v), err }},
		{"complete", "0461636d6500", AppendComplete(nil, c), func(b []byte) ([]byte, error) { v, err := DecodeComplete(b); return AppendComplete(nil, v), err }},
	} {
		if got := hex.EncodeToString(x.b); got != x.want {
			t.Errorf("%s: %s, want %s", x.name, got, x.want)
			continue
		}
		if again, err := x.again(x.b); err != nil || !bytes.Equal(again, x.b) {
			t.Errorf("%s: golden bytes decode to %x, %v", x.name, again, err)
		}
	}
}

func TestGoldenSectionBytes(t *testing.T) {
	a := newGroup(t, 2)
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "x", To: 0, Amount: 5}))
	a.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "y", From: 3, Seq: 17, Amount: 9}))
	a.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "y", From: 1, Seq: 400, Amount: 1 << 20}))
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "y", To: 1, Amount: 2 << 20}))
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "y", To: 0, Amount: 3}))
	a.apply(t, EntryComplete, AppendComplete(nil, Complete{Tenant: "y", Seq: 4}))
	enc, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sec, err := enc()
	if err != nil {
		t.Fatal(err)
	}
	const want = "010402000201780905000101010005000179f3ff7f838080018980400401050003020190030311"
	if got := hex.EncodeToString(sec); got != want {
		t.Fatalf("section %s, want %s", got, want)
	}
	b := newGroup(t, 2)
	commit, err := b.m.PrepareRestore(sec)
	if err != nil {
		t.Fatalf("golden section does not decode: %v", err)
	}
	commit()
	enc, _ = b.m.Snapshot()
	if again, _ := enc(); !bytes.Equal(again, sec) {
		t.Errorf("restored section re-encodes to %x", again)
	}
}

// A padded (non-minimal) uvarint is refused in payloads and in the section:
// no encoder writes one, and each payload has one byte form.
func TestPaddedVarintRefused(t *testing.T) {
	give := AppendGive(nil, Give{Tenant: "t", To: 1, Amount: 3}) // 01 't' 01 03 00
	padded := append([]byte{0x81, 0x00}, give[1:]...)
	if _, err := DecodeGive(padded); !errors.Is(err, ErrBadPayload) || !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded tenant length: %v", err)
	}
	a := newGroup(t, 2)
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "x", To: 0, Amount: 5}))
	enc, _ := a.m.Snapshot()
	sec, _ := enc() // version, groups 4, group 2, ...
	if sec[1] != testG {
		t.Fatalf("section starts %x", sec[:2])
	}
	padded = append([]byte{sec[0], 0x80 | testG, 0x00}, sec[2:]...)
	if _, err := a.m.PrepareRestore(padded); !errors.Is(err, ErrBadPayload) || !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded groups: %v", err)
	}
}
