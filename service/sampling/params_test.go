package sampling

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestParamsYAML: the backlog_controller block docs/sampling.md shows decodes as documented
// (durations as strings).
func TestParamsYAML(t *testing.T) {
	var doc struct {
		BC Params `yaml:"backlog_controller"`
	}
	src := `
backlog_controller:
  kind: locate
  target: 5000
  period: 10s
  kp: 4
  ki: 1
  min_percent: 5
`
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	want := Params{Kind: "locate", Target: 5000, Period: 10 * time.Second, Kp: 4, Ki: 1, MinPercent: 5}
	if doc.BC != want {
		t.Fatalf("decoded %+v, want %+v", doc.BC, want)
	}
	if err := doc.BC.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentUse is for the race detector: reports, ticks, status and
// retuning at once; every accepted report is counted.
func TestConcurrentUse(t *testing.T) {
	c := New(tuned())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				mustReport(t, c, fmt.Sprint("q", w), float64(i), t0.Add(time.Duration(i)*time.Millisecond))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 500 {
			c.Tick(t0.Add(time.Duration(i) * 10 * time.Second))
			_ = c.Status()
			if i%100 == 0 {
				p := tuned()
				p.Kp = float64(1 + i/100)
				c.SetParams(p)
			}
		}
	}()
	wg.Wait()
	if st := c.Status(); st.Reports != 8000 || st.Rejected != 0 {
		t.Fatalf("reports %d rejected %d, want 8000 and 0", st.Reports, st.Rejected)
	}
}
