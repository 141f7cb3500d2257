package server

import (
	"log/slog"
	"testing"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/recovery"
)

// TestEntryRegistry: with every module linked (each registers its own entry
// types at init), the newest registered type is exactly the build's cluster
// version, and every module-owned type belongs to a module a group's FSM is
// configured with, so no committed entry can find its owner missing.
func TestEntryRegistry(t *testing.T) {
	f, err := recovery.FSM(16, 4, 4, 1, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	maxSince := 0
	for _, ty := range fsm.EntryTypes() {
		maxSince = max(maxSince, ty.Since)
		if ty.Module != "" && f.Module(ty.Module) == nil {
			t.Errorf("entry type %d (%s) belongs to module %q, which a group is not configured with", ty.Type, ty.Name, ty.Module)
		}
	}
	if maxSince != fsm.CurrentClusterVersion {
		t.Errorf("fsm.CurrentClusterVersion = %d, but the newest registered entry type needs %d", fsm.CurrentClusterVersion, maxSince)
	}
	if n := len(fsm.EntryTypes()); n != 25 {
		t.Errorf("%d entry types registered, want 25 (3 core, 5 runtime config, 5 shares, 6 metering, 2 layout table, 4 partition moves): a module's init did not run, or a type was added without this test", n)
	}
}
