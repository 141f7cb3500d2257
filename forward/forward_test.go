package forward

import (
	"context"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

// TestOutgoingCarriesTheCallerOnly: a forwarded call names the caller's
// verified principal and never carries a token (the caller's or anyone's:
// the node that forwards authenticates as a node), plus the forwarded mark,
// and nothing else of the incoming metadata; the node's own work names no
// caller.
func TestOutgoingCarriesTheCallerOnly(t *testing.T) {
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer grpc-caller", "other", "x"))
	r := httptest.NewRequest("POST", "/v1/events/start", nil)
	r.Header.Set("Authorization", "Bearer rest-caller")
	r = r.WithContext(WithCaller(r.Context(), "cred:billing"))
	for name, c := range map[string]struct {
		ctx  context.Context
		want []string
	}{
		"gRPC caller":      {WithCaller(in, "cred:dist-a"), []string{"cred:dist-a"}},
		"REST caller":      {FromHTTP(r), []string{"cred:billing"}},
		"anonymous caller": {WithCaller(context.Background(), CallerAnonymous), []string{CallerAnonymous}},
		"node's own work":  {Own(WithCaller(in, "cred:dist-a")), nil},
	} {
		out := Outgoing(c.ctx)
		md, _ := metadata.FromOutgoingContext(out)
		if got := md.Get("authorization"); len(got) != 0 {
			t.Errorf("%s: forwarded a token %q", name, got)
		}
		if got := md.Get(CallerKey); !slices.Equal(got, c.want) {
			t.Errorf("%s: forwarded caller %q, want %q", name, got, c.want)
		}
		if len(md.Get(Header)) != 1 || len(md.Get("other")) != 0 {
			t.Errorf("%s: forwarded metadata %v", name, md)
		}
		if !IsOutgoing(out) {
			t.Errorf("%s: the outgoing call does not read as forwarded", name)
		}
		// The receiving node sees the outgoing metadata as incoming.
		rin := metadata.NewIncomingContext(context.Background(), md)
		if !Was(rin) {
			t.Errorf("%s: a forwarded call does not read as forwarded, so it could be forwarded again", name)
		}
		if got := ForwardedCaller(rin); got != strings.Join(c.want, "") {
			t.Errorf("%s: ForwardedCaller %q", name, got)
		}
	}
	if Was(in) || IsOutgoing(context.Background()) {
		t.Fatal("a call straight from a client reads as forwarded")
	}
}

// TestOneDefinition: the forwarded mark is spelled in this package only; a
// second copy is how the metering service once forwarded without the
// caller's credentials.
func TestOneDefinition(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	here, _ := filepath.Abs(".")
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == here || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), `"`+Header+`"`) {
			t.Errorf("%s spells the forwarded header itself; use forward.Header", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOwnLeavesTheCallerBehind: work a node does on its own account while
// serving a forwarded call is not itself forwarded, carries none of the
// caller's credentials, and keeps the call's deadline.
func TestOwnLeavesTheCallerBehind(t *testing.T) {
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer caller", Header, "1"))
	in, cancel := context.WithCancel(in)
	own := Own(in)
	if Was(own) {
		t.Fatal("own work reads as forwarded, so it could not be forwarded to the group's leader")
	}
	md, _ := metadata.FromOutgoingContext(Outgoing(WithCaller(Own(WithCaller(in, "cred:x")), "")))
	if len(md.Get("authorization"))+len(md.Get(CallerKey)) != 0 {
		t.Fatalf("own work carries the caller's credentials: %v", md)
	}
	if Caller(Own(WithCaller(in, "cred:x"))) != "" {
		t.Fatal("own work keeps the caller's principal")
	}
	cancel()
	if own.Err() == nil {
		t.Fatal("own work outlives the call it serves")
	}
}
