package server

import (
	"strings"
	"testing"
	"time"
)

// TestConfigValidateNamesField: each group's Validate refuses a bad value
// with an error naming the field by its path in Config.
func TestConfigValidateNamesField(t *testing.T) {
	for _, tc := range []struct {
		want string
		mod  func(c *Config)
	}{
		{"Node.DataDir", func(c *Config) { c.Node.DataDir = "" }},
		{"Raft.MaxPendingConns", func(c *Config) { c.Raft.MaxPendingConns = -1 }},
		{"Gossip.MaxStreams", func(c *Config) { c.Gossip.MaxStreams = -1 }},
		{"Gossip.Addr", func(c *Config) { c.Gossip.Join = []string{"127.0.0.1:1"} }},
		{"Cluster.Replicas", func(c *Config) { c.Cluster.Replicas = -1 }},
		{"Cluster.BootstrapExpect", func(c *Config) {
			c.Cluster.Bootstrap, c.Cluster.BootstrapExpect, c.Gossip.Addr = true, 3, "127.0.0.1:0"
		}},
		{"Layout", func(c *Config) { c.Layout.Shards = 3 }},
		{"Tracking.IdleTimeout", func(c *Config) { c.Tracking.IdleTimeout = 90 * time.Second }},
		{"Tracking.DefaultMaxSeries", func(c *Config) { c.Tracking.DefaultMaxSeries = -1 }},
		{"Tracking.BatchWindow", func(c *Config) { c.Tracking.BatchWindow = 2 * time.Second }},
		{"Tracking.MaxInFlight", func(c *Config) { c.Tracking.MaxInFlight = -1 }},
		{"Tracking.MaxBatchHashes", func(c *Config) { c.Tracking.MaxBatchHashes = -1 }},
		{"Tracking.MaxHashesPerRequest", func(c *Config) { c.Tracking.MaxHashesPerRequest = -1 }},
		{"Cluster.BootstrapExpect", func(c *Config) { c.Cluster.BootstrapExpect, c.Gossip.Addr = -1, "127.0.0.1:0" }},
		{"Shares.Mode", func(c *Config) { c.Shares.Mode = "floating" }},
		{"RateLimit.Period", func(c *Config) { c.RateLimit.Period = time.Minute }},
		{"Summaries.NearLimitFraction", func(c *Config) { c.Summaries.NearLimitFraction = 1.5 }},
		{"Access.CredentialsFile", func(c *Config) { c.Access.CredentialsFile = "creds.yaml" }},
		{"Clock.MaxOffset", func(c *Config) { c.Clock.MaxOffset = 2 * time.Hour }},
	} {
		c := Config{Node: NodeConfig{DataDir: t.TempDir()}}
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "config: "+tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", tc.want, err, tc.want)
		}
	}
}

// TestConfigValidateDefaults: an empty config but for the data dir gets
// every group's defaults.
func TestConfigValidateDefaults(t *testing.T) {
	c := Config{Node: NodeConfig{DataDir: t.TempDir()}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Node.ID == "" || c.Node.Zone != "zone-a" || c.Node.GRPCAddr != "127.0.0.1:7300" || c.Raft.Addr != "127.0.0.1:7301" ||
		c.Raft.ApplyTimeout != 5*time.Second || c.Cluster.Replicas != 3 || c.Layout.Partitions != 64 ||
		c.Tracking.IdleTimeout != 20*time.Minute || c.Tracking.BatchWindow != 200*time.Microsecond ||
		c.Clock.Now == nil || c.Clock.MaxOffset != time.Second || c.Shares.Mode != ShareMovable ||
		c.RateLimit.Period != defaultRatePeriod || c.Summaries.NearLimitFraction != 0.85 ||
		c.Limits.Reload != 5*time.Second || c.Sketches.PeerInterval == 0 || c.Logger == nil {
		t.Fatalf("defaults not filled: %+v", c)
	}
}
