package main

import (
	"slices"
	"strings"
	"testing"
)

// TestParseChangeScenarios: an unknown scenario is refused naming the flag
// and the choices; failover (it stops a node) always runs last.
func TestParseChangeScenarios(t *testing.T) {
	if _, err := parseChangeScenarios("steady,nope"); err == nil || !strings.Contains(err.Error(), "--change") ||
		!strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "failover") {
		t.Errorf("unknown scenario: err = %v, want one naming --change, the value and the choices", err)
	}
	got, err := parseChangeScenarios("failover, onoff,lower")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{changeOnOff, changeLower, changeFailover}; !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v (failover last)", got, want)
	}
	all, err := parseChangeScenarios("all")
	if err != nil || all[len(all)-1] != changeFailover || len(all) != len(changeScenarios) {
		t.Errorf("all = %v, %v; want every scenario, failover last", all, err)
	}
}
