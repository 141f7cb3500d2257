package metering

import (
	"errors"
	"math"

	"github.com/tollgate-io/tollgate/fsm/wire"
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

// Target is what correlates start and stop events.
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
// It is computed inline (no hash.Hash, no byte-slice conversions): every
// event hashes its target on the routing node and on each replica's apply.
func TargetHash(t Target) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range t.Fields() {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h = (h ^ 0x1f) * prime
	}
	return h
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

// The payloads and the section are built from fsm/wire fields; these are the
// composite fields they share.

func appendTarget(e *wire.Encoder, t Target) {
	for _, s := range t.Fields() {
		e.String(s)
	}
}

func appendMeasures(e *wire.Encoder, ms []Measure) {
	e.Uvarint(uint64(len(ms)))
	for _, m := range ms {
		e.String(m.Name)
		e.Float64(m.Quantity)
	}
}

func readTarget(d *wire.Decoder) Target {
	return Target{d.String("organization_id", MaxIDLen), d.String("space_id", MaxIDLen), d.String("consumer_id", MaxIDLen),
		d.String("resource_id", MaxIDLen), d.String("plan_id", MaxIDLen), d.String("resource_instance_id", MaxIDLen)}
}

func readMeasures(d *wire.Decoder, max int) []Measure {
	n := d.Count("measure count", max)
	if n == 0 {
		return nil
	}
	ms := make([]Measure, 0, n)
	for range n {
		if d.Err() != nil {
			return nil
		}
		ms = append(ms, Measure{d.String("measure name", MaxIDLen), d.Float64("quantity")})
	}
	return ms
}

// appendItems writes a batch: the count, then each item.
func appendItems[T any](e *wire.Encoder, items []T, item func(*wire.Encoder, *T)) {
	e.Uvarint(uint64(len(items)))
	for i := range items {
		item(e, &items[i])
	}
}

// readItems reads what appendItems wrote, at most MaxBatch items.
func readItems[T any](d *wire.Decoder, what string, item func(*wire.Decoder) T) []T {
	n := d.Count(what, MaxBatch)
	items := make([]T, 0, n)
	for range n {
		if d.Err() != nil {
			break
		}
		items = append(items, item(d))
	}
	return items
}

// EncodeEvents encodes an events payload (type 12).
func EncodeEvents(nowMs, slackMs int64, evs []Event) []byte {
	e := wire.Encoder{}
	e.Varint(nowMs)
	e.Uvarint(uint64(slackMs))
	appendItems(&e, evs, func(e *wire.Encoder, ev *Event) {
		e.Byte(byte(ev.Kind))
		e.String(ev.ID)
		appendTarget(e, ev.Target)
		e.Varint(ev.Timestamp)
		if ev.Kind == Start {
			appendMeasures(e, ev.Measures)
		}
	})
	return e.Buf
}

// DecodeEvents decodes an events payload.
func DecodeEvents(b []byte) (nowMs, slackMs int64, evs []Event, err error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	nowMs = d.Varint("now")
	slackMs = int64(d.Uvarint("slack"))
	evs = readItems(&d, "event count", func(d *wire.Decoder) Event {
		ev := Event{Kind: Kind(d.Byte("kind"))}
		if d.Err() == nil && ev.Kind != Start && ev.Kind != Stop {
			d.Failf("event kind %d", ev.Kind)
		}
		ev.ID = d.String("event id", MaxIDLen)
		ev.Target = readTarget(d)
		ev.Timestamp = d.Varint("timestamp")
		if ev.Kind == Start {
			ev.Measures = readMeasures(d, MaxMeasures)
		}
		return ev
	})
	if slackMs < 0 {
		d.Failf("slack %d", slackMs)
	}
	return nowMs, slackMs, evs, d.Finish()
}

// PlanItem plans one interval of a span at the version the planner saw.
type PlanItem struct {
	Span, Version uint64
	Start, End    int64
	Backward      bool
}

// EncodePlan encodes a plan payload (type 13).
func EncodePlan(nowMs int64, items []PlanItem) []byte {
	e := wire.Encoder{}
	e.Varint(nowMs)
	appendItems(&e, items, func(e *wire.Encoder, it *PlanItem) {
		e.Uvarint(it.Span)
		e.Uvarint(it.Version)
		e.Varint(it.Start)
		e.Varint(it.End)
		e.Bool(it.Backward)
	})
	return e.Buf
}

// DecodePlan decodes a plan payload.
func DecodePlan(b []byte) (nowMs int64, items []PlanItem, err error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	nowMs = d.Varint("now")
	items = readItems(&d, "plan count", func(d *wire.Decoder) PlanItem {
		return PlanItem{Span: d.Uvarint("span id"), Version: d.Uvarint("version"), Start: d.Varint("start"), End: d.Varint("end"),
			Backward: d.Bool("direction")}
	})
	return nowMs, items, d.Finish()
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
	e := wire.Encoder{}
	e.Varint(nowMs)
	appendItems(&e, items, func(e *wire.Encoder, it *ExecItem) {
		e.Uvarint(it.Span)
		e.Uvarint(it.Version)
		if it.DeadCode == 0 {
			e.Byte(0)
			return
		}
		e.Byte(1)
		e.Uvarint(uint64(it.DeadCode))
		r := it.Reason
		if len(r) > maxReason {
			r = r[:maxReason]
		}
		e.String(r)
	})
	return e.Buf
}

// DecodeExecute decodes an execute payload.
func DecodeExecute(b []byte) (nowMs int64, items []ExecItem, err error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	nowMs = d.Varint("now")
	items = readItems(&d, "execute count", func(d *wire.Decoder) ExecItem {
		it := ExecItem{Span: d.Uvarint("span id"), Version: d.Uvarint("version")}
		switch d.Byte("outcome") {
		case 0:
		case 1:
			c := d.Uvarint("dead letter code")
			if d.Err() == nil && (c < 100 || c > 599) {
				d.Failf("dead letter code %d", c)
			}
			it.DeadCode = int(c)
			it.Reason = d.String("reason", maxReason)
		default:
			d.Failf("outcome is not 0 or 1")
		}
		return it
	})
	return nowMs, items, d.Finish()
}

// EncodeTick encodes a tick payload (type 15).
func EncodeTick(nowMs, ledgerCutoffMs int64) []byte {
	e := wire.Encoder{}
	e.Varint(nowMs)
	e.Varint(ledgerCutoffMs)
	return e.Buf
}

// DecodeTick decodes a tick payload.
func DecodeTick(b []byte) (nowMs, cutoff int64, err error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	nowMs = d.Varint("now")
	cutoff = d.Varint("cutoff")
	return nowMs, cutoff, d.Finish()
}

// TenantActive is one tenant's active series in a group at a minute.
type TenantActive struct {
	Tenant string
	Active int64
}

// EncodeSeries encodes a series payload (type 16).
func EncodeSeries(minute int64, rows []TenantActive) []byte {
	e := wire.Encoder{}
	e.Varint(minute)
	appendItems(&e, rows, func(e *wire.Encoder, r *TenantActive) {
		e.String(r.Tenant)
		e.Uvarint(uint64(r.Active))
	})
	return e.Buf
}

// DecodeSeries decodes a series payload.
func DecodeSeries(b []byte) (minute int64, rows []TenantActive, err error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	minute = d.Varint("minute")
	rows = readItems(&d, "tenant count", func(d *wire.Decoder) TenantActive {
		return TenantActive{d.String("tenant", MaxIDLen), int64(d.Uvarint("active") & math.MaxInt64)}
	})
	return minute, rows, d.Finish()
}
