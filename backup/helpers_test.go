package backup

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/layout"
)

// testLayout is a cluster layout used by the tests; B, when set, is the
// group count a raised cluster was created with.
type testLayout struct{ P, G, S, B int }

var (
	bigLayout   = testLayout{P: 64, G: 4, S: 16}
	smallLayout = testLayout{P: 8, G: 2, S: 4}
	// raisedLayout: bigLayout raised from 4 groups to 8 (version 2).
	raisedLayout = testLayout{P: 64, G: 8, S: 16, B: 4}
)

// groupState is one group's FSM after applying a known log, its snapshot and
// the raft position it was taken at.
type groupState struct {
	fsm         *fsm.FSM
	index, term uint64
	data        []byte
}

// makeGroups builds one real FSM per group, applies track entries creating
// about perGroup series spread over tenants (and refreshes of some of them),
// and snapshots each with fsm.WriteSnapshot.
func makeGroups(tb testing.TB, l testLayout, perGroup, tenants int, seed uint64) []groupState {
	tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]groupState, l.G)
	for g := range out {
		f, err := fsm.New(fsm.Config{Partitions: l.P, Groups: l.G, Shards: l.S, Group: g, Base: l.B})
		if err != nil {
			tb.Fatal(err)
		}
		lo, hi := f.PartitionRange()
		if hi == lo { // a group a raise added: it owns no partition of its own
			if res := f.Apply(&raft.Log{Index: uint64(10*g + 1), Term: 3, Type: raft.LogCommand, Data: fsm.AppendTrack(nil, 29_000_000, nil)}); res != nil {
				tb.Fatalf("group %d: apply: %v", g, res)
			}
			var buf bytes.Buffer
			if err := f.WriteSnapshot(&buf); err != nil {
				tb.Fatal(err)
			}
			out[g] = groupState{fsm: f, index: uint64(10*g + 1), term: 3, data: buf.Bytes()}
			continue
		}
		now := int64(29_000_000)
		index, term := uint64(10*g+1), uint64(3)
		var known []uint64
		const perEntry = 500
		for made := 0; made < perGroup; {
			var ths []fsm.TenantHashes
			for tn := 0; tn < tenants && made < perGroup; tn++ {
				th := fsm.TenantHashes{Tenant: fmt.Sprintf("tenant-%d", tn)}
				for j := 0; j < perEntry/tenants && made < perGroup; j++ {
					if len(known) > 0 && r.IntN(4) == 0 {
						th.Hashes = append(th.Hashes, known[r.IntN(len(known))])
						continue
					}
					first, last := layout.PartitionHashRange(lo+r.IntN(hi-lo), l.P)
					h := first + r.Uint64N(last-first)
					known = append(known, h)
					th.Hashes = append(th.Hashes, h)
					made++
				}
				if len(th.Hashes) > 0 {
					ths = append(ths, th)
				}
			}
			res := f.Apply(&raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: fsm.AppendTrack(nil, now, ths)})
			if res != nil {
				tb.Fatalf("group %d: apply: %v", g, res)
			}
			index++
			now += int64(r.IntN(2))
		}
		index-- // the last applied entry
		var buf bytes.Buffer
		if err := f.WriteSnapshot(&buf); err != nil {
			tb.Fatal(err)
		}
		out[g] = groupState{fsm: f, index: index, term: term, data: buf.Bytes()}
	}
	return out
}

func testHeader(l testLayout) Header {
	return Header{
		Partitions: l.P, Groups: l.G, Shards: l.S, Base: l.B,
		Created: time.UnixMilli(1_760_000_000_123).UTC(),
		Source:  "cluster=test node=n1 ☃",
	}
}

// encodeFile writes a backup of gs with the Writer.
func encodeFile(tb testing.TB, h Header, gs []groupState) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		tb.Fatal(err)
	}
	for g, s := range gs {
		if err := w.AddGroup(g, s.index, s.term, s.data); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// rawSection is a section for rawFile, which writes whatever it is given.
type rawSection struct {
	group       uint32
	index, term uint64
	data        []byte
}

// rawFile encodes a backup without any of the Writer's checks, with correct
// checksums, so the reader's field checks can be reached.
func rawFile(h Header, sections []rawSection) []byte {
	b := appendHeader(nil, &h)
	chain := crc32.Update(0, castagnoli, b[len(b)-4:])
	for _, rs := range sections {
		s := section{group: rs.group, index: rs.index, term: rs.term, dataLen: uint64(len(rs.data)), dataCRC: crc32.Checksum(rs.data, castagnoli)}
		b = appendFrame(b, &s)
		b = append(b, rs.data...)
		chain = chainAdd(chain, s.crc)
	}
	return appendTrailer(b, uint32(len(sections)), chain)
}

func rawSections(gs []groupState) []rawSection {
	out := make([]rawSection, len(gs))
	for g, s := range gs {
		out[g] = rawSection{uint32(g), s.index, s.term, s.data}
	}
	return out
}

// reseal recomputes every checksum of a (possibly mangled) backup file that
// still parses structurally, so that the checks behind them are exercised.
// The trailer's section count is left alone.
func reseal(in []byte) []byte {
	b := bytes.Clone(in)
	le := binary.LittleEndian
	if len(b) < headerFixed {
		return b
	}
	end := headerFixed + int(le.Uint16(b[34:]))
	if le.Uint16(b[8:]) == 2 {
		end += 4 // the base group count
	}
	if len(b) < end+4 {
		return b
	}
	le.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
	chain := crc32.Update(0, castagnoli, b[end:end+4])
	pos := end + 4
	for pos < len(b) {
		switch b[pos] {
		case kindGroup:
			if len(b)-pos < frameLen {
				return b
			}
			f := b[pos : pos+frameLen]
			dl := le.Uint64(f[21:])
			if dl <= uint64(len(b)-pos-frameLen) {
				le.PutUint32(f[29:], crc32.Checksum(b[pos+frameLen:pos+frameLen+int(dl)], castagnoli))
			}
			le.PutUint32(f[33:], crc32.Checksum(f[:33], castagnoli))
			chain = chainAdd(chain, le.Uint32(f[33:]))
			if dl > uint64(len(b)-pos-frameLen) {
				return b
			}
			pos += frameLen + int(dl)
		case kindEnd:
			if len(b)-pos < trailerLen {
				return b
			}
			t := b[pos : pos+trailerLen]
			le.PutUint32(t[5:], chain)
			le.PutUint32(t[9:], crc32.Checksum(t[:9], castagnoli))
			return b
		default:
			return b
		}
	}
	return b
}
