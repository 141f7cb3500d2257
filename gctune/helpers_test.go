package gctune

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
)

func unsetGOGC(t *testing.T) {
	t.Helper()
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
}

func runtimeGC() { runtime.GC() }

// currentPercent reads the collector percentage without changing it.
func currentPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
