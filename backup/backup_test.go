package backup

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// TestRoundTrip writes a backup of four real FSM snapshots (and of eight,
// for a cluster raised from four: version 2), reads it back (bytes, header
// and raft positions identical), inspects it (counts equal to the FSMs'),
// restores every group into a fresh FSM (same state) and re-encodes it to
// the same bytes.
func TestRoundTrip(t *testing.T) {
	t.Run("created", func(t *testing.T) { testRoundTrip(t, bigLayout, 1) })
	t.Run("raised", func(t *testing.T) { testRoundTrip(t, raisedLayout, 2) })
}

func testRoundTrip(t *testing.T, l testLayout, version uint16) {
	gs := makeGroups(t, l, 5000, 3, 1)
	h := testHeader(l)
	b := encodeFile(t, h, gs)

	f, err := Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Header.Created.Equal(h.Created) || f.Header.Created.Location() != time.UTC {
		t.Fatalf("created %v, want %v (UTC)", f.Header.Created, h.Created)
	}
	if got := f.Header; got.Partitions != l.P || got.Groups != l.G || got.Shards != l.S || got.Source != h.Source || got.Base != cmp.Or(l.B, l.G) {
		t.Fatalf("header %+v, want %+v", got, h)
	}
	if v := binary.LittleEndian.Uint16(b[8:]); v != version {
		t.Fatalf("written as version %d, want %d", v, version)
	}
	if len(f.Groups) != l.G {
		t.Fatalf("%d groups, want %d", len(f.Groups), l.G)
	}
	for g, s := range gs {
		fg := f.Groups[g]
		if fg.Group != g || fg.Index != s.index || fg.Term != s.term || !bytes.Equal(fg.Data, s.data) {
			t.Fatalf("group %d: got group %d index %d term %d (%d bytes), want index %d term %d (%d bytes)",
				g, fg.Group, fg.Index, fg.Term, len(fg.Data), s.index, s.term, len(s.data))
		}
		// The snapshot restores into an FSM of the same group: same state.
		r, err := fsm.New(fsm.Config{Partitions: l.P, Groups: l.G, Shards: l.S, Group: g, Base: l.B})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Restore(io.NopCloser(bytes.NewReader(fg.Data))); err != nil {
			t.Fatalf("group %d: restore: %v", g, err)
		}
		if got, want := r.Stats(), s.fsm.Stats(); got != want {
			t.Fatalf("group %d: restored stats %+v, want %+v", g, got, want)
		}
	}
	if err := f.CheckLayout(l.P, cmp.Or(l.B, l.G), l.G, l.S); err != nil {
		t.Fatal(err)
	}

	var again bytes.Buffer
	if err := Write(&again, f); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), b) {
		t.Fatal("re-encoded backup differs")
	}

	sum, err := Inspect(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Bytes != int64(len(b)) || len(sum.Groups) != l.G || sum.Header.Source != h.Source {
		t.Fatalf("summary: %d bytes, %d groups, source %q; want %d, %d, %q", sum.Bytes, len(sum.Groups), sum.Header.Source, len(b), l.G, h.Source)
	}
	var total uint64
	totals := map[string]uint64{}
	for g, s := range gs {
		gsum := sum.Groups[g]
		st := s.fsm.Stats()
		if gsum.Group != g || gsum.Index != s.index || gsum.Term != s.term || gsum.Bytes != int64(len(s.data)) ||
			gsum.Series != uint64(st.Series) || len(gsum.Tenants) != st.Tenants || gsum.Snapshot.Series != gsum.Series {
			t.Fatalf("group %d summary %+v, fsm stats %+v", g, gsum, st)
		}
		for i, ts := range gsum.Tenants {
			if i > 0 && gsum.Tenants[i-1].Tenant >= ts.Tenant {
				t.Fatalf("group %d: tenants not sorted: %v", g, gsum.Tenants)
			}
			if want := s.fsm.TenantActive(ts.Tenant); uint64(want) != ts.Series {
				t.Fatalf("group %d tenant %s: %d series, fsm has %d", g, ts.Tenant, ts.Series, want)
			}
			totals[ts.Tenant] += ts.Series
		}
		total += uint64(st.Series)
	}
	if sum.Series != total || total < 4*4000 {
		t.Fatalf("total series %d, want %d (≥ 16000)", sum.Series, total)
	}
	if len(sum.Tenants) != len(totals) {
		t.Fatalf("tenant totals %v, want %v", sum.Tenants, totals)
	}
	for _, ts := range sum.Tenants {
		if totals[ts.Tenant] != ts.Series {
			t.Fatalf("tenant totals %v, want %v", sum.Tenants, totals)
		}
	}
}

// TestZeroCreated: a zero Created is stored as 0 and read back as zero.
func TestZeroCreated(t *testing.T) {
	gs := makeGroups(t, smallLayout, 10, 2, 2)
	h := testHeader(smallLayout)
	h.Created, h.Source = time.Time{}, ""
	f, err := Read(bytes.NewReader(encodeFile(t, h, gs)))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Header.Created.IsZero() || f.Header.Source != "" {
		t.Fatalf("header %+v", f.Header)
	}
}

func TestCheckLayout(t *testing.T) {
	f := &File{Header: Header{Partitions: 64, Groups: 4, Shards: 16}}
	if err := f.CheckLayout(64, 4, 4, 16); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][3]int{{128, 4, 16}, {64, 8, 16}, {64, 4, 32}} {
		err := f.CheckLayout(c[0], c[1], c[1], c[2])
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("%v: got %v, want ErrMismatch", c, err)
		}
		if !strings.Contains(err.Error(), "backup was taken with partitions=64 groups=4 shards=16 but the cluster has") {
			t.Fatalf("unhelpful message: %v", err)
		}
	}
	// A raised cluster's backup fits only a cluster raised from the same count.
	r := &File{Header: Header{Partitions: 64, Groups: 8, Base: 4, Shards: 16}}
	if err := r.CheckLayout(64, 4, 8, 16); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]int{{8, 8}, {4, 4}, {2, 8}} {
		err := r.CheckLayout(64, c[0], c[1], 16)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "groups=8 (raised from 4)") {
			t.Fatalf("raised backup into base %d groups %d: %v, want ErrMismatch naming the raise", c[0], c[1], err)
		}
	}
}

// TestVersion2Header: a version-2 header whose base is not below its group
// count is corrupt (version 2 is written for a raised cluster only, so every
// file has one encoding); a base of 0 likewise.
func TestVersion2Header(t *testing.T) {
	b := encodeFile(t, testHeader(raisedLayout), makeGroups(t, raisedLayout, 100, 2, 3))
	srcLen := int(binary.LittleEndian.Uint16(b[34:]))
	for _, base := range []uint32{0, 8, 9} {
		bad := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(bad[36+srcLen:], base)
		_, err := Read(bytes.NewReader(reseal(bad))) // only the field is wrong
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "base") {
			t.Errorf("base %d in a version-2 header: %v, want ErrCorrupt naming the base", base, err)
		}
	}
}

// TestWriterRefuses: every invalid call returns ErrInvalid, writes nothing
// and leaves the Writer usable; the file finally written is valid.
func TestWriterRefuses(t *testing.T) {
	l := smallLayout
	gs := makeGroups(t, l, 50, 2, 3)
	other := makeGroups(t, bigLayout, 50, 2, 4)

	for name, h := range map[string]Header{
		"partitions": {Partitions: 0, Groups: 1, Shards: 1},
		"groups>P":   {Partitions: 2, Groups: 3, Shards: 1},
		"shards":     {Partitions: 2, Groups: 1, Shards: 3},
		"source":     {Partitions: 2, Groups: 1, Shards: 1, Source: strings.Repeat("x", MaxSource+1)},
		"utf8":       {Partitions: 2, Groups: 1, Shards: 1, Source: "\xff"},
	} {
		var buf bytes.Buffer
		if _, err := NewWriter(&buf, h); !errors.Is(err, ErrInvalid) || buf.Len() != 0 {
			t.Errorf("header %s: err %v, %d bytes written", name, err, buf.Len())
		}
	}

	var buf bytes.Buffer
	w, err := NewWriter(&buf, testHeader(l))
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(what string, f func() error, want string) {
		t.Helper()
		n := buf.Len()
		err := f()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want ErrInvalid mentioning %q", what, err, want)
		}
		if buf.Len() != n {
			t.Errorf("%s: %d bytes written", what, buf.Len()-n)
		}
	}
	g0, g1 := gs[0], gs[1]
	refuse("out of order", func() error { return w.AddGroup(1, g1.index, g1.term, g1.data) }, "out of order")
	refuse("empty", func() error { return w.AddGroup(0, g0.index, g0.term, nil) }, "empty")
	refuse("garbage", func() error { return w.AddGroup(0, g0.index, g0.term, []byte("not a snapshot")) }, "not a valid snapshot")
	refuse("truncated", func() error { return w.AddGroup(0, g0.index, g0.term, g0.data[:len(g0.data)-1]) }, "not a valid snapshot")
	refuse("other group", func() error { return w.AddGroup(0, g1.index, g1.term, g1.data) }, "partitions [4, 8)")
	refuse("other layout", func() error { return w.AddGroup(0, other[0].index, other[0].term, other[0].data) }, "partitions=64 shards=16")
	refuse("index", func() error { return w.AddGroup(0, g0.index+1, g0.term, g0.data) }, "index")
	refuse("term", func() error { return w.AddGroup(0, g0.index, g0.term+1, g0.data) }, "term")
	refuse("close early", w.Close, "groups 0..1 missing")
	if err := w.AddGroup(0, g0.index, g0.term, g0.data); err != nil {
		t.Fatal(err)
	}
	refuse("repeat", func() error { return w.AddGroup(0, g0.index, g0.term, g0.data) }, "out of order")
	refuse("close early", w.Close, "groups 1..1 missing")
	if err := w.AddGroup(1, g1.index, g1.term, g1.data); err != nil {
		t.Fatal(err)
	}
	refuse("extra", func() error { return w.AddGroup(2, g1.index, g1.term, g1.data) }, "already added")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	refuse("after close", func() error { return w.AddGroup(2, g1.index, g1.term, g1.data) }, "closed")
	if _, err := Read(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("file written after refusals: %v", err)
	}
	if !bytes.Equal(buf.Bytes(), encodeFile(t, testHeader(l), gs)) {
		t.Fatal("refused calls changed the output")
	}
}

// failWriter fails every write after the first n bytes.
type failWriter struct {
	n   int
	err error
}

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, w.err
	}
	w.n -= len(p)
	return len(p), nil
}

func TestWriterIOError(t *testing.T) {
	gs := makeGroups(t, smallLayout, 20, 2, 5)
	full := encodeFile(t, testHeader(smallLayout), gs)
	boom := errors.New("disk full")
	for _, n := range []int{0, 10, 100, len(full) / 2, len(full) - 1} {
		fw := &failWriter{n: n, err: boom}
		err := Write(fw, &File{Header: testHeader(smallLayout), Groups: []Group{
			{0, gs[0].index, gs[0].term, gs[0].data}, {1, gs[1].index, gs[1].term, gs[1].data}}})
		if !errors.Is(err, boom) || errors.Is(err, ErrInvalid) {
			t.Fatalf("fail after %d bytes: got %v", n, err)
		}
	}
}

// TestReaderChecks reaches the field checks behind the checksums with files
// whose checksums are all correct.
func TestReaderChecks(t *testing.T) {
	l := smallLayout
	gs := makeGroups(t, l, 30, 2, 6)
	h := testHeader(l)
	secs := rawSections(gs)
	s0, s1 := secs[0], secs[1]
	big := makeGroups(t, bigLayout, 10, 1, 7)
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"missing group", rawFile(h, []rawSection{s0}), "groups 1..1 missing"},
		{"no groups", rawFile(h, nil), "groups 0..1 missing"},
		{"swapped", rawFile(h, []rawSection{s1, s0}), "holds group 1, want group 0"},
		{"repeated", rawFile(h, []rawSection{s0, s0}), "holds group 0, want group 1"},
		{"extra", rawFile(h, []rawSection{s0, s1, s1}), "after the last of 2 groups"},
		{"index", rawFile(h, []rawSection{{0, s0.index + 1, s0.term, s0.data}, s1}), "section says index"},
		{"term", rawFile(h, []rawSection{{0, s0.index, 0, s0.data}, s1}), "section says index"},
		{"wrong group data", rawFile(h, []rawSection{{0, s1.index, s1.term, s1.data}, s1}), "group 0 owns [0, 4)"},
		{"other layout", rawFile(h, []rawSection{{0, big[0].index, big[0].term, big[0].data}, s1}), "snapshot has partitions=64 shards=16"},
		{"not a snapshot", rawFile(h, []rawSection{{0, 1, 1, []byte("hello")}, s1}), "snapfmt"},
		{"empty data", rawFile(h, []rawSection{{0, 1, 1, nil}, s1}), "data length 0"},
		{"snapshot + junk", rawFile(h, []rawSection{{0, s0.index, s0.term, append(bytes.Clone(s0.data), 0)}, s1}), "after the trailer"},
		{"bad layout", rawFile(Header{Partitions: 2, Groups: 3, Shards: 1}, nil), "layout"},
		{"trailing data", append(rawFile(h, secs), 0), "after the trailer"},
	}
	// A header declaring fewer sections than groups.
	hb := rawFile(h, secs)
	hb[30] = 1
	cases = append(cases, struct {
		name string
		b    []byte
		want string
	}{"sections != groups", reseal(hb), "1 sections declared for 2 groups"})
	// A future version.
	vb := rawFile(h, secs)
	vb[8] = 3
	cases = append(cases, struct {
		name string
		b    []byte
		want string
	}{"version", reseal(vb), "format version 3"})
	// A wrong section count in the trailer.
	tb := rawFile(h, secs)
	tb[len(tb)-trailerLen+1] = 3
	cases = append(cases, struct {
		name string
		b    []byte
		want string
	}{"trailer count", reseal(tb), "declares 3 sections, file has 2"})

	for _, c := range cases {
		_, err := Read(bytes.NewReader(c.b))
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Read: got %v, want ErrCorrupt mentioning %q", c.name, err, c.want)
		}
		if _, err := Inspect(bytes.NewReader(c.b)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Inspect: got %v, want ErrCorrupt mentioning %q", c.name, err, c.want)
		}
	}
	if _, err := Read(bytes.NewReader(reseal(vb))); !errors.Is(err, ErrVersion) {
		t.Errorf("version: %v does not wrap ErrVersion", err)
	}
	if _, err := Read(bytes.NewReader(rawFile(h, []rawSection{{0, 1, 1, []byte("hello")}, s1}))); !errors.Is(err, snapfmt.ErrCorrupt) {
		t.Errorf("bad snapshot: %v does not wrap snapfmt.ErrCorrupt", err)
	}
}
