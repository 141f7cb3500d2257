package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultSegmentSize is the size past which a new segment file is started.
const DefaultSegmentSize = 64 << 20

const (
	segMagic      = "TGWAL\x00\x00\x01"
	segHeaderLen  = 16
	frameHdrLen   = 12
	recHdrLen     = 8
	bodyFixedLen  = 2 + 1 + 1 + 8 + 8 + 8 + 4
	maxFrameLen   = 1 << 30
	kindEntry     = 1
	kindTruncate  = 2 // entries after index are void
	kindCompact   = 3 // entries up to and including index are void
	segmentSuffix = ".wal"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrClosed is returned by every operation after Close.
var ErrClosed = errors.New("wal: closed")

// ErrCorrupt wraps every error Open returns for a log it cannot trust.
var ErrCorrupt = errors.New("wal: corrupt")

// Options configure Open.
type Options struct {
	// SegmentSize: a new segment file is started once the active one is
	// larger (default DefaultSegmentSize).
	SegmentSize int64
	// NoSync skips fdatasync. Tests only: a crash can lose acknowledged
	// entries.
	NoSync bool
	// ReadOnly opens the log for reading only (offline tools): nothing is
	// written, not even the cut of a torn tail, and every write fails.
	ReadOnly bool
	// FS is the file layer under the segments; nil is the OS (OSFS).
	FS FS
	// ZeroAhead: when a frame grows the active segment, this many bytes
	// of zeros are written past it in the same round (never past
	// SegmentSize), so that the next rounds overwrite the file in place.
	// Why: an fdatasync that must also make a new file length durable
	// commits the file system's journal; one that only flushes data does
	// not, and costs about 40 % less CPU and half the time on ext4
	// (BENCHMARKS.md). 0 is DefaultZeroAhead; negative turns it off.
	ZeroAhead int64
}

// DefaultZeroAhead is Options.ZeroAhead's default.
const DefaultZeroAhead = 256 << 10

// Recovered is what Open found.
type Recovered struct {
	Segments int
	Records  int
	// TornFile/TornOffset/TornBytes: the torn write cut off the last
	// segment (TornBytes 0 when there was none).
	TornFile   string
	TornOffset int64
	TornBytes  int64
}

// WAL is the node's shared log. Its methods are safe for concurrent use.
type WAL struct {
	dir  string
	opts Options
	lock *os.File

	// mu guards groups, segs and the published state; readers (GetLog,
	// FirstIndex, LastIndex) take it shared.
	mu     sync.RWMutex
	groups map[uint16]*groupState
	segs   []*segment // oldest first; the last is the active one

	// qmu guards the queue the writer drains.
	qmu     sync.Mutex
	qcond   *sync.Cond
	queue   []*request
	closing bool
	done    chan struct{}

	recovered Recovered
	stats     counters
	// unremoved: dead segments' files still to delete, oldest first
	// (removeSegments; writer goroutine only).
	unremoved []string
}

// counters are updated by the writer only.
type counters struct {
	rounds, failed, requests, bytes, syncNanos atomic.Uint64
	growing, zeroFailed                        atomic.Uint64 // rounds that grew the file; rounds whose zeros ahead could not be written
	writing                                    atomic.Int64  // unix ns the round in flight began its write; 0: none
}

// Stalled is how long the round now being written and synced has taken so
// far (0 when none is): a disk whose fsync takes seconds shows here while
// it happens, not only once it returns.
func (w *WAL) Stalled() time.Duration {
	if at := w.stats.writing.Load(); at != 0 {
		return time.Since(time.Unix(0, at))
	}
	return 0
}

// Stats are the log's counters since Open.
type Stats struct {
	Rounds       uint64  // frames written: one write and one fdatasync each
	FailedRounds uint64  // rounds whose write or fdatasync failed
	Requests     uint64  // appends and deletes written (Requests/Rounds is the batching)
	Bytes        uint64  // bytes written
	SyncSeconds  float64 // time spent in write + fdatasync
	// GrowingRounds: rounds whose frame grew the active segment, so that
	// their fdatasync also made a new file length durable (the costly
	// kind; with ZeroAhead about one per ZeroAhead bytes written).
	GrowingRounds uint64
	// ZeroAheadFailed: of those, rounds whose zeros ahead could not be
	// written (a nearly full disk); they went on without them.
	ZeroAheadFailed uint64
	Segments        int // segment files now
}

// Stats returns the log's counters.
func (w *WAL) Stats() Stats {
	w.mu.RLock()
	n := len(w.segs)
	w.mu.RUnlock()
	return Stats{
		Rounds: w.stats.rounds.Load(), FailedRounds: w.stats.failed.Load(),
		GrowingRounds: w.stats.growing.Load(), ZeroAheadFailed: w.stats.zeroFailed.Load(),
		Requests: w.stats.requests.Load(), Bytes: w.stats.bytes.Load(),
		SyncSeconds: float64(w.stats.syncNanos.Load()) / 1e9, Segments: n,
	}
}

type segment struct {
	seq  uint64
	path string
	f    File
	size int64 // the end of the last frame
	// zeroed is the file's length: from size to zeroed it holds zeros,
	// written ahead so that the frames written there do not grow the file
	// (see Options.ZeroAhead).
	zeroed int64
	// live counts the entries of the groups' logs stored here; the
	// segment may go once it is 0 (and it is the oldest).
	live      int
	liveBytes int64 // their records' bytes
}

type loc struct {
	seg *segment
	off int64 // of the record header
	n   uint32
}

// groupState is one group's live log: first..last, locs[i] is first+i.
// Empty is first == 0.
type groupState struct {
	first, last uint64
	locs        []loc
}

func (s *groupState) empty() bool { return s.first == 0 }

// request is one caller's append or delete, waiting for its round.
type request struct {
	group uint16
	kind  uint8
	index uint64   // truncate/compact: the index; entry: first index
	count int      // entries
	buf   []byte   // encoded records
	offs  []uint32 // entry: offset of each record in buf
	err   error
	done  chan struct{}
}

// Open opens (creating if needed) the log in dir and replays it.
func Open(dir string, opts Options) (*WAL, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.FS == nil {
		opts.FS = OSFS{}
	}
	if opts.ZeroAhead == 0 {
		opts.ZeroAhead = DefaultZeroAhead
	}
	if !opts.ReadOnly {
		if err := mkdirDurable(opts.FS, dir); err != nil {
			return nil, fmt.Errorf("wal: create %s: %w", dir, err)
		}
	}
	w := &WAL{dir: dir, opts: opts, groups: map[uint16]*groupState{}, done: make(chan struct{})}
	w.qcond = sync.NewCond(&w.qmu)
	if !opts.ReadOnly {
		lf, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("wal: open lock: %w", err)
		}
		if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = lf.Close()
			return nil, fmt.Errorf("wal: %s is locked (is a node running on this data dir?): %w", dir, err)
		}
		w.lock = lf
	}
	if err := w.replay(); err != nil {
		w.closeFiles()
		return nil, err
	}
	if !opts.ReadOnly {
		if len(w.segs) == 0 {
			if err := w.newSegment(1); err != nil {
				w.closeFiles()
				return nil, err
			}
		}
		go w.writer()
	} else {
		close(w.done)
	}
	return w, nil
}

// Recovered reports what Open found.
func (w *WAL) Recovered() Recovered { return w.recovered }

// Close waits for queued writes, then closes the files. Later calls fail
// with ErrClosed.
func (w *WAL) Close() error {
	w.qmu.Lock()
	if w.closing {
		w.qmu.Unlock()
		<-w.done
		return nil
	}
	w.closing = true
	w.qcond.Broadcast()
	w.qmu.Unlock()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.segs) > 0 {
		w.trimZeros(w.segs[len(w.segs)-1])
	}
	return w.closeFiles()
}

func (w *WAL) closeFiles() error {
	var first error
	for _, s := range w.segs {
		if s.f != nil {
			if err := s.f.Close(); err != nil && first == nil {
				first = err
			}
			s.f = nil
		}
	}
	if w.lock != nil {
		_ = w.lock.Close()
		w.lock = nil
	}
	return first
}

// mkdirDurable creates dir and its missing parents, and syncs the parent
// of each one it creates: a directory's entry in its parent is no more
// durable than a file's, and a log directory lost in a power cut would
// take every acknowledged entry with it.
func mkdirDurable(fsys FS, dir string) error {
	dir = filepath.Clean(dir)
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(created) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- { // outermost first
		if err := fsys.SyncDir(filepath.Dir(created[i])); err != nil {
			return fmt.Errorf("sync %s: %w", filepath.Dir(created[i]), err)
		}
	}
	return nil
}

func segName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, segmentSuffix) }

// newSegment creates segment seq, durable (file and directory) before any
// frame is written to it. Caller holds mu or is single-threaded.
func (w *WAL) newSegment(seq uint64) error {
	path := filepath.Join(w.dir, segName(seq))
	f, err := w.opts.FS.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("wal: create segment: %w", err)
	}
	var hdr [segHeaderLen]byte
	copy(hdr[:], segMagic)
	binary.LittleEndian.PutUint64(hdr[8:], seq)
	if _, err := f.WriteAt(hdr[:], 0); err == nil {
		err = w.sync(f)
	}
	if err == nil {
		err = w.opts.FS.SyncDir(w.dir)
	}
	if err != nil {
		_ = f.Close()
		_ = w.opts.FS.Remove(path)
		return fmt.Errorf("wal: create segment: %w", err)
	}
	w.segs = append(w.segs, &segment{seq: seq, path: path, f: f, size: segHeaderLen, zeroed: segHeaderLen})
	return nil
}

func (w *WAL) sync(f File) error {
	if w.opts.NoSync {
		return nil
	}
	return f.Datasync()
}

// listSegments returns the segment files of dir in order.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wal: read %s: %w", dir, err)
	}
	var seqs []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, segmentSuffix) {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, segmentSuffix), 16, 64)
		if err != nil || len(name) != 16+len(segmentSuffix) {
			return nil, fmt.Errorf("%w: unexpected file %s in %s", ErrCorrupt, name, dir)
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	return seqs, nil
}

// ---- encoding ----

func appendRecord(dst []byte, group uint16, kind, typ uint8, index, term uint64, appendedAt int64, ext, data []byte) []byte {
	blen := bodyFixedLen + len(ext) + len(data)
	start := len(dst)
	dst = slices.Grow(dst, recHdrLen+blen)
	dst = dst[:start+recHdrLen+bodyFixedLen]
	b := dst[start:]
	binary.LittleEndian.PutUint32(b[0:], uint32(blen))
	body := b[recHdrLen:]
	binary.LittleEndian.PutUint16(body[0:], group)
	body[2] = kind
	body[3] = typ
	binary.LittleEndian.PutUint64(body[4:], index)
	binary.LittleEndian.PutUint64(body[12:], term)
	binary.LittleEndian.PutUint64(body[20:], uint64(appendedAt))
	binary.LittleEndian.PutUint32(body[28:], uint32(len(ext)))
	dst = append(dst, ext...)
	dst = append(dst, data...)
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[start+recHdrLen:], castagnoli))
	return dst
}

type record struct {
	group      uint16
	kind, typ  uint8
	index      uint64
	term       uint64
	appendedAt int64
	ext, data  []byte // alias the buffer they were decoded from
}

// decodeRecord decodes the record at the start of b; it returns the record
// and its total length.
func decodeRecord(b []byte) (record, int, error) {
	var r record
	if len(b) < recHdrLen {
		return r, 0, errors.New("short record header")
	}
	blen := int(binary.LittleEndian.Uint32(b[0:]))
	if blen < bodyFixedLen || blen > len(b)-recHdrLen {
		return r, 0, fmt.Errorf("record length %d out of range", blen)
	}
	body := b[recHdrLen : recHdrLen+blen]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return r, 0, errors.New("record checksum mismatch")
	}
	r.group = binary.LittleEndian.Uint16(body[0:])
	r.kind = body[2]
	r.typ = body[3]
	r.index = binary.LittleEndian.Uint64(body[4:])
	r.term = binary.LittleEndian.Uint64(body[12:])
	r.appendedAt = int64(binary.LittleEndian.Uint64(body[20:]))
	extLen := int(binary.LittleEndian.Uint32(body[28:]))
	if extLen > blen-bodyFixedLen {
		return r, 0, fmt.Errorf("extension length %d out of range", extLen)
	}
	r.ext = body[bodyFixedLen : bodyFixedLen+extLen]
	r.data = body[bodyFixedLen+extLen:]
	if r.kind < kindEntry || r.kind > kindCompact {
		return r, 0, fmt.Errorf("unknown record kind %d", r.kind)
	}
	return r, recHdrLen + blen, nil
}

func putFrameHeader(b []byte, payload []byte) {
	binary.LittleEndian.PutUint32(b[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[0:8], castagnoli))
}

// frameAt checks the frame at off in data: it returns the payload length,
// or an error saying what is wrong.
func frameAt(data []byte, off int64) (int, error) {
	rest := data[off:]
	if len(rest) < frameHdrLen {
		return 0, fmt.Errorf("%d bytes left, a frame header needs %d", len(rest), frameHdrLen)
	}
	if crc32.Checksum(rest[0:8], castagnoli) != binary.LittleEndian.Uint32(rest[8:]) {
		return 0, errors.New("frame header checksum mismatch")
	}
	n := int(binary.LittleEndian.Uint32(rest[0:]))
	if n > len(rest)-frameHdrLen {
		return 0, fmt.Errorf("frame of %d bytes runs past the end of the file", n)
	}
	if crc32.Checksum(rest[frameHdrLen:frameHdrLen+n], castagnoli) != binary.LittleEndian.Uint32(rest[4:]) {
		return 0, errors.New("frame checksum mismatch")
	}
	return n, nil
}

// ---- replay ----

func (w *WAL) replay() error {
	seqs, err := listSegments(w.dir)
	if err != nil {
		return err
	}
	// Segments are created with consecutive numbers and removed oldest
	// first, each removal durable before the next: a hole means a lost
	// segment, whose records the later ones may depend on.
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			return fmt.Errorf("%w: %s: segment %s is missing (the log continues at %s)", ErrCorrupt, w.dir, segName(seqs[i-1]+1), segName(seqs[i]))
		}
	}
	for i, seq := range seqs {
		last := i == len(seqs)-1
		path := filepath.Join(w.dir, segName(seq))
		flag := os.O_RDWR
		if w.opts.ReadOnly {
			flag = os.O_RDONLY
		}
		f, err := w.opts.FS.OpenFile(path, flag, 0)
		if err != nil {
			return fmt.Errorf("wal: open %s: %w", path, err)
		}
		data, err := w.opts.FS.ReadFile(path)
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("wal: read %s: %w", path, err)
		}
		seg := &segment{seq: seq, path: path, f: f}
		if len(data) < segHeaderLen || string(data[:8]) != segMagic || binary.LittleEndian.Uint64(data[8:]) != seq {
			if last && !w.opts.ReadOnly && len(data) < segHeaderLen+frameHdrLen {
				// Created but its header never made durable: a crash
				// inside newSegment. Nothing was written to it.
				_ = f.Close()
				if err := w.opts.FS.Remove(path); err != nil {
					return fmt.Errorf("wal: remove unfinished segment %s: %w", path, err)
				}
				if err := w.opts.FS.SyncDir(w.dir); err != nil {
					return fmt.Errorf("wal: remove unfinished segment %s: %w", path, err)
				}
				w.recovered.TornFile, w.recovered.TornBytes = path, int64(len(data))
				continue
			}
			_ = f.Close()
			return fmt.Errorf("%w: %s: bad segment header", ErrCorrupt, path)
		}
		w.segs = append(w.segs, seg)
		off := int64(segHeaderLen)
		seg.zeroed = int64(len(data))
		for off < int64(len(data)) {
			n, ferr := frameAt(data, off)
			if ferr != nil && allZero(data[off:]) {
				// Zeros written ahead of the frames (Options.ZeroAhead),
				// or a round that never reached the disk in them: the
				// segment's frames end here.
				data = data[:off]
				break
			}
			if ferr != nil {
				if !last || validFrameAfter(data, off+1) {
					return fmt.Errorf("%w: %s offset %d: %v", ErrCorrupt, path, off, ferr)
				}
				// A torn write at the tail: never acknowledged.
				w.recovered.TornFile, w.recovered.TornOffset, w.recovered.TornBytes = path, off, int64(len(data))-off
				if !w.opts.ReadOnly {
					if err := f.Truncate(off); err != nil {
						return fmt.Errorf("wal: cut torn tail of %s at %d: %w", path, off, err)
					}
					if err := w.sync(f); err != nil {
						return fmt.Errorf("wal: cut torn tail of %s: %w", path, err)
					}
				}
				data = data[:off]
				seg.zeroed = off
				break
			}
			payload := data[off+frameHdrLen : off+frameHdrLen+int64(n)]
			p := 0
			for p < len(payload) {
				r, rn, rerr := decodeRecord(payload[p:])
				if rerr != nil {
					// The frame's checksum held, so this is not a torn write.
					return fmt.Errorf("%w: %s offset %d: %v", ErrCorrupt, path, off+frameHdrLen+int64(p), rerr)
				}
				at := loc{seg: seg, off: off + frameHdrLen + int64(p), n: uint32(rn)}
				if err := w.applyRecord(r, at); err != nil {
					return fmt.Errorf("%w: %s offset %d: %v", ErrCorrupt, path, at.off, err)
				}
				w.recovered.Records++
				p += rn
			}
			off += frameHdrLen + int64(n)
		}
		seg.size = int64(len(data))
	}
	w.recovered.Segments = len(w.segs)
	return nil
}

// allZero reports whether b holds only zero bytes. A frame header is never
// all zeros (its checksum of eight zero bytes is not zero), so zeros where a
// frame would start mean that nothing was written there.
func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// validFrameAfter reports whether a whole valid frame starts anywhere at or
// after from: if one does, the bad frame before it is not a torn tail.
func validFrameAfter(data []byte, from int64) bool {
	for o := from; o+frameHdrLen <= int64(len(data)); o++ {
		if binary.LittleEndian.Uint32(data[o+8:]) != crc32.Checksum(data[o:o+8], castagnoli) {
			continue
		}
		if _, err := frameAt(data, o); err == nil {
			return true
		}
	}
	return false
}

// applyRecord applies a replayed record to the group states.
func (w *WAL) applyRecord(r record, at loc) error {
	st := w.group(r.group)
	switch r.kind {
	case kindEntry:
		if !st.empty() && r.index != st.last+1 {
			return fmt.Errorf("group %d: entry %d does not follow %d", r.group, r.index, st.last)
		}
		if r.index == 0 {
			return fmt.Errorf("group %d: entry index 0", r.group)
		}
		st.appendLoc(r.index, at)
	case kindTruncate:
		st.truncateAfter(r.index)
	case kindCompact:
		st.compactThrough(r.index)
	}
	return nil
}

func (w *WAL) group(g uint16) *groupState {
	st := w.groups[g]
	if st == nil {
		st = &groupState{}
		w.groups[g] = st
	}
	return st
}

func (s *groupState) appendLoc(index uint64, at loc) {
	if s.empty() {
		s.first = index
		s.locs = s.locs[:0]
	}
	s.last = index
	s.locs = append(s.locs, at)
	at.seg.live++
	at.seg.liveBytes += int64(at.n)
}

// drop voids the entries at locs (their segments hold one live entry less).
func drop(locs []loc) {
	for _, at := range locs {
		at.seg.live--
		at.seg.liveBytes -= int64(at.n)
	}
}

// reset voids the whole log.
func (s *groupState) reset() {
	drop(s.locs)
	*s = groupState{}
}

// truncateAfter voids the entries after k. The bounds follow
// truncateBounds, which the writer also checks a round against before
// writing it.
func (s *groupState) truncateAfter(k uint64) {
	if s.empty() || k >= s.last {
		return
	}
	keep := uint64(0)
	if k >= s.first {
		keep = k - s.first + 1
	}
	drop(s.locs[keep:])
	s.locs = s.locs[:keep]
	s.truncateBounds(k)
}

// compactThrough voids the entries up to k (bounds: compactBounds).
func (s *groupState) compactThrough(k uint64) {
	if s.empty() || k < s.first {
		return
	}
	n := min(k, s.last) - s.first + 1
	drop(s.locs[:n])
	s.locs = slices.Clone(s.locs[n:])
	s.compactBounds(k)
}

func (s *groupState) truncateBounds(k uint64) {
	switch {
	case s.empty() || k >= s.last:
	case k < s.first:
		s.first, s.last = 0, 0
	default:
		s.last = k
	}
}

func (s *groupState) compactBounds(k uint64) {
	switch {
	case s.empty() || k < s.first:
	case k >= s.last:
		s.first, s.last = 0, 0
	default:
		s.first = k + 1
	}
}
