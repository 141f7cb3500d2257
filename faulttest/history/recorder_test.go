package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRecorderConcurrentRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	r, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const clients, each = 8, 50
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				h := uint64(c*1000 + i)
				call := r.Begin(c, Op{Kind: KindTrack, Key: "t", Hashes: []uint64{h}})
				switch i % 3 {
				case 0:
					call.EndTrack(nil, nil)
				case 1:
					call.EndTrack([]uint64{h}, nil)
				default:
					call.EndTrack(nil, status.Error(codes.Unavailable, "no leader"))
				}
			}
		}()
	}
	wg.Wait()
	open := r.Begin(99, Op{Kind: KindConfigCAS, Key: "doc", Expected: 3, Value: "v"})
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	open.End(Op{Outcome: OK, Version: 4}) // after Close: already recorded as unknown

	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, r.Ops(), func(a, b Op) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
		t.Fatalf("file and memory differ: %d vs %d operations", len(got), len(r.Ops()))
	}
	if len(got) != clients*each+1 {
		t.Fatalf("%d operations recorded, want %d", len(got), clients*each+1)
	}
	count := map[Outcome]int{}
	for _, op := range got {
		count[op.Outcome]++
		if op.Return < op.Call {
			t.Fatalf("%+v returns before its call", op)
		}
	}
	want := map[Outcome]int{OK: clients * 17, Rejected: clients * 17, Unknown: clients*16 + 1}
	if fmt.Sprint(count) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", count, want)
	}
	last := got[len(got)-1]
	if last.Client != 99 || last.Outcome != Unknown || last.Value != "v" || last.Expected != 3 {
		t.Fatalf("in-flight call recorded as %+v, want client 99's CAS as unknown", last)
	}
}

func TestClassify(t *testing.T) {
	for err, want := range map[error]Outcome{
		nil: OK,
		status.Error(codes.InvalidArgument, "bad"):   Failed,
		status.Error(codes.PermissionDenied, "no"):   Failed,
		status.Error(codes.Unavailable, "down"):      Unknown,
		status.Error(codes.DeadlineExceeded, "slow"): Unknown,
		errors.New("connection reset"):               Unknown,
	} {
		if got := Classify(err); got != want {
			t.Errorf("Classify(%v) = %s, want %s", err, got, want)
		}
	}
}

func TestLoadNamesBadLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	r, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	r.Begin(0, Op{Kind: KindTrack, Key: "t"}).EndTrack(nil, nil)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("{\"client\": \"x\"}\n")
	f.Close()
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "operation 2") {
		t.Fatalf("loading a damaged history: %v, want an error naming operation 2", err)
	}
	if _, err := Load(path + ".missing"); err == nil {
		t.Fatal("loading a missing file succeeded")
	}
}
