package metering

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/metering/interval"
)

// Golden byte forms of the payloads and of the snapshot section, recorded
// from the encoders as they were before the codec moved to fsm/wire. Entries
// and snapshots outlive builds: a change here is a format change.
func TestGoldenPayloadBytes(t *testing.T) {
	evs := []Event{start("a", tg, 1_700_000_000_000), stop("b", tg, -5),
		{Kind: Start, Target: Target{Org: "o"}, Timestamp: 7, Measures: []Measure{{"cpu", 0.25}, {"mem", -1e9}}}}
	for _, c := range []struct {
		name, want string
		b          []byte
		decode     func([]byte) ([]byte, error)
	}{
		{"events", "82a0abfef9628090a9fa1303010161036f726705737061636508636f6e73756d657208706f737467726573056c6172676506696e73742d3180a0abfef96201066d656d6f72790000000000008040020162036f726705737061636508636f6e73756d657208706f737467726573056c6172676506696e73742d31090100016f00000000000e0203637075000000000000d03f036d656d0000000065cdcdc1", EncodeEvents(1_700_000_000_001, slack, evs), func(b []byte) ([]byte, error) {
			now, sl, evs, err := DecodeEvents(b)
			return EncodeEvents(now, sl, evs), err
		}},
		{"plan", "050201ac02bfa907c0a9070180808080802002000000", EncodePlan(-3, []PlanItem{{Span: 1, Version: 300, Start: -60_000, End: 60_000, Backward: true}, {Span: 1 << 40, Version: 2}}), func(b []byte) ([]byte, error) {
			now, items, err := DecodePlan(b)
			return EncodePlan(now, items), err
		}},
		{"execute", "1202010200030401940304676f6e65", EncodeExecute(9, []ExecItem{{Span: 1, Version: 2}, {Span: 3, Version: 4, DeadCode: 404, Reason: "gone"}}), func(b []byte) ([]byte, error) {
			now, items, err := DecodeExecute(b)
			return EncodeExecute(now, items), err
		}},
		{"tick", "80a0abfef96200", EncodeTick(1_700_000_000_000, 0), func(b []byte) ([]byte, error) {
			now, cut, err := DecodeTick(b)
			return EncodeTick(now, cut), err
		}},
		{"series", "aad4821b020274310a027432808080808001", EncodeSeries(28_333_333, []TenantActive{{"t1", 10}, {"t2", 1 << 35}}), func(b []byte) ([]byte, error) {
			m, rows, err := DecodeSeries(b)
			return EncodeSeries(m, rows), err
		}},
	} {
		if got := hex.EncodeToString(c.b); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
			continue
		}
		if again, err := c.decode(c.b); err != nil || !bytes.Equal(again, c.b) {
			t.Errorf("%s: golden bytes decode to %x, %v", c.name, again, err)
		}
	}
}

// goldenState drives a replica through a fixed workload that leaves spans,
// dedup ids, ledger records, dead letters and series samples.
func goldenState(t *testing.T) *replica {
	r := newReplica(t)
	grid := interval.Grid{G: interval.Minute}
	now := int64(1_700_000_000_000)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 40 {
		tt := tg
		tt.Instance = fmt.Sprint(rng.IntN(8))
		r.events(now, start(fmt.Sprint("s", i), tt, now-rng.Int64N(600_000)), stop(fmt.Sprint("e", i), tt, now-rng.Int64N(300_000)))
		now += 10_000
		if i%7 == 0 {
			runSampler(r, grid, now, func() bool { return rng.IntN(3) == 0 })
		}
	}
	r.apply(EntrySeries, EncodeSeries(now/60_000, []TenantActive{{"t1", 10}, {"t2", 20}}))
	// Plan what is due, then dead-letter every planned interval.
	work, _ := r.m.Due(grid, now, 1000, nil)
	var plans []PlanItem
	for _, w := range work {
		if w.Plan != nil {
			plans = append(plans, *w.Plan)
		}
	}
	r.apply(EntryPlan, EncodePlan(now, plans))
	work, _ = r.m.Due(grid, now, 1000, nil)
	var execs []ExecItem
	for _, w := range work {
		if w.Plan == nil {
			execs = append(execs, ExecItem{Span: w.Span.ID, Version: w.Span.Version, DeadCode: 400, Reason: "bad"})
		}
	}
	r.apply(EntryExecute, EncodeExecute(now, execs))
	// Leave the next intervals planned but not executed.
	work, _ = r.m.Due(grid, now+600_000, 1000, nil)
	plans = plans[:0]
	for _, w := range work {
		if w.Plan != nil {
			plans = append(plans, *w.Plan)
		}
	}
	r.apply(EntryPlan, EncodePlan(now+600_000, plans))
	return r
}

func TestGoldenSectionBytes(t *testing.T) {
	r := goldenState(t)
	sec := r.m.encodeLocked()
	st := r.m.Stats(interval.Grid{G: interval.Minute}, 1_700_000_400_000)
	if st.Spans == 0 || st.Planned == 0 || st.Records == 0 || st.DeadLetters == 0 {
		t.Fatalf("workload too thin for a golden section: %+v", st)
	}
	const want = "4e612bac99d3032a930947a60d2ce4d6228bce3f25f67d753f07dfaa93df0ef7"
	if got := sha256.Sum256(sec); hex.EncodeToString(got[:]) != want {
		t.Errorf("section sha256 %x, want %s", got, want)
	}
	const wantSmall = "01020101036f726705737061636508636f6e73756d657208706f737467726573056c6172676506696e73742d3101066d656d6f7279000000000000804080a0abfef9620080a0abfef9620100016100010101619f94b9c30ab017eb80c0fdf2a16300000080a0abfef962"
	small := newReplica(t)
	small.events(1_700_000_000_000, start("a", tg, 1_700_000_000_000))
	if got := hex.EncodeToString(small.m.encodeLocked()); got != wantSmall {
		t.Errorf("small section %s, want %s", got, wantSmall)
	}
	st2, err := decodeSection(sec)
	if err != nil {
		t.Fatalf("golden section does not decode: %v", err)
	}
	m := New(1)
	m.nextSpan, m.spans, m.open, m.dedup = st2.nextSpan, st2.spans, st2.open, st2.dedup
	m.ledger, m.nrec, m.dead, m.series, m.lastNow = st2.ledger, st2.nrec, st2.dead, st2.series, st2.lastNow
	if !bytes.Equal(m.encodeLocked(), sec) {
		t.Error("decoded golden section re-encodes to other bytes")
	}
}

// A padded (non-minimal) varint is refused in payloads and in the section:
// no encoder writes one, and each payload has one byte form.
func TestPaddedVarintRefused(t *testing.T) {
	tick := EncodeTick(1, 2) // varint 1 = 0x02, varint 2 = 0x04
	if _, _, err := DecodeTick(tick); err != nil || len(tick) != 2 {
		t.Fatalf("reference tick %x: %v", tick, err)
	}
	if _, _, err := DecodeTick([]byte{0x82, 0x00, 0x04}); !errors.Is(err, ErrBadPayload) || !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded now: %v", err)
	}
	r := newReplica(t)
	r.events(1_700_000_000_000, start("a", tg, 1_700_000_000_000))
	sec := r.m.encodeLocked() // version 1, next span id 2, ...
	if sec[0] != sectionVersion || sec[1] != 2 {
		t.Fatalf("section starts %x", sec[:2])
	}
	padded := append([]byte{sectionVersion, 0x82, 0x00}, sec[2:]...)
	if _, err := decodeSection(padded); !errors.Is(err, ErrBadPayload) || !errors.Is(err, wire.ErrNonMinimal) {
		t.Errorf("padded next span id: %v", err)
	}
}
