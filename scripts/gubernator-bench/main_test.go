package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	stat := "4242 (gu ber) n) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 12 0 100 0 0"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if got != 2.0 {
		t.Fatalf("cpu = %v s, want 2.0 (150 + 50 ticks)", got)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Fatal("short stat line accepted")
	}
}

func TestParseFlagsNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		field string
	}{
		{[]string{"--limit", "0"}, "--limit"},
		{[]string{"--concurrency", "-1"}, "--concurrency"},
		{[]string{"--pid", "12,x"}, "--pid"},
		{[]string{"--addr", " , "}, "--addr"},
		{[]string{"--boundary", "1s"}, "--burst"},
		{[]string{"--boundary", "1s", "--burst", "10", "--offset", "2s"}, "--offset"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.field)
		}
	}
	c, err := parseFlags([]string{"--addr", "a:1,b:2", "--pid", "3,4", "--window", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.addrs) != 2 || len(c.pids) != 2 || c.duration != time.Second {
		t.Fatalf("parsed %+v", c)
	}
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{1 * time.Microsecond, 2 * time.Microsecond, 3 * time.Microsecond, 100 * time.Microsecond}
	if p := percentile(d, 0.5); p != 2 {
		t.Fatalf("p50 = %v, want 2", p)
	}
	if p := percentile(d, 1); p != 100 {
		t.Fatalf("p100 = %v, want 100", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Fatalf("empty p50 = %v", p)
	}
}
