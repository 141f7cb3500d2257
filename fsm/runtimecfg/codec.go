package runtimecfg

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/limits"
)

// The byte formats are documented in format.md; their fields are fsm/wire's.
// Every decoder refuses non-canonical input (unsorted or duplicate names,
// non-minimal varints, unknown flag bits, negative zero, trailing bytes) so a
// document has exactly one encoding, and runs Validate, so a decoded document
// is always valid.

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
	w := wire.Encoder{Buf: dst}
	appendBody(&w, d)
	return w.Buf
}

func appendBody(w *wire.Encoder, d *Document) {
	appendScope(w, &d.Defaults)
	w.Uvarint(uint64(len(d.Tenants)))
	for _, n := range d.TenantNames() {
		s := d.Tenants[n]
		w.String(n)
		appendScope(w, &s)
	}
	appendRates(w, d.Global.SampleRates)
	bc := d.Global.BacklogController
	w.Bool(bc != nil)
	if bc != nil {
		w.String(bc.Kind)
		appendFloat(w, bc.Target)
		w.Uvarint(uint64(bc.Period / time.Millisecond))
		appendFloat(w, bc.Kp)
		appendFloat(w, bc.Ki)
		appendFloat(w, bc.MinPercent)
	}
	// The Envoy section is written only when there is one, so a document
	// without it keeps its earlier encoding byte for byte; it is what the
	// *-envoy entry types carry (cluster version 4).
	if len(d.Envoy) > 0 {
		w.Uvarint(uint64(len(d.Envoy)))
		for _, dom := range d.EnvoyDomains() {
			w.String(dom)
			w.Bytes(envoyrl.Render(d.Envoy[dom], ""))
		}
	}
}

// AppendDocument appends the version then the body: the module's snapshot
// section.
func AppendDocument(dst []byte, d *Document) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(d.Version)
	appendBody(&w, d)
	return w.Buf
}

// DecodeDocument decodes what AppendDocument wrote.
func DecodeDocument(b []byte) (*Document, error) {
	r := wire.NewDecoder(b, ErrCorrupt)
	v := r.Uvarint("version")
	d := readBody(&r)
	return finish(&r, d, v)
}

func appendScope(w *wire.Encoder, s *Scope) {
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
	w.Byte(mask)
	if s.MaxSeries != nil {
		w.Uvarint(uint64(*s.MaxSeries))
	}
	if s.MaxSeriesPerPartition != nil {
		w.Uvarint(uint64(*s.MaxSeriesPerPartition))
	}
	if s.IngestionRate != nil {
		appendFloat(w, *s.IngestionRate)
	}
	if s.IngestionBurst != nil {
		w.Uvarint(uint64(*s.IngestionBurst))
	}
	appendRates(w, s.SampleRates)
}

func appendRates(w *wire.Encoder, m map[string]float64) {
	w.Uvarint(uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		w.String(k)
		appendFloat(w, m[k])
	}
}

// appendFloat writes v+0, which is +0 for -0: zero has one byte form.
func appendFloat(w *wire.Encoder, v float64) { w.Float64(v + 0) }

// readInt63 reads a uvarint that must fit a non-negative int64.
func readInt63(r *wire.Decoder, what string) int64 {
	v := r.Uvarint(what)
	if v > math.MaxInt64 {
		r.Failf("%s %d out of range", what, v)
		return 0
	}
	return int64(v)
}

// readFloat reads a float that must be finite and not negative zero.
func readFloat(r *wire.Decoder, what string) float64 {
	v := r.Float64(what)
	if r.Err() != nil {
		return 0
	}
	if math.Float64bits(v) == 1<<63 {
		r.Failf("%s is negative zero", what)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.Failf("%s is not finite", what)
	}
	return v
}

func readRates(r *wire.Decoder, what string) map[string]float64 {
	n := r.Count(what+" count", MaxKinds)
	if n == 0 {
		return nil
	}
	m := make(map[string]float64, n)
	prev := ""
	for i := 0; i < n && r.Err() == nil; i++ {
		k := r.String(what+" kind", MaxKindLength)
		if i > 0 && k <= prev {
			r.Failf("%s kinds not strictly ascending (%q after %q)", what, k, prev)
		}
		prev = k
		m[k] = readFloat(r, what+" percent")
	}
	return m
}

func readScope(r *wire.Decoder, what string) Scope {
	var s Scope
	mask := r.Byte(what + " mask")
	if mask&^scopeBits != 0 {
		r.Failf("%s mask %#x has unknown bits", what, mask)
	}
	if mask&bitMaxSeries != 0 {
		s.MaxSeries = ptr(readInt63(r, what+" "+limits.KeyMaxSeries))
	}
	if mask&bitMaxSeriesPerPartition != 0 {
		s.MaxSeriesPerPartition = ptr(readInt63(r, what+" "+limits.KeyMaxSeriesPerPartition))
	}
	if mask&bitIngestionRate != 0 {
		s.IngestionRate = ptr(readFloat(r, what+" "+limits.KeyIngestionRate))
	}
	if mask&bitIngestionBurst != 0 {
		s.IngestionBurst = ptr(readInt63(r, what+" "+limits.KeyIngestionBurst))
	}
	s.SampleRates = readRates(r, what+" sample rates")
	return s
}

func readBody(r *wire.Decoder) *Document {
	d := &Document{}
	d.Defaults = readScope(r, "defaults")
	n := r.Count("tenant count", MaxTenants)
	if n > 0 {
		d.Tenants = make(map[string]Scope, min(n, 1024))
	}
	prev := ""
	for i := 0; i < n && r.Err() == nil; i++ {
		name := r.String("tenant id", 1<<10)
		if i > 0 && name <= prev {
			r.Failf("tenant ids not strictly ascending (%q after %q)", name, prev)
		}
		prev = name
		s := readScope(r, "tenant")
		if r.Err() == nil && s.empty() {
			r.Failf("tenant %q has an empty scope", name)
		}
		d.Tenants[name] = s
	}
	d.Global.SampleRates = readRates(r, "global sample rates")
	if r.Bool("controller flag") {
		bc := &BacklogController{}
		bc.Kind = r.String("controller kind", MaxKindLength)
		bc.Target = readFloat(r, "controller target")
		ms := r.Uvarint("controller period")
		if ms > uint64(MaxPeriod/time.Millisecond) {
			r.Failf("controller period %dms out of range", ms)
		}
		bc.Period = time.Duration(ms) * time.Millisecond
		bc.Kp = readFloat(r, "controller kp")
		bc.Ki = readFloat(r, "controller ki")
		bc.MinPercent = readFloat(r, "controller min_percent")
		d.Global.BacklogController = bc
	}
	if r.Err() == nil && r.Len() > 0 {
		readEnvoy(r, d)
	}
	return d
}

// readEnvoy reads the optional Envoy section: a count ≥ 1, then per domain
// (strictly ascending) its name and canonical configuration text.
func readEnvoy(r *wire.Decoder, d *Document) {
	n := r.Count("envoy domain count", MaxEnvoyDomains)
	if r.Err() == nil && n == 0 {
		r.Failf("envoy section with no domain")
	}
	prev := ""
	for i := 0; i < n && r.Err() == nil; i++ {
		dom := r.String("envoy domain", envoyrl.MaxString)
		text := r.Bytes("envoy configuration", MaxEnvoyBytes)
		if r.Err() != nil {
			return
		}
		if i > 0 && dom <= prev {
			r.Failf("envoy domains not strictly ascending (%q after %q)", dom, prev)
			return
		}
		prev = dom
		c, err := envoyrl.Parse(text)
		if err != nil {
			r.Failf("envoy domain %q: %v", dom, err)
			return
		}
		if c.Domain != dom || string(envoyrl.Render(c, "")) != string(text) {
			r.Failf("envoy domain %q: configuration not in canonical form", dom)
			return
		}
		if d.Envoy == nil {
			d.Envoy = map[string]*envoyrl.Config{}
		}
		d.Envoy[dom] = c
	}
}

// finish checks that everything was consumed and that the document is valid.
func finish(r *wire.Decoder, d *Document, version uint64) (*Document, error) {
	if err := r.Finish(); err != nil {
		return nil, err
	}
	d.Version = version
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return d, nil
}
