package metering

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
)

// The sampler of a group runs on its leader. Each pass reads the replicated
// spans, proposes one plan entry for every span with an interval due (the
// usage id is fixed when that entry applies), and executes planned
// intervals: straight away when the ledger is the only sink (the execute
// entry writes the record), else after the HTTP sink accepted the record.
// Sink calls run in their own goroutines, one per span, each retrying with
// its own backoff, so a failing call never holds up other spans. A new
// leader finds the plans in the replicated state and re-sends them with the
// same usage id, so the sink sees each id at most once (it dedups by id) and
// no interval is skipped.

const (
	dueBatch     = 4096
	pollInterval = 100 * time.Millisecond
)

func (s *Service) runGroup(g int) {
	defer s.wg.Done()
	for {
		if s.host.Leads(g) {
			s.lead(g)
		}
		select {
		case <-s.stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type worker struct {
	s        *Service
	g        int
	mod      *fsmmeter.Module
	ctx      context.Context
	mu       sync.Mutex
	inflight map[uint64]bool
	results  chan fsmmeter.ExecItem
	poke     chan struct{} // a result arrived
	wg       sync.WaitGroup
	sem      chan struct{}
	lastHK   int64
	// rescan bookkeeping (see pass)
	seenChanges uint64
	wakeAt      int64
	rescan      bool
}

// lead samples group g until this node stops leading it or the service stops.
func (s *Service) lead(g int) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{s: s, g: g, mod: s.host.Module(g), ctx: ctx, inflight: map[uint64]bool{},
		results: make(chan fsmmeter.ExecItem, 4*dueBatch), poke: make(chan struct{}, 1), sem: make(chan struct{}, s.cfg.SinkConcurrency)}
	defer func() {
		cancel()
		w.wg.Wait()
	}()
	// Housekeeping runs on the first pass too: a leader that took over (or
	// started) inside a minute records that minute's sample at once instead
	// of skipping it. It is idempotent: the tick only expires, and a sample
	// is written only where the count changed.
	w.lastHK = math.MinInt64
	s.cfg.Logger.Info("metering sampler started", "group", g)
	backoff := time.Duration(0)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		if !s.host.Leads(g) {
			s.cfg.Logger.Info("metering sampler stopped: no longer leader", "group", g)
			return
		}
		did, err := w.pass()
		if err != nil {
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			s.cfg.Logger.Debug("metering sampler pass failed; backing off", "group", g, "err", err, "backoff", backoff)
		} else {
			backoff = 0
		}
		if did && err == nil {
			continue
		}
		wait := pollInterval
		if backoff > 0 {
			wait = backoff
		}
		select {
		case <-s.stop:
			return
		case <-w.poke:
		case <-s.clock.Changed():
		case <-time.After(wait):
		}
	}
}

// pass does one round of housekeeping, planning and executing; did reports
// whether it proposed anything.
func (w *worker) pass() (did bool, err error) {
	s := w.s
	now := s.clock.NowIn(w.g)
	if minute := now / 60_000; minute != w.lastHK {
		if err := w.housekeeping(now); err != nil {
			return false, err
		}
		w.lastHK = minute
	}
	// Rescan only when the state changed, a waiting span became due, or a
	// sink result came back: a scan reads every span.
	changes := w.mod.Changes()
	if changes == w.seenChanges && now < w.wakeAt && len(w.results) == 0 && !w.rescan {
		return false, nil
	}
	t0 := time.Now()
	work, wake := w.mod.Due(s.grid, now, dueBatch, w.isInflight)
	s.metrics.scanDur.Observe(time.Since(t0).Seconds())
	defer func() {
		if did {
			s.metrics.passDur.Observe(time.Since(t0).Seconds())
		}
	}()
	w.seenChanges, w.wakeAt, w.rescan = changes, wake, len(work) > 0
	if wake == 0 {
		w.wakeAt = math.MaxInt64
	}
	var plans []fsmmeter.PlanItem
	var execs []fsmmeter.ExecItem
	for i := range work {
		wk := &work[i]
		switch {
		case wk.Plan != nil:
			plans = append(plans, *wk.Plan)
		case s.sink == nil:
			execs = append(execs, fsmmeter.ExecItem{Span: wk.Span.ID, Version: wk.Span.Version})
		default:
			w.dispatch(*wk)
		}
	}
drain:
	for len(execs) < dueBatch {
		select {
		case r := <-w.results:
			execs = append(execs, r)
		default:
			break drain
		}
	}
	var errs []error
	if len(plans) > 0 {
		resp, err := s.host.Propose(w.ctx, w.g, fsmmeter.EntryPlan, fsmmeter.EncodePlan(now, plans))
		if err != nil {
			errs = append(errs, fmt.Errorf("plan: %w", err))
		} else if n, ok := resp.(int); ok {
			s.metrics.planned.Add(float64(n))
		}
		did = true
	}
	if len(execs) > 0 {
		resp, err := s.host.Propose(w.ctx, w.g, fsmmeter.EntryExecute, fsmmeter.EncodeExecute(now, execs))
		if err != nil {
			errs = append(errs, fmt.Errorf("execute: %w", err))
		} else if n, ok := resp.(int); ok {
			s.metrics.executed.Add(float64(n))
			for _, e := range execs {
				if e.DeadCode != 0 {
					s.metrics.deadTotal.Inc()
				}
			}
		}
		// Whether or not it applied, these spans may be looked at again:
		// a failed execution is retried from the replicated plan.
		w.mu.Lock()
		for _, e := range execs {
			delete(w.inflight, e.Span)
		}
		w.mu.Unlock()
		did = true
	}
	if len(errs) > 0 {
		return did, errs[0]
	}
	return did, nil
}

func (w *worker) isInflight(span uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight[span]
}

// dispatch delivers one planned record to the HTTP sink in its own goroutine.
func (w *worker) dispatch(wk fsmmeter.Work) {
	w.mu.Lock()
	w.inflight[wk.Span.ID] = true
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		code, reason, ok := w.s.sink.deliver(w.ctx, w.sem, w.g, wk.Record)
		if !ok { // leadership lost or stopping: the next leader re-sends
			w.mu.Lock()
			delete(w.inflight, wk.Span.ID)
			w.mu.Unlock()
			return
		}
		select {
		case w.results <- fsmmeter.ExecItem{Span: wk.Span.ID, Version: wk.Span.Version, DeadCode: code, Reason: reason}:
			select {
			case w.poke <- struct{}{}:
			default:
			}
		case <-w.ctx.Done():
		}
	}()
}

// housekeeping, once per minute of the metering clock: expire dedup ids and
// old ledger records, and record every tenant's active series (billing).
func (w *worker) housekeeping(now int64) error {
	s := w.s
	cutoff := now - s.cfg.LedgerRetention.Milliseconds()
	if !w.mod.Hashes() {
		// The switch: from its entry on, dedup records keep their target's
		// hash, which a partition move of the metering needs (fsm/metering
		// move.go). Refused while a member runs a build below its cluster
		// version: asked again at the next minute.
		_, err := s.host.Propose(w.ctx, w.g, fsmmeter.EntryTargets, fsmmeter.EncodeTargets())
		if err != nil && status.Code(err) != codes.FailedPrecondition {
			return fmt.Errorf("targets switch: %w", err)
		}
	}
	if w.mod.HasState() {
		if _, err := s.host.Propose(w.ctx, w.g, fsmmeter.EntryTick, fsmmeter.EncodeTick(now, cutoff)); err != nil {
			return fmt.Errorf("tick: %w", err)
		}
	}
	// Only changed counts are written: a sample holds until the next one
	// (Bill carries it forward), so an idle cluster writes nothing.
	var rows []fsmmeter.TenantActive
	for _, r := range s.host.TenantsActive(w.g) {
		if last, ok := w.mod.LastSample(r.Tenant); !ok || last != r.Active {
			rows = append(rows, r)
		}
		if len(rows) == fsmmeter.MaxBatch {
			break
		}
	}
	if len(rows) > 0 {
		if _, err := s.host.Propose(w.ctx, w.g, fsmmeter.EntrySeries, fsmmeter.EncodeSeries(now/60_000, rows)); err != nil {
			return fmt.Errorf("series sample: %w", err)
		}
	}
	return nil
}

// RecordDoc is the JSON form of a usage record (ledger queries and the HTTP
// sink).
type RecordDoc struct {
	UsageID            string       `json:"usage_id"`
	Group              int          `json:"group"`
	Timestamp          int64        `json:"timestamp"`
	Start              int64        `json:"start"`
	End                int64        `json:"end"`
	Backward           bool         `json:"backward,omitempty"`
	OrganizationID     string       `json:"organization_id"`
	SpaceID            string       `json:"space_id"`
	ConsumerID         string       `json:"consumer_id"`
	ResourceID         string       `json:"resource_id"`
	PlanID             string       `json:"plan_id"`
	ResourceInstanceID string       `json:"resource_instance_id"`
	MeasuredUsage      []MeasureOut `json:"measured_usage"`
}

// MeasureOut is a measure in a record.
type MeasureOut struct {
	Measure  string  `json:"measure"`
	Quantity float64 `json:"quantity"`
}

func recordDoc(g int, r fsmmeter.Record) RecordDoc {
	d := RecordDoc{UsageID: r.UsageID, Group: g, Timestamp: r.Timestamp, Start: r.Start, End: r.End, Backward: r.Backward,
		OrganizationID: r.Target.Org, SpaceID: r.Target.Space, ConsumerID: r.Target.Consumer, ResourceID: r.Target.Resource,
		PlanID: r.Target.Plan, ResourceInstanceID: r.Target.Instance}
	for _, m := range r.Measures {
		d.MeasuredUsage = append(d.MeasuredUsage, MeasureOut{m.Name, m.Quantity})
	}
	return d
}

// httpSink posts records to a collector.
type httpSink struct {
	url    string
	client *http.Client
	m      *metrics
}

// deliver posts rec until the collector accepts it (2xx) or refuses it for
// good (4xx other than 429: a dead letter, code and reason returned). 429 is
// retried after its Retry-After; 5xx and transport errors with exponential
// backoff and jitter. ok is false when ctx ended first. The concurrency slot
// is held only during a call, never while backing off.
func (h *httpSink) deliver(ctx context.Context, sem chan struct{}, g int, rec fsmmeter.Record) (code int, reason string, ok bool) {
	body, _ := json.Marshal(recordDoc(g, rec))
	backoff := 50 * time.Millisecond
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, "", false
		}
		status, retryAfter, msg := h.call(ctx, rec.UsageID, body)
		<-sem
		var wait time.Duration
		switch {
		case status >= 200 && status < 300:
			return 0, "", true
		case status == http.StatusTooManyRequests:
			wait = retryAfter
			if wait <= 0 {
				wait = time.Second
			}
		case status >= 400 && status < 500:
			return status, msg, true
		default: // 5xx, 1xx/3xx, transport error
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, 10*time.Second)
		}
		select {
		case <-ctx.Done():
			return 0, "", false
		case <-time.After(wait):
		}
	}
}

func (h *httpSink) call(ctx context.Context, usageID string, body []byte) (status int, retryAfter time.Duration, msg string) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		h.m.sinkResp.WithLabelValues("error").Inc()
		return 0, 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", usageID)
	resp, err := h.client.Do(req)
	h.m.sinkDur.Observe(time.Since(start).Seconds())
	if err != nil {
		h.m.sinkResp.WithLabelValues("error").Inc()
		return 0, 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	h.m.sinkResp.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
	return resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After")), fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
}

// parseRetryAfter reads delay-seconds or an HTTP date.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}
