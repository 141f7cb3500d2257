package server

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"
)

// envoyDocFilter is the part of Envoy's rate limit filter configuration that
// docs/envoy.md shows and this test checks.
type envoyDocFilter struct {
	HTTPFilters []struct {
		Name        string `json:"name"`
		TypedConfig struct {
			Domain           string `json:"domain"`
			FailureModeDeny  *bool  `json:"failure_mode_deny"`
			RateLimitService struct {
				GRPCService struct {
					EnvoyGRPC struct {
						ClusterName string `json:"cluster_name"`
					} `json:"envoy_grpc"`
					InitialMetadata []struct {
						Key   string `json:"key"`
						Value string `json:"value"`
					} `json:"initial_metadata"`
				} `json:"grpc_service"`
			} `json:"rate_limit_service"`
		} `json:"typed_config"`
	} `json:"http_filters"`
}

// envoyDocConfig returns the Envoy configuration block of docs/envoy.md (the
// YAML block that configures envoy.filters.http.ratelimit).
func envoyDocConfig(t *testing.T) envoyDocFilter {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	for _, m := range blocks {
		if !strings.Contains(m[1], "envoy.filters.http.ratelimit") {
			continue
		}
		var f envoyDocFilter
		if err := yaml.Unmarshal([]byte(m[1]), &f); err != nil {
			t.Fatalf("docs/envoy.md: the Envoy configuration does not parse: %v", err)
		}
		return f
	}
	t.Fatal("docs/envoy.md: no YAML block configures envoy.filters.http.ratelimit")
	return envoyDocFilter{}
}

// TestEnvoyDocConfigCarriesCredential: the Envoy configuration the docs show
// must authenticate. On a node with an admin token (every production node)
// ShouldRateLimit needs a track credential; a configuration that sends none
// gets Unauthenticated on every call, and Envoy with failure_mode_deny: false
// then admits everything silently. The test takes the documented metadata,
// puts a real token in place of the placeholder, and calls a node with it.
func TestEnvoyDocConfigCarriesCredential(t *testing.T) {
	f := envoyDocConfig(t)
	if len(f.HTTPFilters) != 1 {
		t.Fatalf("docs/envoy.md: %d http_filters, want the rate limit filter alone", len(f.HTTPFilters))
	}
	tc := f.HTTPFilters[0].TypedConfig
	if tc.FailureModeDeny == nil || !*tc.FailureModeDeny {
		t.Fatal("docs/envoy.md: failure_mode_deny must be true in the shown configuration: with false a refused credential admits everything without a sign")
	}
	var auth string
	for _, m := range tc.RateLimitService.GRPCService.InitialMetadata {
		if strings.EqualFold(m.Key, "authorization") {
			auth = m.Value
		}
	}
	placeholder, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || placeholder == "" {
		t.Fatalf("docs/envoy.md: grpc_service.initial_metadata carries no \"authorization: Bearer <token>\" (got %q): a node with a token refuses every call", auth)
	}

	s, _ := startServer(t, filepath.Join(t.TempDir(), "data"), func(c *Config) { c.Access.AdminToken = testToken })
	defer stop(t, s)
	applyEnvoy(t, []*Server{s}, map[string]string{"edge": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 50}\n"})
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := rlsv3.NewRateLimitServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := rlsReq(tc.Domain, "remote_address", "10.0.0.1")

	// What the issue saw: no metadata, Unauthenticated.
	if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no credential: %v, want Unauthenticated", err)
	}
	// The documented metadata with the token in place of its placeholder.
	md := metadata.Pairs("authorization", strings.Replace(auth, placeholder, testToken, 1))
	r, err := c.ShouldRateLimit(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		t.Fatalf("documented credential: %v", err)
	}
	if r.OverallCode.String() != "OK" {
		t.Fatalf("documented credential: %v, want OK", r.OverallCode)
	}
}
