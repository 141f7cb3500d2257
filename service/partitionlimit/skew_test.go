package partitionlimit

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// TestNodeClockSkew: what a node's wrong clock does to the sketch window. A
// client with a correct clock pushes its current minute's sketch. A node
// within a second (the default max clock offset) of it, or less than a minute
// off, merges it. A node more than a minute slow refuses it whole (ErrInvalid
// naming the node's window); a fast one takes it as an older minute of its
// window, which then ends early: either way per-partition limits served from
// that node are wrong until its clock is fixed. The server hands the hub its wall
// clock corrected by the measured offset to the cluster's median, so a
// served node keeps the cluster's window however far off its own clock is
// (server TestSketchWindowOnSkewedNode); this test is the hub on a raw clock.
func TestNodeClockSkew(t *testing.T) {
	truth := newClock()
	minute := truth.now().Unix() / 60
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		skew time.Duration
		ok   bool
	}{
		{0, true}, {time.Second, true}, {-time.Second, true}, {50 * time.Second, true}, {-25 * time.Second, true},
		{-2 * time.Minute, false}, {-5 * time.Minute, false}, {2 * time.Minute, true},
	} {
		node := newClock()
		node.add(tc.skew)
		h := newHub(t, node, func(c *Config) { c.Precision = 11 })
		_, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{sketchOf(r, "t1", 1, minute, 100, 11, false)}})
		switch {
		case tc.ok && err != nil:
			t.Errorf("node %v off: the current minute's sketch was refused: %v", tc.skew, err)
		case !tc.ok && !errors.Is(err, ErrInvalid):
			t.Errorf("node %v off: err %v, want ErrInvalid (minute outside the node's window)", tc.skew, err)
		}
	}
}
