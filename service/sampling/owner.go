package sampling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/limits"
	"github.com/tollgate-io/tollgate/nodeport"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
)

// Owner runs the backlog controller on a node: it sets one kind's global
// sample percentage from the backlog reporters post.
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

// OwnerConfig is what the owner needs of its node.
type OwnerConfig struct {
	// Port is the node: leading the order group makes it the owner, and a
	// report reaches the owner through its LeaderConn.
	Port nodeport.Port
	// Replica returns the order group's replica of the runtime config on
	// this node; Newest the newest config the node holds.
	Replica, Newest func() *runtimecfg.Document
	// LeaderOf names a group's leader as this node knows it ("" if none).
	LeaderOf func(g int) string
	// SetLimits writes the runtime config (runtimecfgsvc.Service.SetLimits).
	SetLimits func(context.Context, *api.SetLimitsRequest) (*api.LimitsChangeResponse, error)
	// MapError turns the controller's errors into gRPC statuses.
	MapError   func(error) error
	Clock      func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Owner is the backlog controller as a node runs it (see above). Every node
// has one; only the order group's leader's controls.
type Owner struct {
	cfg OwnerConfig
	ctl *Controller

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

// OwnerState is the controller's state for /api/v1/status and
// `tollgate limits get`.
type OwnerState struct {
	// Owner is the node that runs the controller (group 0's leader); on other
	// nodes the rest describes the configuration only.
	Owner   string `json:"owner"`
	IsOwner bool   `json:"is_owner"`
	Status
	WrittenPercent float64 `json:"written_percent"`
	Writes         uint64  `json:"writes"`
	LastWriteError string  `json:"last_write_error,omitempty"`
}

var errNoController = errors.New("no backlog_controller in the runtime config (tollgate limits set --global backlog_controller.kind=… target=… period=… kp=…)")

// NewOwner returns the node's owner (idle until the node leads the order
// group) and registers the controller's metrics.
func NewOwner(cfg OwnerConfig) *Owner {
	sc := &Owner{cfg: cfg, ctl: New(Params{})}
	cfg.Registerer.MustRegister(NewCollector(sc.ctl))
	return sc
}

// Run steps the owner until stop is closed.
func (sc *Owner) Run(stop <-chan struct{}) {
	t := time.NewTicker(samplingLoopTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			sc.step(sc.cfg.Clock())
		}
	}
}

// paramsOf converts the document's block to controller parameters.
func paramsOf(bc *runtimecfg.BacklogController) Params {
	return Params{Kind: bc.Kind, Target: bc.Target, Period: bc.Period, Kp: bc.Kp, Ki: bc.Ki, MinPercent: bc.MinPercent}
}

// syncLocked follows ownership and the replicated parameters; it returns
// group 0's document when this node is the owner.
func (sc *Owner) syncLocked() (*runtimecfg.Document, bool) {
	owner := sc.cfg.Port.Leads(runtimecfgsvc.OrderGroup)
	if !owner {
		if sc.owner {
			sc.owner, sc.bcSet, sc.hasOutput = false, false, false
			sc.ctl.SetParams(Params{}) // drop state: a later term starts afresh
			sc.cfg.Logger.Info("backlog controller: no longer the config owner; stopped")
		}
		return nil, false
	}
	doc := sc.cfg.Replica()
	bc := doc.Global.BacklogController
	became := !sc.owner
	if became || !sc.bcSet || !sameBC(bc, sc.bc) {
		if became {
			sc.ctl.SetParams(Params{}) // fresh state for this term
		}
		sc.owner, sc.bcSet, sc.bc = true, true, bc
		if bc == nil {
			sc.ctl.SetParams(Params{})
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

func (sc *Owner) logStateLocked(became bool) {
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
		sc.cfg.Logger.Info(msg, args...)
	} else {
		sc.cfg.Logger.Warn(msg, args...)
	}
}

// step runs one loop iteration: follow the config, tick the controller, and
// write its output when the rules above say so.
func (sc *Owner) step(now time.Time) {
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
	_, err := sc.cfg.SetLimits(ctx, &api.SetLimitsRequest{Global: true,
		Set: map[string]string{limits.SampleRateKey(kind): strconv.FormatFloat(want, 'f', -1, 64)}})
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err != nil {
		if sc.writeErr == nil || sc.writeErr.Error() != err.Error() {
			sc.cfg.Logger.Warn("backlog controller: writing the global sample rate failed; retrying next period", "kind", kind, "percent", want, "err", err)
		}
		sc.writeErr = err
		return
	}
	sc.writeErr = nil
	sc.written = want
	sc.writes++
	sc.cfg.Logger.Debug("backlog controller: wrote the global sample rate", "kind", kind, "percent", want, "input", st.InputBacklog)
}

// worthWriting: a move of minWriteDelta points or more, or one that reaches
// a bound exactly (so the rate can get back to 100 % from 99.8 %).
func worthWriting(want, cur float64, p Params) bool {
	if want == cur {
		return false
	}
	if math.Abs(want-cur) >= minWriteDelta {
		return true
	}
	return want == p.MinPercent || want == p.MaxPercent
}

// ReportBacklog implements Reporter for the HTTP handler: on the
// owner into the controller, elsewhere forwarded to the owner.
func (sc *Owner) ReportBacklog(kind, source string, backlog float64, now time.Time) (Status, error) {
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
		return Status{}, reportError(err)
	}
	return stateFromProto(resp.Status).Status, nil
}

func (sc *Owner) forward(ctx context.Context, req *api.ReportBacklogRequest) (*api.ReportBacklogResponse, error) {
	cc, fctx, err := sc.cfg.Port.LeaderConn(ctx, runtimecfgsvc.OrderGroup)
	if err != nil {
		return nil, err
	}
	return api.NewConfigClient(cc).ReportBacklog(fctx, req)
}

// remoteReportError carries the owner's message and the sentinel
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
		kind = ErrInvalidBacklog
	case codes.FailedPrecondition:
		kind = ErrUnknownKind
	case codes.ResourceExhausted:
		kind = ErrTooManySources
	default:
		kind = ErrUnavailable
	}
	return &remoteReportError{msg: st.Message(), kind: kind}
}

// State returns the controller state as this node knows it.
func (sc *Owner) State() OwnerState {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.syncLocked() // so a read right after a config change shows it
	owner := sc.cfg.LeaderOf(runtimecfgsvc.OrderGroup)
	out := OwnerState{Owner: owner, IsOwner: sc.owner, WrittenPercent: sc.written, Writes: sc.writes}
	if sc.owner {
		out.Owner = sc.cfg.Port.NodeID()
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
	doc := sc.cfg.Newest()
	if bc := doc.Global.BacklogController; bc != nil {
		out.Status = New(paramsOf(bc)).Status()
		out.Status.OutputPercent = doc.GlobalSampleRate(bc.Kind)
	} else {
		out.Status.Reason = errNoController.Error()
	}
	return out
}

// Proto is the state on the wire.
func (st OwnerState) Proto() *api.SamplingControllerStatus {
	return &api.SamplingControllerStatus{Owner: st.Owner, Kind: st.Kind, Enabled: st.Enabled, Reason: st.Reason,
		OutputPercent: st.OutputPercent, WrittenPercent: st.WrittenPercent, InputBacklog: st.InputBacklog, HasInput: st.HasInput,
		TargetBacklog: st.Target, Sources: uint32(st.Sources), Steps: st.Steps, Reports: st.Reports, RejectedReports: st.Rejected,
		Writes: st.Writes, LastWriteError: st.LastWriteError}
}

func stateFromProto(p *api.SamplingControllerStatus) OwnerState {
	return OwnerState{Owner: p.GetOwner(), WrittenPercent: p.GetWrittenPercent(), Writes: p.GetWrites(), LastWriteError: p.GetLastWriteError(),
		Status: Status{Kind: p.GetKind(), Enabled: p.GetEnabled(), Reason: p.GetReason(), OutputPercent: p.GetOutputPercent(),
			InputBacklog: p.GetInputBacklog(), HasInput: p.GetHasInput(), Target: p.GetTargetBacklog(), Sources: int(p.GetSources()),
			Steps: p.GetSteps(), Reports: p.GetReports(), Rejected: p.GetRejectedReports()}}
}

// --- gRPC: the Config service with ReportBacklog and the controller state ---

// configServer is runtimecfgsvc.Service plus what the controller adds: the
// ReportBacklog RPC and the owner's controller state in GetLimits.
type configServer struct {
	*runtimecfgsvc.Service
	sc *Owner
}

// ConfigServer is the node's Config service: svc with the owner's
// ReportBacklog and its controller state in GetLimits.
func (sc *Owner) ConfigServer(svc *runtimecfgsvc.Service) api.ConfigServer {
	return configServer{Service: svc, sc: sc}
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
	if _, err := sc.ctl.ReportBacklog(req.Kind, req.Source, req.Backlog, sc.cfg.Clock()); err != nil {
		return nil, sc.cfg.MapError(err)
	}
	return &api.ReportBacklogResponse{Status: sc.State().Proto()}, nil
}

// GetLimits adds the controller state: the owner's when the owner answers
// (here or forwarded), else this node's view of the configuration.
func (c configServer) GetLimits(ctx context.Context, req *api.GetLimitsRequest) (*api.GetLimitsResponse, error) {
	resp, err := c.Service.GetLimits(ctx, req)
	if err != nil || resp.Controller != nil { // the owner's answer, forwarded
		return resp, err
	}
	resp.Controller = c.sc.State().Proto()
	return resp, nil
}
