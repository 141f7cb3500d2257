package clientlib

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// TestRealServerTLS: Config.TLS reaches a server that requires client
// certificates; without a certificate every call fails (an auth problem is
// never "failed open" into silence, and the client does not hang).
func TestRealServerTLS(t *testing.T) {
	f, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: t.TempDir(), Nodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := f.Nodes["n1"][0], f.Nodes["n1"][1]
	srvTLS, err := tlsutil.ServerConfig(cert, key, f.CA, tlsutil.ClientAuthRequire)
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := tlsutil.ClientConfig(cert, key, f.CA, "")
	s := servertest.Start(t, servertest.Options{Nodes: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.Tracking.DefaultMaxSeries, cfg.Access.TLS = 1000, server.TLSConfig{GRPC: srvTLS, Peer: peer}
	}}).Node(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good, _ := tlsutil.ClientConfig(f.Client, f.ClientKey, f.CA, "")
	cfg := testConfig(s.GRPCAddr())
	cfg.TLS = good
	c := newTestClient(t, cfg)
	hs := hashesIn(3, api.DefaultPartitions, 10)
	if rej, err := c.TrackSeries(ctx, "tls", hs); err != nil || len(rej) != 0 {
		t.Fatalf("with a client certificate: %v rejected, %v", rej, err)
	}

	noCert, _ := tlsutil.ClientConfig("", "", f.CA, "")
	cfg = testConfig(s.GRPCAddr())
	cfg.TLS, cfg.Partitions, cfg.Groups = noCert, api.DefaultPartitions, api.DefaultGroups
	c2 := newTestClient(t, cfg)
	ctx2, cancel2 := context.WithTimeout(ctx, 3*time.Second) // only bounds the retries
	defer cancel2()
	if _, err := c2.TrackSeries(ctx2, "tls", hs); err == nil {
		t.Fatal("a client without a certificate was served")
	}
}
