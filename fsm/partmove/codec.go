package partmove

import (
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// Give is a partition-give's payload.
type Give struct {
	Nonce     uint64
	Partition int
	To        int
}

// Transfer is what a give takes and a receive installs (byte format in
// doc.go).
type Transfer struct {
	Nonce     uint64
	Partition int
	From, To  int
	Now       int64 // the giver's minute when it gave
	Series    []fsm.PartitionSeries
	// Metering is the partition's metering (fsm/metering's transfer), from
	// a partition-give-metering; nil from a partition-give.
	Metering []byte
}

// Count is the number of series the transfer carries.
func (t Transfer) Count() int64 {
	var n int64
	for _, ps := range t.Series {
		n += int64(len(ps.Hashes))
	}
	return n
}

const (
	maxGroups       = 1 << 16
	maxTenantName   = 1 << 16
	maxTenants      = 1 << 24
	maxSeriesTenant = 1 << 28
	maxMetering     = 1 << 34
)

// AppendGive appends a partition-give payload.
func AppendGive(dst []byte, g Give) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(g.Nonce)
	w.Uvarint(uint64(g.Partition))
	w.Uvarint(uint64(g.To))
	return w.Buf
}

// DecodeGive decodes a partition-give payload of a cluster of p partitions.
func DecodeGive(b []byte, p int) (Give, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	g := Give{Nonce: d.Uvarint("nonce")}
	part := d.Uvarint("partition")
	if d.Err() == nil && part >= uint64(p) {
		d.Failf("partition %d of %d", part, p)
	}
	to := d.Uvarint("receiver group")
	if d.Err() == nil && to >= maxGroups {
		d.Failf("receiver group %d", to)
	}
	g.Partition, g.To = int(part), int(to)
	return g, d.Finish()
}

// AppendComplete appends a partition-complete payload.
func AppendComplete(dst []byte, nonce uint64) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(nonce)
	return w.Buf
}

// DecodeComplete decodes a partition-complete payload.
func DecodeComplete(b []byte) (uint64, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	n := d.Uvarint("nonce")
	return n, d.Finish()
}

// AppendTransfer appends a transfer (a partition-receive payload). The
// tenants must be ordered by name and each one's hashes rising (as
// fsm.FSM.TakePartition returns them).
func AppendTransfer(dst []byte, t Transfer) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(t.Nonce)
	w.Uvarint(uint64(t.Partition))
	w.Uvarint(uint64(t.From))
	w.Uvarint(uint64(t.To))
	w.Uvarint(uint64(t.Now))
	w.Uvarint(uint64(len(t.Series)))
	for _, ps := range t.Series {
		w.String(ps.Tenant)
		w.Uvarint(uint64(len(ps.Hashes)))
		for _, h := range ps.Hashes {
			w.Uint64(h)
		}
		w.Raw(ps.Minutes)
	}
	if t.Metering != nil {
		w.Bytes(t.Metering)
	}
	return w.Buf
}

// DecodeTransfer decodes a transfer of a cluster of p partitions: every hash
// must fall in the transfer's partition, tenants rise by name and hashes
// rise, so every transfer has one byte form.
func DecodeTransfer(b []byte, p int) (Transfer, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	t := Transfer{Nonce: d.Uvarint("nonce")}
	part := d.Uvarint("partition")
	if d.Err() == nil && part >= uint64(p) {
		d.Failf("partition %d of %d", part, p)
	}
	from, to := d.Uvarint("giver group"), d.Uvarint("receiver group")
	if d.Err() == nil && (from >= maxGroups || to >= maxGroups || from == to) {
		d.Failf("giver group %d, receiver group %d", from, to)
	}
	now := d.Uvarint("now")
	if d.Err() == nil && now >= 1<<40 {
		d.Failf("now %d", now)
	}
	t.Partition, t.From, t.To, t.Now = int(part), int(from), int(to), int64(now)
	n := d.Count("tenants", maxTenants)
	for i := 0; i < n && d.Err() == nil; i++ {
		name := d.String("tenant", maxTenantName)
		if d.Err() == nil && (name == "" || i > 0 && name <= t.Series[i-1].Tenant) {
			d.Failf("tenant %q empty or out of order", name)
			break
		}
		h := d.Count("series", maxSeriesTenant)
		if d.Err() == nil && h == 0 {
			d.Failf("tenant %q with no series", name)
		}
		if d.Err() != nil {
			break
		}
		ps := fsm.PartitionSeries{Tenant: name, Hashes: make([]uint64, 0, min(h, d.Len()/8))}
		for j := 0; j < h && d.Err() == nil; j++ {
			x := d.Uint64("hash")
			if d.Err() != nil {
				break
			}
			if j > 0 && x <= ps.Hashes[j-1] || layout.Partition(x, p) != int(part) {
				d.Failf("tenant %q: hash %#x out of order or outside partition %d", name, x, part)
				break
			}
			ps.Hashes = append(ps.Hashes, x)
		}
		if d.Err() != nil {
			break
		}
		ps.Minutes = append([]uint8(nil), d.Raw("minutes", uint64(h))...)
		t.Series = append(t.Series, ps)
	}
	if d.Err() == nil && d.Len() > 0 {
		t.Metering = append([]byte(nil), d.Bytes("metering", maxMetering)...)
		if d.Err() == nil && len(t.Metering) == 0 {
			d.Failf("empty metering")
		}
	}
	return t, d.Finish()
}
