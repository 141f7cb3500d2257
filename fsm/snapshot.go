package fsm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm/seriesmap"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/fsm/wire"
)

// metaVersion versions the FSM-level state carried in snapfmt.Header.Meta:
//
//	byte     version (1)
//	uvarint  now: highest applied Unix minute
//	uvarint  lastExpire: Unix minute of the last expiry
//	uvarint  idle: idle age in minutes of the last expire entry (see IdleAge)
//
// Uvarints are minimal (fsm/wire); builds before fsm/wire also accepted
// padded forms, which no build ever wrote.
const metaVersion = 1

// snapshot is an immutable image of the FSM at one raft index. Tables captured
// here are never written again: the FSM clones a table before its first write
// while liveSnaps > 0 (see writableTable).
type snapshot struct {
	f       *FSM
	header  snapfmt.Header
	tables  [][]*seriesmap.Table // [shard][tenant id]
	names   []string             // by tenant id
	modules []moduleSnap         // modules with state, by name
	release func()
}

type moduleSnap struct {
	name   string
	encode func() ([]byte, error)
}

// Snapshot implements raft.FSM. It runs on the apply goroutine and only copies
// table pointers, so applies pause for O(shards × tenants), not O(series).
//
// A halted FSM refuses: a snapshot would let raft compact away the entry it
// could not apply, and with it the only way to converge (see Apply).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	if h := f.halt.Load(); h != nil {
		return nil, fmt.Errorf("snapshot of group %d refused: %w at index %d: %s", f.cfg.Group, ErrHalted, h.index, h.reason)
	}
	f.snapGen++
	f.liveSnaps.Add(1)
	s := &snapshot{f: f, tables: make([][]*seriesmap.Table, len(f.shards))}
	var once sync.Once
	s.release = func() { once.Do(func() { f.liveSnaps.Add(-1) }) }
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.RLock()
		s.tables[i] = slices.Clone(sh.tables)
		sh.mu.RUnlock()
	}
	f.regMu.RLock()
	for _, t := range f.tenants {
		s.names = append(s.names, t.Name)
	}
	f.regMu.RUnlock()
	for _, name := range f.moduleNames {
		enc, err := f.modules[name].Snapshot()
		if err != nil {
			s.release()
			return nil, fmt.Errorf("snapshot of group %d: module %s: %w", f.cfg.Group, name, err)
		}
		if enc != nil {
			s.modules = append(s.modules, moduleSnap{name: name, encode: enc})
		}
	}
	s.header = snapfmt.Header{
		Partitions: uint32(f.cfg.Partitions),
		Shards:     uint32(f.cfg.Shards),
		GroupLo:    uint32(f.lo),
		GroupHi:    uint32(f.hi),
		Index:      f.appliedIndex.Load(),
		Term:       f.appliedTerm.Load(),
		Meta:       f.encodeMeta(),
	}
	if len(s.modules) > 0 {
		// Sections need format version 2; without module state the file stays
		// version 1, readable by builds from before modules existed.
		s.header.Version = 2
	}
	return s, nil
}

func (f *FSM) encodeMeta() []byte {
	w := wire.Encoder{Buf: []byte{metaVersion}}
	w.Uvarint(uint64(f.now.Load()))
	w.Uvarint(uint64(f.lastExpire))
	w.Uvarint(uint64(f.idle))
	return w.Buf
}

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.encode(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot of group %d: %w", s.f.cfg.Group, err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (s *snapshot) Release() { s.release() }

// encode encodes the snapshot in snapfmt. Tenants appear sorted by name and only
// when they hold series, so the bytes depend on the logical state alone, not on
// the order tenants were first seen.
func (s *snapshot) encode(w io.Writer) error {
	// Which tenants have series, and their index in the sorted name list.
	present := make([]bool, len(s.names))
	for _, tabs := range s.tables {
		for id, t := range tabs {
			if t != nil && t.Len() > 0 {
				present[id] = true
			}
		}
	}
	var names []string
	for id, ok := range present {
		if ok {
			names = append(names, s.names[id])
		}
	}
	slices.Sort(names)
	index := make(map[string]uint32, len(names))
	for i, n := range names {
		index[n] = uint32(i)
	}
	h := s.header
	h.Tenants = names

	bw := bufio.NewWriterSize(w, 1<<20)
	sw, err := snapfmt.NewWriter(bw, h)
	if err != nil {
		return err
	}
	var hashes []uint64
	var mins []uint8
	for sh, tabs := range s.tables {
		hashes, mins = hashes[:0], mins[:0]
		var series []snapfmt.TenantSeries
		var bounds []int
		for id, t := range tabs {
			if t == nil || t.Len() == 0 {
				continue
			}
			bounds = append(bounds, len(hashes))
			hashes, mins = t.AppendTo(hashes, mins)
			series = append(series, snapfmt.TenantSeries{Tenant: index[s.names[id]]})
		}
		if len(series) == 0 {
			continue
		}
		bounds = append(bounds, len(hashes))
		for i := range series {
			series[i].Hashes = hashes[bounds[i]:bounds[i+1]]
			series[i].Minutes = mins[bounds[i]:bounds[i+1]]
		}
		slices.SortFunc(series, func(a, b snapfmt.TenantSeries) int { return int(a.Tenant) - int(b.Tenant) })
		if err := sw.WriteShard(uint32(sh), series); err != nil {
			return fmt.Errorf("shard %d: %w", sh, err)
		}
	}
	for _, m := range s.modules {
		b, err := m.encode()
		if err != nil {
			return fmt.Errorf("module %s: %w", m.name, err)
		}
		if err := sw.WriteSection(m.name, b); err != nil {
			return fmt.Errorf("module %s: %w", m.name, err)
		}
	}
	if err := sw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// ErrSnapshotMismatch is returned when a snapshot was written for another layout.
var ErrSnapshotMismatch = errors.New("snapshot does not match this group")

func (f *FSM) restore(r io.Reader) error {
	rd, err := snapfmt.NewReader(bufio.NewReaderSize(r, 1<<20))
	if err != nil {
		return fmt.Errorf("restore group %d: %w", f.cfg.Group, err)
	}
	h := rd.Header()
	if int(h.Partitions) != f.cfg.Partitions || int(h.Shards) != f.cfg.Shards || int(h.GroupLo) != f.lo || int(h.GroupHi) != f.hi {
		return fmt.Errorf("restore group %d: %w: snapshot has P=%d S=%d partitions [%d,%d), this group has P=%d S=%d partitions [%d,%d)",
			f.cfg.Group, ErrSnapshotMismatch, h.Partitions, h.Shards, h.GroupLo, h.GroupHi, f.cfg.Partitions, f.cfg.Shards, f.lo, f.hi)
	}
	now, lastExpire, idle, err := decodeMeta(h.Meta)
	if err != nil {
		return fmt.Errorf("restore group %d: %w", f.cfg.Group, err)
	}
	tenants := make([]*Tenant, len(h.Tenants))
	byName := make(map[string]*Tenant, len(h.Tenants))
	for i, n := range h.Tenants {
		if byName[n] != nil {
			return fmt.Errorf("restore group %d: %w: tenant %q listed twice", f.cfg.Group, snapfmt.ErrCorrupt, n)
		}
		tenants[i] = &Tenant{Name: n, id: uint32(i)}
		byName[n] = tenants[i]
	}
	tables := make([][]*seriesmap.Table, f.cfg.Shards)
	for {
		s, series, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("restore group %d: %w", f.cfg.Group, err)
		}
		if int(s) >= f.cfg.Shards || tables[s] != nil {
			return fmt.Errorf("restore group %d: %w: shard %d out of range or repeated", f.cfg.Group, snapfmt.ErrCorrupt, s)
		}
		tables[s] = make([]*seriesmap.Table, len(tenants))
		for _, ts := range series {
			if int(ts.Tenant) >= len(tenants) || tables[s][ts.Tenant] != nil {
				return fmt.Errorf("restore group %d: %w: shard %d names tenant %d twice or out of range", f.cfg.Group, snapfmt.ErrCorrupt, s, ts.Tenant)
			}
			t, err := seriesmap.FromSorted(ts.Hashes, ts.Minutes)
			if err != nil {
				return fmt.Errorf("restore group %d: %w: shard %d tenant %d: %w", f.cfg.Group, snapfmt.ErrCorrupt, s, ts.Tenant, err)
			}
			tables[s][ts.Tenant] = t
			tenants[ts.Tenant].active += int64(t.Len())
		}
	}

	commits, err := f.prepareModules(rd.Sections())
	if err != nil {
		return fmt.Errorf("restore group %d: %w", f.cfg.Group, err)
	}
	for _, c := range commits {
		c()
	}

	// Swap in place: readers hold f.shards, so replace each shard's contents under
	// its lock rather than the slice itself.
	f.regMu.Lock()
	f.tenants, f.byName = tenants, byName
	f.regMu.Unlock()
	for s := range f.shards {
		sh := &f.shards[s]
		sh.mu.Lock()
		sh.tables = tables[s]
		sh.gens = make([]uint64, len(tables[s]))
		for i := range sh.gens {
			sh.gens[i] = f.snapGen
		}
		sh.mu.Unlock()
	}
	f.setNow(now)
	f.lastExpire, f.idle = lastExpire, idle
	f.appliedIndex.Store(h.Index)
	f.appliedTerm.Store(h.Term)
	return nil
}

// prepareModules validates every module section of a snapshot (and the
// absence of one: that module restores to empty) and returns the installers.
// A section for a module this FSM does not have is refused: its state would
// be dropped silently.
func (f *FSM) prepareModules(sections []snapfmt.Section) ([]func(), error) {
	data := make(map[string][]byte, len(sections))
	for _, sec := range sections {
		if f.modules[sec.Name] == nil {
			return nil, fmt.Errorf("%w: snapshot holds state of module %q, which this group is not configured with (a newer build, or another group's snapshot)", ErrSnapshotMismatch, sec.Name)
		}
		data[sec.Name] = sec.Payload
	}
	var commits []func()
	for _, name := range f.moduleNames {
		c, err := f.modules[name].PrepareRestore(data[name])
		if err != nil {
			return nil, fmt.Errorf("module %s: %w: %w", name, snapfmt.ErrCorrupt, err)
		}
		commits = append(commits, c)
	}
	return commits, nil
}

func decodeMeta(b []byte) (now, lastExpire int64, idle int, err error) {
	d := wire.NewDecoder(b, snapfmt.ErrCorrupt)
	if v := d.Byte("FSM meta version"); d.Err() == nil && v != metaVersion {
		d.Failf("unknown FSM meta version %d", v)
	}
	n, l, i := d.Uvarint("FSM meta now"), d.Uvarint("FSM meta lastExpire"), d.Uvarint("FSM meta idle")
	if d.Err() == nil && (n > 1<<40 || l > 1<<40 || i < 1 || i > MaxIdleAge) {
		d.Failf("FSM meta out of range (now=%d lastExpire=%d idle=%d)", n, l, i)
	}
	// Bytes after the three fields are ignored, as they always were.
	if err := d.Err(); err != nil {
		return 0, 0, 0, err
	}
	return int64(n), int64(l), int(i), nil
}

// WriteSnapshot writes an image of the current state in snapfmt. It must not run
// concurrently with Apply (raft's own snapshots use Snapshot/Persist instead); tools
// and tests use it on a quiescent FSM.
func (f *FSM) WriteSnapshot(w io.Writer) error {
	s, err := f.Snapshot()
	if err != nil {
		return err
	}
	defer s.Release()
	return s.(*snapshot).encode(w)
}
