package snapfmt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// TestGoldenBytes pins the bytes of a version-1 and a version-2 file, recorded
// before the header and varint decoding moved to fsm/wire: snapshots on disk
// and in backups outlive builds, so these bytes change only with a format
// version.
func TestGoldenBytes(t *testing.T) {
	write := func(version uint16, sections []Section) []byte {
		r := rand.New(rand.NewPCG(41, 42))
		h := baseHeader(4, 3)
		h.Version = version
		h.Meta = []byte{1, 0x80, 0x01, 7}
		var buf bytes.Buffer
		w, err := NewWriter(&buf, h)
		if err != nil {
			t.Fatal(err)
		}
		shards := [][]TenantSeries{
			{randTenant(r, 0, 1, 4, 0, 64, window(r, 0, 20)), randTenant(r, 2, 2, 4, 0, 64, window(r, 0, 20))},
			{randTenant(r, 1, 3000, 4, 2, 64, window(r, 5, 20))},
			{randTenant(r, 0, 300, 4, 3, 40, window(r, 7, 1)), randTenant(r, 2, 5, 4, 3, 64, window(r, 0, 120))},
		}
		for i, s := range []uint32{0, 2, 3} {
			if err := w.WriteShard(s, shards[i]); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range sections {
			if err := w.WriteSection(s.Name, s.Payload); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, c := range []struct {
		name, want string
		b          []byte
	}{
		{"v1", "f1a3eda0ff71f9430577ead4d699be95e4152387dc7567cce927ddc23634e38c", write(1, nil)},
		{"v2", "2c820b1a12e120788ff41c45332b5f738da8fc869ad95fc88854af6fe7f7e813", write(2, []Section{{"metering", []byte{1, 2, 3}}, {"shares", nil}})},
	} {
		if sum := sha256.Sum256(c.b); hex.EncodeToString(sum[:]) != c.want {
			t.Errorf("%s: sha256 %x, want %s", c.name, sum, c.want)
		}
		if _, err := readAll(c.b); err != nil {
			t.Errorf("%s: golden file does not read: %v", c.name, err)
		}
	}
}
