package gctune

import (
	"context"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	c := Config{}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 100},
		{64 << 20, 100},   // small heap: the runtime's default
		{128 << 20, 100},  // headroom = live
		{256 << 20, 50},   // half
		{512 << 20, 25},   // a quarter
		{1400 << 20, 10},  // 100 M series: clamped at the floor
		{100 << 30, 10},   // far past it
		{150 << 20, 85},   // in between, rounded down
		{2560 << 20, 10},  // 5 % would be below the floor
		{1280 << 20, 10},  // exactly the floor
		{1100 << 20, 11},  // just above it
		{129 << 20, 99},   // just past the headroom
		{127 << 20, 100},  // just below it
		{1, 100},          // tiny
		{1 << 62, 10},     // huge
		{384 << 20, 33},   // a third
		{192 << 20, 66},   // two thirds
		{1024 << 20, 12},  // 12.5 %, rounded down
		{512<<20 + 1, 24}, // rounding down
	} {
		if got := c.Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{MinPercent: -1}, {MinPercent: 50, MaxPercent: 40}, {Every: -time.Second}} {
		if err := c.validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestRunSetsAndRestores: with a live heap past the headroom, Run lowers the
// collector percentage; when it returns, the percentage it found is back.
func TestRunSetsAndRestores(t *testing.T) {
	t.Setenv("GOGC", "") // t.Setenv then unset: Run must see it absent
	unsetGOGC(t)
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	sink = make([]byte, 64<<20) // live heap ≥ 64 MiB, pointer-free like the tables
	defer func() { sink = nil }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Headroom: 16 << 20, MinPercent: 5, Every: 10 * time.Millisecond}) }()
	deadline := time.Now().Add(10 * time.Second)
	var got int
	for time.Now().Before(deadline) {
		runtimeGC()
		got = currentPercent()
		if got < 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got >= 100 || got < 5 {
		t.Fatalf("percent with a 64 MiB live heap and 16 MiB headroom = %d, want in [5, 100)", got)
	}
	if after := debug.SetGCPercent(100); after != 100 {
		t.Fatalf("percent after Run = %d, want 100 (restored)", after)
	}
}

// sink keeps the test's heap live (a local could be collected early).
var sink []byte

// TestRunLeavesGOGC: a process started with GOGC keeps it.
func TestRunLeavesGOGC(t *testing.T) {
	t.Setenv("GOGC", "300")
	before := debug.SetGCPercent(300)
	defer debug.SetGCPercent(before)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := Run(ctx, Config{Headroom: 1, Every: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(300); got != 300 {
		t.Fatalf("percent = %d, want the operator's 300", got)
	}
}
