package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func open(t *testing.T, dir string, opts Options) *WAL {
	t.Helper()
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return w
}

func entry(g uint16, i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: i/10 + 1, Type: raft.LogCommand,
		Data: []byte(fmt.Sprintf("g%d-e%d-%s", g, i, bytes.Repeat([]byte{'x'}, int(i%37)))),
		Extensions: func() []byte {
			if i%3 == 0 {
				return []byte{byte(i)}
			}
			return nil
		}(),
		AppendedAt: time.Unix(1700000000, int64(i)).UTC()}
}

// checkLog asserts that group g holds exactly first..last as written by entry.
func checkLog(t *testing.T, w *WAL, g uint16, first, last uint64) {
	t.Helper()
	l := w.Group(g)
	f, _ := l.FirstIndex()
	la, _ := l.LastIndex()
	if f != first || la != last {
		t.Fatalf("group %d: log %d..%d, want %d..%d", g, f, la, first, last)
	}
	if first == 0 {
		return
	}
	for i := first; i <= last; i++ {
		var got raft.Log
		if err := l.GetLog(i, &got); err != nil {
			t.Fatalf("group %d GetLog(%d): %v", g, i, err)
		}
		want := entry(g, i)
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("group %d entry %d: got %+v, want %+v", g, i, got, *want)
		}
	}
	var x raft.Log
	if err := l.GetLog(first-1, &x); first > 1 && !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("group %d GetLog(%d) before the log: %v", g, first-1, err)
	}
	if err := l.GetLog(last+1, &x); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("group %d GetLog(%d) after the log: %v", g, last+1, err)
	}
}

func store(t *testing.T, w *WAL, g uint16, from, to uint64) {
	t.Helper()
	var ls []*raft.Log
	for i := from; i <= to; i++ {
		ls = append(ls, entry(g, i))
	}
	if err := w.Group(g).StoreLogs(ls); err != nil {
		t.Fatalf("group %d StoreLogs(%d..%d): %v", g, from, to, err)
	}
}

// Many groups appending at once share rounds, and everything survives a
// reopen.
func TestGroupCommitConcurrentAndReopen(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentSize: 64 << 10})
	const groups, batches, per = 8, 60, 5
	var wg sync.WaitGroup
	for g := uint16(0); g < groups; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				store(t, w, g, uint64(b*per+1), uint64(b*per+per))
			}
		}()
	}
	wg.Wait()
	for g := uint16(0); g < groups; g++ {
		checkLog(t, w, g, 1, batches*per)
	}
	st := w.Stats()
	if st.Requests != groups*batches || st.Rounds == 0 || st.Rounds > st.Requests || st.FailedRounds != 0 || st.Bytes == 0 || st.Segments != len(w.segs) {
		t.Fatalf("Stats %+v: want %d requests in at most as many rounds", st, groups*batches)
	}
	t.Logf("%d appends in %d rounds", st.Requests, st.Rounds)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Group(0).StoreLog(entry(0, batches*per+1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("StoreLog after Close: %v, want ErrClosed", err)
	}
	w = open(t, dir, Options{})
	defer w.Close()
	if rec := w.Recovered(); rec.TornBytes != 0 || rec.Records != groups*batches*per || rec.Segments < 2 {
		t.Fatalf("Recovered %+v: want %d records in several segments, no torn tail", rec, groups*batches*per)
	}
	for g := uint16(0); g < groups; g++ {
		checkLog(t, w, g, 1, batches*per)
	}
}

// Entries must follow the last one; a refused append changes nothing and
// does not fail the others of its round.
func TestAppendMustFollow(t *testing.T) {
	w := open(t, t.TempDir(), Options{})
	defer w.Close()
	store(t, w, 1, 5, 9) // an empty log starts anywhere
	if err := w.Group(1).StoreLog(entry(1, 11)); err == nil {
		t.Fatal("entry 11 after 9 was accepted")
	}
	if err := w.Group(1).StoreLogs([]*raft.Log{entry(1, 10), entry(1, 12)}); err == nil {
		t.Fatal("non-consecutive entries were accepted")
	}
	if err := w.Group(1).StoreLog(&raft.Log{Index: 0}); err == nil {
		t.Fatal("index 0 was accepted")
	}
	store(t, w, 1, 10, 10)
	checkLog(t, w, 1, 5, 10)
	if err := w.Group(1).DeleteRange(7, 8); err == nil {
		t.Fatal("deleting from the middle was accepted")
	}
	checkLog(t, w, 1, 5, 10)
}

// Suffix truncation, prefix compaction and whole-log removal replay the
// same after a reopen, and dead segments are deleted.
func TestDeleteRangeReplaysAndFreesSegments(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentSize: 8 << 10})
	store(t, w, 0, 1, 400)
	store(t, w, 1, 1, 100)
	mustDel := func(g uint16, a, b uint64) {
		t.Helper()
		if err := w.Group(g).DeleteRange(a, b); err != nil {
			t.Fatalf("group %d DeleteRange(%d, %d): %v", g, a, b, err)
		}
	}
	mustDel(0, 351, 400) // conflict: suffix
	store(t, w, 0, 351, 420)
	mustDel(0, 1, 300) // compaction: prefix
	mustDel(1, 1, 100) // snapshot installed: the whole log
	store(t, w, 1, 500, 510)
	checkLog(t, w, 0, 301, 420)
	checkLog(t, w, 1, 500, 510)
	before := len(w.segs)
	for i := uint64(421); i <= 2000; i += 100 {
		store(t, w, 0, i, i+99)
	}
	mustDel(0, 301, 1900)
	segs, _ := listSegments(dir)
	if len(segs) >= before+15 || len(w.segs) != len(segs) {
		t.Fatalf("%d segment files (%d in memory) after compacting nearly everything; %d before appending", len(segs), len(w.segs), before)
	}
	checkLog(t, w, 0, 1901, 2020)
	checkLog(t, w, 1, 500, 510)
	w.Close()
	w = open(t, dir, Options{})
	defer w.Close()
	checkLog(t, w, 0, 1901, 2020)
	checkLog(t, w, 1, 500, 510)
	checkLog(t, w, 2, 0, 0)
}

// lastFrameBounds writes two rounds and returns the file and where the
// second frame starts and ends.
func twoRounds(t *testing.T, dir string) (path string, start, end int64) {
	t.Helper()
	w := open(t, dir, Options{})
	store(t, w, 3, 1, 10)
	start = w.segs[0].size
	store(t, w, 3, 11, 13)
	end = w.segs[0].size
	path = w.segs[0].path
	w.Close()
	return path, start, end
}

// A crash can leave any prefix of the last round on disk: every one is cut
// off and the earlier round is intact.
func TestTornTailAtEveryOffset(t *testing.T) {
	src := t.TempDir()
	path, start, end := twoRounds(t, src)
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for cut := start; cut < end; cut++ {
		for _, fill := range []string{"cut", "zeros", "garbage"} {
			dir := t.TempDir()
			data := append([]byte(nil), full[:cut]...)
			switch fill { // what the rest of the unfinished write left behind
			case "zeros":
				data = append(data, make([]byte, end-cut)...)
			case "garbage":
				g := make([]byte, end-cut)
				for i := range g {
					g[i] = byte(rand.IntN(256))
				}
				data = append(data, g...)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o600); err != nil {
				t.Fatal(err)
			}
			w, err := Open(dir, Options{})
			if err != nil {
				t.Fatalf("cut at %d (%s): %v", cut, fill, err)
			}
			checkLog(t, w, 3, 1, 10)
			rec := w.Recovered()
			// Zeros from where the frame began are what ZeroAhead leaves
			// past the last frame: nothing of the round is on disk, so
			// there is no torn tail to report.
			if cut > start || fill == "garbage" {
				if rec.TornBytes != int64(len(data))-start || rec.TornOffset != start {
					t.Fatalf("cut at %d (%s): Recovered %+v, want a torn tail of %d bytes at %d", cut, fill, rec, int64(len(data))-start, start)
				}
			}
			// The log carries on where the torn write began.
			store(t, w, 3, 11, 11)
			w.Close()
			w = open(t, dir, Options{})
			checkLog(t, w, 3, 1, 11)
			w.Close()
		}
	}
}

// A bad frame followed by a good one is not a torn write: Open refuses the
// log and names the file and offset.
func TestCorruptionBeforeTheTailIsRefused(t *testing.T) {
	src := t.TempDir()
	path, start, _ := twoRounds(t, src)
	full, _ := os.ReadFile(path)
	for _, at := range []int64{segHeaderLen, segHeaderLen + 3, segHeaderLen + 9, segHeaderLen + frameHdrLen + 5, start - 1} {
		dir := t.TempDir()
		data := append([]byte(nil), full...)
		data[at] ^= 0x40
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(dir, Options{})
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: Open = %v, want ErrCorrupt", at, err)
		}
		if !bytes.Contains([]byte(err.Error()), []byte(filepath.Base(path))) {
			t.Fatalf("error does not name the file: %v", err)
		}
	}
	// A damaged segment that is not the last one is refused even at its end.
	dir := t.TempDir()
	data := append([]byte(nil), full...)
	data[len(data)-1] ^= 1
	os.WriteFile(filepath.Join(dir, segName(1)), data, 0o600)
	w := open(t, t.TempDir(), Options{}) // a valid second segment to copy
	w.Close()
	hdr, _ := os.ReadFile(filepath.Join(w.dir, segName(1)))
	hdr[8] = 2
	os.WriteFile(filepath.Join(dir, segName(2)), hdr, 0o600)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged end of a middle segment: Open = %v, want ErrCorrupt", err)
	}
}

// An entry read back from disk is checked: a flipped byte is an error, not
// wrong data.
func TestGetLogChecksEntries(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{})
	defer w.Close()
	store(t, w, 0, 1, 3)
	at := w.groups[0].locs[1]
	b := []byte{0}
	at.seg.f.ReadAt(b, at.off+int64(at.n)-1)
	b[0] ^= 1
	at.seg.f.WriteAt(b, at.off+int64(at.n)-1)
	var l raft.Log
	if err := w.Group(0).GetLog(2, &l); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GetLog of a damaged entry: %v, want ErrCorrupt", err)
	}
}

// One process at a time; a read-only open needs no lock and writes nothing.
func TestLockAndReadOnly(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{})
	store(t, w, 0, 1, 2)
	if _, err := Open(dir, Options{}); err == nil {
		t.Fatal("a second writer opened a locked log")
	}
	ro := open(t, dir, Options{ReadOnly: true})
	checkLog(t, ro, 0, 1, 2)
	if err := ro.Group(0).StoreLog(entry(0, 3)); err == nil {
		t.Fatal("a read-only log accepted an append")
	}
	ro.Close()
	w.Close()
}

// An idle group's few entries do not keep the log's files for ever: raft
// never compacts a log that stopped growing, so the log carries them
// forward and the segments behind them go, while a busy group compacts.
func TestIdleGroupDoesNotPinSegments(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentSize: 16 << 10})
	store(t, w, 7, 1, 3) // then idle
	big := make([]byte, 12<<10)
	for i := uint64(1); i <= 3; i++ { // idle too, and larger than a quarter of a segment
		if err := w.Group(8).StoreLog(&raft.Log{Index: i, Term: 1, Data: big}); err != nil {
			t.Fatal(err)
		}
	}
	maxSegs := 0
	for i := uint64(1); i <= 10000; i += 10 {
		store(t, w, 1, i, i+9)
		if i > 200 && i%100 == 1 { // compaction after a snapshot, keeping 100
			if err := w.Group(1).DeleteRange(1, i-100); err != nil {
				t.Fatal(err)
			}
		}
		maxSegs = max(maxSegs, w.Stats().Segments)
	}
	segs, _ := listSegments(dir)
	t.Logf("%d segment files at the end, %d at most", len(segs), maxSegs)
	if len(segs) > 10 || maxSegs > 12 {
		t.Fatalf("%d segment files at the end, %d at most, for an idle group of 3 entries and a busy one of ~200", len(segs), maxSegs)
	}
	checkLog(t, w, 7, 1, 3)
	first, _ := w.Group(1).FirstIndex()
	checkLog(t, w, 1, first, 10000)
	w.Close()
	w = open(t, dir, Options{})
	defer w.Close()
	checkLog(t, w, 7, 1, 3)
	checkLog(t, w, 1, first, 10000)
	var e raft.Log
	if err := w.Group(8).GetLog(3, &e); err != nil || len(e.Data) != len(big) {
		t.Fatalf("group 8 entry 3 after carrying: %v, %d bytes", err, len(e.Data))
	}
}

// A segment missing between two others is a lost file, not a leftover:
// Open refuses the log and names it.
func TestMissingSegmentIsRefused(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentSize: 1 << 10})
	for i := uint64(1); i <= 200; i += 20 { // a segment rolls over after a round
		store(t, w, 0, i, i+19)
	}
	w.Close()
	segs, err := listSegments(dir)
	if err != nil || len(segs) < 3 {
		t.Fatalf("%d segments (%v), want at least 3", len(segs), err)
	}
	missing := filepath.Join(dir, segName(segs[1]))
	if err := os.Remove(missing); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, Options{})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), segName(segs[1])) {
		t.Fatalf("Open with %s missing: %v, want ErrCorrupt naming it", missing, err)
	}
}

// fileLen is the length of the file at path.
func fileLen(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A round that grows the segment writes ZeroAhead bytes of zeros past its
// frame (never past SegmentSize); the rounds that fit in them leave the
// file's length alone. Every segment, the finished ones included, reopens
// with its zero tail and its entries intact, and the log carries on at the
// end of the last frame, not at the end of the file.
func TestZeroAheadKeepsTheFileLength(t *testing.T) {
	dir := t.TempDir()
	const ahead, segSize = 1 << 10, 4 << 10
	opts := Options{ZeroAhead: ahead, SegmentSize: segSize}
	w := open(t, dir, opts)
	store(t, w, 1, 1, 1)
	seg := w.segs[0]
	first := seg.size
	if got, want := fileLen(t, seg.path), first+ahead; got != want {
		t.Fatalf("after the first round the file is %d bytes, want %d (the frame's end + ZeroAhead)", got, want)
	}
	grown := 0
	for i := uint64(2); i <= 200; i++ {
		before := fileLen(t, w.segs[len(w.segs)-1].path)
		last := w.segs[len(w.segs)-1]
		store(t, w, 1, i, i)
		if last != w.segs[len(w.segs)-1] {
			continue // a new segment was started
		}
		after := fileLen(t, last.path)
		switch {
		case after == before:
		case after > segSize:
			t.Fatalf("round %d grew the file to %d bytes, past SegmentSize %d", i, after, segSize)
		default:
			grown++
			if after < last.size {
				t.Fatalf("round %d: file %d bytes, frames end at %d", i, after, last.size)
			}
		}
	}
	if len(w.segs) < 3 {
		t.Fatalf("%d segments, want several (the test writes past SegmentSize)", len(w.segs))
	}
	// A round of one entry is under 100 bytes: 199 rounds in 1 KB steps grow
	// the files a few times per segment, not every round.
	if grown == 0 || grown > 20 {
		t.Fatalf("the file grew in %d of 199 rounds, want a few", grown)
	}
	// Only the active segment keeps its zeros: a finished one is cut to
	// its frames (a previous release reads zeros there as corruption).
	for i, sg := range w.segs {
		active := i == len(w.segs)-1
		if tail := fileLen(t, sg.path) > sg.size; tail != active {
			t.Fatalf("segment %d of %d: zeros past its frames %v, want %v", i+1, len(w.segs), tail, active)
		}
	}
	// A crash now: the files as they are, the active one with its zeros.
	crash := t.TempDir()
	for _, sg := range w.segs {
		b, err := os.ReadFile(sg.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(crash, filepath.Base(sg.path)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if st := w.Stats(); st.GrowingRounds == 0 || st.GrowingRounds > st.Rounds/4 || st.ZeroAheadFailed != 0 {
		t.Fatalf("%d of %d rounds grew the file (%d without their zeros), want a few", st.GrowingRounds, st.Rounds, st.ZeroAheadFailed)
	}
	w.Close()
	if last := w.segs[len(w.segs)-1]; fileLen(t, last.path) != last.size {
		t.Fatalf("after Close the active segment is %d bytes, its frames end at %d", fileLen(t, last.path), last.size)
	}

	w = open(t, crash, opts)
	if rec := w.Recovered(); rec.TornBytes != 0 {
		t.Fatalf("zeros past the frames were reported as a torn write: %+v", rec)
	}
	checkLog(t, w, 1, 1, 200)
	w.Close()
	w = open(t, dir, opts)
	if rec := w.Recovered(); rec.TornBytes != 0 {
		t.Fatalf("zeros past the frames were reported as a torn write: %+v", rec)
	}
	checkLog(t, w, 1, 1, 200)
	store(t, w, 1, 201, 205)
	w.Close()
	w = open(t, dir, opts)
	checkLog(t, w, 1, 1, 205)
	w.Close()
}

// Zeros past the last frame followed by anything else are not a clean end:
// garbage there is a torn write in the last segment, and a whole valid
// frame after zeros is corruption.
func TestZerosThenDataAreNotAnEnd(t *testing.T) {
	src := t.TempDir()
	path, _, end := twoRounds(t, src)
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	good := append([]byte(nil), full[:end]...)

	dir := t.TempDir()
	data := append(append(append([]byte(nil), good...), make([]byte, 100)...), 0xAB, 0xCD)
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	w := open(t, dir, Options{})
	if rec := w.Recovered(); rec.TornOffset != end || rec.TornBytes != 102 {
		t.Fatalf("zeros then garbage: Recovered %+v, want a torn tail of 102 bytes at %d", rec, end)
	}
	checkLog(t, w, 3, 1, 13)
	w.Close()

	// A copy of the last frame after 100 zeros: valid, so the zeros before
	// it are damage, not an end.
	dir = t.TempDir()
	_, start, _ := twoRounds(t, t.TempDir())
	data = append(append(append([]byte(nil), good...), make([]byte, 100)...), good[start:end]...)
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a valid frame after zeros: Open = %v, want ErrCorrupt", err)
	}
}

// On a disk with room for the frames but not for the zeros ahead, rounds
// still succeed (the zeros are an optimisation) and are counted; the log
// reopens intact. A real tmpfs, filled.
func TestZeroAheadOnANearlyFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): the test needs root with mount permission", dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	logDir := filepath.Join(dir, "wal")
	opts := Options{ZeroAhead: 1 << 20}
	w := open(t, logDir, opts)
	// Fill what is left but about 64 KB: room for rounds, not for 1 MB of
	// zeros.
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, free-64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	stored := uint64(0)
	for i := uint64(1); i < 2000; i++ {
		if err := w.Group(1).StoreLogs([]*raft.Log{entry(1, i)}); err != nil {
			break // the frames themselves no longer fit
		}
		stored = i
	}
	s := w.Stats()
	if s.ZeroAheadFailed == 0 {
		t.Fatalf("no round lacked its zeros ahead (%d rounds, %d grew the file); the filler left too much room", s.Rounds, s.GrowingRounds)
	}
	if stored < 100 {
		t.Fatalf("only entries 1..%d stored: rounds failed for want of room for their zeros", stored)
	}
	w.Close()
	w = open(t, logDir, opts)
	checkLog(t, w, 1, 1, stored)
	w.Close()
}
