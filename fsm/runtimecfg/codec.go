package runtimecfg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// The byte formats are documented in format.md. Every decoder refuses
// non-canonical input (unsorted or duplicate names, non-minimal varints,
// unknown flag bits, negative zero, trailing bytes) so a document has exactly
// one encoding, and runs Validate, so a decoded document is always valid.

// ErrCorrupt is wrapped by every decode failure.
var ErrCorrupt = errors.New("runtimecfg: corrupt encoding")

const (
	bitMaxSeries = 1 << iota
	bitMaxSeriesPerPartition
	bitIngestionRate
	bitIngestionBurst
	scopeBits = bitMaxSeries | bitMaxSeriesPerPartition | bitIngestionRate | bitIngestionBurst
)

// AppendBody appends the canonical encoding of d's settings (not its version).
func AppendBody(dst []byte, d *Document) []byte {
	dst = appendScope(dst, &d.Defaults)
	dst = binary.AppendUvarint(dst, uint64(len(d.Tenants)))
	for _, n := range d.TenantNames() {
		s := d.Tenants[n]
		dst = appendString(dst, n)
		dst = appendScope(dst, &s)
	}
	dst = appendRates(dst, d.Global.SampleRates)
	if bc := d.Global.BacklogController; bc != nil {
		dst = append(dst, 1)
		dst = appendString(dst, bc.Kind)
		dst = appendFloat(dst, bc.Target)
		dst = binary.AppendUvarint(dst, uint64(bc.Period/time.Millisecond))
		dst = appendFloat(dst, bc.Kp)
		dst = appendFloat(dst, bc.Ki)
		dst = appendFloat(dst, bc.MinPercent)
	} else {
		dst = append(dst, 0)
	}
	return dst
}

// AppendDocument appends the version then the body: the module's snapshot
// section.
func AppendDocument(dst []byte, d *Document) []byte {
	return AppendBody(binary.AppendUvarint(dst, d.Version), d)
}

// DecodeDocument decodes what AppendDocument wrote.
func DecodeDocument(b []byte) (*Document, error) {
	r := reader{b: b}
	v := r.uvarint("version")
	d := r.body()
	return r.finish(d, v)
}

func appendScope(dst []byte, s *Scope) []byte {
	var mask byte
	if s.MaxSeries != nil {
		mask |= bitMaxSeries
	}
	if s.MaxSeriesPerPartition != nil {
		mask |= bitMaxSeriesPerPartition
	}
	if s.IngestionRate != nil {
		mask |= bitIngestionRate
	}
	if s.IngestionBurst != nil {
		mask |= bitIngestionBurst
	}
	dst = append(dst, mask)
	if s.MaxSeries != nil {
		dst = binary.AppendUvarint(dst, uint64(*s.MaxSeries))
	}
	if s.MaxSeriesPerPartition != nil {
		dst = binary.AppendUvarint(dst, uint64(*s.MaxSeriesPerPartition))
	}
	if s.IngestionRate != nil {
		dst = appendFloat(dst, *s.IngestionRate)
	}
	if s.IngestionBurst != nil {
		dst = binary.AppendUvarint(dst, uint64(*s.IngestionBurst))
	}
	return appendRates(dst, s.SampleRates)
}

func appendRates(dst []byte, m map[string]float64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		dst = appendString(dst, k)
		dst = appendFloat(dst, m[k])
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func appendFloat(dst []byte, v float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(v+0))
}

// reader decodes with sticky errors: after the first failure every read
// returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong %s", what)
		return 0
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		r.fail("non-minimal encoding of %s", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// int63 reads a uvarint that must fit a non-negative int64.
func (r *reader) int63(what string) int64 {
	v := r.uvarint(what)
	if v > math.MaxInt64 {
		r.fail("%s %d out of range", what, v)
		return 0
	}
	return int64(v)
}

func (r *reader) byte1(what string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated %s", what)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) str(what string, max int) string {
	n := r.uvarint(what + " length")
	if r.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(r.b)) {
		r.fail("%s of %d bytes (max %d, %d left)", what, n, max, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) float(what string) float64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("truncated %s", what)
		return 0
	}
	bits := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	v := math.Float64frombits(bits)
	if bits == 1<<63 {
		r.fail("%s is negative zero", what)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.fail("%s is not finite", what)
	}
	return v
}

func (r *reader) rates(what string) map[string]float64 {
	n := r.uvarint(what + " count")
	if n > MaxKinds {
		r.fail("%d %s, at most %d", n, what, MaxKinds)
		return nil
	}
	if n == 0 {
		return nil
	}
	m := make(map[string]float64, n)
	prev := ""
	for i := uint64(0); i < n && r.err == nil; i++ {
		k := r.str(what+" kind", MaxKindLength)
		if i > 0 && k <= prev {
			r.fail("%s kinds not strictly ascending (%q after %q)", what, k, prev)
		}
		prev = k
		m[k] = r.float(what + " percent")
	}
	return m
}

func (r *reader) scope(what string) Scope {
	var s Scope
	mask := r.byte1(what + " mask")
	if mask&^scopeBits != 0 {
		r.fail("%s mask %#x has unknown bits", what, mask)
	}
	if mask&bitMaxSeries != 0 {
		s.MaxSeries = ptr(r.int63(what + " max_series"))
	}
	if mask&bitMaxSeriesPerPartition != 0 {
		s.MaxSeriesPerPartition = ptr(r.int63(what + " max_series_per_partition"))
	}
	if mask&bitIngestionRate != 0 {
		s.IngestionRate = ptr(r.float(what + " ingestion_rate"))
	}
	if mask&bitIngestionBurst != 0 {
		s.IngestionBurst = ptr(r.int63(what + " ingestion_burst"))
	}
	s.SampleRates = r.rates(what + " sample rates")
	return s
}

func (r *reader) body() *Document {
	d := &Document{}
	d.Defaults = r.scope("defaults")
	n := r.uvarint("tenant count")
	if n > MaxTenants {
		r.fail("%d tenants, at most %d", n, MaxTenants)
		return d
	}
	if n > 0 && r.err == nil {
		d.Tenants = make(map[string]Scope, min(n, 1024))
	}
	prev := ""
	for i := uint64(0); i < n && r.err == nil; i++ {
		name := r.str("tenant id", 1<<10)
		if i > 0 && name <= prev {
			r.fail("tenant ids not strictly ascending (%q after %q)", name, prev)
		}
		prev = name
		s := r.scope("tenant")
		if r.err == nil && s.empty() {
			r.fail("tenant %q has an empty scope", name)
		}
		d.Tenants[name] = s
	}
	d.Global.SampleRates = r.rates("global sample rates")
	switch r.byte1("controller flag") {
	case 0:
	case 1:
		bc := &BacklogController{}
		bc.Kind = r.str("controller kind", MaxKindLength)
		bc.Target = r.float("controller target")
		ms := r.uvarint("controller period")
		if ms > uint64(MaxPeriod/time.Millisecond) {
			r.fail("controller period %dms out of range", ms)
		}
		bc.Period = time.Duration(ms) * time.Millisecond
		bc.Kp = r.float("controller kp")
		bc.Ki = r.float("controller ki")
		bc.MinPercent = r.float("controller min_percent")
		d.Global.BacklogController = bc
	default:
		r.fail("controller flag is not 0 or 1")
	}
	return d
}

// finish checks that everything was consumed and that the document is valid.
func (r *reader) finish(d *Document, version uint64) (*Document, error) {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	d.Version = version
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return d, nil
}
