package membership

import (
	"bytes"
	"testing"
	"time"
)

func startKeyed(t *testing.T, id string, keys ...[]byte) *Membership {
	t.Helper()
	m, err := New(Config{NodeID: id, Zone: "zone-" + id, GRPCAddr: id + ":1", RaftAddr: id + ":2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

// TestGossipEncryption: members sharing a key form a cluster; a member with
// another key, or none, cannot join it; a member whose ring holds the
// other's primary key as a secondary key interoperate (a key rotation).
func TestGossipEncryption(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	a := startKeyed(t, "a", k1)
	b := startKeyed(t, "b", k1)
	if _, err := b.Join([]string{a.GossipAddr()}); err != nil {
		t.Fatalf("same key: %v", err)
	}
	waitFor(t, "a and b alive on a", func() bool { return countStatus(a.Members(), StatusAlive) == 2 })

	if _, err := startKeyed(t, "c", k2).Join([]string{a.GossipAddr()}); err == nil {
		t.Error("a member with another key joined")
	}
	if _, err := startKeyed(t, "d").Join([]string{a.GossipAddr()}); err == nil {
		t.Error("a member without a key joined an encrypted cluster")
	}
	// The other direction: an unencrypted cluster refuses an encrypted member.
	plain := startKeyed(t, "p")
	if _, err := startKeyed(t, "e", k1).Join([]string{plain.GossipAddr()}); err == nil {
		t.Error("an encrypted member joined a plaintext cluster")
	}
	// Mid-rotation: x encrypts with k1 and reads k2, y the reverse; each
	// reads the other, so they form a cluster.
	x := startKeyed(t, "x", k1, k2)
	y := startKeyed(t, "y", k2, k1)
	if _, err := y.Join([]string{x.GossipAddr()}); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	waitFor(t, "x and y alive on x", func() bool { return countStatus(x.Members(), StatusAlive) == 2 })
	for _, m := range a.Members() {
		if m.ID == "c" || m.ID == "d" || m.ID == "e" {
			t.Errorf("a lists %s, which holds none of its keys", m.ID)
		}
	}
}

func TestGossipBadKey(t *testing.T) {
	if _, err := New(Config{NodeID: "a", Zone: "z", GRPCAddr: "x:1", RaftAddr: "x:2", BindAddr: "127.0.0.1:0", Keys: [][]byte{make([]byte, 7)}}); err == nil {
		t.Fatal("a 7-byte gossip key was accepted")
	}
}
