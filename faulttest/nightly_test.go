package faulttest

import (
	"github.com/tollgate-io/tollgate/faulttest/checker"

	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// TestNightly is the long random-fault run: one 3-node cluster of real
// processes under the checker's tracking load for TOLLGATE_NIGHTLY (a
// duration, e.g. 30m), with one fault after another drawn at random from
// every kind the other fault tests inject one at a time:
//
//   - kill-leader: SIGKILL a group's leader, wait for a new one, restart it;
//   - kill-any: SIGKILL a random node, restart it;
//   - freeze: SIGSTOP a leader for 2–6 s, then SIGCONT;
//   - graceful: SIGTERM a random node, restart it;
//   - membership: remove a follower voter of a random group, add it back;
//   - transfer: hand a random group's leadership to a random voter;
//   - wipe: SIGKILL a random node, delete its data dir (a replaced disk),
//     restart it: it must come back a healthy voter of every group;
//   - clock: restart a random node with its wall clock shifted by 0.2–3 s
//     either way (beyond the 1 s bound it must not lead), then restart it
//     on the right time;
//   - full-disk: fill the small filesystem node-3's data dir is on (a tmpfs
//     the test mounts; skipped as a kind when it cannot), hold it full for
//     2–5 s, free it.
//
// After each fault the cluster must be healthy again (every group led, 3
// voters) and writes must progress. At the end every acknowledged series
// must be in its group's state (read from a snapshot of each group), the
// checker's sweep must find none rejected, and the whole recorded history
// (every attempt of every checker client, with its invoke and return
// times) must be linearizable against the tracking model (porcupine).
// Network partitions are not among the kinds: they need docker
// (faulttest/netpart runs them, with histories).
//
//	TOLLGATE_NIGHTLY=30m go test -count=1 -timeout 60m -run '^TestNightly$' -v ./faulttest/
//
// TOLLGATE_NIGHTLY_SEED replays a run's fault sequence (the seed is logged).
// Without TOLLGATE_NIGHTLY the test is skipped: make test runs each kind in
// its own test already.
func TestNightly(t *testing.T) {
	length, seed, rng := checker.Nightly(t, "the nightly-style random fault run")

	// t-big's limit is far lower than the other fault tests' 4,000,000: the
	// history check copies a partition's set of series at each request
	// that adds to it, so its cost grows with the series a tenant
	// accumulates times the requests that add them, and 30 minutes of
	// t-big creating series without end (millions) would not check in a
	// machine's memory. At 200,000 it fills within minutes and then is a
	// tenant at its limit; the rolling tenants (one more every 3 s) keep
	// creating series through every fault.
	const bigLimit = 200_000
	opts := defaultClusterOptions()
	opts.tenantMaxSeries = maps.Clone(opts.tenantMaxSeries)
	opts.tenantMaxSeries["t-big"] = bigLimit
	opts.extraArgs = append(opts.extraArgs, "--idle-timeout", "60m")
	mnt := t.TempDir()
	diskFaults := true
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=512m,mode=0755"); err != nil {
		diskFaults = false
		t.Logf("nightly: no full-disk faults: cannot mount a tmpfs at %s (%v; needs root with mount permission)", mnt, err)
	} else {
		t.Cleanup(func() {
			if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		})
		opts.dataDirs = map[string]string{"node-3": filepath.Join(mnt, "node-3")}
	}
	c := newCluster(t, opts)
	cfg := defaultCheckerConfig()
	for i := range cfg.Tenants {
		if cfg.Tenants[i].Name == "t-big" {
			cfg.Tenants[i].MaxSeries = bigLimit
		}
	}
	// No re-sends during the run: a lost series re-sent would be created
	// again and hide the loss; the end reads every group's state instead
	// (and the sweep re-sends all of them once).
	cfg.ResendMax = 0
	ck := startChecker(t, c, cfg)
	ck.waitProgress("start")
	loadFor(3 * time.Second)

	type fault struct {
		name string
		run  func() string // what it did, for the log
	}
	pick := func(ns []*node) *node { return ns[rng.IntN(len(ns))] }
	leaderOfRandomGroup := func() (int, *node) {
		g := rng.IntN(groups)
		return g, c.waitLeader(g, nil)
	}
	faults := []fault{
		{"kill-leader", func() string {
			g, l := leaderOfRandomGroup()
			l.kill(t)
			nl := c.waitLeader(g, l)
			ck.waitProgress("SIGKILL of " + l.id)
			loadFor(time.Second)
			l.restart(t)
			return fmt.Sprintf("%s (leader of group %d; %s led next)", l.id, g, nl.id)
		}},
		{"kill-any", func() string {
			n := pick(c.nodes)
			n.kill(t)
			ck.waitProgress("SIGKILL of " + n.id)
			loadFor(time.Second)
			n.restart(t)
			return n.id
		}},
		{"freeze", func() string {
			_, l := leaderOfRandomGroup()
			d := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			l.stop(t)
			ck.waitProgress("SIGSTOP of " + l.id)
			time.Sleep(d)
			l.cont(t)
			return fmt.Sprintf("%s for %v", l.id, d.Round(time.Millisecond))
		}},
		{"graceful", func() string {
			n := pick(c.nodes)
			n.term(t)
			ck.waitProgress("SIGTERM of " + n.id)
			loadFor(time.Second)
			n.restart(t)
			return n.id
		}},
		{"membership", func() string {
			g, l := leaderOfRandomGroup()
			victim := followerVoter(t, c, g, l)
			via := pick(c.nodes)
			adminRetry(t, "RemoveServer", func(ctx context.Context) error {
				_, err := c.admin(via).RemoveServer(ctx, &api.RemoveServerRequest{Group: uint32(g), Id: victim.Id})
				return err
			})
			waitVoters(t, c, g, 2)
			ck.waitProgress("RemoveServer " + victim.Id)
			loadFor(time.Second)
			adminRetry(t, "AddVoter", func(ctx context.Context) error {
				_, err := c.admin(via).AddVoter(ctx, &api.AddVoterRequest{Group: uint32(g), Id: victim.Id, Address: victim.Address})
				return err
			})
			waitVoters(t, c, g, 3)
			return fmt.Sprintf("group %d: %s removed and added back via %s", g, victim.Id, via.id)
		}},
		{"transfer", func() string {
			g, l := leaderOfRandomGroup()
			var to string
			adminRetry(t, "TransferLeadership", func(ctx context.Context) error {
				resp, err := c.admin(l).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g)})
				if err == nil {
					to = resp.NewLeaderId
				}
				return err
			})
			return fmt.Sprintf("group %d: %s to %s", g, l.id, to)
		}},
		{"wipe", func() string {
			n := pick(c.nodes)
			n.kill(t)
			if err := os.RemoveAll(n.dir); err != nil {
				t.Fatal(err)
			}
			ck.waitProgress("wipe of " + n.id)
			n.restart(t)
			// The new incarnation joins as a learner, takes a snapshot of
			// every group and is promoted: on a loaded 2-core machine that
			// took up to 72 s, near waitHealthy's 120 s, so it gets longer.
			healed := time.Now()
			for c.health() != "" && time.Since(healed) < 5*time.Minute {
				time.Sleep(500 * time.Millisecond)
			}
			return fmt.Sprintf("%s (data dir deleted; a voter of every group again %v after its restart)", n.id, time.Since(healed).Round(time.Millisecond))
		}},
		{"clock", func() string {
			n := pick(c.nodes)
			off := 200*time.Millisecond + time.Duration(rng.Int64N(int64(2800*time.Millisecond)))
			if rng.IntN(2) == 0 {
				off = -off
			}
			plain := n.args
			n.term(t)
			n.args = setArg(plain, "--test-clock-offset", off.String())
			n.restart(t)
			c.waitHealthy()
			ck.waitProgress(fmt.Sprintf("%s on a clock %v off", n.id, off))
			loadFor(3*time.Second + time.Duration(rng.Int64N(int64(5*time.Second))))
			n.term(t)
			n.args = plain
			n.restart(t)
			return fmt.Sprintf("%s %v off, then right", n.id, off.Round(time.Millisecond))
		}},
	}
	if diskFaults {
		faults = append(faults, fault{"full-disk", func() string {
			n3 := c.nodes[2]
			filler := filepath.Join(mnt, "filler")
			written := fill(t, filler)
			full := time.Now()
			notReady := "never"
			for time.Since(full) < 10*time.Second {
				if code, _ := readyz(n3); code == http.StatusServiceUnavailable {
					notReady = time.Since(full).Round(time.Millisecond).String()
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			ck.waitProgress("node-3's disk full")
			time.Sleep(2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second))))
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("node-3's filesystem filled (%d MiB), not ready after %s, freed", written>>20, notReady)
		}})
	}

	start := time.Now()
	counts := map[string]int{}
	for round := 1; time.Since(start) < length; round++ {
		f := faults[rng.IntN(len(faults))]
		t0 := time.Now()
		what := f.run()
		c.waitHealthy()
		ck.waitProgress(f.name + " done")
		counts[f.name]++
		t.Logf("nightly fault %d at %v: %s: %s; healthy again %v after it began", round, time.Since(start).Round(time.Second), f.name, what, time.Since(t0).Round(time.Millisecond))
		loadFor(time.Second + time.Duration(rng.Int64N(int64(3*time.Second))))
	}

	loadFor(2 * time.Second)
	ck.Stop()
	c.waitHealthy()
	lost, total := lostSeries(t, c, c.nodes[0], ck.AckedHashes())
	if lost > 0 {
		t.Errorf("%d of %d acknowledged series lost (must be 0)", lost, total)
	}
	ck.Sweep()
	ck.Report()
	checkStart := time.Now()
	ck.checkHistory()
	c.checkNoCrashes()
	var kinds []string
	for name, n := range counts {
		kinds = append(kinds, fmt.Sprintf("%s %d", name, n))
	}
	slices.Sort(kinds)
	t.Logf("nightly: %v, seed %d, faults: %s; acknowledged series %d, lost %d; history checked in %v",
		time.Since(start).Round(time.Second), seed, strings.Join(kinds, ", "), total, lost, time.Since(checkStart).Round(time.Millisecond))
}
