package history

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kind names an operation type; each model checks the kinds it knows.
type Kind string

// The operation kinds the models know.
const (
	KindTrack       Kind = "track"        // track Hashes for tenant Key
	KindConfigGet   Kind = "config_get"   // read document Key
	KindConfigCAS   Kind = "config_cas"   // write Value to document Key if its version is Expected
	KindMeterEvent  Kind = "meter_event"  // metering start (or Stop) event ID at Time for resource instance Key
	KindMeterUsage  Kind = "meter_usage"  // read resource instance Key's usage per window (Usage)
	KindMeterLedger Kind = "meter_ledger" // one read of the whole ledger, checked as a KindMeterUsage per instance
)

// Outcome is what the client learned of an operation.
type Outcome string

// Outcomes. Only Unknown leaves the effect open; Failed means the operation
// certainly had no effect.
const (
	OK       Outcome = "ok"       // done: all hashes accepted, read answered, compare-and-set applied
	Rejected Outcome = "rejected" // answered: some hashes refused (Op.Rejected), or compare-and-set lost
	Failed   Outcome = "error"    // refused before it could take effect (invalid, unauthorised)
	Unknown  Outcome = "unknown"  // no answer (timeout, unavailable): may or may not have taken effect
)

// Op is one recorded operation. Call and Return are nanoseconds since the
// recorder started, on its monotonic clock.
type Op struct {
	Client int    `json:"client"`
	Kind   Kind   `json:"kind"`
	Key    string `json:"key"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`

	// Inputs.
	Hashes   []uint64 `json:"hashes,omitempty"`   // track
	Expected uint64   `json:"expected,omitempty"` // config_cas: the version it must replace

	// Answer.
	Outcome  Outcome  `json:"outcome"`
	Rejected []uint64 `json:"rejected,omitempty"` // track: hashes refused
	// Version: config_get the version read; config_cas ok the new version,
	// rejected the current version when the server named it (0 if not).
	Version uint64 `json:"version,omitempty"`
	// Value: config_cas the value written; config_get the value read.
	Value string `json:"value,omitempty"`
	// Metering: an event's id, timestamp (ms) and kind; a usage read's
	// answer, duration (ms) per window start (ms).
	ID    string          `json:"id,omitempty"`
	Time  int64           `json:"time,omitempty"`
	Stop  bool            `json:"stop,omitempty"`
	Usage map[int64]int64 `json:"usage,omitempty"`
	Err   string          `json:"err,omitempty"`
}

// Recorder appends operations to a JSON-lines file and keeps them in memory
// for Ops. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	path  string

	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	enc     *json.Encoder
	ops     []Op
	pending map[*Call]struct{}
	err     error // first write error, returned by Close
	closed  bool
}

// Create starts a recorder writing to path (truncated).
func Create(path string) (*Recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	w := bufio.NewWriter(f)
	return &Recorder{start: time.Now(), path: path, f: f, w: w, enc: json.NewEncoder(w), pending: map[*Call]struct{}{}}, nil
}

// Path is the file the recorder writes.
func (r *Recorder) Path() string { return r.path }

// now is the time since the recorder started. time.Since uses the monotonic
// clock, so wall-clock steps cannot reorder operations.
func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Call is an invoked operation awaiting its answer.
type Call struct {
	r  *Recorder
	op Op
}

// Begin stamps op's invocation time. The caller must End the call (or the
// recorder's Close records it as unknown).
func (r *Recorder) Begin(client int, op Op) *Call {
	op.Client = client
	op.Hashes = slices.Clone(op.Hashes)
	c := &Call{r: r, op: op}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.op.Call = r.now()
	if !r.closed {
		r.pending[c] = struct{}{}
	}
	return c
}

// End records the call's answer: out's Outcome, Rejected, Version, Value
// (when non-empty) and Err.
func (c *Call) End(out Op) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	ret := r.now()
	if _, ok := r.pending[c]; !ok {
		return // ended twice, or after Close (already recorded as unknown)
	}
	delete(r.pending, c)
	op := c.op
	op.Return = ret
	op.Outcome, op.Rejected, op.Version, op.Err = out.Outcome, slices.Clone(out.Rejected), out.Version, out.Err
	if out.Usage != nil {
		op.Usage = maps.Clone(out.Usage)
	}
	if out.Value != "" {
		op.Value = out.Value
	}
	r.write(op)
}

// EndTrack records the answer of a track call: ok when nothing was
// rejected, rejected with the refused hashes, or the outcome Classify gives
// err.
func (c *Call) EndTrack(rejected []uint64, err error) {
	switch {
	case err != nil:
		c.End(Op{Outcome: Classify(err), Err: err.Error()})
	case len(rejected) > 0:
		c.End(Op{Outcome: Rejected, Rejected: rejected})
	default:
		c.End(Op{Outcome: OK})
	}
}

// Classify maps a client error to an outcome: Failed only for refusals that
// happen before anything is proposed (bad argument, authentication,
// permission); anything else, timeouts and unavailability included, may have
// been committed and is Unknown.
func Classify(err error) Outcome {
	if err == nil {
		return OK
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied:
		return Failed
	}
	return Unknown
}

// write appends op; r.mu is held.
func (r *Recorder) write(op Op) {
	r.ops = append(r.ops, op)
	if r.err == nil {
		if err := r.enc.Encode(op); err != nil {
			r.err = fmt.Errorf("history: write: %w", err)
		}
	}
}

// Ops returns a copy of the operations recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Close records calls still in flight as unknown, flushes and syncs the
// file. Calls ended later are ignored.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	r.closed = true
	now := r.now()
	var open []Op
	for c := range r.pending {
		op := c.op
		op.Return, op.Outcome, op.Err = now, Unknown, "in flight when the history closed"
		open = append(open, op)
	}
	clear(r.pending)
	slices.SortFunc(open, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	for _, op := range open {
		r.write(op)
	}
	err := errors.Join(r.err, r.w.Flush(), r.f.Sync(), r.f.Close())
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("history: close: %w", err)
	}
	return r.err
}

// Load reads a history file written by a Recorder.
func Load(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	var ops []Op
	dec := json.NewDecoder(f)
	for {
		var op Op
		if err := dec.Decode(&op); err == io.EOF {
			return ops, nil
		} else if err != nil {
			return nil, fmt.Errorf("history: %s: operation %d: %w", path, len(ops)+1, err)
		}
		ops = append(ops, op)
	}
}
