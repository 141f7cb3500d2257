package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRaftRecoverRefusesIncompleteFlags: the offline recovery names what is
// missing and touches nothing; a directory that is not a node's data dir is
// refused as such.
func TestRaftRecoverRefusesIncompleteFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--all-groups"}, "--data-dir and --node-id"},
		{[]string{"--data-dir", dir, "--all-groups"}, "--data-dir and --node-id"},
		{[]string{"--data-dir", dir, "--node-id", "a1"}, "give --group G or --all-groups"},
		{[]string{"--data-dir", dir, "--node-id", "a1", "--group", "1", "--all-groups"}, "not both"},
		{[]string{"--data-dir", dir, "--node-id", "a1", "--all-groups", "--force"}, "is not the data dir of a tollgate node"},
	} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"raft", "recover"}, tc.args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("raft recover %s: %v, want an error saying %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
