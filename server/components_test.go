package server

import (
	"slices"
	"testing"

	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/fsm/shares"
)

// TestComponentListBuildsTheNode checks that one list builds the node: every
// component has a name of its own, and every group's FSM holds exactly the
// modules the list yields, in list order (the order of the snapshot
// sections), each the instance its capability serves.
func TestComponentListBuildsTheNode(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), nil)
	defer stop(t, s)

	var names []string
	for _, c := range s.comps {
		if c.name == "" || slices.Contains(names, c.name) {
			t.Errorf("component %q: every component needs a name of its own (have %v)", c.name, names)
		}
		names = append(names, c.name)
	}
	for g := range s.cfg.Layout.Groups {
		want := []string{shares.Name, runtimecfg.ModuleName, fsmmeter.Name}
		if g == 0 { // the layout table lives in group 0 only
			want = append(want, fsmlayout.Name)
		}
		want = append(want, partmove.Name)
		var got []string
		for _, m := range s.fsmModules(g) {
			got = append(got, m.Name())
			if s.FSM(g).Module(m.Name()) != m {
				t.Errorf("group %d: the FSM's module %q is not the one its component built", g, m.Name())
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("group %d: FSM modules %v, want %v (their order is the snapshot's section order)", g, got, want)
		}
	}
	if s.FSM(0).Module(shares.Name) != s.shares.Module(0) || s.FSM(0).Module(runtimecfg.ModuleName) != s.rcfg.mods[0] ||
		s.FSM(0).Module(fsmmeter.Name) != s.meterMods[0] || s.FSM(0).Module(fsmlayout.Name) != s.layout.Module() {
		t.Error("group 0's FSM modules are not the instances the capabilities serve")
	}
}
