package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

var errKind = errors.New("bad test payload")

var uvarints = []uint64{0, 1, 127, 128, 255, 300, 1<<14 - 1, 1 << 14, 1<<35 + 7, 1<<56 - 1, 1 << 63, math.MaxUint64}
var varints = []int64{0, 1, -1, 63, -64, 64, -65, 1 << 40, -(1 << 40), math.MaxInt64, math.MinInt64}

// The encoder writes exactly what encoding/binary writes: every format built
// on it keeps the bytes it had before.
func TestEncoderMatchesEncodingBinary(t *testing.T) {
	for _, v := range uvarints {
		var e Encoder
		e.Uvarint(v)
		if want := binary.AppendUvarint(nil, v); !bytes.Equal(e.Buf, want) {
			t.Errorf("Uvarint(%d) = %x, want %x", v, e.Buf, want)
		}
		e = Encoder{}
		e.Uint64(v)
		if want := binary.LittleEndian.AppendUint64(nil, v); !bytes.Equal(e.Buf, want) {
			t.Errorf("Uint64(%d) = %x, want %x", v, e.Buf, want)
		}
	}
	for _, v := range varints {
		var e Encoder
		e.Varint(v)
		if want := binary.AppendVarint(nil, v); !bytes.Equal(e.Buf, want) {
			t.Errorf("Varint(%d) = %x, want %x", v, e.Buf, want)
		}
	}
	e := Encoder{Buf: []byte{0xee}}
	e.String("ab")
	e.Bytes([]byte{1, 2, 3})
	e.Bool(true)
	e.Bool(false)
	e.Byte(9)
	e.Float64(-2.5)
	e.Raw([]byte{7, 7})
	want := []byte{0xee, 2, 'a', 'b', 3, 1, 2, 3, 1, 0, 9, 0, 0, 0, 0, 0, 0, 4, 0xc0, 7, 7}
	if !bytes.Equal(e.Buf, want) {
		t.Errorf("composite %x, want %x", e.Buf, want)
	}
}

type sample struct {
	u  uint64
	i  int64
	by byte
	bo bool
	u8 uint64
	f  float64
	s  string
	b  []byte
	n  int
	r  []byte
}

func (s sample) encode() []byte {
	var e Encoder
	e.Uvarint(s.u)
	e.Varint(s.i)
	e.Byte(s.by)
	e.Bool(s.bo)
	e.Uint64(s.u8)
	e.Float64(s.f)
	e.String(s.s)
	e.Bytes(s.b)
	e.Uvarint(uint64(s.n))
	e.Raw(s.r)
	return e.Buf
}

// decodeSample reads what encode wrote; rawLen is the length of the raw tail
// (a format knows it from context).
func decodeSample(b []byte, rawLen int) (sample, error) {
	d := NewDecoder(b, errKind)
	s := sample{u: d.Uvarint("u"), i: d.Varint("i"), by: d.Byte("by"), bo: d.Bool("bo"), u8: d.Uint64("u8"),
		f: d.Float64("f"), s: d.String("s", 1<<10), b: d.Bytes("b", 1<<10), n: d.Count("n", 1<<10)}
	s.r = d.Raw("r", uint64(rawLen))
	return s, d.Finish()
}

func sameSample(a, b sample) bool {
	return a.u == b.u && a.i == b.i && a.by == b.by && a.bo == b.bo && a.u8 == b.u8 &&
		math.Float64bits(a.f) == math.Float64bits(b.f) && a.s == b.s && bytes.Equal(a.b, b.b) && a.n == b.n && bytes.Equal(a.r, b.r)
}

func TestRoundTrip(t *testing.T) {
	for k := range uvarints {
		s := sample{u: uvarints[k], i: varints[k%len(varints)], by: byte(k), bo: k%2 == 1, u8: uvarints[len(uvarints)-1-k],
			f: float64(k) - 0.5, s: strings.Repeat("x", k*20), b: bytes.Repeat([]byte{byte(k)}, k), n: k % 4, r: []byte{1, 2, 3}}
		enc := s.encode()
		got, err := decodeSample(enc, len(s.r))
		if err != nil || !sameSample(got, s) {
			t.Fatalf("sample %d: %+v, %v; want %+v", k, got, err, s)
		}
	}
}

// Every proper prefix of a valid message fails with ErrTruncated and the
// caller's sentinel, names a field, and never panics.
func TestTruncationAtEveryByte(t *testing.T) {
	s := sample{u: 1 << 40, i: -1 << 30, by: 3, bo: true, u8: 5, f: 1.5, s: "hello", b: []byte{9, 9}, n: 2, r: []byte{4, 4}}
	enc := s.encode()
	for n := 0; n < len(enc); n++ {
		_, err := decodeSample(enc[:n], len(s.r))
		var we *Error
		if !errors.Is(err, ErrTruncated) || !errors.Is(err, errKind) || !errors.As(err, &we) || we.Field == "" || we.Offset > n {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
}

func TestNonMinimalVarintsRefused(t *testing.T) {
	for _, b := range [][]byte{
		{0x80, 0x00},       // 0 in two bytes
		{0x81, 0x00},       // 1 in two bytes
		{0xff, 0x80, 0x00}, // 127 in three bytes
		{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, // 0 in ten bytes
	} {
		d := NewDecoder(b, errKind)
		if v := d.Uvarint("x"); v != 0 || !errors.Is(d.Err(), ErrNonMinimal) || !errors.Is(d.Err(), errKind) {
			t.Errorf("uvarint %x: %d, %v", b, v, d.Err())
		}
		d = NewDecoder(b, errKind)
		if v := d.Varint("x"); v != 0 || !errors.Is(d.Err(), ErrNonMinimal) {
			t.Errorf("varint %x: %d, %v", b, v, d.Err())
		}
	}
	// Minimal forms of every length decode, the ten-byte maximum included.
	for _, v := range uvarints {
		enc := binary.AppendUvarint(nil, v)
		d := NewDecoder(enc, errKind)
		if got := d.Uvarint("x"); got != v || d.Finish() != nil {
			t.Errorf("%d (%x): %d, %v", v, enc, got, d.Err())
		}
		if len(enc) < 10 {
			padded := append(append([]byte(nil), enc...), 0)
			padded[len(enc)-1] |= 0x80
			d := NewDecoder(padded, errKind)
			if d.Uvarint("x"); !errors.Is(d.Err(), ErrNonMinimal) {
				t.Errorf("%d padded to %x: %v", v, padded, d.Err())
			}
		}
	}
	for _, b := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},       // bit 64
		{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, // 11 bytes
	} {
		if _, _, err := Uvarint(b); !errors.Is(err, ErrOverflow) {
			t.Errorf("%x: %v, want ErrOverflow", b, err)
		}
	}
}

func TestBounds(t *testing.T) {
	var e Encoder
	e.String("abcdef")
	d := NewDecoder(e.Buf, errKind)
	if s := d.String("name", 5); s != "" || !errors.Is(d.Err(), ErrTooLarge) {
		t.Errorf("string above max: %q, %v", s, d.Err())
	}
	// A length far beyond the input is refused before any allocation.
	e = Encoder{}
	e.Uvarint(1 << 40)
	e.Raw([]byte("abc"))
	d = NewDecoder(e.Buf, errKind)
	if b := d.Bytes("blob", math.MaxInt); b != nil || !errors.Is(d.Err(), ErrTruncated) {
		t.Errorf("huge length: %v", d.Err())
	}
	d = NewDecoder(e.Buf, errKind)
	if n := d.Count("items", math.MaxInt); n != 0 || !errors.Is(d.Err(), ErrTruncated) {
		t.Errorf("count beyond the bytes left: %d, %v", n, d.Err())
	}
	d = NewDecoder([]byte{5, 0, 0, 0, 0, 0}, errKind)
	if n := d.Count("items", 4); n != 0 || !errors.Is(d.Err(), ErrTooLarge) {
		t.Errorf("count above max: %d, %v", n, d.Err())
	}
	d = NewDecoder([]byte{2}, errKind)
	if d.Bool("flag"); !errors.Is(d.Err(), ErrNotBool) {
		t.Errorf("bool 2: %v", d.Err())
	}
}

// The first error sticks: later reads return zero values and do not move,
// Failf and Finish keep it.
func TestStickyFirstError(t *testing.T) {
	d := NewDecoder([]byte{1, 0x80}, errKind)
	if d.Uvarint("first") != 1 {
		t.Fatal("first field")
	}
	d.Uvarint("second")
	first := d.Err()
	var we *Error
	if !errors.As(first, &we) || we.Field != "second" || we.Offset != 1 || !errors.Is(first, ErrTruncated) {
		t.Fatalf("first error %v", first)
	}
	if d.Byte("b") != 0 || d.String("s", 10) != "" || d.Raw("r", 0) != nil || d.Count("c", 10) != 0 || d.Varint("v") != 0 || d.Bool("t") {
		t.Fatal("reads after an error return values")
	}
	d.Failf("later %d", 1)
	if d.Finish() != first || d.Offset() != 1 {
		t.Fatalf("error replaced: %v, offset %d", d.Finish(), d.Offset())
	}
	want := "bad test payload: second at offset 1: truncated"
	if first.Error() != want {
		t.Errorf("message %q, want %q", first.Error(), want)
	}
}

func TestFailfAndTrailing(t *testing.T) {
	d := NewDecoder([]byte{7, 200, 1, 9, 9}, errKind)
	d.Byte("version")
	v := d.Uvarint("count")
	if d.Err() != nil || v != 200 {
		t.Fatal(d.Err())
	}
	d.Failf("count %d above %d", v, 100)
	err := d.Finish()
	if !errors.Is(err, errKind) || err.Error() != "bad test payload: count 200 above 100 at offset 1" {
		t.Errorf("Failf: %v", err)
	}
	d = NewDecoder([]byte{7, 9, 9}, nil)
	d.Byte("version")
	err = d.Finish()
	if !errors.Is(err, ErrTrailing) || err.Error() != "2 trailing bytes at offset 1" || d.Len() != 2 {
		t.Errorf("trailing: %v", err)
	}
}
