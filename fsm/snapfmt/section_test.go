package snapfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
)

// sectionSnapshot is a version-2 file: the blocks of smallSnapshot followed by
// two sections.
func sectionSnapshot(t *testing.T, sections []Section) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(31, 32))
	h := baseHeader(4, 4)
	h.Version = 2
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteShard(1, []TenantSeries{randTenant(r, 0, 30, 4, 1, 64, window(r, 0, 20))}); err != nil {
		t.Fatal(err)
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

func readAll(b []byte) (*Reader, error) {
	rd, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	for {
		if _, _, err := rd.Next(); err == io.EOF {
			return rd, nil
		} else if err != nil {
			return rd, err
		}
	}
}

func TestSectionsRoundTrip(t *testing.T) {
	want := []Section{{"config", []byte("limits v7")}, {"empty", []byte{}}, {"metering", bytes.Repeat([]byte{0xab}, 5000)}}
	b := sectionSnapshot(t, want)
	rd, err := readAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Header().Version != 2 {
		t.Fatalf("header version %d, want 2", rd.Header().Version)
	}
	got := rd.Sections()
	if len(got) != len(want) {
		t.Fatalf("%d sections, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Name != want[i].Name || !bytes.Equal(got[i].Payload, want[i].Payload) {
			t.Fatalf("section %d = %q (%d bytes), want %q (%d bytes)", i, got[i].Name, len(got[i].Payload), want[i].Name, len(want[i].Payload))
		}
	}
	sum, err := Inspect(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Sections) != 3 || sum.Sections[2].Bytes != 5000 || sum.Blocks != 1 {
		t.Fatalf("inspect: %+v blocks %d", sum.Sections, sum.Blocks)
	}
}

// A header version of 0 keeps writing version 1, byte for byte, so a build that
// reads only version 1 still reads every file without sections.
func TestVersionOneUnchanged(t *testing.T) {
	b := smallSnapshot(t)
	if v := b[6]; v != 1 {
		t.Fatalf("file version %d, want 1", v)
	}
	rd, err := readAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Header().Version != 1 || len(rd.Sections()) != 0 {
		t.Fatalf("version %d sections %d", rd.Header().Version, len(rd.Sections()))
	}
}

func TestWriteSectionRefusals(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, baseHeader(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteSection("config", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("section in a version-1 file: %v", err)
	}
	h := baseHeader(4, 4)
	h.Version = 2
	w, err = NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "Config", "a b", string(bytes.Repeat([]byte("a"), MaxSectionName+1))} {
		if err := w.WriteSection(name, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("name %q: %v", name, err)
		}
	}
	if err := w.WriteSection("m", nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"m", "a"} {
		if err := w.WriteSection(name, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("name %q after m: %v", name, err)
		}
	}
	if err := w.WriteShard(0, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shard after section: %v", err)
	}
	h.Version = Version + 1
	if _, err := NewWriter(&buf, h); !errors.Is(err, ErrInvalid) {
		t.Fatalf("future version: %v", err)
	}
}

// Every single-byte change and every truncation of a file with sections is
// detected.
func TestSectionCorruption(t *testing.T) {
	b := sectionSnapshot(t, []Section{{"config", []byte("abcdefgh")}, {"z", []byte("xyz")}})
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x41
		if _, err := readAll(c); err == nil {
			t.Fatalf("byte %d flipped: no error", i)
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v does not wrap ErrCorrupt", i, err)
		}
	}
	for n := 0; n < len(b); n++ {
		if _, err := readAll(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	// A version-1 file may not hold sections even with valid checksums: rewrite
	// the version and fix the header checksum.
	c := bytes.Clone(b)
	c[6] = 1
	fixHeaderCRC(t, c)
	if _, err := readAll(c); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("section in a version-1 file: %v", err)
	}
}

// fixHeaderCRC recomputes the header checksum after a test edited the header.
func fixHeaderCRC(t *testing.T, b []byte) {
	t.Helper()
	bodyLen := int(binary.LittleEndian.Uint32(b[8:]))
	end := headerFixed + bodyLen
	binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
}
