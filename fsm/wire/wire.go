package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Errors a Decoder's *Error wraps (besides the caller's sentinel), for tests
// and callers that tell them apart.
var (
	// ErrTruncated: the input ends inside a field, or a length or count
	// claims more bytes than are left.
	ErrTruncated = errors.New("truncated")
	// ErrOverflow: a varint longer than 10 bytes, or beyond 64 bits.
	ErrOverflow = errors.New("varint overflows 64 bits")
	// ErrNonMinimal: a varint with padding groups (…0x80 0x00); the value
	// has a shorter encoding, which is the only one accepted.
	ErrNonMinimal = errors.New("non-minimal varint")
	// ErrTooLarge: a length or count above the caller's maximum.
	ErrTooLarge = errors.New("too large")
	// ErrNotBool: a bool byte other than 0 or 1.
	ErrNotBool = errors.New("bool is not 0 or 1")
	// ErrTrailing: bytes left after the last field.
	ErrTrailing = errors.New("trailing bytes")
)

// Error is a decode failure: what failed, where, and why.
type Error struct {
	Kind   error  // the caller's sentinel (may be nil)
	Field  string // the field being read; "" for a check of the caller's or trailing bytes
	Offset int    // byte offset of the field in the decoder's input
	Err    error  // why: wraps one of this package's errors, or the caller's message
}

func (e *Error) Error() string {
	prefix := ""
	if e.Kind != nil {
		prefix = e.Kind.Error() + ": "
	}
	if e.Field == "" {
		return fmt.Sprintf("%s%v at offset %d", prefix, e.Err, e.Offset)
	}
	return fmt.Sprintf("%s%s at offset %d: %v", prefix, e.Field, e.Offset, e.Err)
}

// Unwrap lets errors.Is see both the caller's sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// Uvarint decodes a minimal uvarint from the start of b and returns it with
// the number of bytes it took. err is ErrTruncated, ErrOverflow or
// ErrNonMinimal (n is then 0). For decoders that walk a buffer themselves
// (snapfmt's block payloads); others use Decoder.
func Uvarint(b []byte) (v uint64, n int, err error) {
	v, n = binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, 0, ErrTruncated
	case n < 0:
		return 0, 0, ErrOverflow
	case n > 1 && b[n-1] == 0:
		// The last group carries the top bits; zero there means the value
		// fits in fewer bytes.
		return 0, 0, ErrNonMinimal
	}
	return v, n, nil
}

// Encoder appends fields to Buf in their minimal form. The zero value starts
// an empty buffer; Encoder{Buf: dst} appends to dst.
type Encoder struct {
	Buf []byte
}

// Uvarint appends v as a uvarint.
func (e *Encoder) Uvarint(v uint64) { e.Buf = binary.AppendUvarint(e.Buf, v) }

// Varint appends v as a zig-zag varint.
func (e *Encoder) Varint(v int64) { e.Buf = binary.AppendVarint(e.Buf, v) }

// Byte appends one byte.
func (e *Encoder) Byte(v byte) { e.Buf = append(e.Buf, v) }

// Bool appends 1 for true, 0 for false.
func (e *Encoder) Bool(v bool) {
	var b byte
	if v {
		b = 1
	}
	e.Buf = append(e.Buf, b)
}

// Uint64 appends v as 8 bytes little-endian.
func (e *Encoder) Uint64(v uint64) { e.Buf = binary.LittleEndian.AppendUint64(e.Buf, v) }

// Float64 appends the IEEE-754 bits of v as 8 bytes little-endian (as is: a
// format that wants one form of zero or NaN normalizes before).
func (e *Encoder) Float64(v float64) { e.Uint64(math.Float64bits(v)) }

// String appends the length of s as a uvarint, then s.
func (e *Encoder) String(s string) {
	e.Uvarint(uint64(len(s)))
	e.Buf = append(e.Buf, s...)
}

// Bytes appends the length of b as a uvarint, then b.
func (e *Encoder) Bytes(b []byte) {
	e.Uvarint(uint64(len(b)))
	e.Buf = append(e.Buf, b...)
}

// Raw appends b as it is, without a length.
func (e *Encoder) Raw(b []byte) { e.Buf = append(e.Buf, b...) }

// Decoder reads fields from an input in order. After the first failure every
// read returns the zero value and Err keeps that first error.
type Decoder struct {
	b    []byte
	off  int // next byte to read
	mark int // where the last field started: Failf reports it
	kind error
	err  error
}

// NewDecoder reads b; its errors wrap kind (the format's sentinel, may be nil).
func NewDecoder(b []byte, kind error) Decoder {
	return Decoder{b: b, kind: kind}
}

// Err returns the first error, or nil.
func (d *Decoder) Err() error { return d.err }

// Offset is the offset of the next byte to read.
func (d *Decoder) Offset() int { return d.off }

// Len is the number of bytes left.
func (d *Decoder) Len() int { return len(d.b) - d.off }

// Failf records a failure of the caller's own checks (a value out of range,
// an order violated), at the offset of the field read last. Only the first
// failure is kept.
func (d *Decoder) Failf(format string, args ...any) {
	if d.err == nil {
		d.err = &Error{Kind: d.kind, Offset: d.mark, Err: fmt.Errorf(format, args...)}
	}
}

func (d *Decoder) fail(field string, err error) {
	if d.err == nil {
		d.err = &Error{Kind: d.kind, Field: field, Offset: d.mark, Err: err}
	}
}

// Finish returns the first error, or an ErrTrailing error if bytes are left.
func (d *Decoder) Finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.mark = d.off
		d.fail("", fmt.Errorf("%d %w", len(d.b)-d.off, ErrTrailing))
	}
	return d.err
}

// start begins reading a field; false when an earlier read failed.
func (d *Decoder) start() bool {
	d.mark = d.off
	return d.err == nil
}

// Uvarint reads a minimal uvarint.
func (d *Decoder) Uvarint(what string) uint64 {
	if !d.start() {
		return 0
	}
	v, n, err := Uvarint(d.b[d.off:])
	if err != nil {
		d.fail(what, err)
		return 0
	}
	d.off += n
	return v
}

// Varint reads a minimal zig-zag varint.
func (d *Decoder) Varint(what string) int64 {
	u := d.Uvarint(what)
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

// Byte reads one byte.
func (d *Decoder) Byte(what string) byte {
	if !d.start() {
		return 0
	}
	if d.off >= len(d.b) {
		d.fail(what, ErrTruncated)
		return 0
	}
	v := d.b[d.off]
	d.off++
	return v
}

// Bool reads a byte that must be 0 or 1.
func (d *Decoder) Bool(what string) bool {
	switch d.Byte(what) {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail(what, ErrNotBool)
	return false
}

// Uint64 reads 8 bytes little-endian.
func (d *Decoder) Uint64(what string) uint64 {
	b := d.Raw(what, 8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// Float64 reads the IEEE-754 bits of a float64, 8 bytes little-endian. Any
// bits are accepted: a format that refuses NaN or negative zero checks.
func (d *Decoder) Float64(what string) float64 {
	return math.Float64frombits(d.Uint64(what))
}

// Raw reads the next n bytes, without a length. The result aliases the
// input; nil after a failure.
func (d *Decoder) Raw(what string, n uint64) []byte {
	if !d.start() {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail(what, fmt.Errorf("%w: %d bytes needed, %d left", ErrTruncated, n, len(d.b)-d.off))
		return nil
	}
	v := d.b[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return v
}

// Bytes reads a uvarint length of at most max, then that many bytes. The
// result aliases the input.
func (d *Decoder) Bytes(what string, max int) []byte {
	n := d.length(what, max, "length")
	if d.err != nil {
		return nil
	}
	v := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return v
}

// String reads a uvarint length of at most max, then that many bytes.
func (d *Decoder) String(what string, max int) string {
	return string(d.Bytes(what, max))
}

// length reads a length or count (noun) and checks it against max and the
// bytes left.
func (d *Decoder) length(what string, max int, noun string) int {
	n := d.Uvarint(what)
	if d.err != nil {
		return 0
	}
	if n > uint64(max) {
		d.fail(what, fmt.Errorf("%s %d %w (at most %d)", noun, n, ErrTooLarge, max))
		return 0
	}
	if left := len(d.b) - d.off; n > uint64(left) {
		d.fail(what, fmt.Errorf("%w: %s %d, %d bytes left", ErrTruncated, noun, n, left))
		return 0
	}
	return int(n)
}

// Count reads the number of items that follow, at most max. Every item of
// every format using it takes at least one byte, so a count above the bytes
// left is refused too, before the caller allocates for it.
func (d *Decoder) Count(what string, max int) int {
	return d.length(what, max, "count")
}
