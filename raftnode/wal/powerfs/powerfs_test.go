package powerfs

import (
	"bytes"
	"errors"
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
