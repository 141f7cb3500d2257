package gateway

import (
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// Protocol messages, as the remote-write 2.0 specification names them in the
// Content-Type's proto parameter.
const (
	protoV1 = "prometheus.WriteRequest"
	protoV2 = "io.prometheus.write.v2.Request"
)

// Remote-write headers: the version a sender states, and the counts a 2.0
// receiver answers with.
const (
	headerVersion           = "X-Prometheus-Remote-Write-Version"
	headerSamplesWritten    = "X-Prometheus-Remote-Write-Samples-Written"
	headerHistogramsWritten = "X-Prometheus-Remote-Write-Histograms-Written"
	headerExemplarsWritten  = "X-Prometheus-Remote-Write-Exemplars-Written"
)

// errUnsupported is a request the gateway cannot read at all (415), as
// opposed to one that is malformed (400).
var errUnsupported = errors.New("unsupported media type")

// negotiate reads Content-Type and Content-Encoding as the 2.0 specification
// says: application/x-protobuf without a proto parameter is 1.0; the proto
// parameter names the message; the body must be snappy (block format).
func negotiate(contentType, contentEncoding string) (string, error) {
	if enc := strings.TrimSpace(contentEncoding); enc != "" && !strings.EqualFold(enc, "snappy") {
		return "", fmt.Errorf("%w: Content-Encoding %q: remote write bodies are snappy-compressed (Content-Encoding: snappy)", errUnsupported, enc)
	}
	if strings.TrimSpace(contentType) == "" {
		return protoV1, nil // old senders omit it; 1.0 is the only thing they can mean
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", fmt.Errorf("%w: Content-Type %q: %v", errUnsupported, contentType, err)
	}
	if mt != "application/x-protobuf" {
		return "", fmt.Errorf("%w: Content-Type %q: want application/x-protobuf", errUnsupported, mt)
	}
	switch p := params["proto"]; p {
	case "", protoV1:
		return protoV1, nil
	case protoV2:
		return protoV2, nil
	default:
		return "", fmt.Errorf("%w: Content-Type proto=%q: this gateway accepts %s and %s", errUnsupported, p, protoV1, protoV2)
	}
}

// tooLargeError is a body whose decompressed size is over the bound (413).
type tooLargeError struct{ size, limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("decompressed body of %d bytes is over the limit of %d bytes (max_decompressed_bytes)", e.size, e.limit)
}

// decompress checks the size the snappy header announces before allocating
// anything for it, then decodes.
func decompress(body []byte, limit int64) ([]byte, error) {
	n, err := snappy.DecodedLen(body)
	if err != nil {
		return nil, fmt.Errorf("decompress snappy body: %w", err)
	}
	if int64(n) > limit {
		return nil, &tooLargeError{size: int64(n), limit: limit}
	}
	out, err := snappy.Decode(nil, body)
	if err != nil {
		return nil, fmt.Errorf("decompress snappy body: %w", err)
	}
	return out, nil
}

// batch is one decoded request: the message, and per series its id and the
// number of samples it carries (float samples and histogram samples: what
// the ingestion rate counts).
type batch struct {
	proto string
	// raw is the decompressed request; v1 is decoded from it only when
	// series are dropped (filter) or the request is invalid (scan.go).
	raw      []byte
	metadata bool // a 1.0 request carries metadata
	v1       *prompb.WriteRequest
	v2       *writev2.Request
	hashes   []uint64 // per series, in request order
	samples  []int    // per series
	total    int      // Σ samples
}

func (b *batch) series() int { return len(b.hashes) }

// decode unmarshals raw (already decompressed) as the negotiated message,
// validates every series' labels and computes its id. Any problem refuses
// the whole request, naming the series and what is wrong with it.
func decode(proto string, raw []byte) (*batch, error) {
	b := &batch{proto: proto}
	sb := labels.NewScratchBuilder(16)
	var ls labels.Labels
	switch proto {
	case protoV1:
		b.raw = raw
		if scanV1(raw, b) {
			return b, nil
		}
		// Invalid somewhere: the full decoder names the problem.
		b.hashes, b.samples, b.total, b.metadata = nil, nil, 0, false
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("decode protobuf %s: %w", protoV1, err)
		}
		b.v1, b.metadata = &req, len(req.Metadata) > 0
		b.hashes = make([]uint64, len(req.Timeseries))
		b.samples = make([]int, len(req.Timeseries))
		for i := range req.Timeseries {
			ts := &req.Timeseries[i]
			sb.Reset()
			prev := ""
			for j, l := range ts.Labels {
				if err := checkLabel(j, prev, l.Name, l.Value); err != nil {
					return nil, seriesError(i, ts.Labels, err)
				}
				prev = l.Name
				sb.Add(l.Name, l.Value)
			}
			if len(ts.Labels) == 0 {
				return nil, fmt.Errorf("series %d has no labels", i)
			}
			sb.Overwrite(&ls)
			b.hashes[i] = ls.Hash()
			n := len(ts.Samples) + len(ts.Histograms)
			b.samples[i], b.total = n, b.total+n
		}
	case protoV2:
		var req writev2.Request
		if err := req.Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("decode protobuf %s: %w", protoV2, err)
		}
		if len(req.Symbols) > 0 && req.Symbols[0] != "" {
			return nil, fmt.Errorf("symbols[0] is %q: the symbols table must start with the empty string", trunc(req.Symbols[0]))
		}
		for i, s := range req.Symbols {
			if !utf8.ValidString(s) {
				return nil, fmt.Errorf("symbols[%d] is not valid UTF-8", i)
			}
		}
		b.v2 = &req
		b.hashes = make([]uint64, len(req.Timeseries))
		b.samples = make([]int, len(req.Timeseries))
		for i := range req.Timeseries {
			ts := &req.Timeseries[i]
			refs := ts.LabelsRefs
			if len(refs)%2 != 0 {
				return nil, fmt.Errorf("series %d: labels_refs has %d entries, not a whole number of name/value pairs", i, len(refs))
			}
			if len(refs) == 0 {
				return nil, fmt.Errorf("series %d has no labels", i)
			}
			sb.Reset()
			prev := ""
			for j := 0; j < len(refs); j += 2 {
				if int(refs[j]) >= len(req.Symbols) || int(refs[j+1]) >= len(req.Symbols) {
					return nil, fmt.Errorf("series %d: labels_refs[%d:%d] = %d, %d: outside the symbols table of %d entries", i, j, j+2, refs[j], refs[j+1], len(req.Symbols))
				}
				name, value := req.Symbols[refs[j]], req.Symbols[refs[j+1]]
				if err := checkLabel(j/2, prev, name, value); err != nil {
					return nil, fmt.Errorf("series %d: %w", i, err)
				}
				prev = name
				sb.Add(name, value)
			}
			sb.Overwrite(&ls)
			b.hashes[i] = ls.Hash()
			n := len(ts.Samples) + len(ts.Histograms)
			b.samples[i], b.total = n, b.total+n
		}
	default:
		return nil, fmt.Errorf("%w: %s", errUnsupported, proto)
	}
	return b, nil
}

// checkLabel is the label rule of the remote-write specification: names
// non-empty, unique and sorted, names and values valid UTF-8. A series
// whose labels break it would get another id here than in the backend.
func checkLabel(j int, prev, name, value string) error {
	switch {
	case name == "":
		return fmt.Errorf("label %d has an empty name", j)
	case !utf8.ValidString(name):
		return fmt.Errorf("label %d: name is not valid UTF-8", j)
	case !utf8.ValidString(value):
		return fmt.Errorf("label %q: value is not valid UTF-8", name)
	case j > 0 && name == prev:
		return fmt.Errorf("duplicate label name %q", name)
	case j > 0 && name < prev:
		return fmt.Errorf("labels not sorted: %q after %q", name, prev)
	}
	return nil
}

// seriesError names a 1.0 series by its (printable) labels.
func seriesError(i int, ls []prompb.Label, err error) error {
	var sb strings.Builder
	sb.WriteByte('{')
	for j, l := range ls {
		if j > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s=%q", strings.ToValidUTF8(l.Name, "\uFFFD"), strings.ToValidUTF8(l.Value, "\uFFFD"))
		if sb.Len() > 200 {
			sb.WriteString(", …")
			break
		}
	}
	sb.WriteByte('}')
	return fmt.Errorf("series %d %s: %w", i, sb.String(), err)
}

func trunc(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// filter returns the body to forward without the series whose ids are in
// drop, snappy-compressed, and what it keeps. With nothing to drop the
// caller forwards the original body instead.
func (b *batch) filter(drop map[uint64]bool) (body []byte, keptSeries, keptSamples int, err error) {
	var raw []byte
	switch b.proto {
	case protoV1:
		if b.v1 == nil {
			var req prompb.WriteRequest
			if err := req.Unmarshal(b.raw); err != nil {
				return nil, 0, 0, fmt.Errorf("decode protobuf %s: %w", protoV1, err)
			}
			if len(req.Timeseries) != len(b.hashes) {
				return nil, 0, 0, fmt.Errorf("decode protobuf %s: %d series, %d when scanned", protoV1, len(req.Timeseries), len(b.hashes))
			}
			b.v1 = &req
		}
		out := prompb.WriteRequest{Metadata: b.v1.Metadata}
		for i := range b.v1.Timeseries {
			if !drop[b.hashes[i]] {
				out.Timeseries = append(out.Timeseries, b.v1.Timeseries[i])
				keptSeries++
				keptSamples += b.samples[i]
			}
		}
		raw, err = out.Marshal()
	case protoV2:
		// The symbols table stays whole: unused symbols are allowed, and
		// rewriting every reference would cost more than the bytes saved.
		out := writev2.Request{Symbols: b.v2.Symbols}
		for i := range b.v2.Timeseries {
			if !drop[b.hashes[i]] {
				out.Timeseries = append(out.Timeseries, b.v2.Timeseries[i])
				keptSeries++
				keptSamples += b.samples[i]
			}
		}
		raw, err = out.Marshal()
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("encode filtered request: %w", err)
	}
	return snappy.Encode(nil, raw), keptSeries, keptSamples, nil
}

// hasMetadata reports whether a request carries something besides series
// (1.0 metadata), which is forwarded even when every series is rejected.
func (b *batch) hasMetadata() bool { return b.metadata }
