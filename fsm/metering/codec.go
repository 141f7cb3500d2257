package metering

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
)

// Bounds enforced by the serving side and again on decode.
const (
	MaxIDLen    = 256 // bytes of an event id, a target field, a measure name, a tenant
	MaxMeasures = 32  // measures of one event
	MaxBatch    = 1 << 16
	maxReason   = 1024 // bytes of a dead letter's reason
)

// ErrBadPayload is wrapped by every decode failure.
var ErrBadPayload = errors.New("bad metering payload")

// Target is what correlates start and stop events (seed §3).
type Target struct {
	Org, Space, Consumer, Resource, Plan, Instance string
}

// Fields returns the six ids in wire order.
func (t Target) Fields() [6]string {
	return [6]string{t.Org, t.Space, t.Consumer, t.Resource, t.Plan, t.Instance}
}

// key is the map key of a target: the fields with separators.
func (t Target) key() string {
	f := t.Fields()
	n := 0
	for _, s := range f {
		n += len(s) + 1
	}
	b := make([]byte, 0, n)
	for _, s := range f {
		b = append(b, s...)
		b = append(b, 0x1f)
	}
	return string(b)
}

// TargetHash is the hash that places a target in a partition (see the package
// documentation): FNV-1a 64 over each field followed by 0x1f.
func TargetHash(t Target) uint64 {
	h := fnv.New64a()
	for _, s := range t.Fields() {
		h.Write([]byte(s))
		h.Write([]byte{0x1f})
	}
	return h.Sum64()
}

// Measure is one measured quantity.
type Measure struct {
	Name     string
	Quantity float64
}

// Kind of an event.
type Kind byte

// Event kinds.
const (
	Start Kind = 1
	Stop  Kind = 2
)

// Event is a start or stop as the receiver got it.
type Event struct {
	Kind      Kind
	ID        string // dedup id; "" = none
	Target    Target
	Timestamp int64 // ms
	Measures  []Measure
}

type enc struct{ b []byte }

func (e *enc) u(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) i(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) byte(v byte) { e.b = append(e.b, v) }
func (e *enc) str(s string) {
	e.u(uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *enc) f64(v float64) { e.b = binary.LittleEndian.AppendUint64(e.b, math.Float64bits(v)) }
func (e *enc) target(t Target) {
	for _, s := range t.Fields() {
		e.str(s)
	}
}
func (e *enc) measures(ms []Measure) {
	e.u(uint64(len(ms)))
	for _, m := range ms {
		e.str(m.Name)
		e.f64(m.Quantity)
	}
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadPayload}, args...)...)
	}
}

func (d *dec) u(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) i(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("truncated %s", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) count(what string, max uint64) int {
	n := d.u(what)
	if n > max {
		d.fail("%s %d exceeds %d", what, n, max)
		return 0
	}
	// Every item takes at least one byte: a count beyond the bytes left is corrupt.
	if n > uint64(len(d.b)) {
		d.fail("%s %d exceeds the %d bytes left", what, n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *dec) strMax(what string, max int) string {
	n := d.u(what + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail("%s length %d (max %d, %d bytes left)", what, n, max, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *dec) str(what string) string { return d.strMax(what, MaxIDLen) }

func (d *dec) f64(what string) float64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated %s", what)
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

func (d *dec) u64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated %s", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) target() Target {
	return Target{d.str("organization_id"), d.str("space_id"), d.str("consumer_id"), d.str("resource_id"), d.str("plan_id"), d.str("resource_instance_id")}
}

func (d *dec) measures(max int) []Measure {
	n := d.count("measure count", uint64(max))
	if n == 0 {
		return nil
	}
	ms := make([]Measure, 0, n)
	for range n {
		if d.err != nil {
			return nil
		}
		ms = append(ms, Measure{d.str("measure name"), d.f64("quantity")})
	}
	return ms
}

func (d *dec) end() {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
}

// EncodeEvents encodes an events payload (type 12).
func EncodeEvents(nowMs, slackMs int64, evs []Event) []byte {
	e := enc{}
	e.i(nowMs)
	e.u(uint64(slackMs))
	e.u(uint64(len(evs)))
	for i := range evs {
		ev := &evs[i]
		e.byte(byte(ev.Kind))
		e.str(ev.ID)
		e.target(ev.Target)
		e.i(ev.Timestamp)
		if ev.Kind == Start {
			e.measures(ev.Measures)
		}
	}
	return e.b
}

// DecodeEvents decodes an events payload.
func DecodeEvents(b []byte) (nowMs, slackMs int64, evs []Event, err error) {
	d := dec{b: b}
	nowMs = d.i("now")
	slackMs = int64(d.u("slack"))
	n := d.count("event count", MaxBatch)
	evs = make([]Event, 0, n)
	for range n {
		if d.err != nil {
			break
		}
		ev := Event{Kind: Kind(d.byte("kind"))}
		if d.err == nil && ev.Kind != Start && ev.Kind != Stop {
			d.fail("event kind %d", ev.Kind)
		}
		ev.ID = d.str("event id")
		ev.Target = d.target()
		ev.Timestamp = d.i("timestamp")
		if ev.Kind == Start {
			ev.Measures = d.measures(MaxMeasures)
		}
		evs = append(evs, ev)
	}
	if slackMs < 0 {
		d.fail("slack %d", slackMs)
	}
	d.end()
	return nowMs, slackMs, evs, d.err
}

// PlanItem plans one interval of a span at the version the planner saw.
type PlanItem struct {
	Span, Version uint64
	Start, End    int64
	Backward      bool
}

// EncodePlan encodes a plan payload (type 13).
func EncodePlan(nowMs int64, items []PlanItem) []byte {
	e := enc{}
	e.i(nowMs)
	e.u(uint64(len(items)))
	for _, it := range items {
		e.u(it.Span)
		e.u(it.Version)
		e.i(it.Start)
		e.i(it.End)
		if it.Backward {
			e.byte(1)
		} else {
			e.byte(0)
		}
	}
	return e.b
}

// DecodePlan decodes a plan payload.
func DecodePlan(b []byte) (nowMs int64, items []PlanItem, err error) {
	d := dec{b: b}
	nowMs = d.i("now")
	n := d.count("plan count", MaxBatch)
	items = make([]PlanItem, 0, n)
	for range n {
		if d.err != nil {
			break
		}
		it := PlanItem{Span: d.u("span id"), Version: d.u("version"), Start: d.i("start"), End: d.i("end")}
		switch d.byte("direction") {
		case 0:
		case 1:
			it.Backward = true
		default:
			d.fail("direction byte")
		}
		items = append(items, it)
	}
	d.end()
	return nowMs, items, d.err
}

// ExecItem records one planned interval as executed. DeadCode ≠ 0 means the
// HTTP sink refused it for good (a 4xx other than 429): the record is kept as
// a dead letter with Reason.
type ExecItem struct {
	Span, Version uint64
	DeadCode      int
	Reason        string
}

// EncodeExecute encodes an execute payload (type 14).
func EncodeExecute(nowMs int64, items []ExecItem) []byte {
	e := enc{}
	e.i(nowMs)
	e.u(uint64(len(items)))
	for _, it := range items {
		e.u(it.Span)
		e.u(it.Version)
		if it.DeadCode == 0 {
			e.byte(0)
			continue
		}
		e.byte(1)
		e.u(uint64(it.DeadCode))
		r := it.Reason
		if len(r) > maxReason {
			r = r[:maxReason]
		}
		e.str(r)
	}
	return e.b
}

// DecodeExecute decodes an execute payload.
func DecodeExecute(b []byte) (nowMs int64, items []ExecItem, err error) {
	d := dec{b: b}
	nowMs = d.i("now")
	n := d.count("execute count", MaxBatch)
	items = make([]ExecItem, 0, n)
	for range n {
		if d.err != nil {
			break
		}
		it := ExecItem{Span: d.u("span id"), Version: d.u("version")}
		switch d.byte("outcome") {
		case 0:
		case 1:
			c := d.u("dead letter code")
			if d.err == nil && (c < 100 || c > 599) {
				d.fail("dead letter code %d", c)
			}
			it.DeadCode = int(c)
			it.Reason = d.strMax("reason", maxReason)
		default:
			d.fail("outcome byte")
		}
		items = append(items, it)
	}
	d.end()
	return nowMs, items, d.err
}

// EncodeTick encodes a tick payload (type 15).
func EncodeTick(nowMs, ledgerCutoffMs int64) []byte {
	e := enc{}
	e.i(nowMs)
	e.i(ledgerCutoffMs)
	return e.b
}

// DecodeTick decodes a tick payload.
func DecodeTick(b []byte) (nowMs, cutoff int64, err error) {
	d := dec{b: b}
	nowMs = d.i("now")
	cutoff = d.i("cutoff")
	d.end()
	return nowMs, cutoff, d.err
}

// TenantActive is one tenant's active series in a group at a minute.
type TenantActive struct {
	Tenant string
	Active int64
}

// EncodeSeries encodes a series payload (type 16).
func EncodeSeries(minute int64, rows []TenantActive) []byte {
	e := enc{}
	e.i(minute)
	e.u(uint64(len(rows)))
	for _, r := range rows {
		e.str(r.Tenant)
		e.u(uint64(r.Active))
	}
	return e.b
}

// DecodeSeries decodes a series payload.
func DecodeSeries(b []byte) (minute int64, rows []TenantActive, err error) {
	d := dec{b: b}
	minute = d.i("minute")
	n := d.count("tenant count", MaxBatch)
	rows = make([]TenantActive, 0, n)
	for range n {
		if d.err != nil {
			break
		}
		rows = append(rows, TenantActive{d.str("tenant"), int64(d.u("active") & math.MaxInt64)})
	}
	d.end()
	return minute, rows, d.err
}
