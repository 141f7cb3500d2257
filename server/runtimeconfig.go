package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
)

// Wiring of the replicated runtime configuration (fsm/runtimecfg, served by
// service/runtimecfg). Every group's FSM carries a replica; group 0 orders changes; the
// tracker of group g reads group g's replica, so a leader decides from what
// its own log committed. Until some version is replicated (a new cluster, or
// one below cluster version 3) the node's --limits-file and flags are in
// force, as before.
//
// --limits-file is a way to propose: the replicated configuration is the
// truth. A node proposes its file's contents (compare-and-set on the version
// it read) when
//   - no configuration was ever replicated, or
//   - the file changed since this node last proposed (or first saw) it.
// A node that first sees its file while a different configuration is already
// replicated does not propose it; it logs the difference and records the
// file as seen, so two nodes with different files never overwrite each
// other in a loop. What a node last proposed is kept in
// <data-dir>/limits-file-proposed.

// proposedFile is the data-dir file remembering the last file content this
// node proposed or adopted as seen (hex SHA-256 of its canonical encoding).
const proposedFile = "limits-file-proposed"

type runtimeConfig struct {
	nodePort // runtimecfgsvc.Backend's node half
	s        *Server
	mods     []*runtimecfg.Module
	svc      *runtimecfgsvc.Service

	limits []atomic.Pointer[Limits] // per group: Limits over the group's replica, rebuilt when it changes
	view   atomic.Pointer[viewConfig]

	// File proposer state (its goroutine only, besides setup).
	proposed  string // hex hash last proposed or adopted
	lastNote  string // last thing logged, so a steady state logs once
	proposeMu sync.Mutex
	// The file's document is immutable and replaced on reload: its hash is
	// computed once per document, not on every round (encoding a
	// 100,000-tenant document each round was most of an idle node's CPU).
	hashedDoc *runtimecfg.Document
	docHash   string
}

// viewConfig caches the wire form of the newest document for cluster views,
// and what changed since the one before it: a WatchCluster stream that asked
// for deltas and carried version deltaFrom last gets deltaField (field
// runtime_config_delta of ClusterView, encoded once for every stream)
// instead of the whole document.
type viewConfig struct {
	doc        *runtimecfg.Document
	pb         *api.RuntimeConfig
	deltaFrom  uint64 // 0: no delta
	deltaField []byte
}

// configDeltaField encodes d as field runtime_config_delta of a ClusterView:
// appended to an encoded view without a runtime config, it makes the view
// carry the delta (protobuf concatenation is merge).
func configDeltaField(d *api.RuntimeConfigDelta) ([]byte, error) {
	b, err := proto.Marshal(d)
	if err != nil {
		return nil, err
	}
	num := (&api.ClusterView{}).ProtoReflect().Descriptor().Fields().ByName("runtime_config_delta").Number()
	out := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(out, b), nil
}

// viewConfigDelta returns the encoded delta from version `from` to the
// config of view v, or nil when the node holds none (the stream sends the
// whole config).
func (s *Server) viewConfigDelta(v *api.ClusterView, from uint64) []byte {
	vc := s.rcfg.view.Load()
	if vc == nil || vc.pb != v.RuntimeConfig || vc.deltaFrom == 0 || vc.deltaFrom != from {
		return nil
	}
	return vc.deltaField
}

// setupRuntimeConfig creates the modules (before the FSMs, which carry them)
// and the service.
func (s *Server) setupRuntimeConfig() error {
	rc := &runtimeConfig{nodePort: nodePort{s}, s: s, mods: make([]*runtimecfg.Module, s.cfg.Groups), limits: make([]atomic.Pointer[Limits], s.cfg.Groups)}
	for g := range rc.mods {
		var onChange func(*runtimecfg.Document)
		if g == runtimecfgsvc.OrderGroup {
			onChange = func(*runtimecfg.Document) {
				if rc.svc != nil {
					rc.svc.Changed()
				}
			}
		}
		rc.mods[g] = runtimecfg.New(onChange)
	}
	svc, err := runtimecfgsvc.New(rc, runtimecfgsvc.Options{Logger: s.log, Registerer: s.metrics.reg})
	if err != nil {
		return fmt.Errorf("runtime config: %w", err)
	}
	rc.svc = svc
	if b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, proposedFile)); err == nil {
		rc.proposed = strings.TrimSpace(string(b))
	}
	s.rcfg = rc
	return nil
}

// startRuntimeConfig starts the reconciler and the file proposer.
func (s *Server) startRuntimeConfig() {
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(3)
	go func() { defer s.wg.Done(); <-s.stop; cancel() }()
	go func() { defer s.wg.Done(); s.rcfg.svc.Run(ctx) }()
	go func() { defer s.wg.Done(); s.rcfg.fileLoop(ctx) }()
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
	for g, m := range s.rcfg.mods {
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
func (s *Server) setViewConfig(v *api.ClusterView) {
	rc := s.rcfg
	d := rc.svc.Newest()
	if d.Version == 0 {
		return
	}
	vc := rc.view.Load()
	if vc == nil || vc.doc != d {
		pb := runtimecfgsvc.ToProto(d)
		// Distributors have no use for the Envoy rate limit rules, which
		// can be large: every view would carry them to every client.
		pb.Envoy = nil
		next := &viewConfig{doc: d, pb: pb}
		if vc != nil && vc.pb.GetVersion() != 0 && vc.pb.GetVersion() < d.Version {
			// Once per version, one comparison per tenant; every stream
			// that holds the previous version then gets the change only.
			if f, err := configDeltaField(api.ConfigDelta(vc.pb, pb)); err == nil {
				next.deltaFrom, next.deltaField = vc.pb.GetVersion(), f
			}
		}
		vc = next
		rc.view.Store(vc)
	}
	v.ConfigVersion, v.RuntimeConfig = d.Version, vc.pb
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
	if s.cfg.LimitsFile != "" {
		why += "; showing " + s.cfg.NodeID + "'s limits file " + s.cfg.LimitsFile
	} else {
		why += "; " + s.cfg.NodeID + " has no limits file (flags only)"
	}
	return l.doc, why
}

// --- the limits file as a proposal ---

// fileLoop proposes the limits file when the rules above say so: every
// LimitsReload (the file's own poll period) once settled, every 500 ms while
// a round could not finish (node not ready, no leader, a conflict).
func (rc *runtimeConfig) fileLoop(ctx context.Context) {
	if rc.s.cfg.LimitsFile == "" {
		return
	}
	for {
		wait := 500 * time.Millisecond
		switch rc.proposeFile(ctx) {
		case "unchanged", "same", "adopted", "proposed", "below version 3":
			wait = max(rc.s.cfg.LimitsReload, 100*time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func fileHash(d *runtimecfg.Document) string {
	sum := sha256.Sum256(runtimecfg.AppendBody(nil, d))
	return hex.EncodeToString(sum[:])
}

func (rc *runtimeConfig) note(msg string, args ...any) {
	if key := fmt.Sprint(msg, args); key != rc.lastNote {
		rc.lastNote = key
		rc.s.log.Info(msg, args...)
	}
}

// proposeFile runs one round of the file proposer. It reports what it did
// (for tests).
func (rc *runtimeConfig) proposeFile(ctx context.Context) string {
	rc.proposeMu.Lock()
	defer rc.proposeMu.Unlock()
	s := rc.s
	if !s.Ready() {
		return "not ready"
	}
	file := s.limits.Get().doc
	if file != rc.hashedDoc {
		rc.hashedDoc, rc.docHash = file, fileHash(file)
	}
	h := rc.docHash
	if h == rc.proposed {
		return "unchanged"
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cur, err := rc.svc.GetLimits(cctx, &api.GetLimitsRequest{})
	if err != nil {
		rc.note("limits file: cannot read the replicated config; will retry", "err", err)
		return "read failed"
	}
	if cur.Source == "replicated" {
		repl, err := runtimecfgsvc.FromProto(cur.Config)
		if err == nil && runtimecfg.SameContent(repl, file) {
			rc.record(h)
			return "same"
		}
		if rc.proposed == "" {
			rc.record(h)
			s.log.Warn("limits file differs from the replicated runtime config, which is the truth; not proposing a file this node has not proposed before (edit it to propose it, or run tollgate limits apply -f)",
				"file", s.cfg.LimitsFile, "version", cur.Version)
			return "adopted"
		}
	}
	exp := cur.Version
	if cur.Source != "replicated" {
		exp = 0
	}
	resp, err := rc.svc.ApplyLimits(cctx, &api.ApplyLimitsRequest{Config: runtimecfgsvc.ToProto(file), ExpectedVersion: &exp})
	switch status.Code(err) {
	case codes.OK:
		rc.record(h)
		s.log.Info("limits file proposed as the runtime config", "file", s.cfg.LimitsFile, "version", resp.Version, "changed", resp.Changed)
		return "proposed"
	case codes.FailedPrecondition:
		rc.note("limits file stays in force on this node: the replicated runtime config needs cluster version 3 on every node", "reason", status.Convert(err).Message())
		return "below version 3"
	case codes.Aborted:
		return "conflict" // someone changed it meanwhile: look again next round
	}
	rc.note("limits file: proposing failed; will retry", "err", err)
	return "failed"
}

func (rc *runtimeConfig) record(h string) {
	rc.proposed = h
	path := filepath.Join(rc.s.cfg.DataDir, proposedFile)
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, []byte(h+"\n"), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		rc.s.log.Warn("limits file: cannot record what was proposed; it may be proposed again after a restart", "err", err)
	}
}
