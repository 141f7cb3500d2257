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

// TestOutgoingCarriesTheCallerOnly: a forwarded call carries the caller's
// credentials, from gRPC metadata or from a REST Authorization header (the
// metering copy of this code once sent only the mark, so the leader saw an
// anonymous call), the forwarded mark, and nothing else of the incoming
// metadata.
func TestOutgoingCarriesTheCallerOnly(t *testing.T) {
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer grpc-caller", "other", "x"))
	r := httptest.NewRequest("POST", "/v1/events/start", nil)
	r.Header.Set("Authorization", "Bearer rest-caller")
	for name, c := range map[string]struct {
		ctx  context.Context
		want []string
	}{
		"gRPC caller":      {in, []string{"Bearer grpc-caller"}},
		"REST caller":      {FromHTTP(r), []string{"Bearer rest-caller"}},
		"anonymous caller": {context.Background(), nil},
	} {
		out := Outgoing(c.ctx)
		md, _ := metadata.FromOutgoingContext(out)
		if got := md.Get("authorization"); !slices.Equal(got, c.want) {
			t.Errorf("%s: forwarded authorization %q, want %q", name, got, c.want)
		}
		if len(md.Get(Header)) != 1 || len(md.Get("other")) != 0 {
			t.Errorf("%s: forwarded metadata %v", name, md)
		}
		if !IsOutgoing(out) {
			t.Errorf("%s: the outgoing call does not read as forwarded", name)
		}
		// The receiving node sees the outgoing metadata as incoming.
		if !Was(metadata.NewIncomingContext(context.Background(), md)) {
			t.Errorf("%s: a forwarded call does not read as forwarded, so it could be forwarded again", name)
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
	md, _ := metadata.FromOutgoingContext(Outgoing(own))
	if len(md.Get("authorization")) != 0 {
		t.Fatalf("own work carries the caller's credentials: %v", md)
	}
	cancel()
	if own.Err() == nil {
		t.Fatal("own work outlives the call it serves")
	}
}
