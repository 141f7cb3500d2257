package server

import "testing"

func TestAdminPeerPoolReusesConnections(t *testing.T) {
	var p peerPool
	a1, err := p.conn("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := p.conn("127.0.0.1:1")
	b, _ := p.conn("127.0.0.1:2")
	if a1 != a2 {
		t.Fatal("two connections to the same address")
	}
	if a1 == b {
		t.Fatal("one connection shared by two addresses")
	}
	p.close()
	a3, err := p.conn("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if a3 == a1 {
		t.Fatal("a closed connection was handed out again")
	}
	p.close()
}
