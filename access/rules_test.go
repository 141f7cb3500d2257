package access

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/forward"
)

// apiMethods are the full names of every method of the tollgate.v1
// services compiled into package api and the Envoy rate limit service's.
func apiMethods(t *testing.T) []string {
	t.Helper()
	out := []string{rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	protoregistry.GlobalFiles.RangeFilesByPackage("tollgate.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				out = append(out, fmt.Sprintf("/%s/%s", sd.FullName(), sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) < 30 {
		t.Fatalf("found only %d API methods; is package api's registry linked?", len(out))
	}
	return out
}

// TestRulesCoverEveryMethod: every gRPC method in the API has one line in
// the rule table, and every line names a method of the API (a renamed
// method must not leave a stale line while the new name goes unruled).
// server's TestAccessRules checks the same against a running node's
// registered services and HTTP routes.
func TestRulesCoverEveryMethod(t *testing.T) {
	methods := apiMethods(t)
	known := map[string]bool{}
	for _, m := range methods {
		known[m] = true
		if _, ok := GRPCRule(m); !ok {
			t.Errorf("gRPC %s has no access rule (rules.go)", m)
		}
	}
	for m := range grpcRules {
		if !known[m] {
			t.Errorf("rule for %s, which is no method of the API", m)
		}
	}
	for p, r := range httpRules {
		if r.Scope != "" && r.Scope != ScopeTrack && r.Scope != ScopeMeter && r.Scope != ScopeRead && r.Scope != ScopeAdmin {
			t.Errorf("HTTP %s: unknown scope %q", p, r.Scope)
		}
		if sc, ok := HTTPRouteScope(p); !ok || sc != string(r.Scope) {
			t.Errorf("HTTPRouteScope(%q) = %q, %v; want %q", p, sc, ok, r.Scope)
		}
	}
	if _, ok := HTTPRouteScope("GET /no/such/route"); ok {
		t.Error("HTTPRouteScope has a rule for a route the table does not list")
	}
}

// Credentials of the table test: name → scopes and tenants ("" = all).
var tableCreds = map[string][2]string{
	"track-a": {"track", "a"}, "track-b": {"track", "b"}, "track-all": {"track", ""},
	"meter-a": {"meter", "a"}, "meter-b": {"meter", "b"}, "meter-all": {"meter", ""},
	"read-a": {"read", "a"}, "read-b": {"read", "b"}, "read-all": {"read", ""},
}

const tableAdminToken = "table-admin-token"

func tableStore(t *testing.T) *Store {
	t.Helper()
	var b strings.Builder
	for name, c := range tableCreds {
		h := sha256.Sum256([]byte("tok-" + name))
		fmt.Fprintf(&b, "%s sha256:%s %s %s\n", name, hex.EncodeToString(h[:]), c[0], c[1])
	}
	p := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cs, err := NewStore(p, tableAdminToken, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// tableToken is the authorization a credential state presents for rule r
// (ok false: the state does not apply to r); names: the request names
// tenant "a".
func tableToken(state string, r Rule, names bool) (string, bool) {
	other := map[Scope]string{ScopeTrack: "read-all", ScopeMeter: "track-all", ScopeRead: "meter-all", ScopeAdmin: "read-all"}
	switch state {
	case "none":
		return "", true
	case "wrong":
		return "Bearer not-a-token", true
	case "wrong scope":
		return "Bearer tok-" + other[r.Scope], r.Scope != ""
	case "other tenant":
		return "Bearer tok-" + string(r.Scope) + "-b", r.Scope != "" && r.Scope != ScopeAdmin // admin is never limited to tenants
	case "right":
		switch {
		case r.Scope == "":
			return "", true
		case r.Scope == ScopeAdmin:
			return "Bearer " + tableAdminToken, true
		case names:
			return "Bearer tok-" + string(r.Scope) + "-a", true
		}
		return "Bearer tok-" + string(r.Scope) + "-all", true
	}
	panic(state)
}

var tableStates = []string{"none", "wrong", "wrong scope", "other tenant", "right"}

// TestRuleTableVerdicts walks every endpoint of the rule table, gRPC and
// HTTP, through every credential state, with and without a named tenant,
// and checks the verdict the rule's documented meaning gives: a public
// endpoint admits everyone; a scoped one refuses no or an unknown
// credential as unauthenticated and a credential without the scope as
// forbidden; a credential limited to tenant "b" is refused tenant "a", and
// refused an endpoint that reads every tenant's data unless the endpoint's
// data is shared or its tenants are the handler's to check.
func TestRuleTableVerdicts(t *testing.T) {
	cs := tableStore(t)
	walk := func(kind string, rules map[string]Rule) {
		for name, r := range rules {
			for _, names := range []bool{false, true} {
				var tenants []string
				if names {
					tenants = []string{"a"}
				}
				for _, st := range tableStates {
					tok, ok := tableToken(st, r, names)
					if !ok {
						continue
					}
					var auth []string
					if tok != "" {
						auth = []string{tok}
					}
					want := allowed
					switch {
					case r.Scope == "" || st == "right":
					case st == "none" || st == "wrong":
						want = unauthorized
					case st == "wrong scope":
						want = forbidden
					case st == "other tenant" && (names || !(r.Shared || r.InHandler)):
						want = forbidden
					}
					v, why, c, p := cs.check(r, auth, nil, tenants)
					if v != want {
						t.Errorf("%s %s, %s, tenant named %v: verdict %d (%s), want %d", kind, name, st, names, v, why, want)
					}
					if v != allowed && !strings.Contains(why, name) {
						t.Errorf("%s %s, %s: refusal %q does not name the endpoint", kind, name, st, why)
					}
					if v == allowed && r.Scope != "" && (c == nil || !c.has(r.Scope)) {
						t.Errorf("%s %s, %s: allowed with credential %v lacking scope %q", kind, name, st, c, r.Scope)
					}
					if st == "right" && r.Scope == ScopeAdmin && p != forward.CallerAdminToken {
						t.Errorf("%s %s: admin token's principal %q", kind, name, p)
					}
				}
			}
		}
	}
	walk("gRPC", grpcRules)
	walk("HTTP", httpRules)
}

// TestTapChecksScopeBeforeMessages: for every gRPC method, the tap handler
// (which sees only headers) refuses a caller without a credential for a
// scoped method and one without the scope, and lets through a credential
// limited to another tenant: its tenants are checked once the message is
// decoded.
func TestTapChecksScopeBeforeMessages(t *testing.T) {
	g := &Guard{Creds: tableStore(t), AdminToken: tableAdminToken, Targets: func() []string { return []string{"127.0.0.1:1"} }}
	for _, m := range apiMethods(t) {
		r, _ := GRPCRule(m)
		for _, st := range tableStates {
			tok, ok := tableToken(st, r, true)
			if !ok {
				continue
			}
			md := metadata.MD{}
			if tok != "" {
				md.Set("authorization", tok)
			}
			_, err := g.Tap(metadata.NewIncomingContext(context.Background(), md), &tap.Info{FullMethodName: m, Header: md})
			want := codes.OK
			if r.Scope != "" {
				switch st {
				case "none", "wrong":
					want = codes.Unauthenticated
				case "wrong scope":
					want = codes.PermissionDenied
				}
			}
			if got := status.Code(err); got != want {
				t.Errorf("tap %s, %s: %v, want %v", m, st, err, want)
			}
		}
	}
}
