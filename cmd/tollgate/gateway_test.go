package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// loadGatewaySettings parses args as `tollgate gateway` does, with env as
// the environment, without starting anything.
func loadGatewaySettings(t *testing.T, env map[string]string, args ...string) (*gatewaySettings, error) {
	t.Helper()
	var got *gatewaySettings
	cmd := newGatewayCmdWith(func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		func(_ *cobra.Command, s *gatewaySettings) error { got = s; return nil })
	cmd.SetArgs(args)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	err := cmd.Execute()
	return got, err
}

// Every flag of `tollgate gateway` is a YAML key and an environment
// variable, and every key is accepted in a file.
func TestGatewayFlagsHaveKeyAndEnv(t *testing.T) {
	cmd := newGatewayCmd()
	s := newGatewaySettings()
	byFlag := map[string]option{}
	for _, o := range s.options() {
		byFlag[o.flag] = o
	}
	n := 0
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" || f.Name == "help" {
			return
		}
		n++
		o, ok := byFlag[f.Name]
		if !ok {
			t.Errorf("flag --%s has no option (YAML key / env var)", f.Name)
			return
		}
		if strings.Contains(f.Usage, "UNSUPPORTED") {
			t.Errorf("flag --%s: option type %T not bound", f.Name, o.ptr)
		}
		p := writeFile(t, "one.yaml", o.key()+": "+yamlScalar(f)+"\n")
		if _, err := readConfigFile(p, s.options()); err != nil {
			t.Errorf("key %s refused: %v", o.key(), err)
		}
	})
	if n != len(byFlag) || n < 30 {
		t.Errorf("%d flags, %d options", n, len(byFlag))
	}
}

// Precedence flag > env > file, and every invalid setting named at once.
func TestGatewaySettings(t *testing.T) {
	file := writeFile(t, "g.yaml", "upstream: http://file:9090/api/v1/write\ndefault_tenant: from-file\nmax_inflight: 7\nfail_open_tenants: [a, b]\n")
	s, err := loadGatewaySettings(t, map[string]string{"TOLLGATE_DEFAULT_TENANT": "from-env", "TOLLGATE_ADDR": "10.0.0.9:7300"},
		"--config", file, "--max-inflight", "9")
	if err != nil {
		t.Fatal(err)
	}
	if s.upstream != "http://file:9090/api/v1/write" || s.defaultTenant != "from-env" || s.maxInflight != 9 ||
		s.addrs != "10.0.0.9:7300" || strings.Join(s.openTenants, ",") != "a,b" {
		t.Fatalf("settings %+v", s)
	}
	_, err = loadGatewaySettings(t, map[string]string{"TOLLGATE_TRACK_MODE": "maybe"},
		"--upstream", "ftp://x", "--listen", "nowhere", "--max-inflight", "0", "--rate-strategy", "fast",
		"--upstream-header", "novalue", "--listen-tls-cert", "c.pem", "--upstream-timeout", "0s")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`upstream: "ftp://x" is not an http(s) URL (from --upstream)`,
		`listen: "nowhere" is not host:port`,
		"max_inflight: 0: must be ≥ 1",
		`rate_strategy: "fast"`,
		`upstream_header: "novalue": want Name=value`,
		"listen_tls_cert: give both",
		"upstream_timeout: 0s: must be > 0",
		`track_mode: "maybe": use sync or auto (from env TOLLGATE_TRACK_MODE)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := loadGatewaySettings(t, nil); err == nil || !strings.Contains(err.Error(), "upstream: required") {
		t.Errorf("no upstream: %v", err)
	}
}
