package faulttest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

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
// A tenant without a limit is recorded under one key per partition
// (tenant#partition): without a limit nothing ties one series to another,
// so the check loses nothing, and porcupine checks many small histories
// instead of one whose state (every series the tenant holds) is cloned at
// every step (one key for a 20 s load of 19,000 requests took 73 s and
// 18 GB to check).
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

// key is the history key of tenant's partition p: the tenant, or, when it
// has no limit, the tenant and the partition.
func (th *trackHistory) key(tenant string, p int) string {
	if th.limits[tenant] > 0 {
		return tenant
	}
	return fmt.Sprintf("%s#%d", tenant, p)
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
	th.c.checkHistory(th.h, history.TrackingModel(func(key string) int {
		if strings.Contains(key, "#") {
			return 0 // a tenant without a limit, by partition
		}
		return th.limits[key]
	}))
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
