package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// FuzzRoundTrip: any values encode and decode back; every proper prefix of
// the encoding fails as truncated; a uvarint padded to a longer form is
// refused as non-minimal. Never a panic.
//
//	go test -run '^$' -fuzz FuzzRoundTrip -fuzztime 30s ./fsm/wire/
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint64(0), int64(0), byte(0), false, uint64(0), 0.0, "", []byte{}, []byte{})
	f.Add(uint64(math.MaxUint64), int64(math.MinInt64), byte(255), true, uint64(1<<63), math.Inf(-1), "tenant", []byte{0, 1}, []byte{9})
	f.Add(uint64(300), int64(-65), byte(1), true, uint64(42), math.NaN(), "x", []byte(nil), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, u uint64, i int64, by byte, bo bool, u8 uint64, fl float64, s string, b, r []byte) {
		if len(s) > 1<<10 || len(b) > 1<<10 {
			return
		}
		in := sample{u: u, i: i, by: by, bo: bo, u8: u8, f: fl, s: s, b: b, n: len(r) % 7, r: r}
		enc := in.encode()
		got, err := decodeSample(enc, len(r))
		if err != nil || !sameSample(got, in) {
			t.Fatalf("round trip of %+v: %+v, %v", in, got, err)
		}
		for n := range len(enc) {
			if _, err := decodeSample(enc[:n], len(r)); !errors.Is(err, ErrTruncated) || !errors.Is(err, errKind) {
				t.Fatalf("prefix of %d of %d bytes: %v", n, len(enc), err)
			}
		}
		if lu := len(binary.AppendUvarint(nil, u)); lu < 10 {
			padded := append(enc[:lu-1:lu-1], enc[lu-1]|0x80, 0)
			padded = append(padded, enc[lu:]...)
			if _, err := decodeSample(padded, len(r)); !errors.Is(err, ErrNonMinimal) {
				t.Fatalf("padded uvarint %x accepted: %v", padded, err)
			}
		}
	})
}

// FuzzDecoder reads arbitrary bytes with an arbitrary sequence of field
// reads (schema): it never panics, every failure is an *Error wrapping the
// caller's sentinel, and whatever is accepted re-encodes to the same bytes
// (each value has one byte form).
//
//	go test -run '^$' -fuzz FuzzDecoder -fuzztime 30s ./fsm/wire/
func FuzzDecoder(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9 + 10*3}, sample{u: 300, i: -2, by: 7, bo: true, u8: 1, f: 2, s: "ab", b: []byte{1}, n: 3, r: []byte{1, 2, 3}}.encode())
	f.Add([]byte{0}, []byte{0x80, 0x00})
	f.Add([]byte{6, 8}, []byte{2, 'h', 'i', 200, 1})
	f.Add([]byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, schema, data []byte) {
		var e Encoder
		d := NewDecoder(data, errKind)
		for _, op := range schema {
			switch op % 10 {
			case 0:
				e.Uvarint(d.Uvarint("uvarint"))
			case 1:
				e.Varint(d.Varint("varint"))
			case 2:
				e.Byte(d.Byte("byte"))
			case 3:
				e.Bool(d.Bool("bool"))
			case 4:
				e.Uint64(d.Uint64("uint64"))
			case 5:
				e.Float64(d.Float64("float64"))
			case 6:
				e.String(d.String("string", 64))
			case 7:
				e.Bytes(d.Bytes("bytes", 64))
			case 8:
				e.Uvarint(uint64(d.Count("count", 1000)))
			case 9:
				e.Raw(d.Raw("raw", uint64(op/10)))
			}
		}
		err := d.Finish()
		if err != nil {
			var we *Error
			if !errors.As(err, &we) || !errors.Is(err, errKind) || we.Offset < 0 || we.Offset > len(data) {
				t.Fatalf("error %v (%T)", err, err)
			}
			return
		}
		if !bytes.Equal(e.Buf, data) {
			t.Fatalf("accepted %x re-encodes to %x", data, e.Buf)
		}
	})
}
