package server

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
)

// Wiring of the replicated runtime configuration (fsm/runtimecfg, served by
// service/runtimecfg). Every group's FSM carries a replica; group 0 orders changes; the
// tracker of group g reads group g's replica, so a leader decides from what
// its own log committed. Until some version is replicated (a new cluster, or
// one below cluster version 3) the node's --limits-file and flags are in
// force, as before. A node's --limits-file is proposed as the runtime config
// (runtimecfgsvc.FileProposer).
type runtimeConfig struct {
	nodePort // runtimecfgsvc.Backend's node half
	s        *Server
	mods     []*runtimecfg.Module
	svc      *runtimecfgsvc.Service

	limits []atomic.Pointer[Limits]    // per group: Limits over the group's replica, rebuilt when it changes
	view   runtimecfgsvc.ViewCache     // the newest document's wire form for cluster views
	file   *runtimecfgsvc.FileProposer // proposes --limits-file
}

// setupRuntimeConfig creates the modules (before the FSMs, which carry them)
// and the service.
func (s *Server) setupRuntimeConfig() error {
	// Allocated for every group the layout allows: a raise fills the next
	// entry in place (addGroup) while readers index the others.
	rc := &runtimeConfig{nodePort: nodePort{s}, s: s, mods: make([]*runtimecfg.Module, s.groupCap()), limits: make([]atomic.Pointer[Limits], s.groupCap())}
	for g := range s.cfg.Layout.Groups {
		if err := rc.addGroup(g); err != nil {
			return err
		}
	}
	svc, err := runtimecfgsvc.New(rc, runtimecfgsvc.Options{Logger: s.log, Registerer: s.metrics.reg})
	if err != nil {
		return fmt.Errorf("runtime config: %w", err)
	}
	rc.svc = svc
	rc.file = runtimecfgsvc.NewFileProposer(svc, runtimecfgsvc.FileConfig{Path: s.cfg.Limits.File, Reload: s.cfg.Limits.Reload,
		DataDir: s.cfg.Node.DataDir, Doc: func() *runtimecfg.Document { return s.limits.Get().doc }, Ready: s.Ready, Logger: s.log})
	s.rcfg = rc
	return nil
}

// addGroup creates group g's replica module (before its FSM).
func (rc *runtimeConfig) addGroup(g int) error {
	var onChange func(*runtimecfg.Document)
	if g == runtimecfgsvc.OrderGroup {
		onChange = func(*runtimecfg.Document) {
			if rc.svc != nil {
				rc.svc.Changed()
			}
		}
	}
	rc.mods[g] = runtimecfg.New(onChange)
	return nil
}

// startRuntimeConfig starts the reconciler and the file proposer.
func (s *Server) startRuntimeConfig() {
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(3)
	go func() { defer s.wg.Done(); <-s.stop; cancel() }()
	go func() { defer s.wg.Done(); s.rcfg.svc.Run(ctx) }()
	go func() { defer s.wg.Done(); s.rcfg.file.Run(ctx) }()
}

// groupLimits returns the limits group g's leader decides with: the group's
// replica once one exists, else the file/flags.
func (s *Server) groupLimits(g int) *Limits {
	rc := s.rcfg
	d := rc.mods[g].Current()
	if d.Version == 0 {
		return s.limits.Get()
	}
	if l := rc.limits[g].Load(); l != nil && l.doc == d {
		return l
	}
	l := &Limits{doc: d, base: s.limits.base, source: "runtime config"}
	rc.limits[g].Store(l)
	return l
}

// currentLimits returns the newest replicated limits this node holds, else
// the file/flags: what the HTTP API, the dashboard and the banner show.
func (s *Server) currentLimits() *Limits {
	best, bestG := uint64(0), -1
	for g, m := range s.rcfg.mods[:s.servedGroups()] {
		if v := m.Current().Version; v > best {
			best, bestG = v, g
		}
	}
	if bestG < 0 {
		return s.limits.Get()
	}
	return s.groupLimits(bestG)
}

// RuntimeConfig returns the newest replicated configuration this node holds
// (Version 0 when none). Consumers on the server (rate state, the backlog
// controller) read limits through it or through TenantLimitsFor.
func (s *Server) RuntimeConfig() *runtimecfg.Document { return s.rcfg.svc.Newest() }

// TenantLimitsFor returns a tenant's effective limits as this node knows them
// now (replicated config, else file and flags).
func (s *Server) TenantLimitsFor(tenant string) TenantLimits { return s.currentLimits().For(tenant) }

// setViewConfig adds the newest configuration to a cluster view.
func (s *Server) setViewConfig(v *api.ClusterView) { s.rcfg.view.Set(v, s.rcfg.svc.Newest()) }

// viewConfigDelta returns the encoded delta from version from to the config
// of view v, or nil (the stream sends the whole config).
func (s *Server) viewConfigDelta(v *api.ClusterView, from uint64) []byte {
	return s.rcfg.view.Delta(v, from)
}

// --- runtimecfgsvc.Backend ---

func (rc *runtimeConfig) Module(g int) *runtimecfg.Module { return rc.mods[g] }

func (rc *runtimeConfig) Base() runtimecfg.Effective {
	return runtimecfg.Effective{MaxSeries: rc.s.limits.base.MaxSeries}
}

func (rc *runtimeConfig) Fallback() (*runtimecfg.Document, string) {
	s := rc.s
	why := "no runtime config has been replicated yet"
	if ok, lag := s.groupSupports(runtimecfgsvc.OrderGroup, 3); !ok && s.hostsGroup(runtimecfgsvc.OrderGroup) {
		why = "the cluster is below version 3 (" + strings.Join(lag, "; ") + "): each node uses its own --limits-file and flags"
	}
	l := s.limits.Get()
	if s.cfg.Limits.File != "" {
		why += "; showing " + s.cfg.Node.ID + "'s limits file " + s.cfg.Limits.File
	} else {
		why += "; " + s.cfg.Node.ID + " has no limits file (flags only)"
	}
	return l.doc, why
}
