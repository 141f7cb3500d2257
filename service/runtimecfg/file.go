package runtimecfg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
)

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

// FileConfig is what the file proposer needs of the node.
type FileConfig struct {
	// Path is the limits file (for logs); "" disables the proposer.
	Path string
	// Reload is the file's poll period.
	Reload time.Duration
	// DataDir holds proposedFile.
	DataDir string
	// Doc returns the file's current document (immutable, replaced on reload).
	Doc func() *runtimecfg.Document
	// Ready reports whether the node can serve (a round waits until it can).
	Ready  func() bool
	Logger *slog.Logger
}

// FileProposer proposes a node's limits file as the runtime config (above).
type FileProposer struct {
	cfg FileConfig
	svc *Service

	// State of its goroutine only, besides setup.
	proposed  string // hex hash last proposed or adopted
	lastNote  string // last thing logged, so a steady state logs once
	proposeMu sync.Mutex
	// The file's document is immutable and replaced on reload: its hash is
	// computed once per document, not on every round (encoding a
	// 100,000-tenant document each round was most of an idle node's CPU).
	hashedDoc *runtimecfg.Document
	docHash   string
}

// NewFileProposer returns svc's proposer of cfg.Path, with what this node
// last proposed read from its data dir.
func NewFileProposer(svc *Service, cfg FileConfig) *FileProposer {
	rc := &FileProposer{cfg: cfg, svc: svc}
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, proposedFile)); err == nil {
		rc.proposed = strings.TrimSpace(string(b))
	}
	return rc
}

// Run proposes the limits file when the rules above say so: every
// LimitsReload (the file's own poll period) once settled, every 500 ms while
// a round could not finish (node not ready, no leader, a conflict).
func (rc *FileProposer) Run(ctx context.Context) {
	if rc.cfg.Path == "" {
		return
	}
	for {
		wait := 500 * time.Millisecond
		switch rc.proposeFile(ctx) {
		case "unchanged", "same", "adopted", "proposed", "below version 3":
			wait = max(rc.cfg.Reload, 100*time.Millisecond)
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

func (rc *FileProposer) note(msg string, args ...any) {
	if key := fmt.Sprint(msg, args); key != rc.lastNote {
		rc.lastNote = key
		rc.cfg.Logger.Info(msg, args...)
	}
}

// proposeFile runs one round of the file proposer. It reports what it did
// (for tests).
func (rc *FileProposer) proposeFile(ctx context.Context) string {
	rc.proposeMu.Lock()
	defer rc.proposeMu.Unlock()
	if !rc.cfg.Ready() {
		return "not ready"
	}
	file := rc.cfg.Doc()
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
		repl, err := FromProto(cur.Config)
		if err == nil && runtimecfg.SameContent(repl, file) {
			rc.record(h)
			return "same"
		}
		if rc.proposed == "" {
			rc.record(h)
			rc.cfg.Logger.Warn("limits file differs from the replicated runtime config, which is the truth; not proposing a file this node has not proposed before (edit it to propose it, or run tollgate limits apply -f)",
				"file", rc.cfg.Path, "version", cur.Version)
			return "adopted"
		}
	}
	exp := cur.Version
	if cur.Source != "replicated" {
		exp = 0
	}
	resp, err := rc.svc.ApplyLimits(cctx, &api.ApplyLimitsRequest{Config: ToProto(file), ExpectedVersion: &exp})
	switch status.Code(err) {
	case codes.OK:
		rc.record(h)
		rc.cfg.Logger.Info("limits file proposed as the runtime config", "file", rc.cfg.Path, "version", resp.Version, "changed", resp.Changed)
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

func (rc *FileProposer) record(h string) {
	rc.proposed = h
	path := filepath.Join(rc.cfg.DataDir, proposedFile)
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, []byte(h+"\n"), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		rc.cfg.Logger.Warn("limits file: cannot record what was proposed; it may be proposed again after a restart", "err", err)
	}
}
