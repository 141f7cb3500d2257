package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/version"
)

// loadSettings binds, parses args and loads with env as the environment.
func loadSettings(t *testing.T, env map[string]string, args ...string) (*serverSettings, error) {
	t.Helper()
	s, err := newServerSettings()
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	s.bind(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return s, s.load(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every flag of `tollgate server` is a YAML key and an environment variable,
// and every YAML key is accepted by the loader. Hidden test-only flags
// (--test-clock-offset) are flags alone.
func TestEveryFlagHasKeyAndEnv(t *testing.T) {
	cmd := newServerCmd()
	s, _ := newServerSettings()
	byFlag := map[string]option{}
	for _, o := range s.options() {
		byFlag[o.flag] = o
	}
	n := 0
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" || f.Name == "help" || f.Hidden {
			return
		}
		n++
		o, ok := byFlag[f.Name]
		if !ok {
			t.Errorf("flag --%s has no option (YAML key / env var)", f.Name)
			return
		}
		if o.key() != strings.ReplaceAll(f.Name, "-", "_") || o.env() != "TOLLGATE_"+strings.ToUpper(o.key()) {
			t.Errorf("flag --%s: key %q env %q", f.Name, o.key(), o.env())
		}
		if strings.Contains(f.Usage, "UNSUPPORTED") {
			t.Errorf("flag --%s: option type %T not bound", f.Name, o.ptr)
		}
		// The key is accepted in a file: decode its own default back.
		p := writeFile(t, "one.yaml", o.key()+": "+yamlScalar(f)+"\n")
		if _, err := readConfigFile(p, s.options()); err != nil {
			t.Errorf("key %s refused: %v", o.key(), err)
		}
	})
	if n != len(byFlag) {
		t.Errorf("%d flags, %d options", n, len(byFlag))
	}
	for _, must := range []string{"replicas", "log_level", "admin_token_file", "leader_balance_interval", "disable_auto_place", "shutdown_timeout", "log_format", "limits_reload_period"} {
		if _, ok := byFlag[strings.ReplaceAll(must, "_", "-")]; !ok {
			t.Errorf("no option for %s", must)
		}
	}
}

func yamlScalar(f *pflag.Flag) string {
	if f.Value.Type() == "stringSlice" {
		return "[]"
	}
	return `"` + f.Value.String() + `"`
}

func TestConfigFileRefusesUnknownKeysNamingThem(t *testing.T) {
	p := writeFile(t, "c.yaml", "zone: zone-b\nidle-timeout: 5m\nbogus: 1\nzone: zone-c\n")
	_, err := loadSettings(t, nil, "--config", p, "--data-dir", t.TempDir())
	if err == nil {
		t.Fatal("accepted unknown keys")
	}
	for _, want := range []string{`c.yaml:2: unknown key "idle-timeout" (did you mean idle_timeout?)`, `c.yaml:3: unknown key "bogus"`, `c.yaml:4: key "zone" given twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// Precedence: flag > environment > file > default, for each kind of source.
func TestConfigPrecedence(t *testing.T) {
	file := writeFile(t, "c.yaml", "zone: from-file\nreplicas: 5\nidle_timeout: 7m\njoin: [10.0.0.1:7302, 10.0.0.2:7302]\n")
	env := map[string]string{"TOLLGATE_ZONE": "from-env", "TOLLGATE_REPLICAS": "4"}
	s, err := loadSettings(t, env, "--config", file, "--data-dir", t.TempDir(), "--zone", "from-flag")
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Node.Zone != "from-flag" || c.Cluster.Replicas != 4 || c.Tracking.IdleTimeout != 7*time.Minute || c.Layout.Shards != 16 ||
		!slices.Equal(c.Gossip.Join, []string{"10.0.0.1:7302", "10.0.0.2:7302"}) {
		t.Fatalf("zone %q replicas %d idle %v shards %d join %v", c.Node.Zone, c.Cluster.Replicas, c.Tracking.IdleTimeout, c.Layout.Shards, c.Gossip.Join)
	}
	want := map[string]string{"zone": "--zone", "replicas": "env TOLLGATE_REPLICAS", "idle-timeout": file, "shards": "default"}
	for k, v := range want {
		if s.source[k] != v {
			t.Errorf("source of %s = %q, want %q", k, s.source[k], v)
		}
	}
	// The config file itself can come from the environment.
	s, err = loadSettings(t, map[string]string{"TOLLGATE_CONFIG": file, "TOLLGATE_DATA_DIR": t.TempDir()})
	if err != nil || s.cfg.Node.Zone != "from-file" {
		t.Fatalf("TOLLGATE_CONFIG: zone %q, err %v", s.cfg.Node.Zone, err)
	}
}

// Validation names the fields and where they came from, and reports every
// problem at once, including values that would panic or be silently replaced.
func TestConfigValidationReportsEveryProblem(t *testing.T) {
	file := writeFile(t, "c.yaml", "idle_timeout: 90s\nreplicas: -1\nlimits_reload_period: -5s\nnear_limit_fraction: 0\n")
	env := map[string]string{"TOLLGATE_SHUTDOWN_TIMEOUT": "-1s"}
	_, err := loadSettings(t, env, "--config", file, "--batch-window", "2s", "--partitions", "0",
		"--bootstrap-expect", "-2", "--grpc-addr", "nonsense", "--log-level", "loud", "--max-clock-offset", "5ms")
	if err == nil {
		t.Fatal("accepted")
	}
	var ce *configErr
	if !errors.As(err, &ce) {
		t.Fatalf("%T: %v", err, err)
	}
	for _, want := range []string{
		"data_dir: required",
		"idle_timeout: 1m30s is not whole minutes (from " + file + ")",
		"replicas: -1: must be ≥ 1",
		"limits_reload_period: -5s: must be > 0",
		"near_limit_fraction: 0: must be in (0, 1]",
		"shutdown_timeout: -1s: must be > 0 (from env TOLLGATE_SHUTDOWN_TIMEOUT)",
		"batch_window: 2s: must be in [0, 1s] (from --batch-window)",
		"partitions: partitions=0",
		"bootstrap_expect: -2 is negative",
		`grpc_addr: "nonsense" is not host:port`,
		`log_level: "loud"`,
		"max_clock_offset: 5ms: must be in [10ms, 1h0m0s] (0: the default 1s) (from --max-clock-offset)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
	if len(ce.errs) != 12 {
		t.Errorf("%d problems reported, want 12:\n%v", len(ce.errs), err)
	}
	// A value that does not parse names the variable or the file line.
	_, err = loadSettings(t, map[string]string{"TOLLGATE_IDLE_TIMEOUT": "soon"}, "--data-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `TOLLGATE_IDLE_TIMEOUT="soon"`) {
		t.Errorf("bad env value: %v", err)
	}
	file = writeFile(t, "c.yaml", "zone: a\nreplicas: three\n")
	_, err = loadSettings(t, nil, "--config", file, "--data-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "c.yaml:2: replicas:") {
		t.Errorf("bad file value: %v", err)
	}
}

func TestDevDefaults(t *testing.T) {
	s, err := loadSettings(t, nil, "--dev")
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Node.DataDir != "data/dev" || s.cfg.Node.ID != "dev" || !s.cfg.Cluster.Bootstrap || s.cfg.Gossip.Addr != "" {
		t.Fatalf("dev: %+v", s.cfg)
	}
	// An explicit gossip address (any source) keeps gossip on with --dev.
	file := writeFile(t, "c.yaml", "dev: true\ngossip_addr: 127.0.0.1:7302\n")
	s, err = loadSettings(t, nil, "--config", file)
	if err != nil || s.cfg.Gossip.Addr != "127.0.0.1:7302" || !s.cfg.Cluster.Bootstrap {
		t.Fatalf("dev with gossip: %q %v", s.cfg.Gossip.Addr, err)
	}
	if _, err := loadSettings(t, nil, "--dev", "--bootstrap-expect", "3"); err == nil || !strings.Contains(err.Error(), "conflicts with dev") {
		t.Fatalf("dev + bootstrap-expect: %v", err)
	}
}

func TestAdminTokenFile(t *testing.T) {
	tok := writeFile(t, "token", "s3cret\n")
	s, err := loadSettings(t, nil, "--dev", "--admin-token-file", tok)
	if err != nil || s.cfg.Access.AdminToken != "s3cret" {
		t.Fatalf("token %q err %v", s.cfg.Access.AdminToken, err)
	}
	s, err = loadSettings(t, map[string]string{"TOLLGATE_ADMIN_TOKEN": "s3cret"}, "--dev", "--admin-token-file", tok)
	if err != nil || s.cfg.Access.AdminToken != "s3cret" {
		t.Fatalf("same token twice: %q %v", s.cfg.Access.AdminToken, err)
	}
	_, err = loadSettings(t, map[string]string{"TOLLGATE_ADMIN_TOKEN": "other"}, "--dev", "--admin-token-file", tok)
	if err == nil || !strings.Contains(err.Error(), "different tokens") {
		t.Fatalf("different tokens: %v", err)
	}
}

// The shipped example sets every key and loads and validates as it is.
func TestExampleConfigLoads(t *testing.T) {
	path := filepath.Join("..", "..", "deployments", "tollgate.example.yaml")
	s, err := loadSettings(t, nil, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Node.DataDir != "/var/lib/tollgate" || s.cfg.Node.ID != "tollgate-a1" {
		t.Fatalf("example not applied: %+v", s.cfg)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		t.Fatal(err)
	}
	for _, o := range s.options() {
		if _, ok := keys[o.key()]; !ok {
			t.Errorf("example lacks %s", o.key())
		}
		if src := s.source[o.flag]; src != path {
			t.Errorf("%s came from %s", o.key(), src)
		}
	}
	// Its values that say "default" are the defaults: the file changes nothing
	// but the example lines.
	d, _ := newServerSettings()
	if s.cfg.Tracking.IdleTimeout != d.cfg.Tracking.IdleTimeout || s.cfg.Tracking.BatchWindow != d.cfg.Tracking.BatchWindow || s.cfg.Tracking.DefaultMaxSeries != d.cfg.Tracking.DefaultMaxSeries ||
		s.cfg.Limits.Reload != d.cfg.Limits.Reload || s.cfg.Tracking.MaxHashesPerRequest != d.cfg.Tracking.MaxHashesPerRequest || s.shutdownTimeout != d.shutdownTimeout ||
		s.cfg.Shares.Mode != d.cfg.Shares.Mode || d.cfg.Shares.Mode != server.ShareMovable {
		t.Errorf("example disagrees with the defaults")
	}
}

type fakeReadiness struct{ reasons []string }

func (f *fakeReadiness) WaitingFor() string {
	r := f.reasons[0]
	if len(f.reasons) > 1 {
		f.reasons = f.reasons[1:]
	}
	return r
}

type logLines struct{ lines []string }

func (l *logLines) Write(p []byte) (int, error) {
	l.lines = append(l.lines, strings.TrimSpace(string(p)))
	return len(p), nil
}

// The wait logs each new reason once and returns only when ready.
func TestWaitUntilReadyLogsReasonChanges(t *testing.T) {
	var out logLines
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
			return slog.Attr{}
		}
		return a
	}}))
	r := &fakeReadiness{reasons: []string{"waiting for --bootstrap-expect 3: 1 alive (node-1)", "waiting for --bootstrap-expect 3: 1 alive (node-1)",
		"waiting for --bootstrap-expect 3: 2 alive (node-1, node-3)", "waiting: group 0: no known leader", ""}}
	if !waitUntilReady(context.Background(), r, log, time.Microsecond) {
		t.Fatal("not ready")
	}
	want := []string{`msg="waiting for --bootstrap-expect 3: 1 alive (node-1)"`, `msg="waiting for --bootstrap-expect 3: 2 alive (node-1, node-3)"`, `msg="waiting: group 0: no known leader"`}
	if !slices.Equal(out.lines, want) {
		t.Fatalf("logged %q", out.lines)
	}
	// Never ready: it keeps waiting until the context ends, and says so.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if waitUntilReady(ctx, &fakeReadiness{reasons: []string{"waiting: x"}}, log, time.Microsecond) {
		t.Fatal("claimed ready")
	}
}

func TestVersionFlag(t *testing.T) {
	root := newRootCmd()
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), version.Get().String()+"\n"; got != want {
		t.Fatalf("--version printed %q, want %q", got, want)
	}
}

// Raft's timers are checked against each other with the defaults filled in,
// and a bad combination names the flag.
func TestRaftTimerFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--raft-heartbeat-timeout", "1s"}, "raft_election_timeout: 400ms is below the heartbeat timeout 1s"},
		{[]string{"--raft-heartbeat-timeout", "200ms"}, "raft_leader_lease_timeout: 400ms is above the heartbeat timeout 200ms"},
		{[]string{"--raft-election-timeout", "1ms"}, "raft_election_timeout: 1ms: must be ≥ 5ms"},
		{[]string{"--raft-heartbeat-timeout", "-1s"}, "raft_heartbeat_timeout: -1s: must be ≥ 5ms"},
	} {
		_, err := loadSettings(t, nil, append([]string{"--data-dir", t.TempDir()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
	s, err := loadSettings(t, nil, "--data-dir", t.TempDir(), "--raft-heartbeat-timeout", "300ms", "--raft-election-timeout", "300ms", "--raft-leader-lease-timeout", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Raft.HeartbeatTimeout != 300*time.Millisecond || s.cfg.Raft.ElectionTimeout != 300*time.Millisecond || s.cfg.Raft.LeaderLeaseTimeout != 200*time.Millisecond {
		t.Errorf("not applied: %v %v %v", s.cfg.Raft.HeartbeatTimeout, s.cfg.Raft.ElectionTimeout, s.cfg.Raft.LeaderLeaseTimeout)
	}
}
