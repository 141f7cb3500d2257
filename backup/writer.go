package backup

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// Writer encodes a backup file. It is not safe for concurrent use. The
// underlying writer is not buffered or closed by the Writer.
type Writer struct {
	w     io.Writer
	h     Header
	next  int    // next group expected
	chain uint32 // crc chain: header crc, then every section frame crc
	done  bool
	err   error // sticky write error
}

// NewWriter validates h and writes the backup header.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if msg := checkHeader(&h); msg != "" {
		return nil, invalidf("header: %s", msg)
	}
	b := appendHeader(nil, &h)
	if _, err := w.Write(b); err != nil {
		return nil, fmt.Errorf("backup: write header: %w", err)
	}
	bw := &Writer{w: w, h: h}
	bw.chain = crc32.Update(0, castagnoli, b[len(b)-4:])
	return bw, nil
}

// AddGroup writes the snapshot of one group. Groups must be added in order
// 0, 1, …, Groups-1, each exactly once. data must be a complete, valid
// snapfmt snapshot of that group: it is fully verified (snapfmt.Inspect) and
// its header must match the backup layout, the group's partition range and
// index/term. An invalid argument returns an error wrapping ErrInvalid,
// writes nothing, and leaves the Writer usable.
func (w *Writer) AddGroup(group int, index, term uint64, data []byte) error {
	switch {
	case w.err != nil:
		return w.err
	case w.done:
		return invalidf("group %d: writer is closed", group)
	case w.next == w.h.Groups:
		return invalidf("group %d: all %d groups were already added", group, w.h.Groups)
	case group != w.next:
		return invalidf("group %d added out of order: group %d is next (groups go in order 0..%d, each once)", group, w.next, w.h.Groups-1)
	case len(data) == 0:
		return invalidf("group %d: empty snapshot", group)
	case uint64(len(data)) > MaxGroupData:
		return invalidf("group %d: snapshot is %d bytes, at most %d allowed", group, len(data), uint64(MaxGroupData))
	}
	sum, err := snapfmt.Inspect(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%w: group %d: not a valid snapshot: %w", ErrInvalid, group, err)
	}
	if msg := checkSnapshot(&w.h, group, index, term, &sum.Header); msg != "" {
		return invalidf("group %d: %s", group, msg)
	}
	s := section{
		group:   uint32(group),
		index:   index,
		term:    term,
		dataLen: uint64(len(data)),
		dataCRC: crc32.Checksum(data, castagnoli),
	}
	frame := appendFrame(make([]byte, 0, frameLen), &s)
	if _, err := w.w.Write(frame); err != nil {
		w.err = fmt.Errorf("backup: write group %d: %w", group, err)
		return w.err
	}
	if _, err := w.w.Write(data); err != nil {
		w.err = fmt.Errorf("backup: write group %d: %w", group, err)
		return w.err
	}
	w.chain = chainAdd(w.chain, s.crc)
	w.next++
	return nil
}

// Close writes the trailer. It fails, writing nothing, if some groups were
// not added. Close does not close the underlying writer; calling it again
// after success is a no-op.
func (w *Writer) Close() error {
	switch {
	case w.err != nil:
		return w.err
	case w.done:
		return nil
	case w.next != w.h.Groups:
		return invalidf("groups %d..%d missing: a backup holds all %d groups", w.next, w.h.Groups-1, w.h.Groups)
	}
	if _, err := w.w.Write(appendTrailer(nil, uint32(w.next), w.chain)); err != nil {
		w.err = fmt.Errorf("backup: write trailer: %w", err)
		return w.err
	}
	w.done = true
	return nil
}

// Write encodes f as a backup file (NewWriter, AddGroup for each group,
// Close). Reading the output with Read yields f again, and the bytes are a
// function of f alone.
func Write(w io.Writer, f *File) error {
	bw, err := NewWriter(w, f.Header)
	if err != nil {
		return err
	}
	for _, g := range f.Groups {
		if err := bw.AddGroup(g.Group, g.Index, g.Term, g.Data); err != nil {
			return err
		}
	}
	return bw.Close()
}
