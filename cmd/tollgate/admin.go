package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
)

// adminOpts are the connection flags shared by the operator commands.
type adminOpts struct {
	addrs   string
	token   string
	timeout time.Duration
	tls     clientTLSOpts
	clock   api.ClockClient // set by conn: the answering node's Clock service
}

func (o *adminOpts) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&o.addrs, "addr", defaultAddr(), "gRPC address(es) of any node, comma-separated; the first that answers is used (env TOLLGATE_ADDR)")
	f.StringVar(&o.token, "token", "", "admin token (env TOLLGATE_ADMIN_TOKEN)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline of the whole command")
	o.tls.register(f)
}

// conn dials the first address that answers a NodeGroups call.
func (o *adminOpts) conn(ctx context.Context) (api.AdminClient, api.TrackerClient, func(), error) {
	cc, err := o.dialFirst(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	o.clock = api.NewClockClient(cc)
	return api.NewAdminClient(cc), api.NewTrackerClient(cc), func() { cc.Close() }, nil
}

// dialFirst returns a connection (with the token) to the first address that
// answers a NodeGroups call.
func (o *adminOpts) dialFirst(ctx context.Context) (*grpc.ClientConn, error) {
	tok := o.token
	if tok == "" {
		tok = os.Getenv("TOLLGATE_ADMIN_TOKEN")
	}
	creds := insecure.NewCredentials()
	if tc, err := o.tls.config(); err != nil {
		return nil, err
	} else if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	var errs []error
	for _, addr := range strings.Split(o.addrs, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8 << 20))}
		if tok != "" {
			opts = append(opts, grpc.WithChainUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, co ...grpc.CallOption) error {
				return inv(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), m, req, reply, cc, co...)
			}), grpc.WithChainStreamInterceptor(func(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, s grpc.Streamer, co ...grpc.CallOption) (grpc.ClientStream, error) {
				return s(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), d, cc, m, co...)
			}))
		}
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		adm := api.NewAdminClient(cc)
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = adm.NodeGroups(pctx, &api.NodeGroupsRequest{})
		cancel()
		if err != nil {
			cc.Close()
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		return cc, nil
	}
	err := fmt.Errorf("no node answered: %w", errors.Join(errs...))
	if tc, _ := o.tls.config(); tc != nil {
		for _, addr := range strings.Split(o.addrs, ",") {
			if why := certProblem(context.WithoutCancel(ctx), strings.TrimSpace(addr), tc); why != nil {
				return nil, fmt.Errorf("%w\n(%w)", err, why)
			}
		}
	}
	return nil, tlsHint(err, creds.Info().SecurityProtocol == "tls")
}

// retryCall calls fn until it succeeds, fails in a way retrying cannot fix, or
// ctx (the command's --timeout) ends. During a leader election or transfer
// nodes answer Unavailable, or NotLeader, for a moment: those are retried with
// exponential backoff (50ms doubling to 1s, jittered).
func retryCall[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := fn(ctx)
		if err == nil || !retryable(err) {
			return v, err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return v, fmt.Errorf("%w (gave up after %d attempts: --timeout)", err, attempt)
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%w (gave up after %d attempts: %v)", err, attempt, ctx.Err())
		case <-time.After(wait):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// retryable: the cluster could not answer right now (no leader, leader
// changing, node restarting), as opposed to a refused request.
func retryable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable, codes.Aborted:
		return true
	case codes.Internal:
		// A leadership transfer whose target did not take over in time,
		// from servers that answered it as Internal: nothing changed, so
		// asking again is safe (newer servers answer Unavailable).
		return strings.Contains(st.Message(), "leadership transfer timeout")
	case codes.FailedPrecondition:
		for _, d := range st.Details() {
			if _, ok := d.(*api.NotLeader); ok {
				return true
			}
		}
	}
	return false
}

// open starts the command's --timeout and connects to the first node that
// answers; done releases both.
func (o *adminOpts) open(cmd *cobra.Command) (ctx context.Context, adm api.AdminClient, tc api.TrackerClient, done func(), err error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	adm, tc, closeFn, err := o.conn(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, nil, err
	}
	return ctx, adm, tc, func() { closeFn(); cancel() }, nil
}

// run opens a connection (see open) and calls fn with it.
func (o *adminOpts) run(cmd *cobra.Command, fn func(ctx context.Context, adm api.AdminClient, tc api.TrackerClient) error) error {
	ctx, adm, tc, done, err := o.open(cmd)
	if err != nil {
		return err
	}
	defer done()
	return fn(ctx, adm, tc)
}

func newStatusCmd() *cobra.Command {
	var o adminOpts
	var asJSON bool
	var tenant string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show members by zone with their cluster version, groups, leaders, applied index and series per group, halted and down replicas and the backlog controller (--tenant: one tenant's shares)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant != "" {
				return tenantStatus(cmd, &o, tenant, asJSON)
			}
			return o.run(cmd, func(ctx context.Context, adm api.AdminClient, _ api.TrackerClient) error {
				st, err := retryCall(ctx, func(ctx context.Context) (*api.StatusResponse, error) {
					return adm.Status(ctx, &api.StatusRequest{})
				})
				if err != nil {
					return fmt.Errorf("status: %w", err)
				}
				if asJSON {
					b, _ := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(st)
					if _, err := fmt.Fprintln(cmd.OutOrStdout(), string(b)); err != nil {
						return err
					}
				} else {
					printStatus(cmd.OutOrStdout(), st)
					if off := clockOffsets(ctx, o.clock); off != nil {
						printClock(cmd.OutOrStdout(), off) // clockstatus.go
					}
				}
				return errors.Join(leaderlessError(leaderless(st.GetView())), haltedError(halted(st)), downError(down(st)),
					unreachableError(unreachable(st)))
			})
		},
	}
	o.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the raw status as JSON")
	cmd.Flags().StringVar(&tenant, "tenant", "", "show this tenant's share of max_series per group instead: base, delta, series, moves and transfers outstanding (from the answering node's replicas)")
	return cmd
}

// tenantShares asks the first node that answers for one tenant's shares
// per group (Shares.TenantShares, from its replicas), through leader changes.
func tenantShares(cmd *cobra.Command, o *adminOpts, tenant string) (*api.TenantSharesResponse, error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	cc, err := o.dialFirst(ctx)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	return retryCall(ctx, func(ctx context.Context) (*api.TenantSharesResponse, error) {
		return api.NewSharesClient(cc).TenantShares(ctx, &api.TenantSharesRequest{Tenant: tenant})
	})
}

// tenantStatus prints one tenant's shares (Shares.TenantShares).
func tenantStatus(cmd *cobra.Command, o *adminOpts, tenant string, asJSON bool) error {
	resp, err := tenantShares(cmd, o, tenant)
	if err != nil {
		return fmt.Errorf("status --tenant %s: %w", tenant, err)
	}
	out := cmd.OutOrStdout()
	if asJSON {
		b, _ := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(resp)
		_, err := fmt.Fprintln(out, string(b))
		return err
	}
	printTenantShares(out, resp)
	return nil
}

func printTenantShares(out io.Writer, r *api.TenantSharesResponse) {
	limit := "unlimited"
	if r.MaxSeries > 0 {
		limit = fmt.Sprint(r.MaxSeries)
	}
	fmt.Fprintf(out, "tenant %s: max_series %s, share mode %s (as node %s's replicas see it)\n", r.Tenant, limit, r.ShareMode, r.NodeId)
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tSERIES\tBASE\tDELTA\tSHARE\tGIVEN\tRECEIVED\tMOVES\tOUTSTANDING")
	var series, base, delta, share, out0 int64
	for _, g := range r.Groups {
		var os []string
		for _, t := range g.Outstanding {
			os = append(os, fmt.Sprintf("seq %d → group %d: %d", t.Seq, t.To, t.Amount))
			out0++
		}
		o := "-"
		if len(os) > 0 {
			o = strings.Join(os, ", ")
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%+d\t%d\t%d\t%d\t%d\t%s\n", g.Group, g.Series, g.Base, g.Delta, g.Share, g.Given, g.Received, g.Moves, o)
		series, base, delta, share = series+g.Series, base+g.Base, delta+g.Delta, share+g.Share
	}
	fmt.Fprintf(w, "total\t%d\t%d\t%+d\t%d\t\t\t\t%d transfers\n", series, base, delta, share, out0)
	w.Flush()
	if delta < 0 {
		fmt.Fprintf(out, "%d series of headroom are in transit between groups (given, not yet received); the giver's leader re-drives a transfer outstanding for more than 2 s\n", -delta)
	}
}

// leaderless lists the groups of a view that have no leader.
func leaderless(v *api.ClusterView) []uint32 {
	var out []uint32
	for _, gi := range v.GetGroupInfo() {
		if gi.LeaderId == "" {
			out = append(out, gi.Group)
		}
	}
	return out
}

// leaderlessError makes the command exit non-zero when groups have no leader:
// their partitions can be neither tracked nor changed until one is elected.
func leaderlessError(groups []uint32) error {
	if len(groups) == 0 {
		return nil
	}
	return fmt.Errorf("groups %s have no leader: tracking for their partitions fails until a quorum of their voters is up (see the VOTERS column, and the nodes' logs)", groupList(groups))
}

// unreachable lists the voters the answering node could not ask for their
// state: a killed or partitioned node that still holds replicas. Members that
// left (a graceful leave, a decommission) and failed members no group counts
// as a voter any more (removed with raft remove-server after they died; gossip
// lists them as failed for a long while) are no fault.
func unreachable(st *api.StatusResponse) []string {
	left := map[string]bool{}
	for _, m := range st.GetView().GetMembers() {
		left[m.Id] = m.Status == "left" || m.Status == "leaving"
	}
	voter := map[string]bool{}
	for _, vs := range groupVoters(st) {
		for _, v := range vs {
			voter[v] = true
		}
	}
	var out []string
	for _, id := range st.GetUnreachable() {
		if !left[id] && voter[id] {
			out = append(out, id)
		}
	}
	return out
}

// unreachableError makes the command exit non-zero when a member does not
// answer: every group keeps a quorum while one zone is down, but one more
// failure can take it.
func unreachableError(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	return fmt.Errorf("unreachable: %s: a killed or partitioned node; its groups elect other leaders within seconds, and one more failure can leave them without a quorum (see UNREACHABLE above)", strings.Join(ids, ", "))
}

// haltedReplica is one halted (node, group) replica of a status answer.
type haltedReplica struct {
	node   string
	group  uint32
	reason string
}

// halted lists the halted replicas of st's nodes, by node then group.
func halted(st *api.StatusResponse) []haltedReplica {
	var out []haltedReplica
	for _, n := range st.GetNodes() {
		for _, g := range n.Groups {
			if g.HaltedReason != "" {
				out = append(out, haltedReplica{node: n.NodeId, group: g.Group, reason: g.HaltedReason})
			}
		}
	}
	return out
}

// haltedError makes the command exit non-zero when a replica is halted: it
// applies nothing more (and will not lead its group) until its node is
// restarted with a build that can apply the entry it stopped at.
func haltedError(hs []haltedReplica) error {
	if len(hs) == 0 {
		return nil
	}
	var where []string
	for _, h := range hs {
		where = append(where, fmt.Sprintf("group %d on %s", h.group, h.node))
	}
	return fmt.Errorf("halted replicas: %s: they apply nothing more until their node is restarted with a build that supports the entry they stopped at (see HALTED above)", strings.Join(where, ", "))
}

// groupVoters is each group's voters: as its leader reports them
// (placement), else as the answering node's view has them (a node that
// holds no replica of a group knows none).
func groupVoters(st *api.StatusResponse) map[uint32][]string {
	voters := map[uint32][]string{}
	for _, gi := range st.GetView().GetGroupInfo() {
		voters[gi.Group] = gi.Voters
	}
	for _, gp := range st.GetPlacement() {
		if len(gp.Voters) > 0 {
			voters[gp.Group] = gp.Voters
		}
	}
	return voters
}

// downReplica is a replica that takes no part in its group although its node
// answers: its raft is shut down, or it is a voter of the configuration the
// answering node knows but its own node does not know it is a member.
type downReplica struct {
	node  string
	group uint32
	why   string
}

// down lists the replicas of st that are not running, by node then group.
func down(st *api.StatusResponse) []downReplica {
	voters := groupVoters(st)
	var out []downReplica
	for _, n := range st.GetNodes() {
		for _, g := range n.Groups {
			switch {
			case g.RaftState == "Shutdown":
				why := "its raft replica is shut down"
				if slices.Contains(voters[g.Group], n.NodeId) {
					why += " while the group counts it as a voter"
				}
				out = append(out, downReplica{n.NodeId, g.Group, why})
			case g.RaftState == "None" && slices.Contains(voters[g.Group], n.NodeId):
				out = append(out, downReplica{n.NodeId, g.Group, "the group counts it as a voter, but its replica has no configuration naming it"})
			}
		}
	}
	return out
}

// downError makes the command exit non-zero when a replica is down: a voter
// that does not run counts towards the quorum without voting, so one more
// failure can leave its group without a leader.
func downError(ds []downReplica) error {
	if len(ds) == 0 {
		return nil
	}
	var where []string
	for _, d := range ds {
		where = append(where, fmt.Sprintf("group %d on %s", d.group, d.node))
	}
	return fmt.Errorf("replicas down: %s: a voter that does not run still counts for quorum; restart its node, or remove it (raft remove-server) and add it again (see REPLICA DOWN above)", strings.Join(where, ", "))
}

// clusterVersionLine says which cluster version the whole cluster supports
// and, during a rolling upgrade, which members hold it back.
func clusterVersionLine(st *api.StatusResponse) string {
	cv := st.GetClusterVersion()
	if cv == 0 {
		return fmt.Sprintf("cluster version: unknown (the answering node predates it; this build supports %d)", fsm.CurrentClusterVersion)
	}
	var top uint32
	for _, m := range st.GetView().GetMembers() {
		top = max(top, m.ClusterVersion)
	}
	line := fmt.Sprintf("cluster version %d (this build supports %d)", cv, fsm.CurrentClusterVersion)
	var lag []string
	for _, m := range st.GetView().GetMembers() {
		if m.ClusterVersion < top {
			lag = append(lag, fmt.Sprintf("%s=%d", m.Id, m.ClusterVersion))
		}
	}
	if len(lag) > 0 {
		slices.Sort(lag)
		line += fmt.Sprintf("; members below %d: %s (entry types of newer versions wait for them)", top, strings.Join(lag, ", "))
	}
	return line
}

// controllerLine summarizes the backlog controller in one line ("" when the
// answering node predates it).
func controllerLine(c *api.SamplingControllerStatus) string {
	if c == nil {
		return ""
	}
	owner := c.Owner
	if owner == "" {
		owner = "unknown (no leader of group 0)"
	}
	switch {
	case c.Kind == "":
		return "backlog controller: off (none configured: tollgate limits get --global)"
	case !c.Enabled:
		return fmt.Sprintf("backlog controller (%s) on %s: DISABLED: %s", c.Kind, owner, c.Reason)
	}
	line := fmt.Sprintf("backlog controller (%s) on %s: enabled, output %g%% (written %g%%)", c.Kind, owner, c.OutputPercent, c.WrittenPercent)
	if c.LastWriteError != "" {
		line += "; last write failed: " + c.LastWriteError
	}
	return line
}

// configLag says how many group replicas still lag the newest runtime config
// version (the reconciler copies a change from group 0 into every group).
// Servers that do not report per-replica versions say nothing.
func configLag(st *api.StatusResponse, newest uint64) string {
	if st.GetConfigVersion() == 0 {
		return ""
	}
	behind, replicas := 0, 0
	for _, n := range st.GetNodes() {
		for _, g := range n.GetGroups() {
			if g.GetRaftState() == "None" {
				continue
			}
			replicas++
			if g.GetConfigVersion() < newest {
				behind++
			}
		}
	}
	if behind == 0 {
		return fmt.Sprintf(", all %d replicas at it", replicas)
	}
	return fmt.Sprintf(", %d of %d replicas behind it", behind, replicas)
}

func printStatus(out io.Writer, st *api.StatusResponse) {
	v := st.View
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "cluster: %d partitions, %d groups%s (view from %s)\n", v.GetPartitions(), v.GetGroups(), raisedNote(v), v.GetServedBy())
	fmt.Fprintln(w, clusterVersionLine(st))
	if l := controllerLine(st.GetSamplingController()); l != "" {
		fmt.Fprintln(w, l)
	}
	if cv := max(st.GetConfigVersion(), v.GetConfigVersion()); cv > 0 {
		fmt.Fprintf(w, "runtime config: version %d (replicated%s; tollgate limits get)\n\n", cv, configLag(st, cv))
	} else {
		fmt.Fprintf(w, "runtime config: none replicated: each node uses its --limits-file and flags (needs cluster version 3 on every node, then a limits set/apply or a node's limits file)\n\n")
	}
	members := slices.Clone(v.GetMembers())
	slices.SortFunc(members, func(a, b *api.Member) int {
		if c := strings.Compare(a.Zone, b.Zone); c != 0 {
			return c
		}
		return strings.Compare(a.Id, b.Id)
	})
	// VER: the highest cluster version the member's build supports.
	// REPLICAS: the groups the member is a voter of, per the groups' leaders.
	replicas := replicaCounts(st)
	// A node killed a moment ago is still "alive" in gossip (failure
	// detection takes a few seconds) and may still be named as the leader of
	// its groups until they time out its heartbeats (about a second or two):
	// the answering node's failed call to it is fresher, so say so.
	gone := map[string]bool{}
	for _, id := range unreachable(st) {
		gone[id] = true
	}
	fmt.Fprintln(w, "ZONE\tNODE\tSTATUS\tVER\tGRPC\tRAFT\tREPLICAS\tLEADS")
	for _, m := range members {
		ver := "?" // a server from before the field
		if m.ClusterVersion > 0 {
			ver = fmt.Sprint(m.ClusterVersion)
		}
		stat := m.Status
		if gone[m.Id] && stat == "alive" {
			stat = "unreachable"
		}
		if m.Decommissioning {
			stat += ",draining" // tollgate node drain
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", m.Zone, m.Id, stat, ver, m.GrpcAddress, m.RaftAddress, replicas[m.Id], groupList(m.GroupsLed))
	}
	w.Flush()
	printNewGroups(out, st) // groups.go: groups a raise added
	printMoves(out, st)
	fmt.Fprintln(out)
	byNode := map[string]map[uint32]*api.GroupState{}
	for _, n := range st.Nodes {
		byNode[n.NodeId] = map[uint32]*api.GroupState{}
		for _, g := range n.Groups {
			byNode[n.NodeId][g.Group] = g
		}
	}
	// APPLIED is the state machine's applied index (fsm), the index `snapshot
	// restore` and `snapshot inspect` show too; raft's own log index is higher
	// (it also counts elections and configuration entries).
	voters := groupVoters(st)
	fmt.Fprintln(w, "GROUP\tLEADER\tVOTERS\tAPPLIED INDEX (per voter)\tSERIES\tTENANTS")
	for _, gi := range v.GetGroupInfo() {
		leader := gi.LeaderId
		if leader == "" {
			leader = "NONE"
		} else if gone[leader] {
			leader += " (unreachable)" // stale: a new leader is elected within seconds
		}
		var applied []string
		var series uint64
		var tenants uint32
		gvoters := voters[gi.Group]
		for _, id := range gvoters {
			gs := byNode[id][gi.Group]
			if gs == nil {
				applied = append(applied, id+"=?")
				continue
			}
			applied = append(applied, fmt.Sprintf("%s=%d", id, gs.AppliedIndex))
			if id == gi.LeaderId {
				series, tenants = gs.Series, gs.Tenants
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\n", gi.Group, leader, strings.Join(gvoters, ","), strings.Join(applied, " "), series, tenants)
	}
	w.Flush()
	printPlacement(out, st) // node.go
	if len(st.Unreachable) > 0 {
		fmt.Fprintf(out, "\nunreachable: %s\n", strings.Join(st.Unreachable, ", "))
	}
	if ids := unreachable(st); len(ids) > 0 {
		fmt.Fprintf(out, "UNREACHABLE: %s: the answering node's calls to it fail\n", strings.Join(ids, ", "))
	}
	if ll := leaderless(v); len(ll) > 0 {
		fmt.Fprintf(out, "\nNO LEADER in groups %s\n", groupList(ll))
	}
	if hs := halted(st); len(hs) > 0 {
		fmt.Fprintln(out)
		for _, h := range hs {
			fmt.Fprintf(out, "HALTED: group %d on %s: %s\n", h.group, h.node, h.reason)
		}
	}
	if ds := down(st); len(ds) > 0 {
		fmt.Fprintln(out)
		for _, d := range ds {
			fmt.Fprintf(out, "REPLICA DOWN: group %d on %s: %s\n", d.group, d.node, d.why)
		}
	}
}

func groupList(gs []uint32) string {
	if len(gs) == 0 {
		return "-"
	}
	var s []string
	for _, g := range gs {
		s = append(s, fmt.Sprint(g))
	}
	return strings.Join(s, ",")
}

func newRaftCmd() *cobra.Command {
	var o adminOpts
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "Inspect and change raft group membership (operator commands)",
		Long: `Raft operator commands. Membership changes are raft configuration changes made
by the group's leader (any node forwards the call there); nothing edits files.

Note: when a node joins (or rejoins) the cluster, group leaders add it to groups
whose zone has no voter (unless servers run with --disable-auto-place). A server
removed with remove-server stays out until it joins again.`,
	}
	o.register(cmd)
	var (
		group       int
		all         bool
		id, address string
		to          string
	)
	// perGroup runs fn for --group G, or for every group with --all-groups (or,
	// when allByDefault, without --group).
	perGroup := func(name string, allByDefault bool, fn func(ctx context.Context, adm api.AdminClient, g uint32) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			if group < 0 && !all && !allByDefault {
				return fmt.Errorf("%s: give --group G or --all-groups", name)
			}
			return o.run(cmd, func(ctx context.Context, adm api.AdminClient, tc api.TrackerClient) error {
				gs := []uint32{uint32(group)}
				if all || group < 0 {
					v, err := retryCall(ctx, func(ctx context.Context) (*api.ClusterView, error) { return firstView(ctx, tc) })
					if err != nil {
						return err
					}
					gs = gs[:0]
					for g := range clusterGroups(v) { // a raise's groups too
						gs = append(gs, g)
					}
				}
				for _, g := range gs {
					if err := fn(ctx, adm, g); err != nil {
						return fmt.Errorf("group %d: %w", g, err)
					}
				}
				return nil
			})
		}
	}

	var (
		w        *tabwriter.Writer
		noLeader []uint32
	)
	list := &cobra.Command{
		Use:   "list-peers",
		Short: "List the voters of one group (--group) or of every group; exits non-zero when a group has no leader",
		PreRun: func(cmd *cobra.Command, _ []string) {
			w = tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "GROUP\tNODE\tADDRESS\tSUFFRAGE\tLEADER")
		},
		RunE: perGroup("list-peers", true, func(ctx context.Context, adm api.AdminClient, g uint32) error {
			resp, err := retryCall(ctx, func(ctx context.Context) (*api.ListPeersResponse, error) {
				return adm.ListPeers(ctx, &api.ListPeersRequest{Group: g})
			})
			if err != nil {
				return err
			}
			led := false
			for _, p := range resp.Peers {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%v\n", g, p.Id, p.Address, p.Suffrage, p.Leader)
				led = led || p.Leader
			}
			if !led {
				// A group without a leader answers with the configuration the
				// contacted replica knows.
				fmt.Fprintf(w, "%d\t(no leader)\t\t\t\n", g)
				noLeader = append(noLeader, g)
			}
			return nil
		}),
		PostRunE: func(*cobra.Command, []string) error {
			if err := w.Flush(); err != nil {
				return err
			}
			return leaderlessError(noLeader)
		},
	}
	list.Flags().IntVar(&group, "group", -1, "group id (default: every group)")

	var (
		force   bool
		catchUp time.Duration
	)
	add := &cobra.Command{
		Use:   "add-voter",
		Short: "Add a server to a group: as a non-voter first, promoted to voter once its log has caught up (--group G or --all-groups)",
		Long: `Add a server to a group's raft configuration. The group's leader checks that
the server answers raft at its address, adds it as a non-voter (it receives the
log but counts for no quorum), waits until its log is within a few hundred
entries of the leader's, then promotes it to voter. A server that does not
answer, or does not catch up within --catch-up-timeout, is never made a voter:
the command fails with the reason and the voters are unchanged.

The server must be a running member of the cluster (joined through gossip).
A second voter in a zone that already has one is refused unless --force.`,
		PreRun: func(cmd *cobra.Command, _ []string) {
			// The whole command must outlast every group's catch-up.
			if !cmd.Flags().Changed("timeout") {
				o.timeout = max(o.timeout, 10*time.Minute)
			}
		},
		RunE: perGroup("add-voter", false, func(ctx context.Context, adm api.AdminClient, g uint32) error {
			gctx, cancel := context.WithTimeout(ctx, catchUp+30*time.Second)
			defer cancel()
			resp, err := retryCall(gctx, func(ctx context.Context) (*api.MembershipResponse, error) {
				return adm.AddVoter(ctx, &api.AddVoterRequest{Group: g, Id: id, Address: address, Force: force,
					CatchUpTimeoutMillis: uint64(catchUp.Milliseconds())})
			})
			if err != nil {
				return err
			}
			if resp.AlreadyVoter {
				fmt.Fprintf(cmd.OutOrStdout(), "group %d: %s already is a voter at that address; nothing changed\n", g, id)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "group %d: %s is a voter (caught up as a non-voter in %v, %d entries behind the leader when promoted; configuration index %d, %d servers)\n",
				g, id, (time.Duration(resp.CatchUpMillis) * time.Millisecond).Round(time.Millisecond), resp.LagEntries, resp.Index, len(resp.Peers))
			return nil
		}),
	}
	add.Flags().StringVar(&address, "address", "", "raft address (default: the member's gossiped raft address; another one is refused)")
	add.Flags().BoolVar(&force, "force", false, "add the voter even if another voter of the group is in the same zone")
	add.Flags().DurationVar(&catchUp, "catch-up-timeout", 20*time.Second, "how long the server may take to catch up as a non-voter before the leader gives up (and removes it again)")

	rm := &cobra.Command{
		Use:   "remove-server",
		Short: "Remove a server from a group's configuration (--group G or --all-groups); a leader hands leadership off first",
		RunE: perGroup("remove-server", false, func(ctx context.Context, adm api.AdminClient, g uint32) error {
			resp, err := retryCall(ctx, func(ctx context.Context) (*api.MembershipResponse, error) {
				return adm.RemoveServer(ctx, &api.RemoveServerRequest{Group: g, Id: id, Force: force})
			})
			if err != nil {
				return err
			}
			if resp.HandedOffTo != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "group %d: %s led the group: leadership handed off to %s first\n", g, id, resp.HandedOffTo)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "group %d: %s removed (configuration index %d, %d servers left)\n", g, id, resp.Index, len(resp.Peers))
			return nil
		}),
	}
	rm.Flags().BoolVar(&force, "force", false, "remove the server even if the voters left would not have a quorum of running members")
	for _, c := range []*cobra.Command{add, rm} {
		c.Flags().IntVar(&group, "group", -1, "group id")
		c.Flags().BoolVar(&all, "all-groups", false, "every group")
		c.Flags().StringVar(&id, "id", "", "server (node) id")
		_ = c.MarkFlagRequired("id")
	}

	tr := &cobra.Command{
		Use:   "transfer-leadership",
		Short: "Move a group's leadership to another voter (--to ID, or the most up-to-date one)",
		RunE: perGroup("transfer-leadership", false, func(ctx context.Context, adm api.AdminClient, g uint32) error {
			resp, err := retryCall(ctx, func(ctx context.Context) (*api.TransferLeadershipResponse, error) {
				return adm.TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: g, ToId: to})
			})
			if err != nil {
				return err
			}
			fmt.Printf("group %d: leader is now %s\n", g, resp.NewLeaderId)
			return nil
		}),
	}
	tr.Flags().IntVar(&group, "group", -1, "group id")
	tr.Flags().BoolVar(&all, "all-groups", false, "every group (each leader hands off to another voter)")
	tr.Flags().StringVar(&to, "to", "", "target voter id (default: raft picks the most up-to-date voter)")

	cmd.AddCommand(list, add, rm, tr)
	cmd.AddCommand(newRaftRecoverCmd())
	return cmd
}

// clusterGroups is the number of groups the cluster runs: the layout
// table's count once raised (groups raise), else the count it was created
// with (the view's Groups, which stays that count for clients' arithmetic).
func clusterGroups(v *api.ClusterView) uint32 { return max(v.GetGroups(), v.GetLayout().GetGroups()) }
