package faulttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/backup"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// Helpers of the operations-runbook tests (docs/operations.md): nodes added
// to a running cluster, the CLI run as an operator runs it, and the series a
// cluster holds read from a `tollgate snapshot save` file.

// argValue returns the value following flag in args ("" if absent).
func argValue(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// setArg returns args with flag's value replaced (or appended).
func setArg(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// dropArg returns args without flag and its value.
func dropArg(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag && i+1 < len(args) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// newJoiningNode prepares (does not start) a node with a new id, zone, data
// dir and ports, the other settings of like, joining through via's gossip
// address as a node added to a running cluster does (no --bootstrap-expect).
func (c *cluster) newJoiningNode(like *node, id, zone string, via *node) *node {
	n := &node{c: c, idx: len(c.nodes), id: id, zone: zone, dir: filepath.Join(c.dir, id),
		grpcAddr: fmt.Sprintf("127.0.0.1:%d", freePort(c.t)), httpAddr: fmt.Sprintf("127.0.0.1:%d", freePort(c.t)),
		outPath: filepath.Join(c.dir, id+".stdout"), errPath: filepath.Join(c.dir, id+".stderr")}
	args := like.args
	args = setArg(args, "--node-id", id)
	args = setArg(args, "--zone", zone)
	args = setArg(args, "--data-dir", n.dir)
	args = setArg(args, "--grpc-addr", n.grpcAddr)
	args = setArg(args, "--http-addr", n.httpAddr)
	args = setArg(args, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", freePort(c.t)))
	args = setArg(args, "--gossip-addr", fmt.Sprintf("127.0.0.1:%d", freePort(c.t)))
	args = dropArg(args, "--bootstrap-expect")
	args = setArg(args, "--join", argValue(via.args, "--gossip-addr"))
	n.args = args
	return n
}

// tollgateCLI runs the tollgate binary with args (and the admin token in the
// environment, as an operator would) and returns its combined output.
func (c *cluster) tollgateCLI(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(os.Environ(), "TOLLGATE_ADMIN_TOKEN="+adminToken)
	out, err := cmd.CombinedOutput()
	c.t.Logf("$ tollgate %s\n%s", strings.Join(args, " "), out)
	return string(out), err
}

// seriesIn takes a snapshot of the cluster with `tollgate snapshot save`
// through via and returns every series it holds, per tenant.
func (c *cluster) seriesIn(t *testing.T, via *node) map[string]map[uint64]bool {
	t.Helper()
	path := filepath.Join(c.dir, fmt.Sprintf("snap-%d.tgsnap", time.Now().UnixNano()))
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		if _, lastErr = c.tollgateCLI(2*time.Minute, "snapshot", "save", "-o", path, "--addr", via.grpcAddr, "--timeout", "90s"); lastErr == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if lastErr != nil {
		t.Fatalf("snapshot save via %s: %v", via.id, lastErr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := backup.Read(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	out := map[string]map[uint64]bool{}
	for _, g := range f.Groups {
		rd, err := snapfmt.NewReader(bytes.NewReader(g.Data))
		if err != nil {
			t.Fatalf("group %d of %s: %v", g.Group, path, err)
		}
		names := rd.Header().Tenants
		for {
			_, series, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("group %d of %s: %v", g.Group, path, err)
			}
			for _, ts := range series {
				name := names[ts.Tenant]
				if out[name] == nil {
					out[name] = map[uint64]bool{}
				}
				for _, h := range ts.Hashes {
					out[name][h] = true
				}
			}
		}
	}
	return out
}

// missingSeries lists (at most 10 of) the acknowledged series absent from have,
// and how many are missing and were checked.
func missingSeries(acked map[string][]uint64, have map[string]map[uint64]bool) (examples []string, missing, checked int) {
	tenants := make([]string, 0, len(acked))
	for name := range acked {
		tenants = append(tenants, name)
	}
	sort.Strings(tenants)
	for _, name := range tenants {
		for _, h := range acked[name] {
			checked++
			if !have[name][h] {
				missing++
				if len(examples) < 10 {
					examples = append(examples, fmt.Sprintf("%s/%#016x (group %d)", name, h, api.GroupOf(api.Partition(h, partitions), partitions, groups)))
				}
			}
		}
	}
	return examples, missing, checked
}

// appliedIndexes returns, per group, the highest state-machine applied index
// any running node reports.
func (c *cluster) appliedIndexes() []uint64 {
	out := make([]uint64, groups)
	for _, ng := range c.nodeGroups() {
		for _, gs := range ng.Groups {
			out[gs.Group] = max(out[gs.Group], gs.AppliedIndex)
		}
	}
	return out
}

// waitApplied waits until n has applied at least want[g] in every group.
func (c *cluster) waitApplied(t *testing.T, n *node, want []uint64) {
	t.Helper()
	deadline := time.Now().Add(progressTimeout)
	for {
		ng := c.nodeGroups()[n]
		behind := ""
		for g := range groups {
			gs := groupState(ng, g)
			if gs == nil || gs.AppliedIndex < want[g] {
				behind = fmt.Sprintf("group %d: %s applied %v, want ≥ %d", g, n.id, gs.GetAppliedIndex(), want[g])
				break
			}
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not catch up within %v: %s", n.id, progressTimeout, behind)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitVotersExactly waits until group g's leader (any running node) reports
// exactly the voters want (sorted ids).
func (c *cluster) waitVotersExactly(t *testing.T, g int, want []string) {
	t.Helper()
	deadline := time.Now().Add(healthyTimeout)
	var last []string
	for time.Now().Before(deadline) {
		if l, _ := c.leaderOf(g); l != nil {
			if peers, err := c.listPeers(l, g); err == nil {
				if last = voters(peers); slices.Equal(last, want) {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("group %d: voters %v, want %v (after %v)", g, last, want, healthyTimeout)
}

// waitMemberNot waits until via's view of the cluster no longer lists member id
// as alive (gossip noticed that it is gone), as the runbook has the operator
// check with `tollgate status` before replacing a node.
func (c *cluster) waitMemberNot(t *testing.T, via *node, id, status string) {
	t.Helper()
	deadline := time.Now().Add(healthyTimeout)
	last := "not listed"
	for time.Now().Before(deadline) {
		ctx, cancel := adminCtx(context.Background(), adminCallTO)
		st, err := c.admin(via).Status(ctx, &api.StatusRequest{})
		cancel()
		if err == nil {
			last = "not listed"
			for _, m := range st.GetView().GetMembers() {
				if m.Id == id {
					last = m.Status
				}
			}
			if last != status {
				t.Logf("%s: member %s is %s", via.id, id, last)
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s still lists %s as %s after %v", via.id, id, last, healthyTimeout)
}

// transferLeadership runs `tollgate raft transfer-leadership --group g` (with
// --to when to is set) through via. Under load raft may give up a transfer
// whose target did not catch up in time ("leadership transfer timeout",
// which the CLI reports and does not retry); an operator runs it again, and
// so does this, a few times.
func (c *cluster) transferLeadership(t *testing.T, g int, to, via *node) {
	t.Helper()
	args := []string{"raft", "transfer-leadership", "--group", fmt.Sprint(g), "--addr", via.grpcAddr}
	if to != nil {
		args = append(args, "--to", to.id)
	}
	var err error
	var out string
	for attempt := 1; attempt <= 5; attempt++ {
		if out, err = c.tollgateCLI(time.Minute, args...); err == nil {
			return
		}
		if !strings.Contains(out, "leadership transfer timeout") {
			break
		}
		t.Logf("transfer-leadership of group %d: timed out (attempt %d); again", g, attempt)
	}
	t.Fatalf("tollgate %s: %v", strings.Join(args, " "), err)
}

// placeTimeout bounds the wait for the group leaders to place a joining node
// before the runbook's remedy (add it by hand) is applied.
const placeTimeout = 20 * time.Second

// waitPlaced waits until every group's voters are exactly want (sorted ids),
// which includes the joining node n. The leaders place a node only when it
// becomes alive, and a leader that lost its leadership at that moment (a
// one-voter group that just got a second, still catching-up voter loses its
// lease) does not try again: then, as docs/operations.md says, the operator
// adds it with `raft add-voter --group G`. Each such miss is logged.
func (c *cluster) waitPlaced(t *testing.T, n *node, want []string, via *node) {
	t.Helper()
	deadline := time.Now().Add(placeTimeout)
	for g := range groups {
		for {
			var have []string
			if l, _ := c.leaderOf(g); l != nil {
				if peers, err := c.listPeers(l, g); err == nil {
					have = voters(peers)
				}
			}
			if slices.Equal(have, want) {
				break
			}
			if time.Now().After(deadline) {
				if slices.Contains(have, n.id) {
					c.waitVotersExactly(t, g, want) // placed; something else differs: fails with what
					break
				}
				t.Logf("PLACEMENT MISSED: group %d has voters %v without %s %v after it joined; adding it by hand (runbook)", g, have, n.id, placeTimeout)
				if out, err := c.tollgateCLI(2*time.Minute, "raft", "add-voter", "--id", n.id, "--group", fmt.Sprint(g), "--addr", via.grpcAddr); err != nil {
					t.Fatalf("raft add-voter --id %s --group %d: %v\n%s", n.id, g, err, out)
				}
				c.waitVotersExactly(t, g, want)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
