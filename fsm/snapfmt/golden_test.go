package snapfmt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// TestGoldenBytes pins the bytes of a version-1 and a version-2 file, recorded
// before the header and varint decoding moved to fsm/wire: snapshots on disk
// and in backups outlive builds, so these bytes change only with a format
// version.
func TestGoldenBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	h := baseHeader(4, 3)
	h.Meta = []byte{1, 0x80, 0x01, 7}
	v1 := encodeBlocks(t, h, []block{
		{0, []TenantSeries{randTenant(r, 0, 1, 4, 0, 64, window(r, 0, 20)), randTenant(r, 2, 2, 4, 0, 64, window(r, 0, 20))}},
		{2, []TenantSeries{randTenant(r, 1, 3000, 4, 2, 64, window(r, 5, 20))}},
		{3, []TenantSeries{randTenant(r, 0, 300, 4, 3, 40, window(r, 7, 1)), randTenant(r, 2, 5, 4, 3, 64, window(r, 0, 120))}},
	})
	v2 := sectionSnapshot(t, []Section{{"metering", []byte{1, 2, 3}}, {"shares", nil}})
	for _, c := range []struct {
		name, want string
		b          []byte
	}{
		{"v1", "f1a3eda0ff71f9430577ead4d699be95e4152387dc7567cce927ddc23634e38c", v1},
		{"v2", "6dd00ad8e18584dcdc88537bca5d79586c0e512a744be64dbe9eea1e67aa0cb1", v2},
	} {
		if sum := sha256.Sum256(c.b); hex.EncodeToString(sum[:]) != c.want {
			t.Errorf("%s: sha256 %x, want %s", c.name, sum, c.want)
		}
		if _, err := readAll(c.b); err != nil {
			t.Errorf("%s: golden file does not read: %v", c.name, err)
		}
	}
}

// A uvarint in a padded (non-minimal) form is refused, in the header and in a
// block: no writer produces one, and each file has one byte form.
func TestPaddedUvarintRefused(t *testing.T) {
	h := baseHeader(4, 2)
	hdr := appendHeader(nil, &h)
	at := headerFixed + headerFields // the meta length, 3
	if hdr[at] != 3 {
		t.Fatalf("meta length byte %d", hdr[at])
	}
	b := append(append(append([]byte(nil), hdr[:at]...), 0x83, 0x00), hdr[at+1:len(hdr)-4]...)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(b)-headerFixed))
	b = withTrailer(binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)))
	_, _, err := decodeBlocks(b)
	mustCorrupt(t, err, "padded meta length")
	if !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded meta length: %v", err)
	}

	uv := func(vals ...uint64) []byte {
		var b []byte
		for _, v := range vals {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	tail := append(uv(3, 0, 3, 10, 3), 0b0, 0b1, modeRaw, 1, 2, 3)
	if _, _, err := decodeBlocks(sealBlock(h, 1, append(uv(1), tail...))); err != nil {
		t.Fatalf("reference block: %v", err)
	}
	_, _, err = decodeBlocks(sealBlock(h, 1, append([]byte{0x81, 0x00}, tail...)))
	mustCorrupt(t, err, "padded tenant count")
	// Block errors carry their cause as text (the reader flattens them).
	if !strings.Contains(err.Error(), wire.ErrNonMinimal.Error()) {
		t.Errorf("padded tenant count: %v", err)
	}
}
