package wal

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// submit queues r for the next round and waits for its outcome.
func (w *WAL) submit(r *request) error {
	if w.opts.ReadOnly {
		return errors.New("wal: opened read-only")
	}
	r.done = make(chan struct{})
	w.qmu.Lock()
	if w.closing {
		w.qmu.Unlock()
		return ErrClosed
	}
	w.queue = append(w.queue, r)
	w.qcond.Signal()
	w.qmu.Unlock()
	<-r.done
	return r.err
}

// writer runs the rounds: it takes everything queued, writes it as one
// frame with one fdatasync, publishes it and wakes the callers. While it
// syncs, new requests queue for the next round, so rounds grow with load
// and no timer is needed.
func (w *WAL) writer() {
	defer close(w.done)
	var frame []byte
	for {
		w.qmu.Lock()
		for len(w.queue) == 0 && !w.closing {
			w.qcond.Wait()
		}
		batch := w.queue
		w.queue = nil
		closing := w.closing
		w.qmu.Unlock()
		if len(batch) == 0 && closing {
			return
		}
		frame = w.round(batch, frame[:0])
		for _, r := range batch {
			close(r.done)
		}
		if cap(frame) > 16<<20 {
			frame = nil // do not keep one huge round's buffer for ever
		}
	}
}

// writeFrame seals frame (its header) and appends it to seg, the active
// segment, with one write and one fdatasync. On failure it cuts the frame
// off again, so the file holds only what was acknowledged and the next
// frame is written at the same offset. The caller publishes seg.size.
func (w *WAL) writeFrame(seg *segment, frame []byte) error {
	putFrameHeader(frame, frame[frameHdrLen:])
	base := seg.size
	end := base + int64(len(frame))
	start := time.Now()
	w.stats.writing.Store(start.UnixNano())
	_, err := seg.f.WriteAt(frame, base)
	zeroed := max(seg.zeroed, end)
	if end > seg.zeroed {
		w.stats.growing.Add(1)
	}
	if err == nil && end > seg.zeroed && w.opts.ZeroAhead > 0 {
		// This frame grows the file, so this round's fdatasync commits a
		// new length anyway: write zeros past it now, and the rounds
		// that follow overwrite them in place.
		// The zeros are an optimisation: on a disk too full for them the
		// round goes on without (the frame itself was written).
		to := min(end+w.opts.ZeroAhead, max(end, w.opts.SegmentSize))
		if to > end {
			if zerr := writeZeros(seg.f, end, to); zerr == nil {
				zeroed = to
			} else {
				_ = seg.f.Truncate(end)
				w.stats.zeroFailed.Add(1)
			}
		}
	}
	if err == nil {
		err = w.sync(seg.f)
	}
	w.stats.writing.Store(0)
	w.stats.syncNanos.Add(uint64(time.Since(start)))
	w.stats.rounds.Add(1)
	if err != nil {
		w.stats.failed.Add(1)
		if terr := seg.f.Truncate(base); terr != nil {
			return fmt.Errorf("%w (and cutting it off failed: %v)", err, terr)
		}
		seg.zeroed = base
		return err
	}
	seg.zeroed = zeroed
	w.stats.bytes.Add(uint64(len(frame)))
	return nil
}

// zeroBuf is the source of writeZeros.
var zeroBuf [64 << 10]byte

// writeZeros writes zeros to f from off to end.
func writeZeros(f File, off, end int64) error {
	for off < end {
		n := min(end-off, int64(len(zeroBuf)))
		if _, err := f.WriteAt(zeroBuf[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// shadow is a group's bounds while a round is checked, before it is written.
type shadow struct{ first, last uint64 }

// round writes one batch. Requests that do not fit the group's log (an
// entry that does not follow the last one) fail alone.
func (w *WAL) round(batch []*request, frame []byte) []byte {
	w.mu.RLock()
	seg := w.segs[len(w.segs)-1]
	shadows := map[uint16]*shadow{}
	for _, r := range batch {
		sh := shadows[r.group]
		if sh == nil {
			sh = &shadow{}
			if st := w.groups[r.group]; st != nil {
				sh.first, sh.last = st.first, st.last
			}
			shadows[r.group] = sh
		}
		if r.kind == kindEntry {
			if sh.first != 0 && r.index != sh.last+1 {
				r.err = fmt.Errorf("wal: group %d: entry %d does not follow the last entry %d", r.group, r.index, sh.last)
				continue
			}
			if sh.first == 0 {
				sh.first = r.index
			}
			sh.last = r.index + uint64(r.count) - 1
			continue
		}
		st := groupState{first: sh.first, last: sh.last}
		if r.kind == kindTruncate {
			st.truncateBounds(r.index)
		} else {
			st.compactBounds(r.index)
		}
		sh.first, sh.last = st.first, st.last
	}
	w.mu.RUnlock()

	// One frame: header, then every valid request's records.
	frame = append(frame, make([]byte, frameHdrLen)...)
	for _, r := range batch {
		if r.err == nil {
			frame = append(frame, r.buf...)
		}
	}
	if len(frame) == frameHdrLen {
		return frame
	}
	base := seg.size
	if err := w.writeFrame(seg, frame); err != nil {
		for _, r := range batch {
			if r.err == nil {
				r.err = fmt.Errorf("wal: write: %w", err)
			}
		}
		return frame
	}

	// Durable: publish.
	w.mu.Lock()
	seg.size = base + int64(len(frame))
	off := base + frameHdrLen
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		st := w.group(r.group)
		switch r.kind {
		case kindEntry:
			for i := 0; i < r.count; i++ {
				end := len(r.buf)
				if i+1 < r.count {
					end = int(r.offs[i+1])
				}
				st.appendLoc(r.index+uint64(i), loc{seg: seg, off: off + int64(r.offs[i]), n: uint32(end - int(r.offs[i]))})
			}
		case kindTruncate:
			st.truncateAfter(r.index)
		case kindCompact:
			st.compactThrough(r.index)
		}
		off += int64(len(r.buf))
		w.stats.requests.Add(1)
	}
	rotated := false
	if seg.size >= w.opts.SegmentSize {
		// On failure (a full disk) the active segment grows on; the next
		// round tries again.
		rotated = w.newSegment(seg.seq+1) == nil
	}
	dead := w.deadSegments()
	pinned := len(w.segs) > 2
	w.mu.Unlock()
	if rotated {
		w.trimZeros(seg)
	}
	w.removeSegments(dead)
	if pinned {
		w.carryForward()
	}
	return frame
}

// trimZeros cuts the zeros written ahead off seg, a segment no longer
// written to (finished, or the active one at Close), and makes the cut
// durable: then only the active segment of a running log has a zero tail,
// and a previous release, which reads zeros as a torn write (cut off in
// the last segment, corruption in any other), opens the log after a
// downgrade. Best effort: replay accepts a zero tail anywhere.
func (w *WAL) trimZeros(seg *segment) {
	if seg.zeroed <= seg.size || w.opts.ReadOnly {
		return
	}
	if err := seg.f.Truncate(seg.size); err != nil {
		return
	}
	if err := w.sync(seg.f); err == nil {
		seg.zeroed = seg.size
	}
}

// removeSegments deletes the dead segments' files, oldest first, and
// makes each removal durable (a directory sync) before the next: an
// unsynced removal can be undone by a power cut, and if an older segment
// came back while a newer one stayed removed, its entries would replay
// without the records that voided them (those were in the newer one).
// So at any moment at most one removal is not durable, the oldest file
// left, and the files on disk are always a run of consecutive segments.
// A removal that fails is retried, before any newer one, the next time.
// Runs on the writer goroutine only.
func (w *WAL) removeSegments(dead []*segment) {
	for _, s := range dead {
		// Every entry in it is void and so is every entry before it; its
		// reads are over (callers hold mu while reading).
		_ = s.f.Close()
		w.unremoved = append(w.unremoved, s.path)
	}
	for len(w.unremoved) > 0 {
		path := w.unremoved[0]
		if err := w.opts.FS.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return
		}
		if err := w.opts.FS.SyncDir(w.dir); err != nil {
			return
		}
		w.unremoved = w.unremoved[1:]
	}
}

// carryForward rewrites, at the end of the log, the live entries of the
// groups that keep the oldest segment from being deleted, once the files
// hold more than twice the live entries.
//
// Why: a segment can only go once every entry in it is void, and only after
// every older one. raft compacts a group's log only after a snapshot, which
// it takes after SnapshotThreshold new entries, and it keeps TrailingLogs
// entries even then; so an idle group's last entries would never die, and
// would keep every later segment on disk for ever. Copying them forward in
// one frame (compact-through the group's last index, then the same entry
// records again: on replay the copy replaces the group's log) frees the
// oldest segment. The copy waits until the files hold more than twice the
// live entries, so a busy group, which raft compacts soon anyway, is rarely
// copied, and nothing is copied more than it frees. Runs on the writer
// goroutine, so no append of the group can interleave.
func (w *WAL) carryForward() {
	w.mu.RLock()
	oldest := w.segs[0]
	seg := w.segs[len(w.segs)-1]
	var frame []byte
	type carried struct {
		g     uint16
		first uint64
		offs  []int64 // of each entry's record in frame
		ns    []uint32
	}
	var moves []carried
	// Carry only once the files hold more than twice the live entries (and
	// two segments more): then what is copied is at most what is freed, and
	// the log's disk use stays within about twice its live entries, however
	// large an idle group's last entries are.
	var disk, live int64
	for _, sg := range w.segs {
		disk += sg.size
		live += sg.liveBytes
	}
	var pinning []uint16
	for g, st := range w.groups {
		// A group's entries are in file order, so it holds live entries in
		// the oldest segment if its first one is there.
		if !st.empty() && st.locs[0].seg == oldest {
			pinning = append(pinning, g)
		}
	}
	if len(pinning) == 0 || disk <= 2*live+2*w.opts.SegmentSize {
		w.mu.RUnlock()
		return
	}
	for _, g := range pinning {
		st := w.groups[g]
		if frame == nil {
			frame = make([]byte, frameHdrLen)
		}
		frame = appendRecord(frame, g, kindCompact, 0, st.last, 0, 0, nil, nil)
		mv := carried{g: g, first: st.first}
		for i, at := range st.locs {
			start := len(frame)
			frame = append(frame, make([]byte, at.n)...)
			if _, err := at.seg.f.ReadAt(frame[start:], at.off); err != nil {
				w.mu.RUnlock()
				return // reported by the reads that need it; try again later
			}
			if r, _, err := decodeRecord(frame[start:]); err != nil || r.index != st.first+uint64(i) || r.group != g {
				w.mu.RUnlock()
				return // a damaged entry is not copied: GetLog reports it
			}
			mv.offs = append(mv.offs, int64(start))
			mv.ns = append(mv.ns, at.n)
		}
		moves = append(moves, mv)
	}
	w.mu.RUnlock()
	if len(moves) == 0 {
		return
	}
	base := seg.size
	if err := w.writeFrame(seg, frame); err != nil {
		return // the entries stay where they are; nothing is lost
	}
	w.mu.Lock()
	seg.size = base + int64(len(frame))
	for _, mv := range moves {
		st := w.groups[mv.g]
		st.reset()
		for i, off := range mv.offs {
			st.appendLoc(mv.first+uint64(i), loc{seg: seg, off: base + off, n: mv.ns[i]})
		}
	}
	dead := w.deadSegments()
	w.mu.Unlock()
	w.removeSegments(dead)
}

// deadSegments removes from w.segs, and returns, the oldest segments whose
// entries are all void. Only a prefix goes, so a record that voids entries
// never disappears before them. Caller holds mu.
func (w *WAL) deadSegments() []*segment {
	n := 0
	for n < len(w.segs)-1 && w.segs[n].live == 0 { // never the active one
		n++
	}
	if n == 0 {
		return nil
	}
	dead := append([]*segment(nil), w.segs[:n]...)
	w.segs = append(w.segs[:0:0], w.segs[n:]...)
	return dead
}
