package meterserver

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"

	"google.golang.org/grpc/metadata"
)

// TestForwardCarriesCaller: a call forwarded to another node carries the
// caller's credentials, from gRPC metadata or from a REST Authorization
// header (forwarding used to send only the forwarded mark, so the leader saw
// an anonymous call), and the forwarded mark.
func TestForwardCarriesCaller(t *testing.T) {
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer grpc-caller", "other", "x"))
	r := httptest.NewRequest("POST", "/v1/events/start", nil)
	r.Header.Set("Authorization", "Bearer rest-caller")
	for name, c := range map[string]struct {
		ctx  context.Context
		want []string
	}{
		"gRPC caller":      {in, []string{"Bearer grpc-caller"}},
		"REST caller":      {callerContext(r), []string{"Bearer rest-caller"}},
		"anonymous caller": {context.Background(), nil},
	} {
		md, _ := metadata.FromOutgoingContext(forwardContext(c.ctx))
		if got := md.Get("authorization"); !slices.Equal(got, c.want) {
			t.Errorf("%s: forwarded authorization %q, want %q", name, got, c.want)
		}
		if len(md.Get(forwardedKey)) != 1 || len(md.Get("other")) != 0 {
			t.Errorf("%s: forwarded metadata %v", name, md)
		}
	}
}
