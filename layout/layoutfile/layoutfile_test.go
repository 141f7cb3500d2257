package layoutfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck: a new data dir records the layout; the same layout passes;
// another is refused with both named; a raised group count passes up to the
// raft groups listed, and the recorded count (the arithmetic's base) is
// returned every time.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	want := Layout{Partitions: 64, Groups: 4, Shards: 16}
	if base, err := Check(dir, want, 0); err != nil || base != 4 {
		t.Fatalf("new data dir: base %d, err %v", base, err)
	}
	if got, err := Read(dir); err != nil || got != want {
		t.Fatalf("recorded %+v (%v), want %+v", got, err, want)
	}
	if base, err := Check(dir, want, 4); err != nil || base != 4 {
		t.Fatalf("same layout: base %d, err %v", base, err)
	}
	raised := want
	raised.Groups = 8
	if base, err := Check(dir, raised, 8); err != nil || base != 4 {
		t.Fatalf("groups 8 with 8 raft groups listed: base %d, err %v", base, err)
	}
	_, err := Check(dir, raised, 4)
	if err == nil || !strings.Contains(err.Error(), "groups=4") || !strings.Contains(err.Error(), "groups=8") {
		t.Fatalf("groups 8 with 4 raft groups listed: %v, want a refusal naming both counts", err)
	}
	other := want
	other.Shards = 32
	if _, err := Check(dir, other, 4); err == nil || !strings.Contains(err.Error(), "shards=32") {
		t.Fatalf("other shards: %v, want a refusal naming them", err)
	}
	if _, err := os.Stat(filepath.Join(dir, Name+".tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary file was left behind: %v", err)
	}
}

// TestDamagedFile: a truncated or empty file is reported with its path,
// never taken for a new data dir or a zero layout.
func TestDamagedFile(t *testing.T) {
	for name, content := range map[string]string{"truncated": `{"partitions": 64, "gro`, "empty": "", "zeros": `{}`} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, Name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Check(dir, Layout{Partitions: 64, Groups: 4, Shards: 16}, 0)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, Name)) {
			t.Errorf("%s file: %v, want an error naming it", name, err)
		}
	}
}
