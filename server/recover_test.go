package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/recovery"
)

// TestRecoveryFSMMatchesServer: the state machine raft recover replays the log
// into is built like the server's, module for module (a module missing there
// would drop its state from the group for good), and planning refuses a data
// dir a node runs on.
func TestRecoveryFSMMatchesServer(t *testing.T) {
	dir := t.TempDir()
	s, err := New(quietConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	assertRecoveryFSMsMatch(t, s)
	cfg := s.cfg
	if _, err := recovery.Prepare(recovery.Options{DataDir: dir, NodeID: "n1"}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("planning a recovery on a running node's data dir: %v, want a refusal naming the running node", err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A single node is the whole configuration already: nothing to do.
	p, err := recovery.Prepare(recovery.Options{DataDir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range p.Plans {
		if g.Skip == "" {
			t.Errorf("group %d of a single node: planned a rewrite (%s → %s)", g.Group, cluster.FormatConfiguration(g.Configuration), cluster.FormatConfiguration(g.New))
		}
	}
	if len(p.Plans) != cfg.Layout.Groups {
		t.Errorf("%d groups planned, want %d", len(p.Plans), cfg.Layout.Groups)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		opts recovery.Options
		want string
	}{
		{recovery.Options{DataDir: dir, NodeID: "n1", Voters: []string{"n1", "n7"}}, "n7, which is not in the group's configuration"},
		{recovery.Options{DataDir: dir, NodeID: "n1", Voters: []string{"n7"}}, "does not include this node"},
		{recovery.Options{DataDir: dir, NodeID: "n2"}, `belongs to node "n1", not "n2"`},
		{recovery.Options{DataDir: dir, NodeID: "n1", Groups: []int{99}}, "group 99"},
		{recovery.Options{DataDir: t.TempDir(), NodeID: "n1"}, "not the data dir of a tollgate node"},
	} {
		p, err := recovery.Prepare(bad.opts)
		if err == nil {
			p.Close()
			t.Errorf("%+v: planned, want a refusal", bad.opts)
			continue
		}
		if !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want it to say %q", bad.opts, err, bad.want)
		}
	}
}

// assertRecoveryFSMsMatch checks that recovery builds every group's state
// machine as the running node s did: the same modules in the same order
// (their snapshot sections), the same layout and base.
func assertRecoveryFSMsMatch(t *testing.T, s *Server) {
	t.Helper()
	cfg := s.cfg
	for g, f := range s.servedFSMs() {
		r, err := recovery.FSM(cfg.Layout.Partitions, cfg.Layout.Groups, s.base, cfg.Layout.Shards, g, nil)
		if err != nil {
			t.Fatal(err)
		}
		var have, want []string
		for _, m := range r.Config().Modules {
			have = append(have, m.Name())
		}
		for _, m := range f.Config().Modules {
			want = append(want, m.Name())
		}
		if strings.Join(have, ",") != strings.Join(want, ",") {
			t.Fatalf("group %d: recovery FSM modules %v, the server's %v", g, have, want)
		}
		rc, fc := r.Config(), f.Config()
		if rc.Partitions != fc.Partitions || rc.Groups != fc.Groups || rc.Base != fc.Base || rc.Shards != fc.Shards || rc.Group != fc.Group {
			t.Fatalf("group %d: recovery FSM layout %+v, the server's %+v", g, rc, fc)
		}
	}
}
