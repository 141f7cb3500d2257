package backup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

// smallFile is a valid two-group backup of a few series (a few hundred bytes).
func smallFile(tb testing.TB) []byte {
	tb.Helper()
	return encodeFile(tb, testHeader(smallLayout), makeGroups(tb, smallLayout, 6, 2, 11))
}

// TestFlipEveryByte: changing any byte of the file (every bit pattern class:
// one low bit, all bits) makes both Read and Inspect fail with ErrCorrupt.
func TestFlipEveryByte(t *testing.T) {
	b := smallFile(t)
	t.Logf("small file: %d bytes", len(b))
	for i := range b {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			c := bytes.Clone(b)
			c[i] ^= x
			if _, err := Read(bytes.NewReader(c)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d ^ %#x: Read: %v, want ErrCorrupt", i, x, err)
			}
			if _, err := Inspect(bytes.NewReader(c)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d ^ %#x: Inspect: %v, want ErrCorrupt", i, x, err)
			}
		}
	}
}

// TestTruncateEveryOffset: every proper prefix of the file is rejected.
func TestTruncateEveryOffset(t *testing.T) {
	b := smallFile(t)
	for n := 0; n < len(b); n++ {
		if _, err := Read(bytes.NewReader(b[:n])); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("prefix of %d bytes: Read: %v, want ErrCorrupt wrapping io.ErrUnexpectedEOF", n, err)
		}
		if _, err := Inspect(bytes.NewReader(b[:n])); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("prefix of %d bytes: Inspect: %v, want ErrCorrupt wrapping io.ErrUnexpectedEOF", n, err)
		}
	}
	// Readers returning one byte at a time see the same file.
	if _, err := Read(iotest.OneByteReader(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	if _, err := Inspect(iotest.OneByteReader(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
}

// TestHugeLength: a section declaring MaxGroupData bytes (checksums correct)
// over a short input fails as truncation without allocating the declared size.
func TestHugeLength(t *testing.T) {
	b := smallFile(t)
	hdrEnd := headerFixed + int(binary.LittleEndian.Uint16(b[34:])) + 4
	c := bytes.Clone(b)
	binary.LittleEndian.PutUint64(c[hdrEnd+21:], MaxGroupData)
	c = reseal(c)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := Read(bytes.NewReader(c)); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Read: %v, want truncation", err)
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 16<<20 {
		t.Fatalf("Read allocated %d bytes for a %d-byte input", d, len(c))
	}
	if _, err := Inspect(bytes.NewReader(c)); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Inspect: %v, want truncation", err)
	}
	// One past the limit is rejected before reading.
	binary.LittleEndian.PutUint64(c[hdrEnd+21:], MaxGroupData+1)
	c = reseal(c)
	if _, err := Read(bytes.NewReader(c)); !errors.Is(err, ErrCorrupt) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Read: %v, want length out of range", err)
	}
}

// TestReaderIOError: a failure of the underlying reader is returned as is,
// not as corruption.
func TestReaderIOError(t *testing.T) {
	b := smallFile(t)
	boom := errors.New("disk on fire")
	for _, n := range []int{0, 5, 40, 80, len(b) / 2, len(b) - 1, len(b)} {
		r := io.MultiReader(bytes.NewReader(b[:n]), iotest.ErrReader(boom))
		if _, err := Read(r); !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
			t.Fatalf("error after %d bytes: Read: %v", n, err)
		}
		r = io.MultiReader(bytes.NewReader(b[:n]), iotest.ErrReader(boom))
		if _, err := Inspect(r); !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
			t.Fatalf("error after %d bytes: Inspect: %v", n, err)
		}
	}
}

// TestLargeSection exercises reading data in growing steps past readStep.
func TestLargeSection(t *testing.T) {
	x := make([]byte, 2*readStep+readStep/2+3)
	for i := range x {
		x[i] = byte(i * 7)
	}
	rd := &reader{r: bytes.NewReader(x)}
	got, err := rd.readData(len(x), 0)
	if err != nil || !bytes.Equal(got, x) || rd.off != int64(len(x)) {
		t.Fatalf("readData: %v, equal=%v, off %d", err, bytes.Equal(got, x), rd.off)
	}
	rd = &reader{r: bytes.NewReader(x[:len(x)-1])}
	if _, err := rd.readData(len(x), 0); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short readData: %v", err)
	}
	// A large section that is not a snapshot: read whole, then rejected.
	gs := makeGroups(t, smallLayout, 5, 1, 13)
	b := rawFile(testHeader(smallLayout), []rawSection{{0, 1, 1, x}, {1, gs[1].index, gs[1].term, gs[1].data}})
	for name, f := range map[string]func() error{
		"Read":    func() error { _, err := Read(bytes.NewReader(b)); return err },
		"Inspect": func() error { _, err := Inspect(bytes.NewReader(b)); return err },
	} {
		if err := f(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "group 0: snapshot data") {
			t.Fatalf("%s: %v", name, err)
		}
	}
}
