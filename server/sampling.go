package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/limits"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
	"github.com/tollgate-io/tollgate/service/sampling"
)

// Wiring of the backlog controller (package service/sampling) that sets one kind's
// global sample percentage from the backlog reporters post.
//
// Placement: the controller runs on the leader of group 0, the group that
// orders runtime-config changes (runtimecfgsvc.OrderGroup), so the node that
// computes the output is the one that commits it, without a hop. Every node
// serves POST /api/v1/backlog and the Config.ReportBacklog RPC; a node that is
// not the owner forwards the report over gRPC (peer pool, once), so reporters
// may post to any node with the admin token, as for every admin call; an HTTP
// redirect was not chosen because HTTP clients (Go's, curl) drop the
// Authorization header when following one to another host:port.
//
// Parameters come from the replicated global.backlog_controller of group 0's
// replica. The document checks them at least as strictly as the controller
// (its kind rule, runtimecfg.ValidateKind, is sampleconf's narrowed to
// [a-z0-9_-]; kp > 0), so the controller takes any set the document holds.
// A set the controller refused all the same (its rules changed in another
// release) would disable it: the reason is in `tollgate limits get`,
// /api/v1/status, the log and tollgate_sampling_controller_enabled.
//
// Writing costs G raft entries (group 0's patch, then one install per other
// group), so the output is written as global sample_rates.<kind> through
// service/runtimecfg SetLimits only when it moved by at least minWriteDelta points
// from the replicated value (or reached min/max percent exactly), and at most
// once per max(period, 1s). While the controller is enabled it owns that
// value: an operator's `limits set --global sample_rates.<kind>=P` lasts until
// the controller's next step that differs from it.
//
// After a failover the new owner's controller starts afresh (integral 0, no
// input): it holds the replicated value until the first fresh report arrives,
// then the proportional term acts at once and the integral rebuilds.

const (
	minWriteDelta    = 0.5 // percentage points
	minWriteInterval = time.Second
	samplingLoopTick = 100 * time.Millisecond
)

type samplingCtl struct {
	s   *Server
	ctl *sampling.Controller

	mu        sync.Mutex
	owner     bool
	bc        *runtimecfg.BacklogController // parameters in force (nil: none configured)
	bcSet     bool                          // bc was read at least once while owner
	desired   float64                       // last output computed from a step with input
	hasOutput bool
	lastWrite time.Time // last write attempt
	written   float64
	writes    uint64
	writeErr  error
	lastLog   string
}

// SamplingControllerState is the controller's state for /api/v1/status and
// `tollgate limits get`.
type SamplingControllerState struct {
	// Owner is the node that runs the controller (group 0's leader); on other
	// nodes the rest describes the configuration only.
	Owner   string `json:"owner"`
	IsOwner bool   `json:"is_owner"`
	sampling.Status
	WrittenPercent float64 `json:"written_percent"`
	Writes         uint64  `json:"writes"`
	LastWriteError string  `json:"last_write_error,omitempty"`
}

var errNoController = errors.New("no backlog_controller in the runtime config (tollgate limits set --global backlog_controller.kind=… target=… period=… kp=…)")

func (s *Server) setupSampling() {
	sc := &samplingCtl{s: s, ctl: sampling.New(sampling.Params{})}
	s.sampling = sc
	s.metrics.reg.MustRegister(sampling.NewCollector(sc.ctl))
}

func (s *Server) startSampling() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(samplingLoopTick)
		defer t.Stop()
		for {
			select {
			case <-s.closing:
				return
			case <-t.C:
				s.sampling.step(s.cfg.Clock())
			}
		}
	}()
}

// paramsOf converts the document's block to controller parameters.
func paramsOf(bc *runtimecfg.BacklogController) sampling.Params {
	return sampling.Params{Kind: bc.Kind, Target: bc.Target, Period: bc.Period, Kp: bc.Kp, Ki: bc.Ki, MinPercent: bc.MinPercent}
}

// syncLocked follows ownership and the replicated parameters; it returns
// group 0's document when this node is the owner.
func (sc *samplingCtl) syncLocked() (*runtimecfg.Document, bool) {
	owner := sc.s.rcfg.Leads(runtimecfgsvc.OrderGroup)
	if !owner {
		if sc.owner {
			sc.owner, sc.bcSet, sc.hasOutput = false, false, false
			sc.ctl.SetParams(sampling.Params{}) // drop state: a later term starts afresh
			sc.s.log.Info("backlog controller: no longer the config owner; stopped")
		}
		return nil, false
	}
	doc := sc.s.rcfg.mods[runtimecfgsvc.OrderGroup].Current()
	bc := doc.Global.BacklogController
	became := !sc.owner
	if became || !sc.bcSet || !sameBC(bc, sc.bc) {
		if became {
			sc.ctl.SetParams(sampling.Params{}) // fresh state for this term
		}
		sc.owner, sc.bcSet, sc.bc = true, true, bc
		if bc == nil {
			sc.ctl.SetParams(sampling.Params{})
			sc.hasOutput = false
		} else {
			prevKind := sc.ctl.Status().Kind
			sc.ctl.SetParams(paramsOf(bc))
			if prevKind != bc.Kind {
				sc.hasOutput = false
			}
		}
		sc.logStateLocked(became)
	}
	return doc, true
}

func sameBC(a, b *runtimecfg.BacklogController) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func (sc *samplingCtl) logStateLocked(became bool) {
	st := sc.ctl.Status()
	var msg string
	args := []any{"kind", st.Kind}
	switch {
	case sc.bc == nil:
		msg = "backlog controller: not configured"
	case st.Enabled:
		msg = "backlog controller: running on this node (config owner)"
		args = append(args, "target", st.Target, "period", st.Params.Period, "kp", st.Params.Kp, "ki", st.Params.Ki, "min_percent", st.Params.MinPercent)
	default:
		msg = "backlog controller: disabled by invalid parameters"
		args = append(args, "reason", st.Reason)
	}
	key := fmt.Sprint(msg, args)
	if key == sc.lastLog && !became {
		return
	}
	sc.lastLog = key
	if st.Enabled || sc.bc == nil {
		sc.s.log.Info(msg, args...)
	} else {
		sc.s.log.Warn(msg, args...)
	}
}

// step runs one loop iteration: follow the config, tick the controller, and
// write its output when the rules above say so.
func (sc *samplingCtl) step(now time.Time) {
	sc.mu.Lock()
	doc, owner := sc.syncLocked()
	if !owner || sc.bc == nil {
		sc.mu.Unlock()
		return
	}
	if res, stepped := sc.ctl.Tick(now); stepped && res.HasInput {
		sc.desired, sc.hasOutput = res.Percent, true
	}
	st := sc.ctl.Status()
	interval := max(st.Params.Period, minWriteInterval)
	if !st.Enabled || !sc.hasOutput || now.Sub(sc.lastWrite) < interval ||
		!worthWriting(sc.desired, doc.GlobalSampleRate(st.Kind), st.Params) {
		sc.mu.Unlock()
		return
	}
	want, kind := sc.desired, st.Kind
	sc.lastWrite = now
	sc.mu.Unlock()

	// The write runs outside the lock: reports keep arriving while it commits.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := sc.s.rcfg.svc.SetLimits(ctx, &api.SetLimitsRequest{Global: true,
		Set: map[string]string{limits.SampleRateKey(kind): strconv.FormatFloat(want, 'f', -1, 64)}})
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err != nil {
		if sc.writeErr == nil || sc.writeErr.Error() != err.Error() {
			sc.s.log.Warn("backlog controller: writing the global sample rate failed; retrying next period", "kind", kind, "percent", want, "err", err)
		}
		sc.writeErr = err
		return
	}
	sc.writeErr = nil
	sc.written = want
	sc.writes++
	sc.s.log.Debug("backlog controller: wrote the global sample rate", "kind", kind, "percent", want, "input", st.InputBacklog)
}

// worthWriting: a move of minWriteDelta points or more, or one that reaches
// a bound exactly (so the rate can get back to 100 % from 99.8 %).
func worthWriting(want, cur float64, p sampling.Params) bool {
	if want == cur {
		return false
	}
	if math.Abs(want-cur) >= minWriteDelta {
		return true
	}
	return want == p.MinPercent || want == p.MaxPercent
}

// ReportBacklog implements sampling.Reporter for the HTTP handler: on the
// owner into the controller, elsewhere forwarded to the owner.
func (sc *samplingCtl) ReportBacklog(kind, source string, backlog float64, now time.Time) (sampling.Status, error) {
	sc.mu.Lock()
	_, owner := sc.syncLocked()
	sc.mu.Unlock()
	if owner {
		return sc.ctl.ReportBacklog(kind, source, backlog, now)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := sc.forward(ctx, &api.ReportBacklogRequest{Kind: kind, Backlog: backlog, Source: source})
	if err != nil {
		return sampling.Status{}, reportError(err)
	}
	return stateFromProto(resp.Status).Status, nil
}

func (sc *samplingCtl) forward(ctx context.Context, req *api.ReportBacklogRequest) (*api.ReportBacklogResponse, error) {
	cc, fctx, err := sc.s.rcfg.LeaderConn(ctx, runtimecfgsvc.OrderGroup)
	if err != nil {
		return nil, err
	}
	return api.NewConfigClient(cc).ReportBacklog(fctx, req)
}

// remoteReportError carries the owner's message and the service/sampling sentinel
// its code stands for, so the HTTP handler answers the owner's status.
type remoteReportError struct {
	msg  string
	kind error
}

func (e *remoteReportError) Error() string { return e.msg }
func (e *remoteReportError) Unwrap() error { return e.kind }

func reportError(err error) error {
	st := status.Convert(err)
	var kind error
	switch st.Code() {
	case codes.InvalidArgument:
		kind = sampling.ErrInvalidBacklog
	case codes.FailedPrecondition:
		kind = sampling.ErrUnknownKind
	case codes.ResourceExhausted:
		kind = sampling.ErrTooManySources
	default:
		kind = sampling.ErrUnavailable
	}
	return &remoteReportError{msg: st.Message(), kind: kind}
}

// State returns the controller state as this node knows it.
func (sc *samplingCtl) State() SamplingControllerState {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.syncLocked() // so a read right after a config change shows it
	owner, _ := sc.s.leaderOf(runtimecfgsvc.OrderGroup)
	out := SamplingControllerState{Owner: owner, IsOwner: sc.owner, WrittenPercent: sc.written, Writes: sc.writes}
	if sc.owner {
		out.Owner = sc.s.cfg.NodeID
		out.Status = sc.ctl.Status()
		if sc.bc == nil {
			out.Status.Reason = errNoController.Error()
		}
		if sc.writeErr != nil {
			out.LastWriteError = sc.writeErr.Error()
		}
		return out
	}
	// Not the owner: describe the replicated configuration only.
	doc := sc.s.RuntimeConfig()
	if bc := doc.Global.BacklogController; bc != nil {
		out.Status = sampling.New(paramsOf(bc)).Status()
		out.Status.OutputPercent = doc.GlobalSampleRate(bc.Kind)
	} else {
		out.Status.Reason = errNoController.Error()
	}
	return out
}

func (st SamplingControllerState) proto() *api.SamplingControllerStatus {
	return &api.SamplingControllerStatus{Owner: st.Owner, Kind: st.Kind, Enabled: st.Enabled, Reason: st.Reason,
		OutputPercent: st.OutputPercent, WrittenPercent: st.WrittenPercent, InputBacklog: st.InputBacklog, HasInput: st.HasInput,
		TargetBacklog: st.Target, Sources: uint32(st.Sources), Steps: st.Steps, Reports: st.Reports, RejectedReports: st.Rejected,
		Writes: st.Writes, LastWriteError: st.LastWriteError}
}

func stateFromProto(p *api.SamplingControllerStatus) SamplingControllerState {
	return SamplingControllerState{Owner: p.GetOwner(), WrittenPercent: p.GetWrittenPercent(), Writes: p.GetWrites(), LastWriteError: p.GetLastWriteError(),
		Status: sampling.Status{Kind: p.GetKind(), Enabled: p.GetEnabled(), Reason: p.GetReason(), OutputPercent: p.GetOutputPercent(),
			InputBacklog: p.GetInputBacklog(), HasInput: p.GetHasInput(), Target: p.GetTargetBacklog(), Sources: int(p.GetSources()),
			Steps: p.GetSteps(), Reports: p.GetReports(), Rejected: p.GetRejectedReports()}}
}

// --- gRPC: the Config service with ReportBacklog and the controller state ---

// configServer is runtimecfgsvc.Service plus what the controller adds: the
// ReportBacklog RPC and the owner's controller state in GetLimits.
type configServer struct {
	*runtimecfgsvc.Service
	sc *samplingCtl
}

func (s *Server) configServer() api.ConfigServer {
	s.setupSampling()
	return configServer{Service: s.rcfg.svc, sc: s.sampling}
}

func (c configServer) ReportBacklog(ctx context.Context, req *api.ReportBacklogRequest) (*api.ReportBacklogResponse, error) {
	sc := c.sc
	sc.mu.Lock()
	_, owner := sc.syncLocked()
	sc.mu.Unlock()
	if !owner {
		resp, err := sc.forward(ctx, req)
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				err = status.Errorf(codes.Unavailable, "backlog report: %v", err)
			}
			return nil, err
		}
		return resp, nil
	}
	if _, err := sc.ctl.ReportBacklog(req.Kind, req.Source, req.Backlog, sc.s.cfg.Clock()); err != nil {
		code, hint := codeOf(err)
		msg := err.Error()
		if hint != "" {
			msg += "; " + hint
		}
		return nil, status.Error(code, msg)
	}
	return &api.ReportBacklogResponse{Status: sc.State().proto()}, nil
}

// GetLimits adds the controller state: the owner's when the owner answers
// (here or forwarded), else this node's view of the configuration.
func (c configServer) GetLimits(ctx context.Context, req *api.GetLimitsRequest) (*api.GetLimitsResponse, error) {
	resp, err := c.Service.GetLimits(ctx, req)
	if err != nil || resp.Controller != nil { // the owner's answer, forwarded
		return resp, err
	}
	resp.Controller = c.sc.State().proto()
	return resp, nil
}

// --- HTTP ---

// backlogHandler serves POST /api/v1/backlog behind the admin rule.
func (s *Server) backlogHandler() http.Handler {
	h := sampling.NewHandler(s.sampling, s.cfg.Clock)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var remote net.IP
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			remote = net.ParseIP(host)
		}
		switch s.adminVerdictFor(remote, r.Header.Values("Authorization")) {
		case adminNotLoopback:
			writeJSONError(w, http.StatusForbidden, "backlog: no admin token is configured on this node, so only loopback clients may report; start the server with --admin-token-file")
			return
		case adminBadToken:
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate admin"`)
			writeJSONError(w, http.StatusUnauthorized, "backlog: missing or wrong admin token (header \"Authorization: Bearer <token>\")")
			return
		}
		h.ServeHTTP(w, r)
	})
}
