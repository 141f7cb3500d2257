package membership

import (
	"slices"
	"testing"
	"time"
)

func TestFormatParseGroups(t *testing.T) {
	cases := map[string][]int{
		"":          nil,
		"0":         {0},
		"0-3,7":     {0, 1, 2, 3, 7},
		"1,3,5-6,9": {1, 3, 5, 6, 9},
		"0-4095":    seq(4096),
		"2-3,10-11": {11, 10, 3, 2, 2},
	}
	for want, in := range cases {
		got := FormatGroups(in)
		if got != want {
			t.Errorf("FormatGroups(%v) = %q, want %q", in, got, want)
		}
		back, err := ParseGroups(got)
		if err != nil {
			t.Fatal(err)
		}
		exp := slices.Compact(slices.Sorted(slices.Values(in)))
		if !slices.Equal(back, exp) {
			t.Errorf("ParseGroups(%q) = %v, want %v", got, back, exp)
		}
	}
	for _, bad := range []string{"x", "1-", "-1", "3-1", "1,,2", "0-99999999"} {
		if _, err := ParseGroups(bad); err == nil {
			t.Errorf("ParseGroups(%q): want error", bad)
		}
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func start(t *testing.T, id, zone string) *Membership {
	t.Helper()
	m, err := New(Config{NodeID: id, Zone: zone, GRPCAddr: id + ":1", RaftAddr: id + ":2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestJoinTagsLeave(t *testing.T) {
	a := start(t, "a", "zone-a")
	b := start(t, "b", "zone-b")
	c := start(t, "c", "zone-c")
	ch := a.Changed()
	if _, err := b.Join([]string{a.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join([]string{b.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatal("no change notification after joins")
	}
	waitFor(t, "3 alive members on a", func() bool { return countStatus(a.Members(), StatusAlive) == 3 })
	ms := a.Members()
	if ms[1].ID != "b" || ms[1].Zone != "zone-b" || ms[1].GRPCAddr != "b:1" || ms[1].RaftAddr != "b:2" {
		t.Fatalf("member b as seen by a: %+v", ms[1])
	}
	if err := c.SetLed([]int{0, 1, 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c's led groups on a", func() bool { return slices.Equal(a.Members()[2].GroupsLed, []int{0, 1, 3}) })

	if ms := a.Members(); ms[2].DiskFull {
		t.Fatal("c reported with a full disk before it said so")
	}
	if err := c.SetDiskFull(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c's full disk on a", func() bool { return a.Members()[2].DiskFull })
	if err := c.SetDiskFull(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c's disk writable again on a", func() bool { return !a.Members()[2].DiskFull })

	if a.Members()[1].Draining {
		t.Fatal("b reported draining before it said so")
	}
	if err := b.SetDraining(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b draining on a", func() bool { return a.Members()[1].Draining })

	if err := b.Leave(); err != nil {
		t.Fatal(err)
	}
	_ = b.Shutdown()
	waitFor(t, "b left on a", func() bool { return a.Members()[1].Status == StatusLeft })

	_ = c.Shutdown() // no leave: a must detect the failure
	waitFor(t, "c failed on a", func() bool { return a.Members()[2].Status == StatusFailed })
}

func countStatus(ms []Member, st string) int {
	n := 0
	for _, m := range ms {
		if m.Status == st {
			n++
		}
	}
	return n
}

func TestSetLedTooLarge(t *testing.T) {
	a := start(t, "a", "zone-a")
	var scattered []int
	for g := 0; g < 400; g += 2 {
		scattered = append(scattered, g)
	}
	if err := a.SetLed(scattered); err == nil {
		t.Fatal("want error for an oversized led-groups tag")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{}, {NodeID: "a"}, {NodeID: "a", Zone: "z"}, {NodeID: "a", Zone: "z", GRPCAddr: "x:1", RaftAddr: "x:2", BindAddr: "nope"}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v): want error", c)
		}
	}
}

// TestClusterVersionTag also covers the "lg" tag (LeadGroups), gossiped the
// same way: a member without it may lead any group.
func TestClusterVersionTag(t *testing.T) {
	a := start(t, "a", "zone-a") // no version configured: advertises 1
	b, err := New(Config{NodeID: "b", Zone: "zone-b", GRPCAddr: "b:1", RaftAddr: "b:2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, ClusterVersion: 7, LeadGroups: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Shutdown() })
	if _, err := b.Join([]string{a.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "2 alive members on a and b", func() bool {
		return countStatus(a.Members(), StatusAlive) == 2 && countStatus(b.Members(), StatusAlive) == 2
	})
	for _, m := range []*Membership{a, b} {
		ms := m.Members()
		if ms[0].ClusterVersion != 1 || ms[1].ClusterVersion != 7 {
			t.Fatalf("versions seen: a=%d b=%d, want 1 and 7", ms[0].ClusterVersion, ms[1].ClusterVersion)
		}
		if !ms[0].MayLead(40) || !ms[1].MayLead(3) || ms[1].MayLead(4) {
			t.Fatalf("lead bounds seen: a=%d b=%d, want none and 4", ms[0].LeadGroups, ms[1].LeadGroups)
		}
	}
	for tag, want := range map[string]int{"": 0, "x": 0, "-3": 0, "16": 16} {
		if got := parseLeadGroups(tag); got != want {
			t.Errorf("parseLeadGroups(%q) = %d, want %d", tag, got, want)
		}
	}
	for tag, want := range map[string]int{"": 1, "x": 1, "0": 1, "-3": 1, "2": 2} {
		if got := ParseClusterVersion(tag); got != want {
			t.Errorf("ParseClusterVersion(%q) = %d, want %d", tag, got, want)
		}
	}
	if _, err := New(Config{NodeID: "c", Zone: "z", GRPCAddr: "c:1", RaftAddr: "c:2", ClusterVersion: -1}); err == nil {
		t.Error("negative cluster version accepted")
	}
}

// A member that left or failed stays in the list with the tags it last
// gossiped: the server's version gate counts a down voter with its last "ver"
// (server/versions.go), so that must not read as "unknown" or 1.
func TestDownMembersKeepClusterVersion(t *testing.T) {
	a := start(t, "a", "zone-a")
	var others []*Membership
	for id, ver := range map[string]int{"b": 7, "c": 5} {
		m, err := New(Config{NodeID: id, Zone: "zone-" + id, GRPCAddr: id + ":1", RaftAddr: id + ":2", BindAddr: "127.0.0.1:0",
			ProbeInterval: 200 * time.Millisecond, ClusterVersion: ver})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown() })
		if _, err := m.Join([]string{a.GossipAddr()}); err != nil {
			t.Fatal(err)
		}
		others = append(others, m)
	}
	waitFor(t, "3 alive members on a", func() bool { return countStatus(a.Members(), StatusAlive) == 3 })
	for _, m := range others {
		if m.cfg.NodeID == "b" {
			if err := m.Leave(); err != nil {
				t.Fatal(err)
			}
		}
		_ = m.Shutdown() // c: no leave, a must detect the failure
	}
	waitFor(t, "b left and c failed on a", func() bool {
		ms := a.Members()
		return ms[1].Status == StatusLeft && ms[2].Status == StatusFailed
	})
	ms := a.Members()
	if ms[1].ClusterVersion != 7 || ms[2].ClusterVersion != 5 {
		t.Fatalf("down members' versions on a: b (left) %d, c (failed) %d; want their last advertised 7 and 5",
			ms[1].ClusterVersion, ms[2].ClusterVersion)
	}
	if ms[1].Zone != "zone-b" || ms[2].GRPCAddr != "c:1" {
		t.Fatalf("down members lost their other tags: %+v", ms[1:])
	}
}
