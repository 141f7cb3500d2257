package raftnode

import (
	"net"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

const (
	incA     = "00000000000000a1"
	incB     = "00000000000000b2"
	clusterC = "0000000000000c01"
	clusterD = "0000000000000d02"
)

type refusals struct {
	mu  sync.Mutex
	got []string
}

func (r *refusals) note(group int, named, cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, named+"/"+cluster)
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// dialRefused dials addr from client and checks the server closes the
// connection without handing it to its layer.
func dialRefused(t *testing.T, client *GroupLayer, addr string) {
	t.Helper()
	c, err := client.Dial(raft.ServerAddress(addr), ioTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	expectClosed(t, c)
}

// TestMuxIncarnation: a listener with an incarnation serves only connections
// naming it; one naming another incarnation (a configuration that still lists
// the node's earlier data dir), or none, or coming from another cluster, is
// closed before raft sees it, and reported.
func TestMuxIncarnation(t *testing.T) {
	var seen refusals
	srv, sl := newTestMux(t, MuxConfig{Identity: Identity{Incarnation: incA, ClusterID: clusterC, OnRefused: seen.note}}, 0)
	_, cl := newTestMux(t, MuxConfig{Identity: Identity{ClusterID: clusterC}}, 0)
	ep := srv.ListenAddr().String()

	roundTrip(t, cl[0], sl[0], advertiseAddr(WithIncarnation(ep, incA)))
	dialRefused(t, cl[0], WithIncarnation(ep, incB))
	dialRefused(t, cl[0], ep)

	_, other := newTestMux(t, MuxConfig{Identity: Identity{ClusterID: clusterD}}, 0)
	dialRefused(t, other[0], WithIncarnation(ep, incA))

	// A dialer that does not know its cluster yet is served.
	_, newcomer := newTestMux(t, MuxConfig{}, 0)
	roundTrip(t, newcomer[0], sl[0], advertiseAddr(WithIncarnation(ep, incA)))

	got := seen.list()
	want := []string{incB + "/", "/", "/" + clusterD}
	if len(got) != len(want) {
		t.Fatalf("refusals reported %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("refusals reported %v, want %v", got, want)
		}
	}

	if _, err := cl[0].Dial(raft.ServerAddress(ep+"#nothex"), ioTimeout); err == nil {
		t.Fatal("dial of an address with a malformed incarnation succeeded")
	}
}

// TestMuxIncarnationAdopted: an identity adopted from an earlier build's data
// dir also serves plain addresses (what that build's configurations hold),
// and a listener without an identity serves every header version.
func TestMuxIncarnationAdopted(t *testing.T) {
	srv, sl := newTestMux(t, MuxConfig{Identity: Identity{Incarnation: incA, AcceptUnnamed: true}}, 0)
	_, cl := newTestMux(t, MuxConfig{}, 0)
	ep := srv.ListenAddr().String()
	roundTrip(t, cl[0], sl[0], advertiseAddr(ep))
	roundTrip(t, cl[0], sl[0], advertiseAddr(WithIncarnation(ep, incA)))
	dialRefused(t, cl[0], WithIncarnation(ep, incB))

	plain, pl := newTestMux(t, MuxConfig{}, 0)
	roundTrip(t, cl[0], pl[0], advertiseAddr(WithIncarnation(plain.ListenAddr().String(), incB)))
}

func TestIncarnationAddress(t *testing.T) {
	a := WithIncarnation("127.0.0.1:7301", incA)
	if ep, inc := SplitIncarnation(a); ep != "127.0.0.1:7301" || inc != incA {
		t.Fatalf("split %q: %q %q", a, ep, inc)
	}
	if ep, inc := SplitIncarnation("[::1]:7301"); ep != "[::1]:7301" || inc != "" {
		t.Fatalf("split plain: %q %q", ep, inc)
	}
	if WithIncarnation("h:1", "") != "h:1" {
		t.Fatal("empty incarnation changed the address")
	}
	for _, bad := range []string{"", "0000000000000000", "00000000000000A1", "a1", "zz00000000000000"} {
		if ValidID(bad) == nil {
			t.Errorf("ValidID(%q) accepted", bad)
		}
	}
	if _, _, err := net.SplitHostPort(a); err == nil {
		t.Log("note: an incarnation address still parses as host:port")
	}
}
