package main

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate-io/tollgate/api"
)

// On a one-node group, `raft add-voter` to an address nothing listens on (a
// closed port on 127.0.0.1) used to make that address a second voter: quorum
// 2 of 2, lost at once. It is refused with the reason, every group keeps its
// single voter and its leader, and tracking goes on.
func TestAddVoterDeadAddressOneNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, t.TempDir(), addrs)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	closed := closedPort(t)
	before := mustCLI(t, bin, "raft", "list-peers", "--addr", p.grpc)
	out, err := runCLI(t, bin, "raft", "add-voter", "--addr", p.grpc, "--group", "0", "--id", "ghost", "--address", closed)
	if err == nil || !strings.Contains(out, "does not answer raft") || !strings.Contains(out, "connection refused") ||
		!strings.Contains(out, "nothing was changed") {
		t.Fatalf("add-voter to a closed port: err=%v\n%s", err, out)
	}
	// Without an address, a server that is not a running member is refused
	// too: its log could not be checked before it votes.
	out, err = runCLI(t, bin, "raft", "add-voter", "--addr", p.grpc, "--all-groups", "--id", "ghost")
	if err == nil || !strings.Contains(out, "not a member") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("add-voter of a non-member: err=%v\n%s", err, out)
	}
	if after := mustCLI(t, bin, "raft", "list-peers", "--addr", p.grpc); after != before {
		t.Fatalf("configurations changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	mustCLI(t, bin, "status", "--addr", p.grpc)
	mustCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "a", "--count", "100")
}

// status lists replicas that do not run and exits non-zero for them: a
// shut-down replica (a voter or not), and a voter whose node does not know it
// is a member.
func TestStatusReportsDownReplicas(t *testing.T) {
	st := &api.StatusResponse{
		View: &api.ClusterView{Groups: 2, GroupInfo: []*api.GroupInfo{
			{Group: 0, LeaderId: "a", Voters: []string{"a", "b", "c"}},
			{Group: 1, LeaderId: "a", Voters: []string{"a", "b", "c"}},
		}},
		Nodes: []*api.NodeGroupsResponse{
			{NodeId: "a", Groups: []*api.GroupState{{Group: 0, RaftState: "Leader"}, {Group: 1, RaftState: "Leader"}}},
			{NodeId: "b", Groups: []*api.GroupState{{Group: 0, RaftState: "Follower"}, {Group: 1, RaftState: "Shutdown"}}},
			{NodeId: "c", Groups: []*api.GroupState{{Group: 0, RaftState: "None"}, {Group: 1, RaftState: "Follower"}}},
		},
	}
	ds := down(st)
	if len(ds) != 2 || ds[0].node != "b" || ds[0].group != 1 || !strings.Contains(ds[0].why, "shut down while the group counts it as a voter") ||
		ds[1].node != "c" || ds[1].group != 0 || !strings.Contains(ds[1].why, "no configuration naming it") {
		t.Fatalf("down replicas: %+v", ds)
	}
	err := downError(ds)
	if err == nil || !strings.Contains(err.Error(), "group 1 on b, group 0 on c") {
		t.Fatalf("downError: %v", err)
	}
	var out bytes.Buffer
	printStatus(&out, st)
	if !strings.Contains(out.String(), "REPLICA DOWN: group 1 on b: its raft replica is shut down") {
		t.Fatalf("printStatus:\n%s", out.String())
	}

	// Healthy: nothing listed; a non-voter's "None" is no fault.
	st.Nodes[1].Groups[1].RaftState = "Follower"
	st.View.GroupInfo[0].Voters = []string{"a", "b"}
	if ds := down(st); len(ds) != 0 || downError(ds) != nil {
		t.Fatalf("healthy cluster: %+v", ds)
	}
}

// closedPort returns a 127.0.0.1 address where nothing listens and nothing
// can start listening while the test runs: a TCP socket bound to the port but
// never put in listen state, so connecting is refused (RST), and no other
// process (tests run beside other builds) can take the port meanwhile.
func closedPort(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
