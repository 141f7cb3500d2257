package layouttable

import (
	"bytes"
	"testing"

	"github.com/tollgate-io/tollgate/layout"
)

// The decoder faces bytes from the log: whatever it gets, it must not panic,
// and what it accepts must be canonical (re-encoding gives the same bytes)
// and a valid table.
func FuzzDecodeSet(f *testing.F) {
	f.Add(AppendSet(nil, Set{Expected: 0, Table: layout.ArithmeticTable(64, 4).Move(31, 2)}))
	f.Add(AppendSet(nil, Set{Expected: 7, Table: layout.ArithmeticTable(1, 1)}))
	f.Add([]byte{0, 1, 64, 4, 1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSet(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendSet(nil, s), b) {
			t.Fatalf("accepted a non-canonical encoding %x", b)
		}
		if err := s.Table.Validate(s.Table.Partitions()); err != nil {
			t.Fatalf("accepted an invalid table: %v", err)
		}
	})
}
