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

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
)

// recorder is a real gRPC server on loopback that records the metadata each
// call arrived with and answers every method with Unimplemented, except
// Clock.Now: a recorder with keys answers a node challenge as a node of the
// cluster would (Keys.Prove), one without keys is a stranger.
type recorder struct {
	mu   sync.Mutex
	got  []metadata.MD
	keys *Keys
	addr string
}

func startRecorder(t *testing.T, keys *Keys) (*recorder, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{keys: keys, addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		r.mu.Lock()
		r.got = append(r.got, md)
		r.mu.Unlock()
		if m, _ := grpc.MethodFromServerStream(ss); m == api.Clock_Now_FullMethodName {
			if err := ss.RecvMsg(&api.ClockNowRequest{}); err != nil {
				return err
			}
			if ch := md.Get(ChallengeKey); len(ch) == 1 && r.keys != nil {
				_ = ss.SetHeader(metadata.Pairs(ProofKey, r.keys.Prove(ch[0], r.addr)))
			}
			return ss.SendMsg(&api.ClockNowResponse{})
		}
		return status.Error(codes.Unimplemented, "recorded")
	}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, r.addr
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

func (r *recorder) all() []metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]metadata.MD(nil), r.got...)
}

const testMethod = "/test.Svc/Method"

func call(ctx context.Context, cc *grpc.ClientConn) error {
	return cc.Invoke(ctx, testMethod, &emptyMsg{}, &emptyMsg{})
}

var clusterKey = [][]byte{[]byte("0123456789abcdef0123456789abcdef")}

// TestNodeCredentials: every call the pool makes to a node of the cluster
// carries a node credential that the node verifies for that target and
// method, once, and never a token: not for the node's own calls, not for a
// caller's call forwarded to the leader (which names the caller's principal
// instead of passing its token on).
func TestNodeCredentials(t *testing.T) {
	peerKeys := NewKeys("n2", clusterKey)
	rec, addr := startRecorder(t, peerKeys)
	p := NewPool(nil, NewKeys("n1", clusterKey))
	defer p.Close()
	leaderOf := func(int) (string, string) { return "n2", addr }

	verify := func(md metadata.MD, caller string) {
		t.Helper()
		if got := md.Get("authorization"); len(got) != 0 {
			t.Fatalf("a token reached the peer: %v", got)
		}
		cred := md.Get(NodeAuthKey)
		if len(cred) != 1 {
			t.Fatalf("no node credential: %v", md)
		}
		id, err := peerKeys.Verify(cred[0], []string{addr}, testMethod, caller)
		if err != nil || id != "n1" {
			t.Fatalf("node credential: id %q, %v", id, err)
		}
		if _, err := peerKeys.Verify(cred[0], []string{addr}, testMethod, caller); err == nil {
			t.Fatal("a node credential was accepted twice (replay)")
		}
	}

	cc, ctx, err := p.Leader(context.Background(), "n1", 0, leaderOf)
	if err != nil {
		t.Fatal(err)
	}
	_ = call(ctx, cc)
	md := rec.last(t)
	verify(md, "")
	if len(md.Get(forward.Header)) == 0 {
		t.Fatal("node's own call through Leader lacks the forwarded mark")
	}

	caller := forward.WithCaller(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer caller-token")), "cred:dist-a")
	cc, ctx, err = p.Leader(caller, "n1", 0, leaderOf)
	if err != nil {
		t.Fatal(err)
	}
	_ = call(ctx, cc)
	md = rec.last(t)
	verify(md, "cred:dist-a")
	if got := md.Get(CallerKey); len(got) != 1 || got[0] != "cred:dist-a" {
		t.Fatalf("forwarded caller: %s %v, want the caller's principal", CallerKey, got)
	}

	plain, err := p.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	if plain != cc {
		t.Fatal("Conn dialled a second connection to the same address")
	}
	// Even a token put on the call by mistake stays behind.
	_ = call(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer admin"), plain)
	md = rec.last(t)
	verify(md, "")
	if len(md.Get(forward.Header)) != 0 {
		t.Fatal("pooled own call carries the forwarded mark")
	}
}

// TestStrangerGetsNothing: an address that does not prove it is a node of
// this cluster (a stranger, or a node of another cluster) receives the
// challenge and nothing else: no node credential, no token, and the call
// itself fails without being sent.
func TestStrangerGetsNothing(t *testing.T) {
	for name, keys := range map[string]*Keys{
		"stranger":      nil,
		"other cluster": NewKeys("n9", [][]byte{[]byte("another cluster's key, 32 bytes!")}),
	} {
		rec, addr := startRecorder(t, keys)
		p := NewPool(nil, NewKeys("n1", clusterKey))
		cc, err := p.Conn(addr)
		if err != nil {
			t.Fatal(err)
		}
		err = call(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer admin"), cc)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: call err %v, want PermissionDenied (not proved)", name, err)
		}
		for _, md := range rec.all() {
			for k := range md {
				switch k {
				case ChallengeKey, "content-type", "user-agent", ":authority", "grpc-accept-encoding", "grpc-timeout":
				default:
					t.Errorf("%s: the stranger received metadata %q: %v", name, k, md)
				}
			}
		}
		if _, ok := p.Proven(addr); ok {
			t.Errorf("%s: recorded as proven", name)
		}
		p.Close()
	}
}

// TestPoolWithoutKeys: a cluster without a key sends no credential at all.
func TestPoolWithoutKeys(t *testing.T) {
	rec, addr := startRecorder(t, nil)
	p := NewPool(nil, nil)
	defer p.Close()
	cc, _ := p.Conn(addr)
	_ = call(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer admin"), cc)
	if md := rec.last(t); len(md.Get("authorization"))+len(md.Get(NodeAuthKey)) != 0 {
		t.Fatalf("credentials sent: %v", md)
	}
}

// TestLeaderForwardsOnce: a call that was forwarded here, or a group this
// node leads or nobody is known to lead, is not passed on.
func TestLeaderForwardsOnce(t *testing.T) {
	_, addr := startRecorder(t, nil)
	p := NewPool(nil, nil)
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
	p := NewPool(nil, nil)
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
