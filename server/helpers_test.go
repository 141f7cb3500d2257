package server

import (
	"bytes"
	"fmt"
	"io"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// stripIndex reduces a snapshot to its logical content — tenants and their
// (hash, minute) series — as a canonical string. A restart appends raft
// configuration and barrier entries and may expire, which move the index and the
// FSM clock without changing which series are held.
func stripIndex(b []byte) []byte {
	r, err := snapfmt.NewReader(bytes.NewReader(b))
	if err != nil {
		return []byte("error: " + err.Error())
	}
	h := r.Header()
	var out bytes.Buffer
	fmt.Fprintf(&out, "P=%d S=%d [%d,%d) tenants=%v\n", h.Partitions, h.Shards, h.GroupLo, h.GroupHi, h.Tenants)
	var lines []string
	for {
		shard, series, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return []byte("error: " + err.Error())
		}
		for _, ts := range series {
			for i, hash := range ts.Hashes {
				lines = append(lines, fmt.Sprintf("%d %s %016x %d", shard, h.Tenants[ts.Tenant], hash, ts.Minutes[i]))
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		out.WriteString(l + "\n")
	}
	return out.Bytes()
}
