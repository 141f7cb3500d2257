package nodeid

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/raftnode"
)

// TestIdentityFile: a new data dir gets an incarnation, the cluster id is
// recorded once and for good, a data dir of another node is refused, every
// kind of corrupt file is refused, and an earlier build's data dir adopts
// an identity.
func TestIdentityFile(t *testing.T) {
	dir := t.TempDir()
	id, err := Load(dir, true, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if id.Adopted || id.ClusterID() != "" || raftnode.ValidID(id.Incarnation) != nil {
		t.Fatalf("new identity: %+v", id)
	}
	if err := id.SetClusterID("00000000000000c1"); err != nil {
		t.Fatal(err)
	}
	again, err := Load(dir, false, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if again.Incarnation != id.Incarnation || again.ClusterID() != "00000000000000c1" || again.Adopted {
		t.Fatalf("reloaded identity %+v, want %+v", again, id)
	}
	if err := again.SetClusterID("00000000000000c2"); err == nil {
		t.Fatal("a data dir moved to another cluster")
	}

	if _, err := Load(dir, false, "n2"); err == nil || !strings.Contains(err.Error(), `belongs to node "n1"`) {
		t.Fatalf("data dir of n1 started as n2: %v", err)
	}
	path := filepath.Join(dir, File)
	for name, content := range map[string]string{
		"not json":         "{",
		"bad incarnation":  `{"version":1,"node_id":"n1","incarnation":"xyz"}`,
		"bad cluster id":   `{"version":1,"node_id":"n1","incarnation":"00000000000000a1","cluster_id":"0"}`,
		"unknown version":  `{"version":9,"node_id":"n1","incarnation":"00000000000000a1"}`,
		"zero incarnation": `{"version":1,"node_id":"n1","incarnation":"0000000000000000"}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(dir, false, "n1"); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}

	// A data dir with state but no identity (an earlier build's) adopts one.
	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "cluster.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ad, err := Load(old, false, "n1")
	if err != nil || !ad.Adopted {
		t.Fatalf("earlier build's data dir: %+v, %v", ad, err)
	}
}
