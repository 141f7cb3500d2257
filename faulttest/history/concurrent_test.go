package history

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// server is a correct, linearizable tracker kept in memory: the reference
// implementation the checker is tested against (the real server's histories
// are checked by the fault tests).
type server struct {
	mu    sync.Mutex
	sets  map[string]map[uint64]bool
	limit int
}

func (s *server) track(tenant string, hashes []uint64) (rejected []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.sets[tenant]
	for _, h := range hashes {
		switch {
		case set[h]:
		case len(set) < s.limit:
			set[h] = true
		default:
			rejected = append(rejected, h)
		}
	}
	return rejected
}

// recordConcurrent runs clients against a correct server and returns the
// recorded history: re-sends of known series, new series past the limit,
// answers lost after the effect and requests lost before it.
func recordConcurrent(t *testing.T) []Op {
	t.Helper()
	r, err := Create(filepath.Join(t.TempDir(), "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s := &server{sets: map[string]map[uint64]bool{}, limit: 30}
	tenants := []string{"a", "b", "c"}
	for _, tn := range tenants {
		s.sets[tn] = map[uint64]bool{}
	}
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 40))
			for range 60 {
				tenant := tenants[rng.IntN(len(tenants))]
				var hs []uint64
				for range 1 + rng.IntN(4) {
					hs = append(hs, rng.Uint64N(60)) // 60 candidates over a limit of 30
				}
				call := r.Begin(c, Op{Kind: KindTrack, Key: tenant, Hashes: hs})
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				switch rng.IntN(10) {
				case 0: // lost before the server saw it
					call.EndTrack(nil, errors.New("connection refused"))
				case 1: // applied, answer lost
					s.track(tenant, hs)
					call.EndTrack(nil, errors.New("deadline exceeded"))
				default:
					rej := s.track(tenant, hs)
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					call.EndTrack(rej, nil)
				}
			}
		}()
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return r.Ops()
}

// A correct server's concurrent history passes; the same history with one
// answer changed into a violation fails.
func TestCheckConcurrentHistory(t *testing.T) {
	ops := recordConcurrent(t)
	m := TrackingModel(func(string) int { return 30 })
	if err := Check(m, ops, "", time.Minute); err != nil {
		t.Fatalf("a correct server's history: %v", err)
	}

	// An acknowledgement followed (strictly after its return) by a
	// rejection of the same series.
	answered := func(op Op) bool { return op.Outcome == OK || op.Outcome == Rejected }
	mutated := false
	for i := range ops {
		for j := range ops {
			if mutated || !answered(ops[i]) || !answered(ops[j]) || ops[i].Key != ops[j].Key || ops[i].Return >= ops[j].Call {
				continue
			}
			for _, h := range ops[i].Hashes {
				if !slices.Contains(ops[i].Rejected, h) && slices.Contains(ops[j].Hashes, h) && !slices.Contains(ops[j].Rejected, h) {
					bad := slices.Clone(ops)
					bad[j].Outcome, bad[j].Rejected = Rejected, append(slices.Clone(bad[j].Rejected), h)
					if err := Check(m, bad, "", time.Minute); !errors.Is(err, ErrNotLinearizable) {
						t.Fatalf("series %x acknowledged by %s then rejected by %s: Check = %v", h, fmt.Sprint(ops[i]), fmt.Sprint(bad[j]), err)
					}
					mutated = true
					break
				}
			}
		}
	}
	if !mutated {
		t.Fatal("the history has no acknowledged series sent again: nothing to break")
	}

	// The same history against a limit one lower than the server's: some
	// tenant reached 30, so 29 must fail.
	if err := Check(TrackingModel(func(string) int { return 29 }), ops, "", time.Minute); !errors.Is(err, ErrNotLinearizable) {
		t.Fatalf("a history reaching 30 series checked against a limit of 29: %v", err)
	}
}
