package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/datadir"
	"github.com/tollgate-io/tollgate/fsm"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/layout/layoutfile"
	"github.com/tollgate-io/tollgate/nodeid"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/service/layouttable"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
)

// Options selects what to recover on a stopped node's data dir.
type Options struct {
	DataDir string // the node's --data-dir (holds cluster.json and raft/)
	NodeID  string // the node's --node-id
	// Groups to recover; empty: every group in which this node holds raft
	// state.
	Groups []int
	// Voters are the ids of the servers the recovered configuration keeps,
	// each with the address and suffrage-to-be (voter) it has in the old
	// configuration; empty: NodeID alone. Every server listed must run the
	// same recovery with the same list before any of them starts.
	Voters []string
	Logger *slog.Logger
}

// Plan is what Apply will do; it holds the data dir's lock (no node can
// start on it) until Close.
type Plan struct {
	opts                       Options
	Partitions, Groups, Shards int // Groups: the raft groups the data dir holds, a raise's too
	Base                       int // the count the cluster was created with (cluster.json)
	Plans                      []cluster.GroupRecovery
	dir                        *datadir.Dir
}

// Recovered is the outcome of one group's recovery.
type Recovered struct {
	Group        int
	Series       int64
	Tenants      int
	AppliedIndex uint64 // the state machine's (what status shows)
}

// Prepare reads a stopped node's data dir and works out, per group, the
// configuration it has and the one recovery gives it. It changes nothing. It
// refuses a data dir a node is running on, one that is not a Tollgate data dir,
// a group in which this node holds no state or is not in the configuration
// (its data may be stale), and voters that are not in the old configuration.
// A group whose configuration already is the new one is skipped.
func Prepare(opts Options) (_ *Plan, err error) {
	if opts.DataDir == "" || opts.NodeID == "" {
		return nil, errors.New("recover: the node's data dir and node id are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, "cluster.json")); err != nil {
		return nil, fmt.Errorf("recover: %s is not the data dir of a tollgate node (%w)", opts.DataDir, err)
	}
	// The data dir names its node (identity.go): a recovery under another
	// id would write a configuration this node is not in, report success
	// and leave the replica down.
	if b, err := os.ReadFile(filepath.Join(opts.DataDir, nodeid.File)); err == nil {
		var id nodeid.Identity
		if err := json.Unmarshal(b, &id); err != nil {
			return nil, fmt.Errorf("recover: node identity %s is corrupt: %w", filepath.Join(opts.DataDir, nodeid.File), err)
		}
		if id.NodeID != opts.NodeID {
			return nil, fmt.Errorf("recover: data dir %s belongs to node %q, not %q: run the recovery with --node-id %s (nothing was changed)",
				opts.DataDir, id.NodeID, opts.NodeID, id.NodeID)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("recover: node identity: %w", err)
	}
	dir, err := datadir.Open(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w (recovery runs on a stopped node)", err)
	}
	defer func() {
		if err != nil {
			_ = dir.Release(false)
		}
	}()
	layout, err := layoutfile.Read(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	raftDir := filepath.Join(opts.DataDir, "raft")
	// A raise's groups are recovered too: the data dir lists them (a group
	// left without its quorum holds the partitions moved into it).
	listed, err := raftnode.ListedGroups(raftDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	p := &Plan{opts: opts, Partitions: layout.Partitions, Groups: max(layout.Groups, listed), Base: layout.Groups, Shards: layout.Shards, dir: dir}
	explicit := len(opts.Groups) > 0
	gs := opts.Groups
	if !explicit {
		for g := range p.Groups {
			gs = append(gs, g)
		}
	}
	keep := opts.Voters
	if len(keep) == 0 {
		keep = []string{opts.NodeID}
	} else if !slices.Contains(keep, opts.NodeID) {
		return nil, fmt.Errorf("recover: --voters %s does not include this node (%s): run the recovery on the nodes that stay", strings.Join(keep, ","), opts.NodeID)
	}
	var errs []error
	for _, g := range gs {
		if g < 0 || g >= p.Groups {
			errs = append(errs, fmt.Errorf("group %d: the cluster has groups 0..%d", g, p.Groups-1))
			continue
		}
		og, err := raftnode.InspectGroup(raftDir, g)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		gr, err := cluster.PlanGroupRecovery(og, opts.NodeID, opts.DataDir, keep, explicit)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.Plans = append(p.Plans, gr)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("recover: %w; nothing was changed", err)
	}
	return p, nil
}

// Apply rewrites every planned group, in order, and stops at the first error
// (groups done before it stay recovered; running the same plan again skips
// them).
func (p *Plan) Apply() ([]Recovered, error) {
	var out []Recovered
	raftDir := filepath.Join(p.opts.DataDir, "raft")
	for _, gr := range p.Plans {
		if gr.Skip != "" {
			continue
		}
		f, err := FSM(p.Partitions, p.Groups, p.Base, p.Shards, gr.Group, p.opts.Logger)
		if err != nil {
			return out, fmt.Errorf("recover group %d: %w", gr.Group, err)
		}
		if err := raftnode.RecoverGroup(raftDir, gr.Group, p.opts.NodeID, f, gr.New, p.opts.Logger); err != nil {
			if h, why := f.Halted(); h {
				err = fmt.Errorf("%w (the state machine halted while replaying the log: %s)", err, why)
			}
			return out, fmt.Errorf("%w; group %d was not changed", err, gr.Group)
		}
		st := f.Stats()
		out = append(out, Recovered{Group: gr.Group, Series: st.Series, Tenants: st.Tenants, AppliedIndex: st.AppliedIndex})
	}
	return out, nil
}

// NodeID is the node whose data dir the plan is for.
func (p *Plan) NodeID() string { return p.opts.NodeID }

// DataDir is the data dir the plan rewrites.
func (p *Plan) DataDir() string { return p.opts.DataDir }

// Close releases the data dir's lock.
func (p *Plan) Close() error { return p.dir.Release(false) }

// FSM builds group g's state machine with the modules a node gives it
// (package server's TestRecoveryFSMMatchesServer keeps the two in step): RecoverCluster writes
// this FSM's snapshot as the group's whole state. groups is the count the
// node runs, base the one the cluster was created with.
func FSM(partitions, groups, base, shardCount, g int, log *slog.Logger) (*fsm.FSM, error) {
	sh, err := shares.New(g, sharessvc.ModuleGroups(g, base))
	if err != nil {
		return nil, err
	}
	mt := fsmmeter.New(g)
	lo, hi := layout.GroupSpan(g, partitions, base)
	mt.SetHome(partitions, lo, hi)
	mods := []fsm.Module{sh, runtimecfg.New(nil), mt}
	if g == layouttable.OrderGroup {
		mods = append(mods, fsmlayout.New(partitions, base, nil))
	}
	pm := partmove.New(g, partitions, base)
	f, err := fsm.New(fsm.Config{Partitions: partitions, Groups: groups, Base: base, Shards: shardCount, Group: g, Logger: log,
		MaxClusterVersion: fsm.CurrentClusterVersion, Modules: append(mods, pm)})
	if err == nil {
		pm.Bind(f, sh, mt)
	}
	return f, err
}
