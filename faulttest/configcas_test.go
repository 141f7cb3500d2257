package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/history"
)

// conflictVersion reads the current version out of a compare-and-set
// refusal ("runtime config is at version N, not M: …").
var conflictVersion = regexp.MustCompile(`at version (\d+), not \d+`)

// TestConfigCASUnderLeaderKill: three clients change the runtime config with
// compare-and-set (SetLimits with expected_version, each value new) through
// random nodes while group 0's leader, which orders the changes, is
// SIGKILLed and restarted. Every attempt is recorded and the history checked
// with the runtime config model: a change succeeds only on the current
// version and yields a higher one; a conflict names a version the document
// really had; nothing succeeds on a version already replaced.
func TestConfigCASUnderLeaderKill(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	start := c.waitReplicas(1).Version
	hist := c.recordHistory()
	var n atomic.Int64
	var oks, conflicts, unknown atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for client := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(client), 41))
			v := start
			for {
				select {
				case <-stop:
					return
				default:
				}
				via := c.nodes[rng.IntN(len(c.nodes))]
				if !via.usable() {
					continue
				}
				val := fmt.Sprint(1000 + n.Add(1))
				exp := v
				call := hist.Begin(client, history.Op{Kind: history.KindConfigCAS, Key: "doc", Expected: exp, Value: val})
				ctx, cancel := adminCtx(context.Background(), 3*time.Second)
				resp, err := api.NewConfigClient(c.conn(via.grpcAddr)).SetLimits(ctx, &api.SetLimitsRequest{
					Tenant: "t-cas", Set: map[string]string{"max_series": val}, ExpectedVersion: &exp})
				cancel()
				switch {
				case err == nil:
					call.End(history.Op{Outcome: history.OK, Version: resp.Version})
					v = resp.Version
					oks.Add(1)
				case status.Code(err) == codes.Aborted:
					cur := uint64(0)
					if m := conflictVersion.FindStringSubmatch(status.Convert(err).Message()); m != nil {
						cur, _ = strconv.ParseUint(m[1], 10, 64)
					}
					call.End(history.Op{Outcome: history.Rejected, Version: cur, Err: err.Error()})
					if cur != 0 {
						v = cur
					}
					conflicts.Add(1)
				default:
					call.End(history.Op{Outcome: history.Classify(err), Err: err.Error()})
					unknown.Add(1)
					time.Sleep(300 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(3 * time.Second)
	leader := c.waitLeader(0, nil)
	t.Logf("killing %s, leader of group 0 (the orderer), after %d changes", leader.id, oks.Load())
	leader.kill(t)
	c.waitLeader(0, leader)
	time.Sleep(2 * time.Second)
	leader.restart(t)
	c.waitHealthy()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("compare-and-set: %d applied, %d conflicts, %d without an answer", oks.Load(), conflicts.Load(), unknown.Load())
	if oks.Load() == 0 || conflicts.Load() == 0 {
		t.Errorf("the load made %d changes and %d conflicts: nothing raced", oks.Load(), conflicts.Load())
	}
	c.checkHistory(hist, history.RuntimeConfigModel(start, ""))
	c.checkNoCrashes()
}
