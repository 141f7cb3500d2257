package faulttest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/faulttest/history"
)

// trackHistory records the clientlib calls of a test whose clients are not
// the checker's, for the tracking model.
//
// clientlib sends one request per partition a call touches, and each is
// linearized on its own; recording the call as one operation would claim an
// atomicity the service does not offer. So a call is recorded as one
// operation per partition, each with the call's own invocation and return
// times (they contain its request's) and the answer for that partition's
// hashes. A call that fails is unknown (or failed) in every part. A call
// answered while the client failed open (Config.FailOpen: an answer the
// service never gave) is unknown too; the client's FailedOpen counter, not
// the call, says so, so every call in flight while it moved is unknown.
//
// Every operation is keyed by tenant and partition (tenant#partition) and
// checked with the tracking model without a limit; the limit is checked
// apart, on the set of every series an answer acknowledged (overLimit).
// The two together are exactly the tracking model per tenant: whether a
// series may be refused depends only on operations on that series (one
// partition), and the limit only on how many distinct series were
// acknowledged, not in which order (every state a linearisation passes
// through is a subset of the last one). Checked per tenant instead, the
// parts of one call, all concurrent, made porcupine try their orders: a
// broken build's 126 operations were not decided in 2 minutes, and a
// 20 s stall load of 19,000 calls took 73 s and 18 GB.
//
// A nil *trackHistory records nothing.
type trackHistory struct {
	c      *cluster
	h      *history.Recorder
	limits map[string]int // tenant → the highest max_series during the history (0: none); read-only
}

// recordTracks starts a history (history.jsonl beside the nodes' logs, or
// the next free name) for tenants with these limits; check closes and
// checks it.
func (c *cluster) recordTracks(limits map[string]int) *trackHistory {
	c.t.Helper()
	l := map[string]int{}
	for tn, n := range limits {
		l[tn] = n
	}
	return &trackHistory{c: c, h: c.recordHistory(), limits: l}
}

// track is cl.TrackSeries, recorded as client.
func (th *trackHistory) track(ctx context.Context, cl *clientlib.Client, client int, tenant string, hashes []uint64) ([]uint64, error) {
	if th == nil {
		return cl.TrackSeries(ctx, tenant, hashes)
	}
	byPart := map[int][]uint64{}
	for _, h := range hashes {
		p := api.Partition(h, partitions)
		byPart[p] = append(byPart[p], h)
	}
	parts := slices.Sorted(maps.Keys(byPart))
	calls := make([]*history.Call, len(parts))
	opened := cl.Stats().FailedOpen
	for i, p := range parts {
		calls[i] = th.h.Begin(client, history.Op{Kind: history.KindTrack, Key: th.key(tenant, p), Hashes: byPart[p]})
	}
	rej, err := cl.TrackSeries(ctx, tenant, hashes)
	th.end(cl, opened, calls, parts, byPart, rej, err)
	return rej, err
}

// trackPartition is cl.TrackPartition, recorded as client.
func (th *trackHistory) trackPartition(ctx context.Context, cl *clientlib.Client, client int, tenant string, p int, hashes []uint64) ([]uint64, error) {
	if th == nil {
		return cl.TrackPartition(ctx, tenant, p, hashes)
	}
	opened := cl.Stats().FailedOpen
	call := th.h.Begin(client, history.Op{Kind: history.KindTrack, Key: th.key(tenant, p), Hashes: hashes})
	rej, err := cl.TrackPartition(ctx, tenant, p, hashes)
	th.end(cl, opened, []*history.Call{call}, []int{p}, map[int][]uint64{p: hashes}, rej, err)
	return rej, err
}

// key is the history key of tenant's partition p.
func (th *trackHistory) key(tenant string, p int) string { return history.TrackKey(tenant, p) }

// overLimit checks that no tenant had more distinct series acknowledged
// (accepted by an answered call) than its limit.
func (th *trackHistory) overLimit(ops []history.Op) error {
	return history.OverLimit(ops, func(tenant string) int { return th.limits[tenant] })
}

func (th *trackHistory) end(cl *clientlib.Client, opened uint64, calls []*history.Call, parts []int, byPart map[int][]uint64, rej []uint64, err error) {
	if err == nil && cl.Stats().FailedOpen != opened {
		for _, call := range calls {
			call.End(history.Op{Outcome: history.Unknown, Err: "the client failed open while the call was in flight"})
		}
		return
	}
	refused := map[uint64]bool{}
	for _, h := range rej {
		refused[h] = true
	}
	for i, call := range calls {
		if err != nil {
			call.EndTrack(nil, err)
			continue
		}
		var mine []uint64
		for _, h := range byPart[parts[i]] {
			if refused[h] && !slices.Contains(mine, h) {
				mine = append(mine, h)
			}
		}
		call.EndTrack(mine, nil)
	}
}

// check closes the history and checks it with the tracking model: a
// violation fails the test and writes history.html beside it.
func (th *trackHistory) check() {
	if th == nil {
		return
	}
	th.c.t.Helper()
	th.c.checkHistory(th.h, th.model())
	if err := th.overLimit(th.h.Ops()); err != nil {
		th.c.t.Error(err)
	}
}

// checkErr closes the history and returns the check's error (for tests
// that expect a violation).
func (th *trackHistory) checkErr() error {
	if err := th.h.Close(); err != nil {
		return err
	}
	return errors.Join(
		history.Check(th.model(), th.h.Ops(), strings.TrimSuffix(th.h.Path(), ".jsonl")+".html", 2*time.Minute),
		th.overLimit(th.h.Ops()))
}

// model is the tracking model per tenant#partition, without a limit (see
// overLimit).
func (th *trackHistory) model() history.Model {
	return history.TrackingModel(func(string) int { return 0 })
}

// trackAll sends hashes for tenant (recorded as client 0) and returns the
// rejected ones; an error fails the test.
func (th *trackHistory) trackAll(t *testing.T, cl *clientlib.Client, tenant string, hashes []uint64) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	defer cancel()
	rej, err := th.track(ctx, cl, 0, tenant, hashes)
	if err != nil {
		t.Fatalf("track %d series of %s: %v", len(hashes), tenant, err)
	}
	return rej
}

// overLimit counts the distinct series answered calls acknowledged, over
// every partition of a tenant; refused series and calls without an answer
// do not count.
func TestTrackHistoryOverLimit(t *testing.T) {
	th := &trackHistory{limits: map[string]int{"a": 2, "free": 0}}
	op := func(key string, out history.Outcome, hashes []uint64, rejected ...uint64) history.Op {
		return history.Op{Kind: history.KindTrack, Key: key, Outcome: out, Hashes: hashes, Rejected: rejected}
	}
	within := []history.Op{
		op("a#1", history.OK, []uint64{1}),
		op("a#2", history.Rejected, []uint64{2, 3}, 3),
		op("a#3", history.Unknown, []uint64{4}),
		op("a#1", history.OK, []uint64{1}),
		op("free#0", history.OK, []uint64{5, 6, 7}),
	}
	if err := th.overLimit(within); err != nil {
		t.Fatalf("2 series acknowledged under a limit of 2: %v", err)
	}
	over := append(within, op("a#3", history.OK, []uint64{8}))
	if err := th.overLimit(over); err == nil || !strings.Contains(err.Error(), "tenant a: 3 distinct series") {
		t.Fatalf("3 series acknowledged under a limit of 2 (in three partitions): %v, want an error naming tenant a", err)
	}
}
