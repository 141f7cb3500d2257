package gateway

import (
	"bytes"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/encoding/protowire"
)

// scanV1 reads what the gateway needs of a remote write 1.0 request (the
// series' ids and sample counts, and whether it carries metadata) straight
// from the protobuf bytes, without building the message: no string per
// label name and value, no slice per series. Decoding the whole message
// (prompb's generated Unmarshal) was most of the gateway's CPU and all of
// its garbage (7,512 allocations and 803 KB for 500 series).
//
// The wire format it walks (prometheus/prompb/remote.proto, types.proto):
//
//	WriteRequest: 1 timeseries (message, repeated), 3 metadata (message, repeated)
//	TimeSeries:   1 labels (message, repeated), 2 samples, 3 exemplars, 4 histograms
//	Label:        1 name (string), 2 value (string)
//
// Any other field is skipped, as the generated code skips unknown fields,
// and a field repeated within a Label keeps its last value, as Unmarshal
// does. A series' id is labels.Labels.Hash of its labels, as the
// distributors' clientlib computes it: xxhash64 of the labels laid out as
// Prometheus' default build (stringlabels) holds them (appendString),
// checked against labels.Labels.Hash in TestScanMatchesDecode.
//
// ok is false when the request is anything but well formed and valid (bad
// wire bytes, a label rule broken, a series without labels): the caller
// then decodes it the slow way, which finds and names the problem. So the
// error messages stay those of the full decoder.
func scanV1(raw []byte, b *batch) (ok bool) {
	buf := make([]byte, 0, 1024) // one series' hashed bytes, reused
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return false
		}
		raw = raw[n:]
		if num == 1 && typ == protowire.BytesType {
			msg, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return false
			}
			raw = raw[n:]
			h, samples, ok := scanSeries(msg, &buf)
			if !ok {
				return false
			}
			b.hashes = append(b.hashes, h)
			b.samples = append(b.samples, samples)
			b.total += samples
			continue
		}
		if num == 1 || num == 3 {
			// A timeseries of another wire type, or metadata.
			if typ != protowire.BytesType {
				return false
			}
			msg, n := protowire.ConsumeBytes(raw)
			if n < 0 || !fieldsWalk(msg) {
				return false
			}
			raw = raw[n:]
			b.metadata = true
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, raw)
		if n < 0 {
			return false
		}
		raw = raw[n:]
	}
	return true
}

// appendString adds one label string to a series' hashed bytes as
// Prometheus' default labels build (stringlabels) lays it out: its length
// (one byte below 255; else 255 and three bytes, little-endian), then the
// string.
func appendString(b, s []byte) []byte {
	if n := len(s); n < 255 {
		b = append(b, byte(n))
	} else {
		b = append(b, 255, byte(n), byte(n>>8), byte(n>>16))
	}
	return append(b, s...)
}

// scanSeries hashes one TimeSeries' labels (checking the label rules) and
// counts its samples and histograms; buf is scratch space, kept for the
// next series.
func scanSeries(msg []byte, buf *[]byte) (h uint64, samples int, ok bool) {
	b := (*buf)[:0]
	var prev []byte
	nLabels := 0
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, 0, false
		}
		msg = msg[n:]
		if typ != protowire.BytesType {
			if num >= 1 && num <= 4 {
				return 0, 0, false // a known field with the wrong wire type
			}
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return 0, 0, false
			}
			msg = msg[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(msg)
		if n < 0 {
			return 0, 0, false
		}
		msg = msg[n:]
		switch num {
		case 1:
			name, value, ok := scanLabel(v)
			if !ok || len(name) == 0 || !utf8.Valid(name) || !utf8.Valid(value) ||
				(nLabels > 0 && bytes.Compare(name, prev) <= 0) {
				return 0, 0, false
			}
			prev = name
			nLabels++
			b = appendString(appendString(b, name), value)
		case 2, 4:
			if !fieldsWalk(v) {
				return 0, 0, false
			}
			samples++
		case 3:
			if !fieldsWalk(v) {
				return 0, 0, false
			}
		}
	}
	if nLabels == 0 {
		return 0, 0, false
	}
	*buf = b
	return xxhash.Sum64(b), samples, true
}

// scanLabel returns a Label's name and value (the last of each, as
// Unmarshal keeps).
func scanLabel(msg []byte) (name, value []byte, ok bool) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, nil, false
		}
		msg = msg[n:]
		if num == 1 || num == 2 {
			if typ != protowire.BytesType {
				return nil, nil, false
			}
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, nil, false
			}
			msg = msg[n:]
			if num == 1 {
				name = v
			} else {
				value = v
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, msg)
		if n < 0 {
			return nil, nil, false
		}
		msg = msg[n:]
	}
	return name, value, true
}

// fieldsWalk reports whether msg is a sequence of well-formed fields (one
// level: a sample, exemplar, histogram or metadata message whose bytes are
// cut or garbled is refused, as Unmarshal refuses it; what nests deeper, a
// histogram's spans, is left to the backend, which decodes it anyway).
func fieldsWalk(msg []byte) bool {
	for len(msg) > 0 {
		_, _, n := protowire.ConsumeField(msg)
		if n < 0 {
			return false
		}
		msg = msg[n:]
	}
	return true
}
