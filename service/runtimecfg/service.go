package runtimecfg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/nodeport"
)

// OrderGroup is the group whose log orders configuration changes.
const OrderGroup = 0

// Backend is what the service needs of the node (the server implements it):
// the node's port (leadership, proposals, the leader's connection) and the
// configuration state this node holds.
type Backend interface {
	nodeport.Port
	// Module is this node's replica of group g's configuration; nil when the
	// node holds no replica of g.
	Module(g int) *runtimecfg.Module
	// Fallback is the node's limits file as a document, and why it is in
	// force, for when no replicated version exists yet.
	Fallback() (*runtimecfg.Document, string)
	// Base is the node's base limits (its --default-max-series).
	Base() runtimecfg.Effective
}

// leader is a Config client for group g's leader and the context to call it
// with (nodeport: forwarded at most once, with the caller's credential).
func (s *Service) leader(ctx context.Context, g int) (api.ConfigClient, context.Context, error) {
	cc, fctx, err := s.b.LeaderConn(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	return api.NewConfigClient(cc), fctx, nil
}

// propose appends a runtime-config entry to group g, led here, and returns
// the module's result.
func (s *Service) propose(ctx context.Context, g int, typ byte, payload []byte) (runtimecfg.Result, error) {
	out, err := s.b.Propose(ctx, g, typ, payload)
	if err != nil {
		return runtimecfg.Result{}, err
	}
	res, ok := out.(runtimecfg.Result)
	if !ok {
		return runtimecfg.Result{}, status.Errorf(codes.Internal, "group %d: runtime config entry applied with an unexpected result %T", g, out)
	}
	return res, nil
}

// Service implements api.ConfigServer and runs the reconciler.
type Service struct {
	api.UnimplementedConfigServer
	b    Backend
	opt  Options
	log  *slog.Logger
	m    *metrics
	poke chan struct{}

	mu sync.Mutex
	// known is, for the reconciler, each group's version as last reported
	// (absent: not asked yet). A map, not a table sized at New: groups are
	// added while the node runs.
	known   map[int]uint64
	maxSeen uint64 // highest version any group reported (orderer's floor)
}

// Options configure a Service.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are not registered
	// ReplicateWait bounds how long a change waits for the other groups
	// before replying (the reconciler finishes the job). Default 2s.
	ReplicateWait time.Duration
	// ReconcileEvery is the reconciler's period besides its wake-ups on
	// change. Default 1s.
	ReconcileEvery time.Duration
	// RecheckEvery is how often the reconciler forgets the versions other
	// groups reported and asks them again, which is how it notices a group
	// restored from a backup elsewhere. Default 30s.
	RecheckEvery time.Duration
}

// New returns a service over b.
func New(b Backend, o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReplicateWait <= 0 {
		o.ReplicateWait = 2 * time.Second
	}
	if o.ReconcileEvery <= 0 {
		o.ReconcileEvery = time.Second
	}
	if o.RecheckEvery <= 0 {
		o.RecheckEvery = 30 * time.Second
	}
	s := &Service{b: b, opt: o, log: o.Logger, poke: make(chan struct{}, 1), known: map[int]uint64{}}
	m, err := newMetrics(o.Registerer, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// Changed wakes the reconciler; call it when the order group's replica
// changes (the module's onChange; it never blocks).
func (s *Service) Changed() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// Newest returns the newest replica this node holds (versions are ordered by
// group 0, so the highest is the newest), or the empty document.
func (s *Service) Newest() *runtimecfg.Document {
	best := &runtimecfg.Document{}
	for g := range s.b.Groups() {
		if m := s.b.Module(g); m != nil {
			if d := m.Current(); d.Version > best.Version {
				best = d
			}
		}
	}
	return best
}

func (s *Service) groupVersions() []uint64 {
	out := make([]uint64, s.b.Groups())
	for g := range out {
		if m := s.b.Module(g); m != nil {
			out[g] = m.Current().Version
		}
	}
	return out
}

// GetLimits answers from group 0's leader (forwarded once) so that a read
// after a change sees it; when no leader is reachable, from the newest local
// replica.
func (s *Service) GetLimits(ctx context.Context, req *api.GetLimitsRequest) (*api.GetLimitsResponse, error) {
	if req.Tenant != "" {
		if err := api.ValidateTenantID(req.Tenant); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "tenant: %v", err)
		}
	}
	var doc *runtimecfg.Document
	if s.b.Leads(OrderGroup) {
		doc = s.b.Module(OrderGroup).Current()
	} else if c, fctx, err := s.leader(ctx, OrderGroup); err == nil {
		if resp, err := c.GetLimits(fctx, req); err == nil {
			return resp, nil
		} else if st := status.Code(err); st == codes.InvalidArgument || st == codes.PermissionDenied || st == codes.Unauthenticated {
			return nil, err
		}
		doc = s.Newest()
	} else {
		doc = s.Newest()
	}
	resp := &api.GetLimitsResponse{Version: doc.Version, Source: "replicated", GroupVersions: s.groupVersions(), ServedBy: s.b.NodeID()}
	if doc.Version == 0 {
		var why string
		doc, why = s.b.Fallback()
		resp.Source, resp.SourceReason = "file", why
	}
	if req.Tenant == "" {
		resp.Config = ToProto(doc)
	} else {
		part := &runtimecfg.Document{Version: doc.Version, Defaults: doc.Defaults}
		if sc, ok := doc.Tenants[req.Tenant]; ok {
			part.Tenants = map[string]runtimecfg.Scope{req.Tenant: sc}
		}
		resp.Config = ToProto(part)
		e := doc.For(req.Tenant, s.b.Base())
		resp.Effective = &api.TenantLimits{MaxSeries: &e.MaxSeries, MaxSeriesPerPartition: &e.MaxSeriesPerPartition,
			IngestionRate: &e.IngestionRate, IngestionBurst: &e.IngestionBurst}
	}
	resp.Config.Version = resp.Version
	return resp, nil
}

// patchOf turns a SetLimits request into a patch: clear first, then the sets
// in key order, then the unsets (a fixed order, so equal requests make equal
// entries).
func patchOf(req *api.SetLimitsRequest) (runtimecfg.Patch, error) {
	var p runtimecfg.Patch
	n := 0
	if req.Tenant != "" {
		n++
		if err := api.ValidateTenantID(req.Tenant); err != nil {
			return p, status.Errorf(codes.InvalidArgument, "tenants.%s: %v", req.Tenant, err)
		}
		p.Target = runtimecfg.Target{Kind: runtimecfg.TargetTenant, Tenant: req.Tenant}
	}
	if req.Defaults {
		n++
		p.Target = runtimecfg.Target{Kind: runtimecfg.TargetDefaults}
	}
	if req.Global {
		n++
		p.Target = runtimecfg.Target{Kind: runtimecfg.TargetGlobal}
	}
	if n != 1 {
		return p, status.Error(codes.InvalidArgument, "set limits: name exactly one scope: a tenant, defaults or global")
	}
	if !req.Clear && len(req.Set) == 0 && len(req.Unset) == 0 {
		return p, status.Error(codes.InvalidArgument, "set limits: nothing to change (give key=value pairs, unset keys or clear)")
	}
	if req.Clear {
		p.Ops = append(p.Ops, runtimecfg.Op{Kind: runtimecfg.OpClear})
	}
	keys := make([]string, 0, len(req.Set))
	for k := range req.Set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p.Ops = append(p.Ops, runtimecfg.Op{Kind: runtimecfg.OpSet, Key: k, Value: req.Set[k]})
	}
	for _, k := range req.Unset {
		p.Ops = append(p.Ops, runtimecfg.Op{Kind: runtimecfg.OpUnset, Key: k})
	}
	if req.ExpectedVersion != nil {
		p.HasExpected, p.Expected = true, *req.ExpectedVersion
	}
	return p, nil
}

// SetLimits patches one scope on group 0's leader.
func (s *Service) SetLimits(ctx context.Context, req *api.SetLimitsRequest) (*api.LimitsChangeResponse, error) {
	p, err := patchOf(req)
	if err != nil {
		s.m.errors.WithLabelValues("invalid").Inc()
		return nil, err
	}
	// Check against the current document before anything moves (the FSM
	// checks again, alike on every replica). Only group 0's leader's verdict
	// is final: a patch is valid or not against the document it extends, and
	// a follower's copy may not have the last change yet (a patch that
	// completes a section set a moment ago would be refused here). A follower
	// forwards, and gives its own refusal only when no leader answers.
	_, checkErr := s.Newest().ApplyPatch(p)
	if !s.b.Leads(OrderGroup) {
		c, fctx, err := s.leader(ctx, OrderGroup)
		if err != nil {
			if checkErr != nil {
				return nil, s.refusal(checkErr)
			}
			return nil, s.unavailable(err)
		}
		return c.SetLimits(fctx, req)
	}
	if checkErr != nil {
		return nil, s.refusal(checkErr)
	}
	res, err := s.propose(ctx, OrderGroup, runtimecfg.TypePatch, runtimecfg.AppendPatch(nil, p))
	if err != nil {
		return nil, s.proposeErr(err)
	}
	if res.Err != nil {
		return nil, s.refusal(res.Err)
	}
	return s.changed(ctx, "set", p.Target.Path(), res), nil
}

// ApplyLimits replaces the whole document on group 0's leader.
func (s *Service) ApplyLimits(ctx context.Context, req *api.ApplyLimitsRequest) (*api.LimitsChangeResponse, error) {
	if req.Config == nil {
		s.m.errors.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, "apply limits: config is required (an empty document clears every setting)")
	}
	doc, err := FromProto(req.Config)
	if err != nil {
		return nil, s.refusal(err)
	}
	if !s.b.Leads(OrderGroup) {
		c, fctx, err := s.leader(ctx, OrderGroup)
		if err != nil {
			return nil, s.unavailable(err)
		}
		return c.ApplyLimits(fctx, req)
	}
	// Without an expected version the document replaces whatever is current;
	// an entry still in the pipeline may move the version under us, so a
	// conflict is retried a few times.
	for attempt := 0; ; attempt++ {
		cur := s.b.Module(OrderGroup).Current()
		expected := cur.Version
		if req.ExpectedVersion != nil {
			expected = *req.ExpectedVersion
		}
		a := runtimecfg.Apply{Expected: expected, NewVersion: max(cur.Version, s.floor()) + 1, Doc: doc}
		res, err := s.propose(ctx, OrderGroup, runtimecfg.ApplyType(a.Doc), runtimecfg.AppendApply(nil, a))
		if err != nil {
			return nil, s.proposeErr(err)
		}
		var ce *runtimecfg.ConflictError
		if errors.As(res.Err, &ce) && req.ExpectedVersion == nil && attempt < 3 {
			continue
		}
		if res.Err != nil {
			return nil, s.refusal(res.Err)
		}
		return s.changed(ctx, "apply", "document", res), nil
	}
}

// changed finishes a successful change: copy it into the other groups
// (bounded wait) and build the reply.
func (s *Service) changed(ctx context.Context, op, what string, res runtimecfg.Result) *api.LimitsChangeResponse {
	resp := &api.LimitsChangeResponse{Version: res.Version, Changed: res.Changed}
	if res.Changed {
		s.m.changes.WithLabelValues(op).Inc()
		s.log.Info("runtime config changed", "op", op, "scope", what, "version", res.Version)
	}
	// Copying into the other groups is this node's own work as group 0's
	// leader, not the caller's: a change forwarded here from a follower must
	// still reach the groups led elsewhere (a forwarded call may not be
	// forwarded again).
	at, groups := s.replicateAll(forward.Own(ctx), res.Version)
	resp.GroupsAtVersion, resp.Groups = uint32(at), uint32(groups)
	return resp
}

func (s *Service) refusal(err error) error {
	var ce *runtimecfg.ConflictError
	if errors.As(err, &ce) {
		s.m.errors.WithLabelValues("conflict").Inc()
		return status.Error(codes.Aborted, err.Error())
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	s.m.errors.WithLabelValues("invalid").Inc()
	return status.Errorf(codes.InvalidArgument, "%v (nothing was applied)", err)
}

func (s *Service) proposeErr(err error) error {
	switch status.Code(err) {
	case codes.FailedPrecondition:
		s.m.errors.WithLabelValues("cluster_version").Inc()
	default:
		s.m.errors.WithLabelValues("unavailable").Inc()
	}
	return err
}

func (s *Service) unavailable(err error) error {
	s.m.errors.WithLabelValues("unavailable").Inc()
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.Unavailable, "runtime config: %v", err)
}

// ReplicateLimits installs the orderer's version in one group, on its leader.
func (s *Service) ReplicateLimits(ctx context.Context, req *api.ReplicateLimitsRequest) (*api.ReplicateLimitsResponse, error) {
	g := int(req.Group)
	if n := s.b.Groups(); g >= n {
		return nil, status.Errorf(codes.InvalidArgument, "group %d out of range: this cluster has %d groups", g, n)
	}
	doc, err := runtimecfg.DecodeDocument(req.Document)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "replicate limits: %v", err)
	}
	if !s.b.Leads(g) {
		c, fctx, err := s.leader(ctx, g)
		if err != nil {
			return nil, s.unavailable(err)
		}
		return c.ReplicateLimits(fctx, req)
	}
	if cur := s.b.Module(g).Current(); cur.Version >= doc.Version {
		return &api.ReplicateLimitsResponse{Version: cur.Version}, nil
	}
	res, err := s.propose(ctx, g, runtimecfg.InstallType(doc), runtimecfg.AppendInstall(nil, doc))
	if err != nil {
		return nil, err
	}
	return &api.ReplicateLimitsResponse{Version: res.Version}, nil
}

func (s *Service) floor() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxSeen
}

// replicateOne brings group g to the orderer's document d (here when this
// node leads g, else through g's leader) and returns g's version.
func (s *Service) replicateOne(ctx context.Context, g int, d *runtimecfg.Document) (uint64, error) {
	resp, err := s.ReplicateLimits(ctx, &api.ReplicateLimitsRequest{Group: uint32(g), Document: runtimecfg.AppendDocument(nil, d)})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.known[g] = resp.Version
	s.maxSeen = max(s.maxSeen, resp.Version)
	s.mu.Unlock()
	return resp.Version, nil
}

// replicateAll copies group 0's current document into every group that does
// not report it yet, in parallel, waiting at most the replicate timeout. It
// returns how many groups hold version want (or newer), of how many. Groups
// added since the last call are among them: each call reads the count.
func (s *Service) replicateAll(ctx context.Context, want uint64) (atVersion, groups int) {
	ctx, cancel := context.WithTimeout(ctx, s.opt.ReplicateWait)
	defer cancel()
	// One reading of the count for the whole pass: it can grow between two.
	groups = s.b.Groups()
	d := s.b.Module(OrderGroup).Current()
	if d.Version == 0 {
		return 0, groups
	}
	at := make([]bool, groups)
	var wg sync.WaitGroup
	for g := range groups {
		if g == OrderGroup {
			at[g] = d.Version >= want
			continue
		}
		if m := s.b.Module(g); m != nil && m.Current().Version == d.Version {
			at[g] = d.Version >= want
			continue
		}
		s.mu.Lock()
		k := s.known[g]
		s.mu.Unlock()
		if k == d.Version {
			at[g] = d.Version >= want
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := s.replicateOne(ctx, g, d)
			if err != nil {
				s.log.Debug("runtime config: replicate to group failed; the reconciler retries", "group", g, "version", d.Version, "err", err)
				return
			}
			at[g] = v >= want
		}()
	}
	wg.Wait()
	n := 0
	for _, ok := range at {
		if ok {
			n++
		}
	}
	return n, groups
}

// Run is the reconciler: while this node leads group 0 it keeps every group's
// replica at group 0's version, on every change of group 0 and every period.
// If some group reports a version above group 0's, or group 0's version went
// back (both after a restore of an older backup), it re-issues group 0's
// document under a version above every one it has seen, so a version number
// always names one document and copies and clients keep moving forward. It
// returns when ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.opt.ReconcileEvery)
	defer t.Stop()
	forget := time.Now().Add(s.opt.RecheckEvery)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.poke:
		}
		if time.Now().After(forget) {
			// Versions learned from other nodes may be stale after a restore
			// there: ask everyone again now and then.
			s.mu.Lock()
			clear(s.known)
			s.mu.Unlock()
			forget = time.Now().Add(s.opt.RecheckEvery)
		}
		if !s.b.Leads(OrderGroup) {
			s.mu.Lock()
			clear(s.known)
			s.mu.Unlock()
			continue
		}
		d := s.b.Module(OrderGroup).Current()
		if d.Version == 0 {
			continue
		}
		// Remember the highest version group 0 ever had here: a restore of
		// an older backup moves it back, and clients (which only move
		// forward) would ignore the restored document under an old number.
		s.mu.Lock()
		s.maxSeen = max(s.maxSeen, d.Version)
		s.mu.Unlock()
		s.replicateAll(ctx, d.Version)
		if fl := s.floor(); fl > d.Version {
			s.reassert(ctx, d, fl)
		}
	}
}

func (s *Service) reassert(ctx context.Context, d *runtimecfg.Document, floor uint64) {
	a := runtimecfg.Apply{Expected: d.Version, NewVersion: floor + 1, Force: true, Doc: d}
	res, err := s.propose(ctx, OrderGroup, runtimecfg.ApplyType(a.Doc), runtimecfg.AppendApply(nil, a))
	if err == nil && res.Err == nil {
		s.log.Warn("runtime config: a group held a version above group 0's (restored from an older backup?); group 0's document re-asserted above it",
			"group0_version", d.Version, "seen", floor, "new_version", res.Version)
		s.Changed()
		return
	}
	s.log.Warn("runtime config: re-assert failed; retrying", "err", fmt.Sprint(err, res.Err))
}
