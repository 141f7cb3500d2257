package nodeport

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/forward"
)

// recorder is a real gRPC server on loopback that answers every method with
// Unimplemented and records the metadata each call arrived with.
type recorder struct {
	mu  sync.Mutex
	got []metadata.MD
}

func startRecorder(t *testing.T) (*recorder, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		r.mu.Lock()
		r.got = append(r.got, md)
		r.mu.Unlock()
		return status.Error(codes.Unimplemented, "recorded")
	}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

func (r *recorder) last(t *testing.T) metadata.MD {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		t.Fatal("no call arrived")
	}
	return r.got[len(r.got)-1]
}

func call(ctx context.Context, cc *grpc.ClientConn) error {
	return cc.Invoke(ctx, "/test.Svc/Method", &emptyMsg{}, &emptyMsg{})
}

// TestLeaderCredentials: a call the node makes for itself reaches the leader
// with the node's token and the forwarded mark; a caller's call with the
// caller's credential only; a plain pooled call (not through Leader) with
// the node's token and no mark.
func TestLeaderCredentials(t *testing.T) {
	rec, addr := startRecorder(t)
	p := NewPool(nil, "node-token")
	defer p.Close()
	leaderOf := func(int) (string, string) { return "n2", addr }

	cc, ctx, err := p.Leader(context.Background(), "n1", 0, leaderOf)
	if err != nil {
		t.Fatal(err)
	}
	_ = call(ctx, cc)
	md := rec.last(t)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer node-token" {
		t.Fatalf("node's own call: authorization %v, want the node's token", got)
	}
	if len(md.Get(forward.Header)) == 0 {
		t.Fatal("node's own call through Leader lacks the forwarded mark")
	}

	caller := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer caller-token"))
	cc, ctx, err = p.Leader(caller, "n1", 0, leaderOf)
	if err != nil {
		t.Fatal(err)
	}
	_ = call(ctx, cc)
	if got := rec.last(t).Get("authorization"); len(got) != 1 || got[0] != "Bearer caller-token" {
		t.Fatalf("forwarded caller: authorization %v, want only the caller's", got)
	}

	plain, err := p.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	if plain != cc {
		t.Fatal("Conn dialled a second connection to the same address")
	}
	_ = call(context.Background(), plain)
	md = rec.last(t)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer node-token" {
		t.Fatalf("pooled own call: authorization %v, want the node's token", got)
	}
	if len(md.Get(forward.Header)) != 0 {
		t.Fatal("pooled own call carries the forwarded mark")
	}
}

// TestLeaderForwardsOnce: a call that was forwarded here, or a group this
// node leads or nobody is known to lead, is not passed on.
func TestLeaderForwardsOnce(t *testing.T) {
	_, addr := startRecorder(t)
	p := NewPool(nil, "")
	defer p.Close()
	forwarded := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forward.Header, "1"))
	for name, tc := range map[string]struct {
		ctx      context.Context
		id, addr string
	}{
		"forwarded call": {forwarded, "n2", addr},
		"self leads":     {context.Background(), "n1", addr},
		"no leader":      {context.Background(), "", ""},
		"no address":     {context.Background(), "n2", ""},
	} {
		_, _, err := p.Leader(tc.ctx, "n1", 3, func(int) (string, string) { return tc.id, tc.addr })
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: err %v, want Unavailable", name, err)
		}
	}
}

// TestPoolReusesConnections: one connection per address, reused; Close
// closes them and a later Conn dials afresh.
func TestPoolReusesConnections(t *testing.T) {
	p := NewPool(nil, "")
	a1, err := p.Conn("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := p.Conn("127.0.0.1:1")
	b, _ := p.Conn("127.0.0.1:2")
	if a1 != a2 {
		t.Fatal("two connections to the same address")
	}
	if a1 == b {
		t.Fatal("one connection shared by two addresses")
	}
	p.Close()
	a3, err := p.Conn("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if a3 == a1 {
		t.Fatal("a closed connection was handed out again")
	}
	p.Close()
}
