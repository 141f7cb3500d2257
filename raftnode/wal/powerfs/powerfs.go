package powerfs

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/raftnode/wal"
)

// ErrPowerCut is what every write, sync or removal returns after Freeze.
var ErrPowerCut = errors.New("powerfs: the power is off")

// Mode is what a cut keeps of the writes since the last sync.
type Mode int

const (
	DropAll Mode = iota // the disk holds exactly what was synced
	KeepAll             // every write reached the disk (as after SIGKILL)
	Random              // a random subset, in order, the last possibly torn
)

func (m Mode) String() string {
	return [...]string{"drop-all", "keep-all", "random"}[m]
}

type op struct {
	off      int64
	data     []byte
	truncate bool // to off
}

// removal is a file (or an empty directory) removed since the last sync of
// its directory, with the contents it had durably.
type removal struct {
	name    string
	durable []byte
	dir     bool
}

// rename is a rename of a durable entry not yet made durable by a sync of
// the new name's directory: a cut may undo it.
type rename struct{ from, to string }

type fileState struct {
	durable []byte // the contents as of the last sync
	pending []op   // since then, in order
}

// FS is one machine's disk. The zero value is not usable: use New.
type FS struct {
	mu    sync.Mutex
	files map[string]*fileState
	// created: files and directories created since their directory's
	// last sync; a cut may take their directory entry (and so the whole
	// file, or the directory with everything in it) away.
	created map[string]bool
	removed []removal // since the last directory sync, oldest first
	renamed []rename  // since the last directory sync, oldest first
	frozen  bool
	// armed > 0: the power goes off right after that many more writes
	// (CutAfter), or changes of any kind (CutAfterOps: armedOps); fired
	// is closed then.
	armed    int
	armedOps bool
	fired    chan struct{}
	// syncDelay, when set, is slept in every Datasync (a slow disk).
	syncDelay time.Duration
	// lying: Datasync reports success and makes nothing durable (a disk
	// or mount that ignores flushes): a deliberately broken disk, for
	// tests that their check catches lost acknowledged writes.
	lying bool
}

// SetLying makes Datasync succeed without making anything durable.
func (fs *FS) SetLying(lying bool) {
	fs.mu.Lock()
	fs.lying = lying
	fs.mu.Unlock()
}

// New returns a disk that has lost nothing yet.
func New() *FS { return &FS{files: map[string]*fileState{}, created: map[string]bool{}} }

// SetSyncDelay makes every later Datasync take d first (0: no delay).
func (fs *FS) SetSyncDelay(d time.Duration) {
	fs.mu.Lock()
	fs.syncDelay = d
	fs.mu.Unlock()
}

// state returns name's state, reading its current contents as durable if
// the disk has not seen the file since the last cut.
func (fs *FS) state(name string) (*fileState, error) {
	if st, ok := fs.files[name]; ok {
		return st, nil
	}
	b, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	st := &fileState{durable: b}
	fs.files[name] = st
	return st, nil
}

// OpenFile opens the real file and tracks its writes.
func (fs *FS) OpenFile(name string, flag int, perm os.FileMode) (wal.File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.frozen && flag&(os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_RDWR) != 0 {
		return nil, ErrPowerCut
	}
	_, statErr := os.Stat(name)
	creating := flag&os.O_CREATE != 0 && errors.Is(statErr, os.ErrNotExist)
	st, err := fs.state(name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if creating {
		if i := slices.IndexFunc(fs.removed, func(r removal) bool { return r.name == name }); i >= 0 {
			// Removed and created again, neither made durable: the
			// directory still durably names the old file.
			st.durable = fs.removed[i].durable
			fs.removed = slices.Delete(fs.removed, i, i+1)
			st.pending = append(st.pending, op{off: 0, truncate: true})
		} else {
			fs.created[name] = true
		}
	}
	if flag&os.O_TRUNC != 0 {
		st.pending = append(st.pending, op{off: 0, truncate: true})
	}
	if creating || flag&os.O_TRUNC != 0 {
		fs.tick(false)
	}
	return &file{fs: fs, name: name, f: f}, nil
}

// tick counts one change towards an armed cut: a write always, anything
// else only under CutAfterOps. Caller holds mu.
func (fs *FS) tick(write bool) {
	if fs.armed == 0 || (!write && !fs.armedOps) {
		return
	}
	if fs.armed--; fs.armed == 0 {
		fs.frozen = true
		close(fs.fired)
	}
}

// ReadFile reads the real file.
func (fs *FS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// Remove removes the real file; until the directory is synced, a cut may
// bring it back with its durable contents (unless its creation was never
// made durable either).
func (fs *FS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.frozen {
		return ErrPowerCut
	}
	if fi, err := os.Lstat(name); err == nil && fi.IsDir() {
		if err := os.Remove(name); err != nil { // only an empty one
			return err
		}
		if fs.created[name] {
			delete(fs.created, name)
		} else {
			fs.removed = append(fs.removed, removal{name: name, dir: true})
		}
		fs.tick(false)
		return nil
	}
	st, err := fs.state(name)
	if err != nil {
		return err
	}
	if err := os.Remove(name); err != nil {
		return err
	}
	if fs.created[name] {
		delete(fs.created, name)
	} else {
		fs.removed = append(fs.removed, removal{name: name, durable: st.durable})
	}
	delete(fs.files, name)
	fs.tick(false)
	return nil
}

// Mkdir makes the real directory; until its parent is synced, a cut may
// take it away with everything in it.
func (fs *FS) Mkdir(name string, perm os.FileMode) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.frozen {
		return ErrPowerCut
	}
	if err := os.Mkdir(name, perm); err != nil {
		return err
	}
	fs.created[filepath.Clean(name)] = true
	fs.tick(false)
	return nil
}

// Rename renames the real file or directory. The target must not exist:
// replacing an entry is not modelled (a cut would have to bring the old
// target back). Until the new name's directory is synced, a cut may undo
// the rename; if the entry itself was created since its directory's last
// sync, the entry is still new under its new name and a cut may take it
// away (it does not come back under the old one: either way, what was
// being renamed into place is not there).
func (fs *FS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.frozen {
		return ErrPowerCut
	}
	oldname, newname = filepath.Clean(oldname), filepath.Clean(newname)
	if _, err := os.Lstat(newname); err == nil {
		return fmt.Errorf("powerfs: rename %s over the existing %s is not modelled", oldname, newname)
	}
	if err := os.Rename(oldname, newname); err != nil {
		return err
	}
	wasCreated := fs.created[oldname]
	// What the disk tracks under the old name now lives under the new one.
	move := func(name string) (string, bool) {
		if name == oldname {
			return newname, true
		}
		if rest, ok := strings.CutPrefix(name, oldname+string(filepath.Separator)); ok {
			return filepath.Join(newname, rest), true
		}
		return name, false
	}
	for name, st := range fs.files {
		if to, ok := move(name); ok {
			delete(fs.files, name)
			fs.files[to] = st
		}
	}
	for name := range fs.created {
		if to, ok := move(name); ok {
			delete(fs.created, name)
			fs.created[to] = true
		}
	}
	if !wasCreated {
		fs.renamed = append(fs.renamed, rename{oldname, newname})
	}
	fs.tick(false)
	return nil
}

// ReadDir lists the real directory.
func (fs *FS) ReadDir(name string) ([]os.DirEntry, error) { return os.ReadDir(name) }

// SyncDir makes the creations, removals and renames in dir durable.
func (fs *FS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.frozen {
		return ErrPowerCut
	}
	dir = filepath.Clean(dir)
	in := func(name string) bool { return filepath.Dir(name) == dir }
	// A directory whose removal is now durable is gone with whatever it
	// held: the unsynced removals in it can no longer be undone.
	var gone []string
	for _, r := range fs.removed {
		if r.dir && in(r.name) {
			gone = append(gone, r.name+string(filepath.Separator))
		}
	}
	under := func(name string) bool {
		return slices.ContainsFunc(gone, func(p string) bool { return strings.HasPrefix(name, p) })
	}
	fs.removed = slices.DeleteFunc(fs.removed, func(r removal) bool { return in(r.name) || under(r.name) })
	fs.renamed = slices.DeleteFunc(fs.renamed, func(r rename) bool { return in(r.to) })
	for name := range fs.created {
		if in(name) {
			delete(fs.created, name)
		}
	}
	fs.tick(false)
	return nil
}

// Freeze cuts the power: from now on every write, sync and removal fails
// with ErrPowerCut. Stop the node, then call Cut.
func (fs *FS) Freeze() {
	fs.mu.Lock()
	fs.frozen = true
	fs.mu.Unlock()
}

// CutAfter arms the disk to lose power right after n more writes reach it
// (the last of them written but not synced: the moment a power cut does
// most damage). The returned channel is closed when it does.
func (fs *FS) CutAfter(n int) <-chan struct{} {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed, fs.armedOps, fs.fired = max(n, 1), false, make(chan struct{})
	return fs.fired
}

// CutAfterOps is CutAfter counting every change, not only writes: a
// write, truncate, sync, creation, removal or directory sync. It can so
// stop the power between any two steps, such as two segment removals.
func (fs *FS) CutAfterOps(n int) <-chan struct{} {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed, fs.armedOps, fs.fired = max(n, 1), true, make(chan struct{})
	return fs.fired
}

// CutReport says what a cut did.
type CutReport struct {
	Files       int // files rewritten
	Unsynced    int // writes (and truncates) not yet synced at the cut
	Kept        int // of them, kept whole
	Torn        int // kept in part (0 or 1 per file)
	Resurrected int // removed files (or directories) that came back
	Vanished    int // created files or directories whose entry was lost
	Unrenamed   int // renames undone
}

// Cut rewrites every file the disk has seen as it could be after the power
// cut (mode, with rng for Random), then turns the power back on: the files
// as they are now become the durable state. Call it after Freeze, once
// nothing uses the files any more.
func (fs *FS) Cut(mode Mode, rng *rand.Rand) (CutReport, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.frozen {
		return CutReport{}, errors.New("powerfs: Cut without Freeze")
	}
	var rep CutReport
	for name, st := range fs.files {
		rep.Unsynced += len(st.pending)
		if len(st.pending) == 0 {
			continue // the file is what was synced
		}
		img := st.durable
		for i, o := range st.pending {
			keep := mode == KeepAll || (mode == Random && rng.IntN(2) == 0)
			if !keep {
				if mode == Random {
					continue // an independent subset: later writes may survive
				}
				break
			}
			if mode == Random && !o.truncate && i == len(st.pending)-1 && rng.IntN(3) == 0 && len(o.data) > 1 {
				o.data = o.data[:rng.IntN(len(o.data))] // torn
				rep.Torn++
			} else {
				rep.Kept++
			}
			img = apply(img, o)
		}
		if err := os.WriteFile(name, img, 0o600); err != nil {
			return rep, fmt.Errorf("powerfs: rewrite %s: %w", name, err)
		}
		rep.Files++
	}
	// Directory entries not synced: POSIX promises no order among them
	// (a journalling file system happens to commit them in order, others
	// need not), so each is lost or kept on its own.
	lost := func() bool { return mode == DropAll || (mode == Random && rng.IntN(2) == 0) }
	// First the creations (by their current names; a lost directory
	// takes everything in it), then the renames, newest first, then the
	// removals (a directory before what was in it; a file whose directory
	// is gone for good stays gone).
	created := slices.Sorted(maps.Keys(fs.created))
	for _, name := range created {
		if !lost() {
			continue
		}
		if _, err := os.Lstat(name); errors.Is(err, os.ErrNotExist) {
			continue // went with its directory
		}
		if err := os.RemoveAll(name); err != nil {
			return rep, fmt.Errorf("powerfs: undo the creation of %s: %w", name, err)
		}
		rep.Vanished++
	}
	for _, r := range slices.Backward(fs.renamed) {
		if !lost() {
			continue
		}
		if _, err := os.Lstat(r.to); err != nil {
			continue
		}
		if err := os.Rename(r.to, r.from); err != nil {
			return rep, fmt.Errorf("powerfs: undo the rename of %s to %s: %w", r.from, r.to, err)
		}
		rep.Unrenamed++
	}
	back := map[int]bool{}
	for i, r := range fs.removed {
		back[i] = lost()
		if !back[i] || !r.dir {
			continue
		}
		if err := os.MkdirAll(r.name, 0o750); err != nil {
			return rep, fmt.Errorf("powerfs: restore the directory %s: %w", r.name, err)
		}
		rep.Resurrected++
	}
	for i, r := range fs.removed {
		if !back[i] || r.dir {
			continue
		}
		if _, err := os.Stat(filepath.Dir(r.name)); err != nil {
			continue
		}
		if err := os.WriteFile(r.name, r.durable, 0o600); err != nil {
			return rep, fmt.Errorf("powerfs: restore %s: %w", r.name, err)
		}
		rep.Resurrected++
	}
	fs.files, fs.created, fs.removed, fs.renamed = map[string]*fileState{}, map[string]bool{}, nil, nil
	fs.frozen, fs.armed = false, 0
	return rep, nil
}

// apply returns img with o applied (img may be reused).
func apply(img []byte, o op) []byte {
	if o.truncate {
		if int64(len(img)) > o.off {
			return append([]byte(nil), img[:o.off]...)
		}
		return append(img, make([]byte, o.off-int64(len(img)))...)
	}
	out := append([]byte(nil), img...)
	if end := o.off + int64(len(o.data)); end > int64(len(out)) {
		out = append(out, make([]byte, end-int64(len(out)))...)
	}
	copy(out[o.off:], o.data)
	return out
}

type file struct {
	fs   *FS
	name string
	f    *os.File
}

func (f *file) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.frozen {
		return 0, ErrPowerCut
	}
	st, err := f.fs.state(f.name)
	if err != nil {
		return 0, err
	}
	n, err := f.f.WriteAt(p, off)
	st.pending = append(st.pending, op{off: off, data: append([]byte(nil), p[:n]...)})
	f.fs.tick(true)
	return n, err
}

func (f *file) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.frozen {
		return ErrPowerCut
	}
	st, err := f.fs.state(f.name)
	if err != nil {
		return err
	}
	if err := f.f.Truncate(size); err != nil {
		return err
	}
	st.pending = append(st.pending, op{off: size, truncate: true})
	f.fs.tick(false)
	return nil
}

// Datasync makes the file's writes so far survive any cut. It does not
// call fdatasync: durability here is the model's, not the disk's.
func (f *file) Datasync() error {
	f.fs.mu.Lock()
	delay := f.fs.syncDelay
	f.fs.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.frozen {
		return ErrPowerCut
	}
	if f.fs.lying {
		return nil
	}
	st, err := f.fs.state(f.name)
	if err != nil {
		return err
	}
	for _, o := range st.pending {
		st.durable = apply(st.durable, o)
	}
	st.pending = nil
	f.fs.tick(false)
	return nil
}

func (f *file) Close() error { return f.f.Close() }
