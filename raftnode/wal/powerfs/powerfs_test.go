package powerfs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// setup writes "synced" and syncs, then writes "+later" unsynced, and cuts.
func setup(t *testing.T, mode Mode, seed uint64) ([]byte, CutReport) {
	t.Helper()
	fs := New()
	path := filepath.Join(t.TempDir(), "seg")
	f, err := fs.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("synced"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	fired := fs.CutAfter(2)
	if _, err := f.WriteAt([]byte("+late"), 6); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("+later"), 11); err != nil {
		t.Fatal(err)
	}
	<-fired // the second write was the last: the power is off
	if _, err := f.WriteAt([]byte("x"), 17); !errors.Is(err, ErrPowerCut) {
		t.Fatalf("write after the cut: %v, want ErrPowerCut", err)
	}
	if err := f.Datasync(); !errors.Is(err, ErrPowerCut) {
		t.Fatalf("sync after the cut: %v, want ErrPowerCut", err)
	}
	_ = f.Close()
	rep, err := fs.Cut(mode, rand.New(rand.NewPCG(seed, 1)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, rep
}

func TestCutModes(t *testing.T) {
	if b, rep := setup(t, DropAll, 1); string(b) != "synced" || rep.Unsynced != 2 || rep.Kept != 0 {
		t.Fatalf("drop-all: %q %+v, want only the synced bytes", b, rep)
	}
	if b, rep := setup(t, KeepAll, 1); string(b) != "synced+late+later" || rep.Kept != 2 {
		t.Fatalf("keep-all: %q %+v, want every write", b, rep)
	}
	// Random: always the synced prefix; each write kept or not, the last
	// possibly torn; over many seeds every shape shows up.
	seen := map[string]bool{}
	for seed := range uint64(200) {
		b, _ := setup(t, Random, seed)
		if !bytes.HasPrefix(b, []byte("synced")) {
			t.Fatalf("random cut lost synced bytes: %q", b)
		}
		seen[string(b)] = true
	}
	for _, want := range []string{"synced", "synced+late", "synced+late+later"} {
		if !seen[want] {
			t.Errorf("random cuts never gave %q (saw %d shapes)", want, len(seen))
		}
	}
	torn := false
	for s := range seen {
		if len(s) > len("synced+late") && len(s) < len("synced+late+later") {
			torn = true
		}
	}
	if !torn {
		t.Errorf("random cuts never tore the last write (saw %v)", seen)
	}
}

// A segment removed since the directory's last sync may come back with its
// synced contents; one removed before a directory sync never does.
func TestRemovalNeedsDirSync(t *testing.T) {
	fs := New()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, p := range []string{a, b} {
		f, _ := fs.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
		_, _ = f.WriteAt([]byte(p), 0)
		_ = f.Datasync()
		_ = f.Close()
	}
	if err := fs.SyncDir(dir); err != nil { // both created for good
		t.Fatal(err)
	}
	if err := fs.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(b); err != nil {
		t.Fatal(err)
	}
	fs.Freeze()
	rep, err := fs.Cut(DropAll, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a (removal synced) is back: %v", err)
	}
	if got, err := os.ReadFile(b); err != nil || string(got) != b || rep.Resurrected != 1 {
		t.Errorf("b (removal not synced): %q %v %+v, want it back", got, err, rep)
	}
}

// A file created since its directory's last sync may vanish in a cut, with
// the data synced into it; one whose creation was synced stays. A file
// created and removed without a directory sync never comes back.
func TestCreationNeedsDirSync(t *testing.T) {
	for _, mode := range []Mode{DropAll, KeepAll} {
		fs := New()
		dir := t.TempDir()
		kept, lost, never := filepath.Join(dir, "kept"), filepath.Join(dir, "lost"), filepath.Join(dir, "never")
		write := func(p string) {
			t.Helper()
			f, err := fs.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte(p), 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Datasync(); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()
		}
		write(kept)
		if err := fs.SyncDir(dir); err != nil {
			t.Fatal(err)
		}
		write(lost)
		write(never)
		if err := fs.Remove(never); err != nil {
			t.Fatal(err)
		}
		fs.Freeze()
		rep, err := fs.Cut(mode, rand.New(rand.NewPCG(1, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(kept); err != nil || string(got) != kept {
			t.Errorf("%v: kept (creation synced): %q %v", mode, got, err)
		}
		_, err = os.Stat(lost)
		if mode == DropAll && (!errors.Is(err, os.ErrNotExist) || rep.Vanished != 1) {
			t.Errorf("%v: lost (creation not synced) is still there: %v %+v", mode, err, rep)
		}
		if mode == KeepAll && err != nil {
			t.Errorf("%v: lost (creation not synced, every change kept): %v", mode, err)
		}
		if _, err := os.Stat(never); !errors.Is(err, os.ErrNotExist) || rep.Resurrected != 0 {
			t.Errorf("%v: never (created and removed, neither synced) came back: %v %+v", mode, err, rep)
		}
	}
}

// Unsynced removals come back each on its own: over many random cuts an
// older one comes back while a newer stays removed (no journal order is
// assumed), and the other way round.
func TestRemovalsComeBackInNoOrder(t *testing.T) {
	shapes := map[[2]bool]bool{}
	for seed := range uint64(64) {
		fs := New()
		dir := t.TempDir()
		var paths []string
		for _, n := range []string{"old", "new"} {
			p := filepath.Join(dir, n)
			f, _ := fs.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
			_, _ = f.WriteAt([]byte(n), 0)
			_ = f.Datasync()
			_ = f.Close()
			paths = append(paths, p)
		}
		_ = fs.SyncDir(dir)
		for _, p := range paths {
			if err := fs.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		fs.Freeze()
		if _, err := fs.Cut(Random, rand.New(rand.NewPCG(seed, 7))); err != nil {
			t.Fatal(err)
		}
		var back [2]bool
		for i, p := range paths {
			_, err := os.Stat(p)
			back[i] = err == nil
		}
		shapes[back] = true
	}
	for _, want := range [][2]bool{{true, false}, {false, true}, {true, true}, {false, false}} {
		if !shapes[want] {
			t.Errorf("random cuts never brought back old=%v new=%v (saw %v)", want[0], want[1], shapes)
		}
	}
}

// CutAfterOps stops the power after a removal or a directory sync too, not
// only after writes.
func TestCutAfterOpsCountsEveryChange(t *testing.T) {
	fs := New()
	dir := t.TempDir()
	p := filepath.Join(dir, "a")
	f, err := fs.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	fired := fs.CutAfterOps(2)
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired:
		t.Fatal("the power went off after one change, armed for two")
	default:
	}
	if err := fs.Remove(p); err != nil {
		t.Fatal(err)
	}
	<-fired
	if err := fs.SyncDir(dir); !errors.Is(err, ErrPowerCut) {
		t.Fatalf("directory sync after the cut: %v, want ErrPowerCut", err)
	}
}

// snapshotLike makes dir/x.tmp with a synced file in it and renames it to
// dir/x, the snapshot store's sequence, syncing the parent only if
// syncParent; then cuts with mode.
func snapshotLike(t *testing.T, mode Mode, syncTmp, syncParent bool) (string, CutReport) {
	t.Helper()
	fs := New()
	dir := t.TempDir()
	tmp, final := filepath.Join(dir, "x.tmp"), filepath.Join(dir, "x")
	if err := fs.Mkdir(tmp, 0o750); err != nil {
		t.Fatal(err)
	}
	f, err := fs.OpenFile(filepath.Join(tmp, "state"), os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("state"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if syncTmp {
		if err := fs.SyncDir(tmp); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	if syncParent {
		if err := fs.SyncDir(dir); err != nil {
			t.Fatal(err)
		}
	}
	fs.Freeze()
	rep, err := fs.Cut(mode, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, _ error) error {
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, rel)
		}
		return nil
	})
	return fmt.Sprint(names), rep
}

func TestDirectories(t *testing.T) {
	// Fully synced: survives anything.
	for _, m := range []Mode{DropAll, KeepAll, Random} {
		if got, _ := snapshotLike(t, m, true, true); got != "[x x/state]" {
			t.Errorf("%s, synced: %s, want [x x/state]", m, got)
		}
	}
	// The new directory's own entries not synced: the directory survives
	// empty.
	if got, rep := snapshotLike(t, DropAll, false, true); got != "[x]" || rep.Vanished != 1 {
		t.Errorf("drop-all, tmp dir not synced: %s %+v, want [x] with one entry vanished", got, rep)
	}
	// The parent not synced: the new directory (created since) is gone.
	if got, _ := snapshotLike(t, DropAll, true, false); got != "[]" {
		t.Errorf("drop-all, parent not synced: %s, want []", got)
	}
	if got, _ := snapshotLike(t, KeepAll, false, false); got != "[x x/state]" {
		t.Errorf("keep-all: %s, want [x x/state]", got)
	}
}

func TestRenameAndRemoveDirectoryUndone(t *testing.T) {
	fs := New()
	dir := t.TempDir()
	old, moved, gone := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	for _, d := range []string{old, gone} {
		if err := os.Mkdir(d, 0o750); err != nil { // durable: made before the disk saw it
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(gone, "f"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(old, moved); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(moved, moved); err == nil {
		t.Fatal("rename over an existing entry: no error")
	}
	if err := fs.Remove(filepath.Join(gone, "f")); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(gone); err != nil {
		t.Fatal(err)
	}
	fs.Freeze()
	if err := fs.Mkdir(filepath.Join(dir, "d"), 0o750); !errors.Is(err, ErrPowerCut) {
		t.Fatalf("mkdir after the cut: %v", err)
	}
	rep, err := fs.Cut(DropAll, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil || rep.Unrenamed != 1 {
		t.Fatalf("rename not undone: %v %+v", err, rep)
	}
	if b, err := os.ReadFile(filepath.Join(gone, "f")); err != nil || string(b) != "kept" {
		t.Fatalf("removed directory and file not back: %q %v", b, err)
	}

	// Synced: the removal of the directory is durable, and so is that of
	// the file in it, though its own directory was never synced after.
	fs2 := New()
	if err := fs2.Remove(filepath.Join(gone, "f")); err != nil {
		t.Fatal(err)
	}
	if err := fs2.Remove(gone); err != nil {
		t.Fatal(err)
	}
	if err := fs2.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	fs2.Freeze()
	if rep, err := fs2.Cut(DropAll, nil); err != nil || rep.Resurrected != 0 {
		t.Fatalf("%+v %v, want nothing back", rep, err)
	}
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("durably removed directory is back: %v", err)
	}
}
