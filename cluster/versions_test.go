package cluster

import (
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

func TestVersionLag(t *testing.T) {
	servers := func(ids ...string) []raft.Server {
		var out []raft.Server
		for _, id := range ids {
			out = append(out, raft.Server{ID: raft.ServerID(id), Suffrage: raft.Voter})
		}
		return out
	}
	member := func(id, st string, ver int) membership.Member {
		return membership.Member{ID: id, Status: st, ClusterVersion: ver}
	}
	cases := []struct {
		name        string
		members     []membership.Member
		selfVersion int
		version     int
		want        []string // one substring per lagging server, in order
	}{
		{"all alive and current", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusAlive, 3)}, 3, 3, nil},
		{"alive voter below", []membership.Member{member("b", membership.StatusAlive, 2), member("c", membership.StatusAlive, 3)}, 3, 3,
			[]string{"b supports cluster version 2"}},
		{"self below", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusAlive, 3)}, 2, 3,
			[]string{"a supports cluster version 2"}},
		// A down voter counts with what it last advertised.
		{"failed voter current", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusFailed, 3)}, 3, 3, nil},
		{"left voter current", []membership.Member{member("b", membership.StatusLeft, 3), member("c", membership.StatusAlive, 3)}, 3, 3, nil},
		{"leaving voter current", []membership.Member{member("b", membership.StatusLeaving, 3), member("c", membership.StatusAlive, 3)}, 3, 3, nil},
		{"failed voter below", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusFailed, 1)}, 3, 3,
			[]string{"c is failed and last advertised cluster version 1"}},
		{"left voter below", []membership.Member{member("b", membership.StatusLeft, 2), member("c", membership.StatusAlive, 3)}, 3, 3,
			[]string{"b is left and last advertised cluster version 2"}},
		{"failed voter below, older entry type", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusFailed, 1)}, 3, 1, nil},
		// Nobody knows the version of a server serf does not list.
		{"not in the member list", []membership.Member{member("b", membership.StatusAlive, 3)}, 3, 1,
			[]string{"c is not in the member list"}},
		{"several", []membership.Member{member("b", membership.StatusFailed, 2)}, 1, 3,
			[]string{"a supports cluster version 1", "b is failed and last advertised cluster version 2", "c is not in the member list"}},
	}
	for _, tt := range cases {
		got, unknown := VersionLagUnknown(servers("a", "b", "c"), tt.members, nil, "a", tt.selfVersion, tt.version)
		absent := 0
		for _, w := range tt.want {
			if strings.Contains(w, "not in the member list") {
				absent++
			}
		}
		if unknown != absent {
			// moveGate turns "unknown only" into a retryable answer and
			// anything else into the static rule: the count must be exact.
			t.Errorf("%s: %d lagging for an unknown version, want %d", tt.name, unknown, absent)
		}
		if len(got) != len(tt.want) {
			t.Errorf("%s: lagging %q, want %d entries like %q", tt.name, got, len(tt.want), tt.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tt.want[i]) {
				t.Errorf("%s: lagging[%d] = %q, want it to mention %q", tt.name, i, got[i], tt.want[i])
			}
		}
	}

	// After a restart, a raft peer that gossip does not list yet counts with
	// the version this node's peers record holds for it; gossip, once it
	// lists the member, wins over the record.
	recorded := func(vers map[string]int) func(string) int {
		return func(id string) int { return vers[id] }
	}
	b3 := []membership.Member{member("b", membership.StatusAlive, 3)}
	for _, tc := range []struct {
		name    string
		members []membership.Member
		record  map[string]int
		version int
		want    string // "" none lagging; else a substring of the one lagging server
		unknown int
	}{
		{"recorded current", b3, map[string]int{"c": 3}, 3, "", 0},
		{"recorded above", b3, map[string]int{"c": 4}, 3, "", 0},
		{"recorded below: still unknown", b3, map[string]int{"c": 2}, 3, "c is not in the member list", 1},
		{"recorded without a version", b3, map[string]int{}, 3, "c is not in the member list", 1},
		{"gossip wins", []membership.Member{member("b", membership.StatusAlive, 3), member("c", membership.StatusAlive, 2)},
			map[string]int{"c": 3}, 3, "c supports cluster version 2", 0},
	} {
		got, unknown := VersionLagUnknown(servers("a", "b", "c"), tc.members, recorded(tc.record), "a", 3, tc.version)
		if unknown != tc.unknown || (tc.want == "") != (len(got) == 0) || (tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want))) {
			t.Errorf("%s: lagging %q (%d unknown), want %q (%d unknown)", tc.name, got, unknown, tc.want, tc.unknown)
		}
	}
}
