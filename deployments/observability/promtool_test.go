package observability

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtoolFile is what this test reads of a YAML file here: a rule file has
// groups, a promtool unit test file has rule_files and tests.
type promtoolFile struct {
	Groups []struct {
		Rules []struct {
			Alert string `json:"alert"`
		} `json:"rules"`
	} `json:"groups"`
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestPromtoolRules runs `promtool test rules` on every promtool test file in
// this directory, and requires that every rule file here is tested by one and
// that every alert has a case in which it fires. Generic on purpose: a rule
// file added here (another component's alerts) is covered the same way, by
// adding its test file beside it.
func TestPromtoolRules(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ruleFiles, testFiles []string
	alerts := map[string]string{} // alert → rule file
	tested := map[string]bool{}   // rule files named by a test file
	fired := map[string]bool{}    // alerts some case expects to fire
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pf promtoolFile
		if err := yaml.Unmarshal(b, &pf); err != nil {
			continue // not a Prometheus file (the dashboard is JSON; other YAML may follow)
		}
		switch {
		case len(pf.Tests) > 0:
			testFiles = append(testFiles, f)
			for _, rf := range pf.RuleFiles {
				tested[filepath.Clean(rf)] = true
			}
			for _, tc := range pf.Tests {
				for _, at := range tc.AlertRuleTest {
					if len(at.ExpAlerts) > 0 {
						fired[at.Alertname] = true
					}
				}
			}
		case len(pf.Groups) > 0:
			ruleFiles = append(ruleFiles, f)
			for _, g := range pf.Groups {
				for _, r := range g.Rules {
					if r.Alert != "" {
						alerts[r.Alert] = f
					}
				}
			}
		}
	}
	if !slices.Contains(ruleFiles, "alerts.yaml") {
		t.Fatalf("rule files %v: want alerts.yaml among them", ruleFiles)
	}
	for _, rf := range ruleFiles {
		if !tested[rf] {
			t.Errorf("%s: no promtool test file here names it in rule_files (add <name>.test.yaml)", rf)
		}
	}
	for a, f := range alerts {
		if !fired[a] {
			t.Errorf("%s: alert %s has no promtool case in which it fires", f, a)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install it (Debian: apt-get install prometheus; .ci/run does) to run the alert rule unit tests")
	}
	out, err := exec.Command(promtool, append([]string{"test", "rules"}, testFiles...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", strings.Join(testFiles, " "), err, out)
	}
	t.Logf("promtool test rules %s:\n%s", strings.Join(testFiles, " "), out)
}
