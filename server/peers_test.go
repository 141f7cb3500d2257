package server

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestAdminForwardMetadata(t *testing.T) {
	in := metadata.New(map[string]string{"authorization": "Bearer tok", "x-other": "dropped"})
	ctx := metadata.NewIncomingContext(context.Background(), in)
	if wasForwarded(ctx) {
		t.Fatal("a call from a client reads as forwarded")
	}
	out, ok := metadata.FromOutgoingContext(outgoing(ctx))
	if !ok {
		t.Fatal("outgoing: no outgoing metadata")
	}
	if got := out.Get("authorization"); !slices.Equal(got, []string{"Bearer tok"}) {
		t.Fatalf("forwarded authorization %q, want the caller's", got)
	}
	if got := out.Get("x-other"); len(got) != 0 {
		t.Fatalf("forwarded unrelated metadata %q", got)
	}
	// The receiving node sees the outgoing metadata as incoming.
	if !wasForwarded(metadata.NewIncomingContext(context.Background(), out)) {
		t.Fatal("a forwarded call does not read as forwarded, so it could be forwarded again")
	}
	// No credentials to copy: the call is still marked.
	bare, _ := metadata.FromOutgoingContext(outgoing(context.Background()))
	if len(bare.Get("authorization")) != 0 || len(bare.Get(forwardedKey)) != 1 {
		t.Fatalf("forwarding a call without metadata: %v", bare)
	}
}

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
