package metering

import (
	"encoding/binary"
	"slices"
	"sort"
	"time"
	"unsafe"
)

// A tenant's active-series samples in one group. Samples of the open billing
// period (the UTC calendar month that bills, service/metering's BillingSummary,
// count as "to date") are kept at full resolution in open, 16 bytes each; the
// samples of closed months are compacted, one block per month, into
// delta-varint bytes (usually 2–4 bytes a sample). The compaction is lossless:
// every query, every bill and the snapshot section give the same answers and
// bytes as the uncompacted samples, so it is a change of memory layout only.
// That is what keeps it safe: the replicated state (entries, snapshot bytes,
// query results) is exactly what builds that hold every sample at full
// resolution have, so replicas of mixed builds cannot diverge and no cluster
// version gates it.
//
// Why not lossy (a period's bill plus a coarse resolution)? The bill is the
// 95th percentile of the tenant's per-minute total summed over groups, and
// each group holds only its own share of those totals: no per-group summary
// of a closed month gives the cross-group percentile exactly. See
// docs/metering.md.
type tenantSeries struct {
	closed []block  // compacted samples, in minute order, all before open's
	open   []sample // full resolution, in minute order
}

// block is a run of compacted samples (one calendar month's, or what was left
// of it). Its samples with a minute before from were dropped by the ledger
// retention after the block was built: they are skipped on reading rather
// than re-encoded at every tick while the retention edge moves through the
// block (the block goes once its last sample is older than the cutoff).
type block struct {
	first int64  // minute of its first sample (dropped or not)
	from  int64  // samples before this minute are dropped
	last  sample // its latest sample (never dropped: the block goes first)
	n     int    // samples encoded
	// data: per sample, the step from the previous one (the first's previous
	// is (first, 0)): minute step dm, count change da. When dm = 1 (a count
	// that changes every minute) and zigzag(da) < 2⁶³: uvarint
	// 2·zigzag(da) — one byte while |da| < 32, two below 4,096. Otherwise
	// uvarint 1, uvarint dm, varint da. Minutes strictly increase, so dm > 0
	// after the first; it is taken modulo 2⁶⁴ so no input minute overflows.
	data []byte
}

// Sizes counted by bytes (unsafe.Sizeof, so they follow the platform).
const (
	sampleBytes       = int(unsafe.Sizeof(sample{}))
	blockBytes        = int(unsafe.Sizeof(block{}))
	tenantSeriesBytes = int(unsafe.Sizeof(tenantSeries{}))
)

func encodeBlock(ss []sample) block {
	buf := make([]byte, 0, 2*len(ss)+16)
	prevM, prevA := ss[0].minute, int64(0)
	for _, s := range ss {
		dm, da := uint64(s.minute)-uint64(prevM), s.active-prevA
		if z := uint64(da<<1) ^ uint64(da>>63); dm == 1 && z < 1<<63 {
			buf = binary.AppendUvarint(buf, z<<1)
		} else {
			buf = binary.AppendUvarint(buf, 1)
			buf = binary.AppendUvarint(buf, dm)
			buf = binary.AppendVarint(buf, da)
		}
		prevM, prevA = s.minute, s.active
	}
	return block{first: ss[0].minute, from: ss[0].minute, last: ss[len(ss)-1], n: len(ss), data: slices.Clip(slices.Clone(buf))}
}

// appendTo appends the block's samples (those not dropped) to out. The data
// was written by encodeBlock in this process, so it decodes; a short read
// would be a bug, and stops rather than inventing samples.
func (b *block) appendTo(out []sample) []sample {
	m, a := b.first, int64(0)
	data := b.data
	for range b.n {
		u, k := binary.Uvarint(data)
		if k <= 0 {
			return out
		}
		data = data[k:]
		var dm uint64
		var da int64
		if u&1 == 0 {
			z := u >> 1
			dm, da = 1, int64(z>>1)^-int64(z&1)
		} else {
			if dm, k = binary.Uvarint(data); k <= 0 {
				return out
			}
			data = data[k:]
			if da, k = binary.Varint(data); k <= 0 {
				return out
			}
			data = data[k:]
		}
		m, a = int64(uint64(m)+dm), a+da
		if m >= b.from {
			out = append(out, sample{m, a})
		}
	}
	return out
}

// monthEnd returns the first minute of the UTC calendar month after the one
// holding minute. Minutes too far from now for time.Time to carry (corrupt or
// hostile entries) are their own month.
func monthEnd(minute int64) int64 {
	const sane = 1 << 40 // ±2 million years
	if minute < -sane || minute > sane {
		return minute + 1
	}
	t := time.Unix(minute*60, 0).UTC()
	return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC).Unix() / 60
}

// monthStart returns the first minute of the UTC calendar month holding
// minute (with monthEnd's bounds).
func monthStart(minute int64) int64 {
	const sane = 1 << 40
	if minute < -sane || minute > sane {
		return minute
	}
	t := time.Unix(minute*60, 0).UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC).Unix() / 60
}

// latest returns the tenant's latest sample.
func (ts *tenantSeries) latest() (sample, bool) {
	if n := len(ts.open); n > 0 {
		return ts.open[n-1], true
	}
	if k := len(ts.closed); k > 0 {
		return ts.closed[k-1].last, true
	}
	return sample{}, false
}

// put records a sample as the uncompacted list did: a later minute is
// appended, the latest minute again overwrites its count, an older minute is
// ignored.
func (ts *tenantSeries) put(s sample) {
	last, ok := ts.latest()
	if ok && last.minute > s.minute {
		return
	}
	if ok && last.minute == s.minute {
		if len(ts.open) == 0 {
			// The latest sample is compacted (a leader stamping a minute
			// of a closed month again): its block goes back to full
			// resolution. Rare, and the next compaction takes it again.
			k := len(ts.closed) - 1
			ts.open = ts.closed[k].appendTo(nil)
			ts.closed = slices.Clip(ts.closed[:k])
		}
		ts.open[len(ts.open)-1].active = s.active
		return
	}
	ts.open = append(ts.open, s)
}

// compact moves the open samples before minute before into blocks, one per
// calendar month, and returns how many it moved.
func (ts *tenantSeries) compact(before int64) int {
	i := sort.Search(len(ts.open), func(i int) bool { return ts.open[i].minute >= before })
	if i == 0 {
		return 0
	}
	for j := 0; j < i; {
		end := monthEnd(ts.open[j].minute)
		e := j + 1
		for e < i && ts.open[e].minute < end {
			e++
		}
		ts.closed = append(ts.closed, encodeBlock(ts.open[j:e]))
		j = e
	}
	ts.closed = slices.Clip(ts.closed)
	if i == len(ts.open) {
		ts.open = nil
	} else {
		ts.open = slices.Clone(ts.open[i:])
	}
	return i
}

// dropBefore drops the samples before minute cut (ledger retention) and
// reports whether none is left.
func (ts *tenantSeries) dropBefore(cut int64) (empty bool) {
	k := 0
	for k < len(ts.closed) && ts.closed[k].last.minute < cut {
		k++
	}
	if k > 0 {
		ts.closed = slices.Clone(ts.closed[k:])
	}
	if len(ts.closed) > 0 && ts.closed[0].from < cut {
		ts.closed[0].from = cut
	}
	i := sort.Search(len(ts.open), func(i int) bool { return ts.open[i].minute >= cut })
	if i == len(ts.open) {
		ts.open = nil
	} else if i > 0 {
		ts.open = append([]sample(nil), ts.open[i:]...)
	}
	return len(ts.closed) == 0 && len(ts.open) == 0
}

// count returns the number of samples held (those a block dropped are not).
func (ts *tenantSeries) count() int {
	n := len(ts.open)
	for i := range ts.closed {
		b := &ts.closed[i]
		if b.from == b.first {
			n += b.n
		} else {
			n += len(b.appendTo(nil))
		}
	}
	return n
}

// all returns every sample held, in minute order (snapshot encoding).
func (ts *tenantSeries) all() []sample {
	if len(ts.closed) == 0 {
		return ts.open
	}
	n := len(ts.open)
	for i := range ts.closed {
		n += ts.closed[i].n
	}
	out := make([]sample, 0, n)
	for i := range ts.closed {
		out = ts.closed[i].appendTo(out)
	}
	return append(out, ts.open...)
}

// window returns the samples with minute in [from, to) (to 0: no bound),
// led, when withPrior is set and none is at from, by the latest sample
// before from — the rule SeriesSamples documents. Only the blocks that can
// hold a sample of the window are decoded: a window in the open month
// decodes none.
func (ts *tenantSeries) window(from, to int64, withPrior bool) []Sample {
	if to != 0 && to <= from {
		return nil
	}
	var pre *sample // the latest compacted sample before from, when the window needs no block
	ss := ts.open
	k := sort.Search(len(ts.closed), func(i int) bool { return ts.closed[i].last.minute >= from })
	if k > 0 {
		pre = &ts.closed[k-1].last
	}
	if k < len(ts.closed) && (to == 0 || ts.closed[k].first < to) {
		// Some block may hold samples of the window: read from block k on.
		n := 1 + len(ts.open)
		for i := k; i < len(ts.closed) && (to == 0 || ts.closed[i].first < to); i++ {
			n += ts.closed[i].n
		}
		buf := make([]sample, 0, n)
		if pre != nil {
			buf = append(buf, *pre)
			pre = nil
		}
		for i := k; i < len(ts.closed) && (to == 0 || ts.closed[i].first < to); i++ {
			buf = ts.closed[i].appendTo(buf)
		}
		ss = append(buf, ts.open...)
	}
	lo := sort.Search(len(ss), func(i int) bool { return ss[i].minute >= from })
	hi := len(ss)
	if to != 0 {
		hi = sort.Search(len(ss), func(i int) bool { return ss[i].minute >= to })
	}
	var prior *sample
	if withPrior && (lo == len(ss) || ss[lo].minute > from) {
		// No sample at from: the one before is the count in force.
		if lo > 0 {
			prior = &ss[lo-1]
		} else {
			prior = pre
		}
	}
	n := hi - lo
	if prior != nil {
		n++
	}
	if n <= 0 {
		return nil
	}
	out := make([]Sample, 0, n)
	if prior != nil {
		out = append(out, Sample{prior.minute, prior.active})
	}
	for _, s := range ss[lo:hi] {
		out = append(out, Sample{s.minute, s.active})
	}
	return out
}

// bytes is the memory the tenant's samples hold: the tenant's struct, the
// open samples' array, the block array and each block's data (capacities,
// not lengths). The map entry and the tenant's name are not counted.
func (ts *tenantSeries) bytes() int {
	n := tenantSeriesBytes + cap(ts.open)*sampleBytes + cap(ts.closed)*blockBytes
	for i := range ts.closed {
		n += cap(ts.closed[i].data)
	}
	return n
}
