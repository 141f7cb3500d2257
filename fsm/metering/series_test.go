package metering

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/fsm"
)

func fsmEntry(typ byte, payload []byte) fsm.ModuleEntry {
	return fsm.ModuleEntry{Type: typ, Payload: payload}
}

// flatSeries is the model: every sample at full resolution, with the rules
// the module had before compaction (a later minute appends, the latest minute
// again overwrites, an older one is ignored; retention drops samples before
// the cutoff's minute).
type flatSeries map[string][]sample

func (f flatSeries) put(minute int64, rows []TenantActive) {
	for _, r := range rows {
		s := f[r.Tenant]
		if n := len(s); n > 0 && s[n-1].minute >= minute {
			if s[n-1].minute == minute {
				s[n-1].active = r.Active
			}
			continue
		}
		f[r.Tenant] = append(s, sample{minute, r.Active})
	}
}

func (f flatSeries) gc(cutoff int64) {
	if cutoff <= 0 {
		return
	}
	cut := cutoff / 60_000
	for t, ss := range f {
		i := sort.Search(len(ss), func(i int) bool { return ss[i].minute >= cut })
		if i == len(ss) {
			delete(f, t)
		} else {
			f[t] = ss[i:]
		}
	}
}

// window is SeriesSamples' rule on the flat list.
func (f flatSeries) window(tenant string, from, to int64, withPrior bool) []Sample {
	if to != 0 && to <= from {
		return nil
	}
	ss := f[tenant]
	lo := sort.Search(len(ss), func(i int) bool { return ss[i].minute >= from })
	hi := len(ss)
	if to != 0 {
		hi = sort.Search(len(ss), func(i int) bool { return ss[i].minute >= to })
	}
	if withPrior && lo > 0 && (lo == len(ss) || ss[lo].minute > from) {
		lo--
	}
	if lo >= hi {
		return nil
	}
	var out []Sample
	for _, s := range ss[lo:hi] {
		out = append(out, Sample{s.minute, s.active})
	}
	return out
}

// flatSection is the snapshot section a module holding f at full resolution
// writes (no spans, ledger or dedup ids: the test applies none).
func flatSection(f flatSeries, lastNow int64) []byte {
	m := New(1)
	for t, ss := range f {
		m.series[t] = &tenantSeries{open: append([]sample(nil), ss...)}
	}
	m.lastNow = lastNow
	return m.encodeLocked()
}

func minuteOf(y int, mo time.Month, d, h, mi int) int64 {
	return time.Date(y, mo, d, h, mi, 0, 0, time.UTC).Unix() / 60
}

// TestSeriesCompactionLossless drives the module and the full-resolution
// model with the same random series and tick entries over fourteen months —
// counts that jump by anything up to 2⁶², stale minutes, a closed month's
// last minute stamped again, retention cutting through compacted months, a
// snapshot and restore on the way — and checks after each step that every
// query answers as the model does and the snapshot section is byte for byte
// the one the full-resolution module writes.
func TestSeriesCompactionLossless(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			r := newReplica(t)
			// A small budget: the months' compaction spreads over many
			// entries, which the queries must not notice.
			r.m.compactBudget = 1 + int(seed)*40
			model := flatSeries{}
			tenants := []string{"a", "b", "c", "d"}
			minute := minuteOf(2025, 1, 28, 0, 0)
			end := minuteOf(2026, 3, 5, 0, 0)
			var lastNow int64
			active := map[string]int64{}
			step := 0
			recent := make([]int64, 4)
			for minute < end {
				step++
				var rows []TenantActive
				for _, tn := range tenants {
					if rng.IntN(3) == 0 {
						continue
					}
					switch rng.IntN(10) {
					case 0:
						active[tn] = rng.Int64N(1 << 62)
					case 1:
						active[tn] = 0
					case 2, 3, 4:
						active[tn] = max(0, active[tn]+rng.Int64N(41)-20)
					default:
						active[tn] = max(0, active[tn]+rng.Int64N(20_001)-10_000)
					}
					rows = append(rows, TenantActive{tn, active[tn]})
				}
				at := minute
				switch rng.IntN(40) {
				case 0:
					at -= rng.Int64N(3 * 44_640) // a stale leader's minute, maybe months back
				case 1:
					at = monthStart(minute) - 1 // the last minute of the previous month again
				case 2, 3:
					at = recent[rng.IntN(len(recent))] // a minute stamped again: its counts overwritten
				}
				recent = append(recent[1:], at)
				r.apply(EntrySeries, EncodeSeries(at, rows))
				model.put(at, rows)
				if rng.IntN(8) == 0 {
					now := minute*60_000 + rng.Int64N(60_000)
					cutoff := int64(0)
					if rng.IntN(2) == 0 {
						cutoff = now - (200+rng.Int64N(100))*24*3_600_000 // cuts through months
					}
					r.apply(EntryTick, EncodeTick(now, cutoff))
					model.gc(cutoff)
					lastNow = max(lastNow, now)
				}
				if step%97 == 0 {
					r.restoreFrom(r.snapshot())
				}
				if step%41 == 0 {
					checkSeries(t, r.m, model, rng, minute)
					if got, want := r.m.encodeLocked(), flatSection(model, lastNow); !bytes.Equal(got, want) {
						t.Fatalf("step %d: section differs from the full-resolution one (%d vs %d bytes)", step, len(got), len(want))
					}
				}
				if rng.IntN(5) == 0 {
					minute += 1 + rng.Int64N(1_500)
				} else {
					minute++ // counts that change every minute: the short form
				}
			}
			checkSeries(t, r.m, model, rng, minute)
			var blocks int
			for _, ts := range r.m.series {
				blocks += len(ts.closed)
			}
			if blocks == 0 {
				t.Fatal("nothing was compacted: the test proves nothing")
			}
		})
	}
}

func checkSeries(t *testing.T, m *Module, model flatSeries, rng *rand.Rand, now int64) {
	t.Helper()
	lo := minuteOf(2024, 12, 1, 0, 0)
	for _, tn := range []string{"a", "b", "c", "d", "none"} {
		ss := model[tn]
		wantLast, wantOK := int64(0), len(ss) > 0
		if wantOK {
			wantLast = ss[len(ss)-1].active
		}
		if got, ok := m.LastSample(tn); got != wantLast || ok != wantOK {
			t.Fatalf("LastSample(%s) = %d %v, want %d %v", tn, got, ok, wantLast, wantOK)
		}
		for range 30 {
			from := lo + rng.Int64N(now-lo+100)
			to := int64(0)
			if rng.IntN(4) != 0 {
				to = from + rng.Int64N(90_000) - 100
			}
			if rng.IntN(5) == 0 { // a calendar month, as bills ask
				from = monthStart(from)
				to = monthEnd(from)
			}
			withPrior := rng.IntN(3) != 0
			got, want := m.SeriesSamples(tn, from, to, withPrior), model.window(tn, from, to, withPrior)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("SeriesSamples(%s, %d, %d, %v) = %v, want %v", tn, from, to, withPrior, got, want)
			}
		}
	}
	for range 10 {
		from := lo + rng.Int64N(now-lo+100)
		to := monthEnd(from)
		got := m.SeriesWindow(from, to)
		want := map[string][]Sample{}
		for tn := range model {
			if w := model.window(tn, from, to, true); len(w) > 0 {
				want[tn] = w
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("SeriesWindow(%d, %d) = %v, want %v", from, to, got, want)
		}
	}
}

// The bound on the memory a tenant's active-series samples hold per
// retained month in one group (docs/metering.md states it). A month has at
// most 44,640 samples (one a minute); a closed month costs its block's header
// and, per sample a minute after the previous one, 1 byte while the count
// moves by less than 32, 2 below 4,096, 3 below 524,288, at most 12 for any
// jump; a sample after a gap of g minutes costs at most 10 + g bytes, so a
// block never costs more than 12 bytes per minute of its month.
const (
	minutesPerMonth = 31 * 24 * 60
	// closedMonthBound: a count that moves by less than 4,096 a minute
	// (a tenant of a million series churning every minute): 2 bytes a minute
	// and the block, 87 KiB, against 714 KB at 16 bytes a sample.
	closedMonthBound = 2*minutesPerMonth + 128
	// closedMonthWorst: any counts at all.
	closedMonthWorst = 12*minutesPerMonth + 128
)

// TestSeriesMemoryPerTenantMonth: a tenant sampled every minute for twelve
// closed months and ten days of the open one holds at most twelve times the
// per-month bound plus the open month at 16 bytes a sample; with counts that
// jump arbitrarily, the worst-case bound. The bills' data is intact: the
// closed months' samples all read back.
func TestSeriesMemoryPerTenantMonth(t *testing.T) {
	for _, c := range []struct {
		name  string
		next  func(rng *rand.Rand, v int64) int64
		bound int
	}{
		{"churn", func(rng *rand.Rand, v int64) int64 { return max(0, v+rng.Int64N(8_191)-4_095) }, closedMonthBound},
		{"arbitrary", func(rng *rand.Rand, v int64) int64 { return rng.Int64N(math.MaxInt64) }, closedMonthWorst},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			m := New(0)
			from := minuteOf(2025, 1, 1, 0, 0)
			open := minuteOf(2026, 1, 1, 0, 0)
			until := minuteOf(2026, 1, 11, 0, 0)
			v := int64(1_000_000)
			for minute := from; minute < until; minute++ {
				v = c.next(rng, v)
				if _, err := m.Apply(fsmEntry(EntrySeries, EncodeSeries(minute, []TenantActive{{"t", v}}))); err != nil {
					t.Fatal(err)
				}
			}
			ts := m.series["t"]
			if len(ts.closed) != 12 || len(ts.open) != int(until-open) {
				t.Fatalf("%d closed blocks, %d open samples", len(ts.closed), len(ts.open))
			}
			openBytes := cap(ts.open)*sampleBytes + tenantSeriesBytes
			got := m.SeriesBytes("t")
			if closed := got - openBytes; closed > 12*c.bound {
				t.Fatalf("12 closed months hold %d bytes, bound %d (%d per month)", closed, 12*c.bound, c.bound)
			}
			// The open month is 16 bytes a sample, plus append's slack
			// (under half: a large slice grows by about a quarter).
			if openBytes > tenantSeriesBytes+sampleBytes*len(ts.open)*3/2 {
				t.Fatalf("open month: %d bytes for %d samples", openBytes, len(ts.open))
			}
			perMonth := (got - openBytes) / 12
			fullMonths := sampleBytes * int(open-from) // the same samples at full resolution, without slack
			t.Logf("%s: 12 closed months %d B (%d B a month, %.2f B a minute); the same at full resolution %d B (%.1fx); open month %d B for %d samples",
				c.name, got-openBytes, perMonth, float64(got-openBytes)/float64(open-from), fullMonths, float64(fullMonths)/float64(got-openBytes), openBytes, len(ts.open))
			if n := len(m.SeriesSamples("t", from, open, false)); n != int(open-from) {
				t.Fatalf("closed months read back %d samples, want %d", n, open-from)
			}
		})
	}
}

// TestSeriesRewriteOfCompactedMinute: a series entry stamping again the
// minute of a tenant's latest sample overwrites its count, as it did at full
// resolution, also once that sample has been compacted (its block comes back
// to full resolution); later minutes append and the next month compacts it
// again.
func TestSeriesRewriteOfCompactedMinute(t *testing.T) {
	r := newReplica(t)
	x := minuteOf(2026, 11, 30, 23, 59)
	r.apply(EntrySeries, EncodeSeries(x-1, []TenantActive{{"t", 4}}))
	r.apply(EntrySeries, EncodeSeries(x, []TenantActive{{"t", 5}}))
	r.apply(EntryTick, EncodeTick((x+1)*60_000, 0)) // December on the group's clock
	if ts := r.m.series["t"]; len(ts.closed) != 1 || len(ts.open) != 0 {
		t.Fatalf("after the month turned: %d blocks, %d open samples", len(ts.closed), len(ts.open))
	}
	r.apply(EntrySeries, EncodeSeries(x, []TenantActive{{"t", 7}}))
	if v, ok := r.m.LastSample("t"); !ok || v != 7 {
		t.Fatalf("LastSample = %d %v, want 7", v, ok)
	}
	want := []Sample{{x - 1, 4}, {x, 7}}
	if got := r.m.SeriesSamples("t", x-1, x+1, false); !reflect.DeepEqual(got, want) {
		t.Fatalf("samples %v, want %v", got, want)
	}
	r.apply(EntrySeries, EncodeSeries(x+2, []TenantActive{{"t", 9}}))
	r.apply(EntrySeries, EncodeSeries(x-5, []TenantActive{{"t", 1}})) // older than the latest: ignored
	model := flatSeries{"t": {{x - 1, 4}, {x, 7}, {x + 2, 9}}}
	if got, wantB := r.m.encodeLocked(), flatSection(model, (x+1)*60_000); !bytes.Equal(got, wantB) {
		t.Fatal("section differs from the full-resolution one")
	}
	r.apply(EntryTick, EncodeTick(minuteOf(2027, 1, 1, 0, 0)*60_000, 0))
	if ts := r.m.series["t"]; len(ts.closed) != 2 || len(ts.open) != 0 {
		t.Fatalf("after January: %d blocks, %d open samples", len(ts.closed), len(ts.open))
	}
	r.restoreFrom(r.snapshot())
	want = append(want, Sample{x + 2, 9})
	if got := r.m.SeriesSamples("t", 0, 0, false); !reflect.DeepEqual(got, want) {
		t.Fatalf("after restore: %v, want %v", got, want)
	}
}

// monthOfChurn fills m with n tenants sampled every minute of October 2026,
// counts moving by less than 4,096 a minute.
func monthOfChurn(m *Module, n int) {
	rng := rand.New(rand.NewPCG(1, 2))
	from, to := minuteOf(2026, 10, 1, 0, 0), minuteOf(2026, 11, 1, 0, 0)
	for i := range n {
		ts := &tenantSeries{open: make([]sample, 0, to-from)}
		v := int64(1_000_000)
		for minute := from; minute < to; minute++ {
			v = max(0, v+rng.Int64N(8_191)-4_095)
			ts.open = append(ts.open, sample{minute, v})
		}
		m.series[fmt.Sprint("tenant-", i)] = ts
	}
	m.openMonth = monthStart(from)
}

// BenchmarkMonthCompaction: the pass that runs on the apply goroutine when
// the month turns, over 100 tenants with a sample every minute of the month
// (4.46M samples). Setup is outside the timer.
func BenchmarkMonthCompaction(b *testing.B) {
	const tenants = 100
	for b.Loop() {
		b.StopTimer()
		m := New(0)
		monthOfChurn(m, tenants)
		b.StartTimer()
		m.advanceMonth(minuteOf(2026, 11, 1, 0, 0))
		for len(m.compactQ) > 0 {
			m.compactSome()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tenants, "ns/tenant-month")
}

// BenchmarkSeriesSamplesMonth: one tenant's month of samples read back
// (what a bill of that month reads per group), from full resolution (the
// open month) and from a compacted block (a closed month).
func BenchmarkSeriesSamplesMonth(b *testing.B) {
	from, to := minuteOf(2026, 10, 1, 0, 0), minuteOf(2026, 11, 1, 0, 0)
	for _, closed := range []bool{false, true} {
		name := "full"
		if closed {
			name = "compacted"
		}
		b.Run(name, func(b *testing.B) {
			m := New(0)
			monthOfChurn(m, 1)
			if closed {
				m.advanceMonth(to)
				m.compactSome()
				if len(m.series["tenant-0"].closed) != 1 {
					b.Fatal("not compacted")
				}
			}
			for b.Loop() {
				if n := len(m.SeriesSamples("tenant-0", from, to, true)); n != int(to-from) {
					b.Fatalf("%d samples", n)
				}
			}
		})
	}
}
