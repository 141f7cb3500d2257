package partitionlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// syncer pushes local changes to a node and merges the node's stream. Nodes
// are tried in turn starting from a random one, so clients spread over them;
// a failure moves on to the next.
type syncer struct {
	l       *Limiter
	clients []api.SketchesClient
	conns   []*grpc.ClientConn
	cur     atomic.Int64 // index of the preferred node
	// Two contexts: Close ends the watch stream first, and the push loop's
	// last push still runs before the push context is cancelled.
	watchCtx, pushCtx       context.Context
	cancelWatch, cancelPush context.CancelFunc

	incMu sync.Mutex
	inc   string // incarnation of the node that accepted the last push

	resub chan struct{} // a tenant was checked for the first time
}

// errResubscribe ends a watch stream so that the next one follows the
// tenants checked since it opened.
var errResubscribe = errors.New("partitionlimit: tenants to follow changed")

// resubscribe asks the watch loop to follow the tenants checked now.
func (s *syncer) resubscribe() {
	select {
	case s.resub <- struct{}{}:
	default:
	}
}

// maxPushBytes bounds one PushSketches call: a tenant's changes (a full
// resend above all) are split into calls of about this size, well below the
// nodes' gRPC receive limit.
const maxPushBytes = 1 << 20

func newSyncer(l *Limiter) (*syncer, error) {
	s := &syncer{l: l, resub: make(chan struct{}, 1)}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, l.cfg.DialOptions...)
	if l.cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(l.cfg.Token)))
	}
	for _, addr := range l.cfg.Addrs {
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			for _, c := range s.conns {
				_ = c.Close()
			}
			return nil, fmt.Errorf("partitionlimit: dial %s: %w", addr, err)
		}
		s.conns = append(s.conns, cc)
		s.clients = append(s.clients, api.NewSketchesClient(cc))
	}
	s.cur.Store(int64(rand.IntN(len(s.clients))))
	s.watchCtx, s.cancelWatch = context.WithCancel(context.Background())
	s.pushCtx, s.cancelPush = context.WithCancel(context.Background())
	return s, nil
}

func (s *syncer) close() {
	s.cancelWatch()
	s.cancelPush()
	for _, c := range s.conns {
		_ = c.Close()
	}
}

func (s *syncer) pushLoop() {
	t := time.NewTicker(s.l.cfg.PushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.l.stop:
			s.pushAll() // best effort: what changed since the last tick
			return
		case <-t.C:
			s.l.Rotate()
			s.pushAll()
		}
	}
}

// pushAll pushes every tenant's changes, one call per tenant so that a tenant
// a node refuses (unknown to it) does not hold back the others.
func (s *syncer) pushAll() {
	s.l.resendIfNeeded()
	now := s.l.minute()
	for _, ts := range s.l.tenantList() {
		req := s.l.takeChanges(ts, now)
		if req == nil {
			continue
		}
		_ = s.pushTenant(ts, req)
	}
}

// pushTenant pushes one tenant's changes in calls of at most maxPushBytes.
// A call no node accepted puts its changes and those of the calls not yet
// made back (sent again next interval); a call a node refused as invalid is
// dropped, counted and logged (sending it again cannot succeed).
func (s *syncer) pushTenant(ts *tenantState, req *api.PushSketchesRequest) error {
	parts := splitPush(req, maxPushBytes)
	var first error
	for i, part := range parts {
		err := s.push(part)
		switch {
		case err == nil:
			continue
		case status.Code(err) == codes.InvalidArgument:
			s.l.st.pushRejected.Add(1)
			s.l.cfg.Logger.Warn("partitionlimit: a node refused sketches; dropped", "tenant", ts.name, "err", err)
		default:
			s.l.st.pushFailures.Add(1)
			for _, rest := range parts[i:] {
				s.l.restoreChanges(ts, rest)
			}
			return fmt.Errorf("partitionlimit: push tenant %q: %w", ts.name, err)
		}
		if first == nil {
			first = fmt.Errorf("partitionlimit: push tenant %q: %w", ts.name, err)
		}
	}
	return first
}

// splitPush cuts req into requests of about limit bytes of registers each
// (at least one sketch per request).
func splitPush(req *api.PushSketchesRequest, limit int) []*api.PushSketchesRequest {
	size := func(sk *api.Sketch) int { return 32 + len(sk.Tenant) + len(sk.Dense) + 4*len(sk.Sparse) }
	total := 0
	for _, sk := range req.Sketches {
		total += size(sk)
	}
	if total <= limit {
		return []*api.PushSketchesRequest{req}
	}
	var out []*api.PushSketchesRequest
	cur, n := &api.PushSketchesRequest{Precision: req.Precision, Origin: req.Origin}, 0
	for _, sk := range req.Sketches {
		if sz := size(sk); n > 0 && n+sz > limit {
			out = append(out, cur)
			cur, n = &api.PushSketchesRequest{Precision: req.Precision, Origin: req.Origin}, 0
		}
		cur.Sketches = append(cur.Sketches, sk)
		n += size(sk)
	}
	return append(out, cur)
}

// noteIncarnation remembers which node (incarnation) accepted the last push.
// When it changes — the client failed over to another node, or its node
// restarted — what the previous one accepted but had not yet passed to its
// peers may be lost with it (a SIGKILL within the peer interval), so the
// next push interval sends every in-window sketch again (max-merge makes the
// repeat harmless). A broken watch stream asks for the same (watchLoop).
func (s *syncer) noteIncarnation(inc string) {
	if inc == "" {
		return
	}
	s.incMu.Lock()
	prev := s.inc
	s.inc = inc
	s.incMu.Unlock()
	if prev != "" && prev != inc {
		s.l.resend.Store(true)
	}
}

// push sends req to the preferred node, then to each other node in turn.
func (s *syncer) push(req *api.PushSketchesRequest) error {
	var err error
	n := len(s.clients)
	for range n {
		i := s.cur.Load()
		ctx, cancel := context.WithTimeout(s.pushCtx, s.l.cfg.RPCTimeout)
		resp, err := s.clients[i].PushSketches(ctx, req)
		cancel()
		if err == nil {
			s.noteIncarnation(resp.GetIncarnation())
			s.l.st.remoteOK.Store(true)
			s.l.st.pushes.Add(1)
			s.l.st.sketchesPushed.Add(uint64(len(req.Sketches)))
			s.l.st.bytesPushed.Add(uint64(proto.Size(req)))
			s.l.st.lastPushUnixNano.Store(s.l.cfg.Clock().UnixNano())
			return nil
		}
		if status.Code(err) == codes.InvalidArgument {
			s.l.st.remoteOK.Store(true) // the node answered
			return err
		}
		s.cur.CompareAndSwap(i, (i+1)%int64(n))
	}
	s.l.st.remoteOK.Store(false)
	return err
}

// takeChanges builds a push of the registers tenant ts raised locally since
// the last push (sparse), or whole minute sketches when many changed (dense),
// and clears the change marks. nil: nothing to push.
func (l *Limiter) takeChanges(ts *tenantState, now int64) *api.PushSketchesRequest {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if !ts.dirty {
		return nil
	}
	ts.dirty = false
	req := &api.PushSketchesRequest{Precision: uint32(l.p)}
	for p, ps := range ts.parts {
		for i := range ps.minutes {
			ms := &ps.minutes[i]
			if ms.minute == 0 || (!ms.all && len(ms.changed) == 0) || !l.inWindow(ms.minute, now) {
				continue
			}
			sk := &api.Sketch{Tenant: ts.name, Partition: uint32(p), Minute: ms.minute}
			if ms.all {
				if nz := nonZero(ms.regs); nz*4 < len(ms.regs) {
					// A resend of a sketch still mostly empty: list its registers.
					sk.Sparse = make([]uint32, 0, nz)
					for idx, v := range ms.regs {
						if v != 0 {
							sk.Sparse = append(sk.Sparse, api.HLLSparseEntry(uint32(idx), v))
						}
					}
				} else {
					sk.Dense = slices.Clone(ms.regs)
				}
			} else {
				slices.Sort(ms.changed)
				sk.Sparse = make([]uint32, len(ms.changed))
				for j, idx := range ms.changed {
					sk.Sparse[j] = api.HLLSparseEntry(idx, ms.regs[idx])
				}
			}
			req.Sketches = append(req.Sketches, sk)
			clear(ms.changedBits)
			ms.changed = ms.changed[:0]
			ms.all = false
		}
	}
	if len(req.Sketches) == 0 {
		return nil
	}
	return req
}

func nonZero(regs []uint8) int {
	n := 0
	for _, v := range regs {
		if v != 0 {
			n++
		}
	}
	return n
}

// resendIfNeeded marks every in-window minute sketch of every tenant for a
// full push when noteIncarnation asked for it.
func (l *Limiter) resendIfNeeded() {
	if !l.resend.Swap(false) {
		return
	}
	now := l.minute()
	marked := false
	for _, ts := range l.tenantList() {
		ts.mu.Lock()
		for _, ps := range ts.parts {
			for i := range ps.minutes {
				if ms := &ps.minutes[i]; ms.minute != 0 && ms.regs != nil && l.inWindow(ms.minute, now) {
					ms.all = true
					ts.dirty = true
					marked = true
				}
			}
		}
		ts.mu.Unlock()
	}
	if marked {
		l.st.resends.Add(1)
	}
}

// restoreChanges marks the registers of a failed push as changed again, so the
// next interval sends them (with whatever changed since).
func (l *Limiter) restoreChanges(ts *tenantState, req *api.PushSketchesRequest) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, sk := range req.Sketches {
		ps := ts.parts[int32(sk.Partition)]
		if ps == nil {
			continue
		}
		ms := &ps.minutes[sk.Minute%l.slots]
		if ms.minute != sk.Minute {
			continue // left the window meanwhile
		}
		if len(sk.Dense) > 0 {
			ms.all = true
		}
		for _, e := range sk.Sparse {
			idx, _ := api.HLLSparseSplit(e)
			ms.markChanged(idx)
		}
		ts.dirty = true
	}
}

// watchLoop keeps one WatchSketches stream open, moving to the next node when
// it breaks, with a capped backoff while no node answers.
func (s *syncer) watchLoop() {
	backoff := 50 * time.Millisecond
	for {
		i := s.cur.Load()
		err := s.watch(s.clients[i])
		if errors.Is(err, errResubscribe) {
			continue // same node, at once: nothing was lost
		}
		s.l.st.watching.Store(false)
		select {
		case <-s.l.stop:
			return
		default:
		}
		s.l.st.watchReconnects.Add(1)
		// The stream's node may have died (or restarted) holding pushes it had
		// not passed on yet; nothing else would tell a client that has no
		// new change to push, so resend everything to the next node.
		s.l.resend.Store(true)
		if status.Code(err) == codes.InvalidArgument {
			s.l.cfg.Logger.Error("partitionlimit: node refused the watch (precision differs from the cluster's?)", "err", err)
		}
		s.cur.CompareAndSwap(i, (i+1)%int64(len(s.clients)))
		select {
		case <-s.l.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.l.cfg.ReconnectMax)
		if err == nil { // the stream worked for a while: reconnect quickly
			backoff = 50 * time.Millisecond
		}
	}
}

// watch merges one stream's batches until it fails. It returns nil when the
// stream had delivered at least one batch (so the caller reconnects at once),
// and errResubscribe when it ended the stream to follow newly checked tenants
// (at most every ResubscribeEvery). The stream follows only the tenants
// checked here: a node then sends what this client uses, not every tenant's
// sketches (a node from before subscriptions sends them all, and applyBatch
// keeps those with a limit, as before).
func (s *syncer) watch(c api.SketchesClient) error {
	names := s.l.subscribed()
	ctx, cancel := context.WithCancel(s.watchCtx)
	defer cancel()
	stream, err := c.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: uint32(s.l.p), OnlyTenants: true, Tenants: names})
	if err != nil {
		return err
	}
	var resub atomic.Bool
	go func() {
		opened := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.resub:
			}
			if wait := s.l.cfg.ResubscribeEvery - time.Since(opened); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					s.resubscribe() // for the next stream
					return
				}
			}
			if !slices.Equal(s.l.subscribed(), names) {
				resub.Store(true)
				cancel()
				return
			}
		}
	}()
	got := false
	for {
		b, err := stream.Recv()
		if err != nil {
			if resub.Load() {
				return errResubscribe
			}
			if got {
				return nil
			}
			return err
		}
		got = true
		s.l.st.watching.Store(true)
		s.l.applyBatch(b)
	}
}

// errPrecision is counted, never returned: a batch of another precision
// cannot be merged.
var errPrecision = errors.New("precision differs")

// applyBatch merges a node's batch. Sketches of tenants without a limit here
// are skipped (no state is kept for them); invalid ones are counted and
// ignored.
func (l *Limiter) applyBatch(b *api.SketchBatch) {
	l.st.batchesReceived.Add(1)
	l.st.bytesReceived.Add(uint64(proto.Size(b)))
	l.st.lastReceiveUnixNano.Store(l.cfg.Clock().UnixNano())
	if b.Precision != uint32(l.p) {
		l.st.badReceived.Add(uint64(len(b.Sketches)))
		l.cfg.Logger.Error("partitionlimit: node streams another precision", "node", b.ServedBy, "precision", b.Precision, "want", l.p, "err", errPrecision)
		return
	}
	now := l.minute()
	for _, sk := range b.Sketches {
		l.st.sketchesReceived.Add(1)
		if l.cfg.Limits == nil || l.cfg.Limits.MaxSeriesPerPartition(sk.Tenant) <= 0 {
			continue
		}
		if sk.Partition >= uint32(l.cfg.Partitions) || api.ValidateSketchRegisters(sk, l.p) != nil {
			l.st.badReceived.Add(1)
			continue
		}
		ts, err := l.tenant(sk.Tenant)
		if err != nil {
			l.st.badReceived.Add(1)
			continue
		}
		ts.mu.Lock()
		l.mergeRemote(ts, int32(sk.Partition), sk.Minute, sk, now)
		ts.mu.Unlock()
	}
}

// ErrLocalOnly is returned by Flush when no node address is configured.
var ErrLocalOnly = errors.New("partitionlimit: no node addresses configured (local only)")

// Flush pushes every pending change now instead of at the next interval (on
// shutdown, or in tests). It returns the first push error; changes that could
// not be pushed stay pending.
func (l *Limiter) Flush(ctx context.Context) error {
	if l.sy == nil {
		return ErrLocalOnly
	}
	l.resendIfNeeded()
	now := l.minute()
	var first error
	for _, ts := range l.tenantList() {
		if err := ctx.Err(); err != nil {
			return err
		}
		req := l.takeChanges(ts, now)
		if req == nil {
			continue
		}
		if err := l.sy.pushTenant(ts, req); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// bearerToken sends "authorization: Bearer <token>" with every call. It
// does not require TLS: the development default is plaintext on loopback;
// on a network, serve TLS so the token does not travel in the clear.
type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return false }
