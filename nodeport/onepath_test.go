package nodeport

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneForwardingPath: a forwarded call's context is built here only
// (Pool.Forward). Before this package, six places in two packages each
// resolved the leader, checked the forwarded mark and chose credentials, and
// one of them dropped the caller's.
func TestOneForwardingPath(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	here, _ := filepath.Abs(".")
	forwardPkg := filepath.Join(root, "forward")
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == here || p == forwardPkg || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "forward.Outgoing(") {
			t.Errorf("%s builds a forwarded call's context itself; use nodeport (Port.LeaderConn, Pool.Leader or Pool.Forward)", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
