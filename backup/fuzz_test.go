package backup

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzRead feeds arbitrary bytes to Read and Inspect, optionally with every
// checksum recomputed (reseal) so the field checks behind them are reached.
// Neither may panic; failures must wrap ErrCorrupt; both must accept exactly
// the same inputs; and whatever Read accepts must re-encode (Write) to the
// very same bytes.
//
//	go test -run '^$' -fuzz FuzzRead -fuzztime 60s ./backup/
func FuzzRead(f *testing.F) {
	seed := smallFile(f)
	f.Add(seed, false)
	f.Add(seed, true)
	one := encodeFile(f, Header{Partitions: 1, Groups: 1, Shards: 1}, makeGroups(f, testLayout{P: 1, G: 1, S: 1}, 1, 1, 12))
	f.Add(one, false)
	f.Add(one, true)
	raised := encodeFile(f, testHeader(testLayout{P: 4, G: 3, S: 1, B: 2}), makeGroups(f, testLayout{P: 4, G: 3, S: 1, B: 2}, 3, 1, 13))
	f.Add(raised, false)
	f.Add(raised, true)
	f.Fuzz(func(t *testing.T, data []byte, resealIt bool) {
		if resealIt {
			data = reseal(data)
		}
		file, err := Read(bytes.NewReader(data))
		sum, ierr := Inspect(bytes.NewReader(data))
		if (err == nil) != (ierr == nil) {
			t.Fatalf("Read and Inspect disagree: %v / %v", err, ierr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || !errors.Is(ierr, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v / %v", err, ierr)
			}
			return
		}
		var again bytes.Buffer
		if err := Write(&again, file); err != nil {
			t.Fatalf("accepted file does not re-encode: %v", err)
		}
		if !bytes.Equal(again.Bytes(), data) {
			t.Fatalf("re-encoded file differs (%d vs %d bytes)", again.Len(), len(data))
		}
		if sum.Bytes != int64(len(data)) || len(sum.Groups) != file.Header.Groups || len(file.Groups) != file.Header.Groups {
			t.Fatalf("summary %d bytes %d groups, file %d groups of %d", sum.Bytes, len(sum.Groups), len(file.Groups), file.Header.Groups)
		}
	})
}
