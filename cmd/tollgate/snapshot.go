package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/backup"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/server"
)

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save, inspect and restore cluster snapshots (backups)",
		Long: `A snapshot file holds one snapshot per raft group, each taken on the group's
leader after a barrier, so it contains every write acknowledged before the save
began. Groups own disjoint partitions, so each group's snapshot is consistent on
its own; the groups are taken one after another. Every part carries a checksum;
a damaged or truncated file is refused.`,
	}
	cmd.AddCommand(newSnapshotSaveCmd(), newSnapshotInspectCmd(), newSnapshotRestoreCmd())
	return cmd
}

func newSnapshotSaveCmd() *cobra.Command {
	var o adminOpts
	var out string
	cmd := &cobra.Command{
		Use:   "save -o FILE",
		Short: "Save a snapshot of every group into one file",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("snapshot save: -o FILE is required")
			}
			ctx, adm, tc, done, err := o.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			view, err := retryCall(ctx, func(ctx context.Context) (*api.ClusterView, error) { return firstView(ctx, tc) })
			if err != nil {
				return err
			}
			type part struct {
				index, term uint64
				data        []byte
			}
			// Every group the cluster runs, a raise's too (the layout
			// table's count; the view's Groups is the created count). A
			// partition handed from one group to another between the two
			// groups' snapshots could be in neither: the table's epoch
			// moves with every hand-off (and a raise), so the save is taken
			// again when it moved meanwhile.
			var groups uint32
			var parts []part
			for try := 1; ; try++ {
				groups = clusterGroups(view)
				parts = make([]part, groups)
				for g := range groups {
					data, err := retryCall(ctx, func(ctx context.Context) ([]byte, error) { return downloadSnapshot(ctx, adm, g) })
					if err != nil {
						return fmt.Errorf("snapshot group %d: %w", g, err)
					}
					parts[g].data = data
				}
				after, err := retryCall(ctx, func(ctx context.Context) (*api.ClusterView, error) { return firstView(ctx, tc) })
				if err != nil {
					return err
				}
				if after.GetLayout().GetEpoch() == view.GetLayout().GetEpoch() {
					break
				}
				if try == 3 {
					return fmt.Errorf("partitions moved between groups during each of %d attempts (layout epoch %d, now %d): run it again once `tollgate status` shows no partition moves pending; nothing was written",
						try, view.GetLayout().GetEpoch(), after.GetLayout().GetEpoch())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "partitions moved during the save (layout epoch %d → %d): taking it again\n", view.GetLayout().GetEpoch(), after.GetLayout().GetEpoch())
				view = after
			}
			// The file records the FSM's own index/term (from the snapfmt
			// header), which is what restore compares with the cluster's applied
			// index; raft's snapshot index also counts entries the FSM never
			// sees (no-ops, barriers, configuration).
			var shards int
			for g := range parts {
				rd, err := snapfmt.NewReader(bytes.NewReader(parts[g].data))
				if err != nil {
					return fmt.Errorf("snapshot of group %d from the cluster is unreadable: %w", g, err)
				}
				h := rd.Header()
				parts[g].index, parts[g].term, shards = h.Index, h.Term, int(h.Shards)
			}
			tmp := out + ".tmp"
			f, err := os.Create(tmp)
			if err != nil {
				return err
			}
			defer os.Remove(tmp)
			w, err := backup.NewWriter(f, backup.Header{Partitions: int(view.Partitions), Groups: int(groups), Base: int(view.Groups), Shards: shards,
				Created: time.Now(), Source: "tollgate snapshot save via " + view.ServedBy})
			if err != nil {
				f.Close()
				return err
			}
			for g, p := range parts {
				if err := w.AddGroup(g, p.index, p.term, p.data); err != nil {
					f.Close()
					return fmt.Errorf("write group %d: %w", g, err)
				}
			}
			if err := w.Close(); err != nil {
				f.Close()
				return err
			}
			if err := f.Sync(); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp, out); err != nil {
				return err
			}
			return inspectFile(cmd.OutOrStdout(), out)
		},
	}
	o.register(cmd)
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write")
	return cmd
}

// downloadSnapshot streams one group's snapshot from its leader; a stream cut
// by a leader change is retried whole by the caller.
func downloadSnapshot(ctx context.Context, adm api.AdminClient, g uint32) ([]byte, error) {
	st, err := adm.SnapshotGroup(ctx, &api.SnapshotGroupRequest{Group: g})
	if err != nil {
		return nil, err
	}
	var data []byte
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			return data, nil
		}
		if err != nil {
			return nil, err
		}
		data = append(data, ch.Data...)
	}
}

func firstView(ctx context.Context, tc api.TrackerClient) (*api.ClusterView, error) {
	w, err := tc.WatchCluster(ctx, &api.WatchClusterRequest{})
	if err != nil {
		return nil, fmt.Errorf("watch cluster: %w", err)
	}
	v, err := w.Recv()
	if err != nil {
		return nil, fmt.Errorf("watch cluster: %w", err)
	}
	return v, nil
}

func newSnapshotInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect FILE",
		Short: "Verify a snapshot file and show its groups, raft index/term, tenants and series",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return inspectFile(cmd.OutOrStdout(), args[0])
		},
	}
}

func inspectFile(out io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sum, err := backup.Inspect(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	h := sum.Header
	fmt.Fprintf(out, "%s: valid (every checksum verified), %d bytes\n", path, sum.Bytes)
	raised := ""
	if h.Base < h.Groups {
		raised = fmt.Sprintf(" (raised from %d)", h.Base)
	}
	fmt.Fprintf(out, "layout: partitions=%d groups=%d%s shards=%d; created %s by %q\n\n", h.Partitions, h.Groups, raised, h.Shards,
		h.Created.UTC().Format(time.RFC3339), h.Source)
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tINDEX\tTERM\tBYTES\tSERIES\tTENANTS\tBYTES/SERIES")
	for _, g := range sum.Groups {
		bps := "-"
		if g.Series > 0 {
			bps = fmt.Sprintf("%.2f", float64(g.Bytes)/float64(g.Series))
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%s\n", g.Group, g.Index, g.Term, g.Bytes, g.Series, len(g.Tenants), bps)
	}
	w.Flush()
	fmt.Fprintf(out, "\n%d series, %d tenants\n", sum.Series, len(sum.Tenants))
	if len(sum.Tenants) > 0 {
		fmt.Fprintln(w, "\nTENANT\tSERIES")
		for i, t := range sum.Tenants {
			if i == 50 {
				fmt.Fprintf(w, "… %d more\t\n", len(sum.Tenants)-50)
				break
			}
			fmt.Fprintf(w, "%s\t%d\n", t.Tenant, t.Series)
		}
		w.Flush()
	}
	return nil
}

func newSnapshotRestoreCmd() *cobra.Command {
	var (
		o               adminOpts
		force, offline  bool
		dataDir, nodeID string
		raftAddr        string
	)
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Restore a snapshot file: online through the admin API, or --offline into an empty data dir",
		Long: `Online (default): every group's state is replaced by the snapshot's through raft:
its leader installs the snapshot and the followers receive it, so afterwards every
replica holds exactly the snapshot's series; writes made after the snapshot are
rolled back. If the cluster holds newer state than the snapshot, the command
lists what would be lost and refuses unless --force is given. The file is
verified completely first; a damaged file, or one taken from a cluster with a
different layout (partitions, groups, shards), is refused and nothing changes.

Offline (--offline --data-dir DIR --node-id ID --raft-addr ADDR): seeds an empty
data dir for disaster recovery. Start that node with the same --node-id and raft
address and without --bootstrap-expect: it leads every group alone with the
snapshot's state. Then start the other nodes with --join pointing at it; the
group leaders add them as voters (one per zone) and they receive the state.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			file, err := backup.Read(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w; nothing was changed", args[0], err)
			}
			if offline {
				return restoreOffline(cmd.OutOrStdout(), file, dataDir, nodeID, raftAddr)
			}
			return restoreOnline(cmd, &o, file, force)
		},
	}
	o.register(cmd)
	f := cmd.Flags()
	f.BoolVar(&force, "force", false, "restore even though the cluster holds newer state (it is lost)")
	f.BoolVar(&offline, "offline", false, "seed an empty data dir instead of talking to a cluster")
	f.StringVar(&dataDir, "data-dir", "", "with --offline: the data dir to seed")
	f.StringVar(&nodeID, "node-id", "", "with --offline: the id the node will run with")
	f.StringVar(&raftAddr, "raft-addr", "", "with --offline: the raft address the node will advertise")
	return cmd
}

func restoreOffline(out io.Writer, file *backup.File, dataDir, nodeID, raftAddr string) error {
	if dataDir == "" || nodeID == "" || raftAddr == "" {
		return errors.New("restore --offline needs --data-dir, --node-id and --raft-addr")
	}
	h := file.Header
	raftDir := filepath.Join(dataDir, "raft")
	has, err := raftnode.HasState(raftDir, h.Groups)
	if err != nil {
		return err
	}
	if has {
		return fmt.Errorf("%s already holds raft state; offline restore only seeds an empty data dir (use the online restore for a running cluster); nothing was changed", dataDir)
	}
	// The data dir records the count the cluster was created with; the
	// raised groups are the raft groups seeded below (a start runs both).
	if err := server.InitLayout(dataDir, h.Partitions, h.Base, h.Shards); err != nil {
		return fmt.Errorf("%w; nothing was changed", err)
	}
	for _, g := range file.Groups {
		if err := raftnode.SeedGroup(raftDir, g.Group, nodeID, raftAddr, g.Index, g.Term, bytes.NewReader(g.Data), int64(len(g.Data))); err != nil {
			return fmt.Errorf("seed group %d: %w", g.Group, err)
		}
	}
	if h.Groups > h.Base { // a raised cluster: the node opens every group from its first start
		if err := raftnode.RecordGroups(raftDir, h.Groups); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "seeded %s with %d groups (partitions=%d shards=%d) for node %q at raft address %s\n", dataDir, len(file.Groups), h.Partitions, h.Shards, nodeID, raftAddr)
	fmt.Fprintf(out, "next: tollgate server --data-dir %s --node-id %s --raft-addr %s ... (no --bootstrap-expect), then start the other nodes with --join\n", dataDir, nodeID, raftAddr)
	return nil
}

func restoreOnline(cmd *cobra.Command, o *adminOpts, file *backup.File, force bool) error {
	out := cmd.OutOrStdout()
	ctx, adm, tc, done, err := o.open(cmd)
	if err != nil {
		return err
	}
	defer done()
	view, err := retryCall(ctx, func(ctx context.Context) (*api.ClusterView, error) { return firstView(ctx, tc) })
	if err != nil {
		return err
	}
	if err := file.CheckLayout(int(view.Partitions), int(view.Groups), int(clusterGroups(view)), file.Header.Shards); err != nil {
		return fmt.Errorf("%w; nothing was changed", err)
	}
	st, err := retryCall(ctx, func(ctx context.Context) (*api.StatusResponse, error) { return adm.Status(ctx, &api.StatusRequest{}) })
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	// The leader's state is the cluster's state.
	leaderState := map[uint32]*api.GroupState{}
	for _, n := range st.Nodes {
		for _, gs := range n.Groups {
			if gs.RaftState == "Leader" {
				leaderState[gs.Group] = gs
			}
		}
	}
	summaries := map[int]uint64{}
	for _, g := range file.Groups {
		s, err := snapfmt.Inspect(bytes.NewReader(g.Data))
		if err != nil {
			return fmt.Errorf("group %d: %w; nothing was changed", g.Group, err)
		}
		summaries[g.Group] = s.Series
	}
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	// Both indexes are applied indexes of the state machine: the APPLIED INDEX
	// column of `tollgate status` and the INDEX of `snapshot inspect`.
	fmt.Fprintln(w, "GROUP\tCLUSTER APPLIED INDEX\tCLUSTER SERIES\tSNAPSHOT APPLIED INDEX\tSNAPSHOT SERIES\t")
	var newer []string
	for _, g := range file.Groups {
		cs := leaderState[uint32(g.Group)]
		if cs == nil {
			w.Flush()
			return fmt.Errorf("group %d has no leader right now; retry when `tollgate status` shows one; nothing was changed", g.Group)
		}
		note := ""
		if cs.AppliedIndex > g.Index {
			note = "cluster is newer: writes after the snapshot will be lost"
			newer = append(newer, fmt.Sprint(g.Group))
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\n", g.Group, cs.AppliedIndex, cs.Series, g.Index, summaries[g.Group], note)
	}
	w.Flush()
	if len(newer) > 0 && !force {
		return fmt.Errorf("the cluster holds newer state than the snapshot in groups %s; restoring rolls it back to the snapshot and every series tracked after it is lost (see above). Re-run with --force to restore anyway; nothing was changed", strings.Join(newer, ","))
	}
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	type restored struct {
		group          int
		applied        uint64
		series, raftIx uint64
	}
	var restoredGroups []restored
	for _, g := range file.Groups {
		resp, err := retryCall(ctx, func(ctx context.Context) (*api.RestoreGroupResponse, error) {
			return restoreGroup(ctx, adm, g.Group, g.Data, castagnoli)
		})
		if err != nil {
			return fmt.Errorf("restore group %d: %w", g.Group, err)
		}
		// After a restore the state machine's applied index is the
		// snapshot's; the response's index is raft's log index, which also
		// counts entries the state machine never sees.
		restoredGroups = append(restoredGroups, restored{g.Group, g.Index, resp.Series, resp.Index})
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RESTORED GROUP\tAPPLIED INDEX\tSERIES\tRAFT LOG INDEX")
	for _, r := range restoredGroups {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\n", r.group, r.applied, r.series, r.raftIx)
	}
	w.Flush()
	fmt.Fprintln(out, "\nAPPLIED INDEX is what `tollgate status` shows until new writes arrive; RAFT LOG INDEX is raft's (it also counts elections and configuration entries).")
	return nil
}

// restoreGroup uploads one group's snapshot to its leader.
func restoreGroup(ctx context.Context, adm api.AdminClient, group int, data []byte, castagnoli *crc32.Table) (*api.RestoreGroupResponse, error) {
	up, err := adm.RestoreGroup(ctx)
	if err != nil {
		return nil, err
	}
	hdr := &api.RestoreHeader{Group: uint32(group), Size: uint64(len(data)), Crc32C: crc32.Checksum(data, castagnoli)}
	if err := up.Send(&api.RestoreChunk{Header: hdr}); err != nil {
		return nil, err
	}
	for off := 0; off < len(data); off += 1 << 20 {
		if err := up.Send(&api.RestoreChunk{Data: data[off:min(off+1<<20, len(data))]}); err != nil {
			break // the cause comes back from CloseAndRecv
		}
	}
	return up.CloseAndRecv()
}
