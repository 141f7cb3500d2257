package metering

import (
	"bytes"
	"testing"
)

// FuzzDecoders feeds arbitrary bytes to every payload decoder and the
// snapshot section decoder: they must return an error or a value, never
// panic or allocate without bound.
func FuzzDecoders(f *testing.F) {
	f.Add(EncodeEvents(1, 2, []Event{start("a", tg, 5), stop("b", tg, 6)}))
	f.Add(EncodePlan(1, []PlanItem{{Span: 1, Version: 2, Start: 3, End: 4, Backward: true}}))
	f.Add(EncodeExecute(1, []ExecItem{{Span: 1, Version: 2}, {Span: 3, Version: 4, DeadCode: 404, Reason: "gone"}}))
	f.Add(EncodeTick(1, 2))
	f.Add(EncodeSeries(5, []TenantActive{{"t", 3}}))
	r := newReplica(f)
	r.events(1_700_000_000_000, start("a", tg, 1_700_000_000_000))
	f.Add(r.m.encodeLocked())
	// Samples over three months: a restore compacts the first two.
	for _, m := range []int64{29_000_000, 29_000_001, 29_050_000, 29_100_000} {
		r.apply(EntrySeries, EncodeSeries(m, []TenantActive{{"t", m % 7}, {"u", m % 5}}))
	}
	f.Add(r.m.encodeLocked())
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, evs, err := DecodeEvents(b); err == nil {
			for _, ev := range evs {
				if ev.Kind != Start && ev.Kind != Stop {
					t.Fatalf("kind %d accepted", ev.Kind)
				}
			}
		}
		_, _, _ = DecodePlan(b)
		_, _, _ = DecodeExecute(b)
		_, _, _ = DecodeTick(b)
		_, _, _ = DecodeSeries(b)
		if st, err := decodeSection(b); err == nil {
			m := New(1)
			m.nextSpan, m.spans, m.open, m.dedup = st.nextSpan, st.spans, st.open, st.dedup
			m.ledger, m.nrec, m.dead, m.series, m.lastNow = st.ledger, st.nrec, st.dead, st.series, st.lastNow
			enc := m.encodeLocked()
			again, err := decodeSection(enc)
			if err != nil || len(again.spans) != len(st.spans) || again.nrec != st.nrec {
				t.Fatalf("re-encoded section does not decode the same: %v", err)
			}
			// Samples held compacted are written back as they were read.
			m2 := New(1)
			m2.nextSpan, m2.spans, m2.open, m2.dedup = again.nextSpan, again.spans, again.open, again.dedup
			m2.ledger, m2.nrec, m2.dead, m2.series, m2.lastNow = again.ledger, again.nrec, again.dead, again.series, again.lastNow
			if !bytes.Equal(m2.encodeLocked(), enc) {
				t.Fatal("a decoded, re-encoded section changes on a second round")
			}
		}
	})
}
