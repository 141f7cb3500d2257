package raftnode

// The snapshot store: raft.SnapshotStore on the file layer wal.FS, so that
// the power-cut layer (raftnode/wal/powerfs) reaches the snapshots as it
// reaches the log.
//
// # On-disk format
//
// It is raft's FileSnapshotStore's (hashicorp/raft file_snapshot.go), so
// that a data dir written by either store opens with the other:
//
//	<group dir>/snapshots/
//	  <term>-<index>-<unix ms>/      one snapshot; the name is its ID
//	    state.bin                    the FSM's bytes, exactly as written
//	    meta.json                    JSON of raft.SnapshotMeta plus "CRC"
//	  <term>-<index>-<unix ms>.tmp/  a snapshot being written (or the
//	                                 leftover of one a crash interrupted)
//
// meta.json holds the fields of raft.SnapshotMeta (Version, ID, Index,
// Term, Peers, Configuration, ConfigurationIndex, Size) and CRC: the
// CRC-64 (ECMA polynomial) of state.bin as 8 big-endian bytes, which JSON
// spells in base64. Peers is the legacy voter list, msgpack-encoded as
// raft encodes it. Snapshots sort by (Term, Index, ID), newest first.
//
// # Write order
//
// A snapshot is durable, and Close returns nil, only after:
//
//  1. mkdir <id>.tmp; state.bin written there as raft streams it in,
//  2. state.bin Datasync'd, then meta.json (with the CRC) written and
//     Datasync'd,
//  3. <id>.tmp synced (its entries: state.bin and meta.json),
//  4. <id>.tmp renamed to <id>,
//  5. snapshots/ synced (the new entry <id>, and <id>.tmp gone).
//
// raft compacts the log only after Close returns nil, so the log an
// acknowledged entry lives in is dropped only once a snapshot holding it
// is durable. Step 3 is the one raft's own store leaves out: without it a
// power cut can leave <id> with neither file, the log already compacted
// past the previous snapshot (TestSnapshotPowerCutCatchesMissingDirSync).
// A cut before step 5 leaves the old snapshots and the uncompacted log;
// what it may leave of the new one is a .tmp directory (removed when the
// node opens the store) or, when the rename survived, the complete
// snapshot. Older snapshots beyond the retain count are removed after a
// successful Close, whole directories only (their files, then the
// directory); a cut in the middle of that leaves a directory without
// meta.json, which List skips and a later reap removes.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode/wal"
)

const (
	snapDirName   = "snapshots"
	snapMetaName  = "meta.json"
	snapStateName = "state.bin"
	snapTmpSuffix = ".tmp"
)

// errSnapshotCRC: a snapshot's state.bin does not match the CRC in its
// meta.json (the error names the file).
var errSnapshotCRC = errors.New("snapshot state CRC mismatch")

// snapCRCTable is the CRC-64 raft's FileSnapshotStore uses.
var snapCRCTable = crc64.MakeTable(crc64.ECMA)

// skipSnapshotDirSyncForTest, when set, leaves out the sync of the new
// snapshot directory before its rename (step 3): raft's FileSnapshotStore's
// order, for the test that shows the power-cut test catches the loss.
var skipSnapshotDirSyncForTest bool

// snapFileMeta is meta.json: raft.SnapshotMeta's fields and the CRC, the
// layout raft's FileSnapshotStore writes (its fileSnapshotMeta).
type snapFileMeta struct {
	raft.SnapshotMeta
	CRC []byte
}

// snapStore is a raft.SnapshotStore in <base>/snapshots, on fs.
type snapStore struct {
	fs     wal.FS
	dir    string // <base>/snapshots
	retain int
	log    hclog.Logger
}

// newSnapStore opens (making it if needed) the snapshot directory under
// base. It changes nothing else on disk: leftovers of interrupted writes
// are removed by removeTemporary, which only the node that owns the data
// dir calls (an offline inspect must not remove a running node's .tmp).
func newSnapStore(base string, retain int, fs wal.FS, logger hclog.Logger) (*snapStore, error) {
	if retain < 1 {
		return nil, fmt.Errorf("snapshot store: retain %d, want ≥ 1", retain)
	}
	if fs == nil {
		fs = wal.OSFS{}
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &snapStore{fs: fs, dir: filepath.Join(base, snapDirName), retain: retain, log: logger}
	if _, err := fs.ReadDir(s.dir); errors.Is(err, os.ErrNotExist) {
		if err := fs.Mkdir(s.dir, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
		// A snapshot made in it must not vanish with the directory.
		if err := fs.SyncDir(base); err != nil {
			return nil, fmt.Errorf("snapshot store: sync %s: %w", base, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	return s, nil
}

// removeTemporary removes the .tmp directories interrupted writes left.
func (s *snapStore) removeTemporary() error {
	entries, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	removed := false
	for _, e := range entries {
		if e.IsDir() && strings.HasSuffix(e.Name(), snapTmpSuffix) {
			p := filepath.Join(s.dir, e.Name())
			s.log.Info("removing an unfinished snapshot", "path", p)
			if err := s.removeDir(p); err != nil {
				return err
			}
			removed = true
		}
	}
	if removed {
		if err := s.fs.SyncDir(s.dir); err != nil {
			return fmt.Errorf("snapshot store: sync %s: %w", s.dir, err)
		}
	}
	return nil
}

// removeDir removes a snapshot directory: its entries, then itself.
func (s *snapStore) removeDir(p string) error {
	entries, err := s.fs.ReadDir(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, e := range entries {
		c := filepath.Join(p, e.Name())
		if e.IsDir() {
			if err := s.removeDir(c); err != nil {
				return err
			}
			continue
		}
		if err := s.fs.Remove(c); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("snapshot store: %w", err)
		}
	}
	if err := s.fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	return nil
}

// Create starts a snapshot in <id>.tmp.
func (s *snapStore) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	// raft's store takes version 1 only, and so does this one: a snapshot
	// of another version would not open with raft's store.
	if version != 1 {
		return nil, fmt.Errorf("snapshot store: unsupported snapshot version %d", version)
	}
	peers, err := encodeSnapshotPeers(conf, trans)
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixMilli())
	tmp := filepath.Join(s.dir, id+snapTmpSuffix)
	if err := s.fs.Mkdir(tmp, 0o750); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	f, err := s.fs.OpenFile(filepath.Join(tmp, snapStateName), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o640)
	if err != nil {
		_ = s.removeDir(tmp)
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	sk := &snapSink{
		s: s, tmp: tmp, f: f, crc: crc64.New(snapCRCTable),
		meta: snapFileMeta{SnapshotMeta: raft.SnapshotMeta{
			Version: version, ID: id, Index: index, Term: term, Peers: peers,
			Configuration: conf, ConfigurationIndex: confIndex,
		}},
	}
	sk.w = bufio.NewWriterSize(io.MultiWriter(&offsetWriter{f: f, off: &sk.size}, sk.crc), 256<<10)
	s.log.Info("creating new snapshot", "path", tmp)
	return sk, nil
}

// encodeSnapshotPeers is meta.json's legacy Peers: the voters' addresses
// as the transport encodes them, a msgpack array, as raft writes it.
func encodeSnapshotPeers(conf raft.Configuration, trans raft.Transport) ([]byte, error) {
	var peers [][]byte
	for _, srv := range conf.Servers {
		if srv.Suffrage == raft.Voter {
			peers = append(peers, trans.EncodePeer(srv.ID, srv.Address))
		}
	}
	var buf bytes.Buffer
	h := codec.MsgpackHandle{}
	h.TimeNotBuiltin = true
	if err := codec.NewEncoder(&buf, &h).Encode(peers); err != nil {
		return nil, fmt.Errorf("snapshot store: encode peers: %w", err)
	}
	return buf.Bytes(), nil
}

// offsetWriter appends to a wal.File (which writes at offsets).
type offsetWriter struct {
	f   wal.File
	off *int64
}

func (w *offsetWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, *w.off)
	*w.off += int64(n)
	return n, err
}

// snapSink is one snapshot being written.
type snapSink struct {
	s    *snapStore
	tmp  string
	f    wal.File
	w    *bufio.Writer
	crc  hash.Hash64
	size int64
	meta snapFileMeta
	done bool
}

func (k *snapSink) ID() string { return k.meta.ID }

func (k *snapSink) Write(p []byte) (int, error) { return k.w.Write(p) }

// Close makes the snapshot durable in the order the file comment gives;
// raft compacts the log once it returns nil. On an error the .tmp
// directory is removed (when still there) and the older snapshots stay.
func (k *snapSink) Close() error {
	if k.done {
		return nil
	}
	k.done = true
	if err := k.finish(); err != nil {
		k.s.log.Error("failed to finish snapshot", "path", k.tmp, "error", err)
		_ = k.s.removeDir(k.tmp)
		return err
	}
	final := strings.TrimSuffix(k.tmp, snapTmpSuffix)
	if err := k.s.fs.Rename(k.tmp, final); err != nil {
		_ = k.s.removeDir(k.tmp)
		return fmt.Errorf("snapshot store: move the snapshot into place: %w", err)
	}
	if err := k.s.fs.SyncDir(k.s.dir); err != nil {
		// The snapshot may or may not survive a crash: raft must not
		// compact the log for it.
		return fmt.Errorf("snapshot store: sync %s: %w", k.s.dir, err)
	}
	if err := k.s.reap(); err != nil {
		// The new snapshot is durable; an old one left over costs disk,
		// and the next snapshot reaps again.
		k.s.log.Warn("failed to remove old snapshots", "error", err)
	}
	return nil
}

// finish writes out state.bin and meta.json into the .tmp directory and
// makes both, and the directory's entries, durable (steps 1-3).
func (k *snapSink) finish() error {
	if err := k.w.Flush(); err != nil {
		_ = k.f.Close()
		return fmt.Errorf("snapshot store: write %s: %w", snapStateName, err)
	}
	if err := k.f.Datasync(); err != nil {
		_ = k.f.Close()
		return fmt.Errorf("snapshot store: sync %s: %w", snapStateName, err)
	}
	if err := k.f.Close(); err != nil {
		return fmt.Errorf("snapshot store: close %s: %w", snapStateName, err)
	}
	k.meta.Size = k.size
	k.meta.CRC = k.crc.Sum(nil)
	b, err := json.Marshal(&k.meta)
	if err != nil {
		return fmt.Errorf("snapshot store: encode %s: %w", snapMetaName, err)
	}
	b = append(b, '\n') // as raft's json.Encoder writes it
	mf, err := k.s.fs.OpenFile(filepath.Join(k.tmp, snapMetaName), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o640)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	if _, err := mf.WriteAt(b, 0); err != nil {
		_ = mf.Close()
		return fmt.Errorf("snapshot store: write %s: %w", snapMetaName, err)
	}
	if err := mf.Datasync(); err != nil {
		_ = mf.Close()
		return fmt.Errorf("snapshot store: sync %s: %w", snapMetaName, err)
	}
	if err := mf.Close(); err != nil {
		return fmt.Errorf("snapshot store: close %s: %w", snapMetaName, err)
	}
	if skipSnapshotDirSyncForTest {
		return nil
	}
	if err := k.s.fs.SyncDir(k.tmp); err != nil {
		return fmt.Errorf("snapshot store: sync %s: %w", k.tmp, err)
	}
	return nil
}

// Cancel drops the snapshot being written.
func (k *snapSink) Cancel() error {
	if k.done {
		return nil
	}
	k.done = true
	_ = k.f.Close()
	return k.s.removeDir(k.tmp)
}

// snapScan is what the snapshot directory holds.
type snapScan struct {
	metas []*snapFileMeta // readable snapshots, newest first
	// bad: snapshot directories (not .tmp) List skips, by name, and why.
	bad map[string]error
}

// scan reads every snapshot's meta.json.
func (s *snapStore) scan() (snapScan, error) {
	entries, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return snapScan{}, fmt.Errorf("snapshot store: %w", err)
	}
	out := snapScan{bad: map[string]error{}}
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), snapTmpSuffix) {
			continue
		}
		m, err := s.readMeta(e.Name())
		if err != nil {
			out.bad[e.Name()] = err
			continue
		}
		out.metas = append(out.metas, m)
	}
	slices.SortFunc(out.metas, func(a, b *snapFileMeta) int { return -compareSnapshots(&a.SnapshotMeta, &b.SnapshotMeta) })
	return out, nil
}

// compareSnapshots orders by (Term, Index, ID), as raft's store does.
func compareSnapshots(a, b *raft.SnapshotMeta) int {
	switch {
	case a.Term != b.Term:
		return cmpUint(a.Term, b.Term)
	case a.Index != b.Index:
		return cmpUint(a.Index, b.Index)
	default:
		return strings.Compare(a.ID, b.ID)
	}
}

func cmpUint(a, b uint64) int {
	if a < b {
		return -1
	}
	return 1
}

// readMeta reads and checks snapshot id's meta.json, and that its
// state.bin is there.
func (s *snapStore) readMeta(id string) (*snapFileMeta, error) {
	p := filepath.Join(s.dir, id, snapMetaName)
	b, err := s.fs.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	m := new(snapFileMeta)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("snapshot store: %s: %w", p, err)
	}
	if m.Version < raft.SnapshotVersionMin || m.Version > raft.SnapshotVersionMax {
		return nil, fmt.Errorf("snapshot store: %s: unsupported snapshot version %d", p, m.Version)
	}
	if m.ID != id {
		return nil, fmt.Errorf("snapshot store: %s: names snapshot %q", p, m.ID)
	}
	if len(m.CRC) != 8 {
		return nil, fmt.Errorf("snapshot store: %s: CRC of %d bytes, want 8", p, len(m.CRC))
	}
	entries, err := s.fs.ReadDir(filepath.Join(s.dir, id))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == snapStateName && !e.IsDir() }) {
		return nil, fmt.Errorf("snapshot store: %s: %w", filepath.Join(s.dir, id, snapStateName), os.ErrNotExist)
	}
	return m, nil
}

// List returns the readable snapshots, newest first, at most retain of
// them (as raft's store does).
func (s *snapStore) List() ([]*raft.SnapshotMeta, error) {
	sc, err := s.scan()
	if err != nil {
		return nil, err
	}
	for id, err := range sc.bad {
		s.log.Warn("skipping an unreadable snapshot", "name", id, "error", err)
	}
	var out []*raft.SnapshotMeta
	for _, m := range sc.metas {
		if len(out) == s.retain {
			break
		}
		out = append(out, &m.SnapshotMeta)
	}
	return out, nil
}

// Open opens snapshot id after checking state.bin against the CRC in its
// meta.json; a mismatch is an error naming the file (errSnapshotCRC).
func (s *snapStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	return s.open(id, true)
}

// open opens snapshot id; verify: check the CRC first (a full read).
func (s *snapStore) open(id string, verify bool) (*raft.SnapshotMeta, io.ReadCloser, error) {
	m, err := s.readMeta(id)
	if err != nil {
		return nil, nil, err
	}
	p := filepath.Join(s.dir, id, snapStateName)
	f, err := s.fs.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot store: %w", err)
	}
	if verify {
		h := crc64.New(snapCRCTable)
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("snapshot store: read %s: %w", p, err)
		}
		if got := h.Sum(nil); !bytes.Equal(got, m.CRC) {
			_ = f.Close()
			return nil, nil, fmt.Errorf("%s: CRC-64 %x, meta.json has %x: %w", p, got, m.CRC, errSnapshotCRC)
		}
	}
	return &m.SnapshotMeta, &snapReader{Reader: bufio.NewReaderSize(io.NewSectionReader(f, 0, 1<<62), 256<<10), f: f}, nil
}

type snapReader struct {
	*bufio.Reader
	f wal.File
}

func (r *snapReader) Close() error { return r.f.Close() }

// reap removes the snapshots beyond the newest retain, and directories
// without a readable meta.json (a reap or a copy a crash interrupted) that
// are older than the oldest one kept.
func (s *snapStore) reap() error {
	sc, err := s.scan()
	if err != nil {
		return err
	}
	if len(sc.metas) <= s.retain && len(sc.bad) == 0 {
		return nil
	}
	var doomed []string
	for _, m := range sc.metas[min(s.retain, len(sc.metas)):] {
		doomed = append(doomed, m.ID)
	}
	if len(sc.metas) >= s.retain {
		oldest := sc.metas[s.retain-1]
		for id := range sc.bad {
			if idx, ok := snapshotIndexFromID(id); ok && idx < oldest.Index {
				doomed = append(doomed, id)
			}
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	for _, id := range doomed {
		p := filepath.Join(s.dir, id)
		s.log.Info("reaping snapshot", "path", p)
		if err := s.removeDir(p); err != nil {
			return err
		}
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("snapshot store: sync %s: %w", s.dir, err)
	}
	return nil
}
