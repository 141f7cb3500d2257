package clientlib

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// TestRealServerToken: Config.Token reaches a node with scoped credentials:
// a track credential limited to tenant "mine" tracks it (through the
// cluster stream it also needs) and is refused for another tenant with
// PermissionDenied; without a token the call fails, never silently.
func TestRealServerToken(t *testing.T) {
	sum := sha256.Sum256([]byte("client-token"))
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("dist sha256:"+hex.EncodeToString(sum[:])+" track mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := servertest.Start(t, servertest.Options{Nodes: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.Tracking.DefaultMaxSeries, cfg.Access.AdminToken, cfg.Access.CredentialsFile = 1000, "admin", creds
	}}).Node(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := testConfig(s.GRPCAddr())
	cfg.Token = "client-token"
	c := newTestClient(t, cfg)
	hs := hashesIn(3, api.DefaultPartitions, 10)
	if rej, err := c.TrackSeries(ctx, "mine", hs); err != nil || len(rej) != 0 {
		t.Fatalf("own tenant with the token: %v rejected, %v", rej, err)
	}
	if _, err := c.TrackSeries(ctx, "theirs", hs); status.Code(errors.Unwrap(err)) != codes.PermissionDenied && status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another tenant with the token: %v, want PermissionDenied", err)
	}

	cfg = testConfig(s.GRPCAddr())
	cfg.Partitions, cfg.Groups = api.DefaultPartitions, api.DefaultGroups
	c2 := newTestClient(t, cfg)
	ctx2, cancel2 := context.WithTimeout(ctx, 3*time.Second) // only bounds the retries
	defer cancel2()
	if _, err := c2.TrackSeries(ctx2, "mine", hs); err == nil {
		t.Fatal("a client without a token was served")
	}
}
