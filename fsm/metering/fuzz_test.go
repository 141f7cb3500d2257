package metering

import (
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
			again, err := decodeSection(m.encodeLocked())
			if err != nil || len(again.spans) != len(st.spans) || again.nrec != st.nrec {
				t.Fatalf("re-encoded section does not decode the same: %v", err)
			}
		}
	})
}
