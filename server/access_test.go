package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// Tokens of the access test: name → token. Limited credentials act on
// tenant "a" or "b" only.
var accessTokens = map[string]struct{ scopes, tenants string }{
	"track-a": {"track", "a"}, "track-b": {"track", "b"}, "track-all": {"track", ""},
	"meter-a": {"meter", "a"}, "meter-b": {"meter", "b"}, "meter-all": {"meter", ""},
	"read-a": {"read", "a"}, "read-b": {"read", "b"}, "read-all": {"read", ""},
}

const accessAdminToken = "the-admin-token"

func writeCredentials(t *testing.T) string {
	var b strings.Builder
	b.WriteString("# test credentials\n")
	for tok, c := range accessTokens {
		h := sha256.Sum256([]byte("tok-" + tok))
		fmt.Fprintf(&b, "%s sha256:%s %s %s\n", tok, hex.EncodeToString(h[:]), c.scopes, c.tenants)
	}
	p := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// grpcAccessRows: one request per gRPC method; those naming a tenant name
// "a". Every method the node serves must have a row (see the test).
var grpcAccessRows = map[string]proto.Message{
	api.Tracker_TrackSeries_FullMethodName:          &api.TrackSeriesRequest{Tenant: "a"},
	api.Tracker_GetUsersCloseToLimit_FullMethodName: &api.GetUsersCloseToLimitRequest{},
	api.Tracker_WatchCluster_FullMethodName:         &api.WatchClusterRequest{},
	api.Summaries_WatchSummaries_FullMethodName:     &api.WatchSummariesRequest{},
	api.Sketches_WatchSketches_FullMethodName:       &api.WatchSketchesRequest{Precision: 11},
	api.Sketches_PushSketches_FullMethodName:        &api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{{Tenant: "a"}}},
	api.RateLimit_Sync_FullMethodName: &api.RateReport{ClientId: 7, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE,
		NewIds: []uint32{1}, NewNames: []string{"a"}},
	api.RateAdmit_Admit_FullMethodName:   &api.RateReport{NewNames: []string{"a"}, ConsumedTotal: []uint64{1}},
	api.RateAdmit_Handoff_FullMethodName: &api.RateHandoffRequest{Keys: []string{"a"}},
	rlsv3.RateLimitService_ShouldRateLimit_FullMethodName: &rlsv3.RateLimitRequest{Domain: "access-test",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}},
	api.Clock_Now_FullMethodName:                   &api.ClockNowRequest{From: "access-test"},
	api.Clock_Offsets_FullMethodName:               &api.ClockOffsetsRequest{},
	api.Metering_Start_FullMethodName:              &api.MeterEvent{Target: &api.MeterTarget{OrganizationId: "a"}},
	api.Metering_Stop_FullMethodName:               &api.MeterEvent{Target: &api.MeterTarget{OrganizationId: "a"}},
	api.Metering_Events_FullMethodName:             &api.MeterEventsRequest{Events: []*api.MeterEventItem{{Event: &api.MeterEvent{Target: &api.MeterTarget{OrganizationId: "a"}}}}},
	api.Metering_QueryUsage_FullMethodName:         &api.QueryUsageRequest{Group: -1, Target: &api.MeterTarget{OrganizationId: "a"}},
	api.Metering_SeriesSamples_FullMethodName:      &api.SeriesSamplesRequest{Tenant: "a"},
	api.Metering_GroupSeriesSamples_FullMethodName: &api.GroupSeriesSamplesRequest{},
	api.Metering_SetClock_FullMethodName:           &api.SetClockRequest{},
	api.Admin_Status_FullMethodName:                &api.StatusRequest{},
	api.Admin_ListPeers_FullMethodName:             &api.ListPeersRequest{},
	api.Admin_AddVoter_FullMethodName:              &api.AddVoterRequest{},
	api.Admin_RemoveServer_FullMethodName:          &api.RemoveServerRequest{},
	api.Admin_TransferLeadership_FullMethodName:    &api.TransferLeadershipRequest{Group: 999},
	api.Admin_NodeGroups_FullMethodName:            &api.NodeGroupsRequest{},
	api.Admin_SnapshotGroup_FullMethodName:         &api.SnapshotGroupRequest{Group: 999},
	api.Admin_RestoreGroup_FullMethodName:          &api.RestoreChunk{},
	api.Admin_DropTenant_FullMethodName:            &api.DropTenantRequest{},
	api.Admin_DrainNode_FullMethodName:             &api.DrainNodeRequest{},
	api.Admin_RaiseGroups_FullMethodName:           &api.RaiseGroupsRequest{}, // To 0: refused as a lowering, nothing changes
	api.Config_GetLimits_FullMethodName:            &api.GetLimitsRequest{},
	api.Config_SetLimits_FullMethodName:            &api.SetLimitsRequest{},
	api.Config_ApplyLimits_FullMethodName:          &api.ApplyLimitsRequest{},
	api.Config_ReplicateLimits_FullMethodName:      &api.ReplicateLimitsRequest{},
	api.Config_ReportBacklog_FullMethodName:        &api.ReportBacklogRequest{},
	api.Shares_Give_FullMethodName:                 &api.GiveRequest{},
	api.Shares_Receive_FullMethodName:              &api.ReceiveRequest{},
	api.Shares_Complete_FullMethodName:             &api.CompleteRequest{},
	api.Shares_TenantShares_FullMethodName:         &api.TenantSharesRequest{},
	api.Shares_Cover_FullMethodName:                &api.CoverRequest{},
	api.PartitionMoves_Give_FullMethodName:         &api.MoveGiveRequest{Group: 999, To: 1},
	api.PartitionMoves_Receive_FullMethodName:      &api.MoveReceiveRequest{}, // an empty transfer: refused
	api.PartitionMoves_Complete_FullMethodName:     &api.MoveCompleteRequest{Group: 999},
	api.PartitionMoves_State_FullMethodName:        &api.MoveStateRequest{Group: 999},
}

// httpAccessRows: one request per HTTP route (method, path, body); those
// naming a tenant name "a".
var httpAccessRows = map[string][3]string{
	"GET /metrics":                  {"GET", "/metrics", ""},
	"GET /healthz":                  {"GET", "/healthz", ""},
	"GET /readyz":                   {"GET", "/readyz", ""},
	"GET /{$}":                      {"GET", "/", ""},
	"GET /ui/":                      {"GET", "/ui/", ""},
	"GET /api/v1/status":            {"GET", "/api/v1/status", ""},
	"GET /api/v1/sketches":          {"GET", "/api/v1/sketches", ""},
	"GET /api/v1/tenants":           {"GET", "/api/v1/tenants", ""},
	"GET /api/v1/tenants/{tenant}":  {"GET", "/api/v1/tenants/a", ""},
	"GET /api/v1/overview":          {"GET", "/api/v1/overview", ""},
	"/api/v1/backlog":               {"POST", "/api/v1/backlog", `{"kind":"locate","backlog":1}`},
	"POST /v1/events/start":         {"POST", "/v1/events/start", accessEvent("a", true)},
	"POST /v1/events/stop":          {"POST", "/v1/events/stop", accessEvent("a", false)},
	"POST /v1/events":               {"POST", "/v1/events", `{"events":[` + accessEvent("a", true)[:1] + `"kind":"start",` + accessEvent("a", true)[1:] + `]}`},
	"GET /v1/usage":                 {"GET", "/v1/usage?organization_id=a", ""},
	"GET /v1/usage/bill":            {"GET", "/v1/usage/bill?tenant=a&from=1&to=2", ""},
	"GET /v1/metering/status":       {"GET", "/v1/metering/status", ""},
	"GET /v1/metering/dead-letters": {"GET", "/v1/metering/dead-letters", ""},
	"POST /v1/metering/clock":       {"POST", "/v1/metering/clock", `{}`},
	"/debug/pprof/":                 {"GET", "/debug/pprof/", ""},
	"/debug/pprof/cmdline":          {"GET", "/debug/pprof/cmdline", ""},
	"/debug/pprof/profile":          {"GET", "/debug/pprof/profile?seconds=1", ""},
	"/debug/pprof/symbol":           {"GET", "/debug/pprof/symbol", ""},
	"/debug/pprof/trace":            {"GET", "/debug/pprof/trace?seconds=1", ""},
}

// accessEvent is a valid metering event of org: the access check must
// decide on a document the handler would write.
func accessEvent(org string, start bool) string {
	usage := `,"measured_usage":[{"measure":"m","quantity":1}]`
	if !start {
		usage = ""
	}
	return fmt.Sprintf(`{"id":"access-%s","timestamp":%d,"organization_id":%q,"space_id":"s","consumer_id":"c","resource_id":"r","plan_id":"p","resource_instance_id":"i"%s}`,
		org, time.Now().UnixMilli(), org, usage)
}

// credential states of the access test, and the token each uses for a rule.
func tokenFor(state string, r access.Rule, names bool) (string, bool) {
	switch state {
	case "none":
		return "", true
	case "wrong":
		return "Bearer not-a-token", true
	case "wrong scope":
		other := map[access.Scope]string{access.ScopeTrack: "read-all", access.ScopeMeter: "track-all", access.ScopeRead: "meter-all", access.ScopeAdmin: "read-all"}[r.Scope]
		return "Bearer tok-" + other, true
	case "other tenant":
		if r.Scope == access.ScopeAdmin {
			return "", false // admin credentials are never limited to tenants
		}
		return "Bearer tok-" + string(r.Scope) + "-b", true
	case "right":
		if r.Scope == access.ScopeAdmin {
			return "Bearer " + accessAdminToken, true
		}
		if names {
			return "Bearer tok-" + string(r.Scope) + "-a", true
		}
		return "Bearer tok-" + string(r.Scope) + "-all", true
	}
	panic(state)
}

// expectRefused says which answer a rule documents for a state: "" when
// the call must get past the access check, "unauthenticated" or
// "forbidden".
func expectRefused(state string, r access.Rule, names bool) string {
	if r.Scope == "" {
		return ""
	}
	switch state {
	case "none", "wrong":
		return "unauthenticated"
	case "wrong scope":
		return "forbidden"
	case "other tenant":
		if r.Shared && !names {
			return ""
		}
		return "forbidden"
	}
	return ""
}

// TestAccessRules: every gRPC method and HTTP route of a node with a
// credentials file, called with no credential, an unknown token, a
// credential without the scope, one limited to another tenant, and the
// right one, gets the answer its rule documents. A method or route the node
// serves without a row here (or without a rule) fails the test.
func TestAccessRules(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) { testAccessRules(t, false) })
	// TLS with client certificates on gRPC and none on HTTP (browsers and
	// scrapers): a certificate says which machine connects, the credential
	// what it may do, so the answers are the same.
	t.Run("TLS", func(t *testing.T) { testAccessRules(t, true) })
}

// accessTLS is a node's TLS for the access tests: client certificates
// required on gRPC, none on HTTP (browsers and scrapers).
func accessTLS(t *testing.T, pki tlsutil.DevFiles, name string) TLSConfig {
	t.Helper()
	c := nodeTLS(t, pki, name, tlsutil.ClientAuthRequire)
	var err error
	if c.HTTP, err = tlsutil.ServerConfig(pki.Nodes[name][0], pki.Nodes[name][1], pki.CA, tlsutil.ClientAuthNone); err != nil {
		t.Fatal(err)
	}
	return c
}

func testAccessRules(t *testing.T, withTLS bool) {
	creds := writeCredentials(t)
	var pki tlsutil.DevFiles
	if withTLS {
		pki = testPKI(t)
	}
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.AdminToken, c.Access.CredentialsFile, c.Access.EnableDebugEndpoints = accessAdminToken, creds, true
		if withTLS {
			c.Access.TLS = accessTLS(t, pki, "n1")
		}
	})
	defer stop(t, s)

	for svc, info := range s.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			if _, ok := access.GRPCRule(full); !ok {
				t.Errorf("gRPC %s has no access rule (access/rules.go)", full)
			}
			if _, ok := grpcAccessRows[full]; !ok {
				t.Errorf("gRPC %s has no row in this test", full)
			}
		}
	}
	for _, p := range s.httpRoutes {
		if _, ok := access.HTTPRule(p); !ok {
			t.Errorf("HTTP %s has no access rule (access/rules.go)", p)
		}
		if _, ok := httpAccessRows[p]; !ok {
			t.Errorf("HTTP %s has no row in this test", p)
		}
	}

	cc := dialAnon(t, s.GRPCAddr())
	client := &http.Client{Timeout: 30 * time.Second}
	scheme := "http://"
	if withTLS {
		cc = tlsDial(t, s.GRPCAddr(), clientTLS(t, pki.Client, pki.ClientKey, pki.CA))
		client.Transport = &http.Transport{TLSClientConfig: clientTLS(t, "", "", pki.CA)}
		scheme = "https://"
	}
	probeTable(t, cc, scheme+s.HTTPAddr(), client, []string{"none", "wrong", "wrong scope", "other tenant", "right"}, tokenFor, expectRefused)
}

// probeTable calls every gRPC method (over cc) and HTTP route (at base)
// of the access rows once per credential state, with the token tok gives
// (ok false: the state does not apply to the rule), and checks the answer
// against want: "" (past the access check), "unauthenticated" or
// "forbidden".
func probeTable(t *testing.T, cc *grpc.ClientConn, base string, client *http.Client, states []string,
	tok func(state string, r access.Rule, names bool) (string, bool), want func(state string, r access.Rule, names bool) string) {
	t.Helper()
	tokenFor, expectRefused := tok, want
	for method, req := range grpcAccessRows {
		r, _ := access.GRPCRule(method)
		names := r.GRPCTenants != nil && r.GRPCTenants(req) != nil
		for _, st := range states {
			tok, ok := tokenFor(st, r, names)
			if !ok {
				continue
			}
			code := callGRPC(t, cc, method, req, tok)
			want := expectRefused(st, r, names)
			got := ""
			switch code {
			case codes.Unauthenticated:
				got = "unauthenticated"
			case codes.PermissionDenied:
				got = "forbidden"
			}
			if got != want {
				t.Errorf("gRPC %s, credential %s: %s, want %q", method, st, code, want)
			}
		}
	}
	for pattern, row := range httpAccessRows {
		r, _ := access.HTTPRule(pattern)
		names := strings.Contains(row[1], "a&") || strings.HasSuffix(row[1], "=a") || strings.HasSuffix(row[1], "/a") || strings.Contains(row[2], `"a"`)
		for _, st := range states {
			tok, ok := tokenFor(st, r, names)
			if !ok {
				continue
			}
			for _, chunked := range []bool{false, true} {
				if chunked && row[2] == "" {
					continue
				}
				var body io.Reader = strings.NewReader(row[2])
				if chunked {
					body = struct{ io.Reader }{body} // unknown length: sent chunked
				}
				req, _ := http.NewRequest(row[0], base+row[1], body)
				if row[2] != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				if tok != "" {
					req.Header.Set("Authorization", tok)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got := ""
				switch resp.StatusCode {
				case http.StatusUnauthorized:
					got = "unauthenticated"
				case http.StatusForbidden:
					got = "forbidden"
				}
				if want := expectRefused(st, r, names); got != want {
					t.Errorf("HTTP %s (chunked %v), credential %s: %d %.200s, want %q", pattern, chunked, st, resp.StatusCode, out, want)
				}
			}
		}
	}
}

// callGRPC calls method with req and the authorization value tok ("" for
// none), and returns the status code of the call's first answer.
func callGRPC(t *testing.T, cc *grpc.ClientConn, method string, req proto.Message, tok string) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tok)
	}
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	resp := dynamicpb.NewMessage(md.Output())
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		return status.Code(cc.Invoke(ctx, method, req, resp))
	}
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: md.IsStreamingServer(), ClientStreams: md.IsStreamingClient()}, method)
	if err != nil {
		return status.Code(err)
	}
	if err := st.SendMsg(req); err != nil && err != io.EOF {
		return status.Code(err)
	}
	if !md.IsStreamingServer() || !md.IsStreamingClient() {
		_ = st.CloseSend()
	}
	code := status.Code(st.RecvMsg(resp))
	if code == codes.DeadlineExceeded {
		return codes.OK // the stream is open and waiting: past the access check
	}
	return code
}

// TestAccessOnFollowerAndReload: on a three-node cluster with credentials,
// metering events posted to every node (followers forward to the group
// leader, which applies the rule again) succeed with a credential limited
// to the event's tenant and are refused for another tenant's; then the
// credentials file is rewritten without that credential and, without a
// restart, every node refuses it.
func TestAccessOnFollowerAndReload(t *testing.T) {
	creds := writeCredentials(t)
	tc := startCluster(t, 3, func(_ int, c *Config) {
		c.Access.AdminToken, c.Access.CredentialsFile, c.Node.HTTPAddr = accessAdminToken, creds, "127.0.0.1:0"
	})
	now := time.Now().UnixMilli()
	post := func(s *Server, tok, org, id string) (int, string) {
		body := fmt.Sprintf(`{"id":%q,"timestamp":%d,"organization_id":%q,"space_id":"s","consumer_id":"c","resource_id":"r","plan_id":"p","resource_instance_id":%q,"measured_usage":[{"measure":"m","quantity":1}]}`,
			id, now, org, id)
		for {
			req, _ := http.NewRequest("POST", "http://"+s.HTTPAddr()+"/v1/events/start", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return resp.StatusCode, string(b)
			}
			time.Sleep(50 * time.Millisecond) // no leader yet
		}
	}
	for i, s := range tc.nodes {
		// Enough ids that some land in groups this node does not lead.
		for j := range 8 {
			id := fmt.Sprintf("ev-%d-%d", i, j)
			if code, body := post(s, "tok-meter-a", "a", id); code != http.StatusCreated {
				t.Fatalf("%s: event for tenant a with meter-a: %d %s", s.NodeID(), code, body)
			}
			if code, body := post(s, "tok-meter-a", "b", id+"-b"); code != http.StatusForbidden {
				t.Fatalf("%s: event for tenant b with meter-a: %d %s", s.NodeID(), code, body)
			}
		}
	}
	// Without meter-a the file reloads on every node.
	data, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "meter-a ") {
			keep = append(keep, l)
		}
	}
	if err := writeFileAtomic(creds, []byte(strings.Join(keep, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range tc.nodes {
		waitFor(t, s.NodeID()+" refuses the removed credential", func() bool {
			code, _ := post(s, "tok-meter-a", "a", "after-reload")
			return code == http.StatusUnauthorized
		})
	}
	// A broken file keeps the credentials in force.
	if err := writeFileAtomic(creds, []byte("broken line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // two reload periods
	if code, body := post(tc.nodes[0], "tok-meter-all", "z", "kept"); code != http.StatusCreated {
		t.Fatalf("after a broken reload, meter-all: %d %s", code, body)
	}
}

// TestCertIdentityScopes: a credentials file line "cert:cn=<name>" maps a
// verified client certificate to scopes and tenants, with the same rule on
// gRPC and HTTP: the development client certificate (CN tollgate-client),
// mapped to track and read for tenant "a", tracks and reads "a" without a
// token, is refused "b" and the admin API, and a wrong token is refused
// even over the certificate; without a certificate (HTTP "request" mode)
// the call needs a token.
func TestCertIdentityScopes(t *testing.T) {
	pki := testPKI(t)
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := writeFileAtomic(creds, []byte("dist cert:cn=tollgate-client track,read a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.AdminToken, c.Access.CredentialsFile = accessAdminToken, creds
		c.Access.TLS = nodeTLS(t, pki, "n1", tlsutil.ClientAuthRequire)
		var err error
		if c.Access.TLS.HTTP, err = tlsutil.ServerConfig(pki.Nodes["n1"][0], pki.Nodes["n1"][1], pki.CA, tlsutil.ClientAuthRequest); err != nil {
			t.Fatal(err)
		}
	})
	defer stop(t, s)
	cc := tlsDial(t, s.GRPCAddr(), clientTLS(t, pki.Client, pki.ClientKey, pki.CA))
	track := func(tenant, tok string) codes.Code {
		return callGRPC(t, cc, api.Tracker_TrackSeries_FullMethodName, &api.TrackSeriesRequest{Tenant: tenant, Hashes: []uint64{1}}, tok)
	}
	if c := track("a", ""); c != codes.OK {
		t.Errorf("gRPC track a with the certificate: %v, want OK", c)
	}
	if c := track("b", ""); c != codes.PermissionDenied {
		t.Errorf("gRPC track b with the certificate: %v, want PermissionDenied", c)
	}
	if c := track("a", "Bearer not-a-token"); c != codes.Unauthenticated {
		t.Errorf("gRPC track a with the certificate and a wrong token: %v, want Unauthenticated", c)
	}
	if c := callGRPC(t, cc, api.Admin_Status_FullMethodName, &api.StatusRequest{}, ""); c != codes.PermissionDenied {
		t.Errorf("gRPC admin status with the certificate: %v, want PermissionDenied", c)
	}
	get := func(cfg *tls.Config, path string) int {
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := c.Get("https://" + s.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	withCert, noCert := clientTLS(t, pki.Client, pki.ClientKey, pki.CA), clientTLS(t, "", "", pki.CA)
	for _, c := range []struct {
		cfg  *tls.Config
		path string
		want int
	}{
		{withCert, "/api/v1/tenants/a", http.StatusOK},
		{withCert, "/api/v1/tenants/b", http.StatusForbidden},
		{withCert, "/api/v1/status", http.StatusForbidden}, // every tenant's data
		{noCert, "/api/v1/tenants/a", http.StatusUnauthorized},
	} {
		if got := get(c.cfg, c.path); got != c.want {
			t.Errorf("HTTP %s (certificate %v): %d, want %d", c.path, c.cfg == withCert, got, c.want)
		}
	}
}

// TestAccessAdminTokenOnly: a node with an admin token and no credentials
// file answers no endpoint that writes or reveals tenant data without a
// credential, and the admin token satisfies every scope. Before, billing
// writes, usage and bill reads, tracking, sketch pushes and every stream
// answered without a token on such a node.
func TestAccessAdminTokenOnly(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.AdminToken, c.Access.EnableDebugEndpoints = accessAdminToken, true
	})
	defer stop(t, s)
	probeTable(t, dialAnon(t, s.GRPCAddr()), "http://"+s.HTTPAddr(), &http.Client{Timeout: 30 * time.Second},
		[]string{"none", "wrong", "admin token"},
		func(state string, _ access.Rule, _ bool) (string, bool) {
			switch state {
			case "wrong":
				return "Bearer not-a-token", true
			case "admin token":
				return "Bearer " + accessAdminToken, true
			}
			return "", true
		},
		func(state string, r access.Rule, _ bool) string {
			if r.Scope == "" || state == "admin token" {
				return ""
			}
			return "unauthenticated"
		})
}

// TestAccessDevDefault: without any credential (the development default,
// on loopback) every endpoint answers without a token.
func TestAccessDevDefault(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.EnableDebugEndpoints = true })
	defer stop(t, s)
	probeTable(t, dialAnon(t, s.GRPCAddr()), "http://"+s.HTTPAddr(), &http.Client{Timeout: 30 * time.Second},
		[]string{"none"},
		func(string, access.Rule, bool) (string, bool) { return "", true },
		func(string, access.Rule, bool) string { return "" })
}

// TestAccessRulesCluster: the table on every node of a three-node cluster,
// so each call meets leaders and followers of its group (a follower checks
// the caller, and what it forwards carries the caller's token).
func TestAccessRulesCluster(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) { testAccessRulesCluster(t, false) })
	// TLS on every channel (gRPC with required client certificates, HTTP
	// without), so the answers of leaders and followers, and of calls they
	// forward to each other, are checked over TLS too.
	t.Run("TLS", func(t *testing.T) { testAccessRulesCluster(t, true) })
}

func testAccessRulesCluster(t *testing.T, withTLS bool) {
	creds := writeCredentials(t)
	var pki tlsutil.DevFiles
	if withTLS {
		pki = testPKI(t)
	}
	tc := startCluster(t, 3, func(i int, c *Config) {
		c.Access.AdminToken, c.Access.CredentialsFile, c.Node.HTTPAddr, c.Access.EnableDebugEndpoints = accessAdminToken, creds, "127.0.0.1:0", true
		if withTLS {
			c.Access.TLS = accessTLS(t, pki, fmt.Sprintf("n%d", i+1))
		}
	})
	for _, s := range tc.nodes {
		t.Run(s.NodeID(), func(t *testing.T) {
			cc := dialAnon(t, s.GRPCAddr())
			client := &http.Client{Timeout: 30 * time.Second}
			scheme := "http://"
			if withTLS {
				cc = tlsDial(t, s.GRPCAddr(), clientTLS(t, pki.Client, pki.ClientKey, pki.CA))
				client.Transport = &http.Transport{TLSClientConfig: clientTLS(t, "", "", pki.CA)}
				scheme = "https://"
			}
			probeTable(t, cc, scheme+s.HTTPAddr(), client,
				[]string{"none", "wrong", "wrong scope", "other tenant", "right"}, tokenFor, expectRefused)
		})
	}
}

// writeFileAtomic replaces path as an operator should (a temporary file
// renamed over it): a reload that reads the file while os.WriteFile has
// truncated it but not yet written it would see an empty, valid file, no
// credentials, and refuse every caller.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
