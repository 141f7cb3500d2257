package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// readyz returns node n's /readyz status code and body (0 when it does not
// answer).
func readyz(n *node) (int, string) {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + n.httpAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// fill writes a file on the filesystem of path until it refuses more: 1 MiB
// writes, then 4 KiB ones for the remainder.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total int64
	for _, size := range []int{1 << 20, 4096} {
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(i) | 1 // not zeros: nothing may store it sparsely
		}
		for {
			n, err := f.Write(buf)
			total += int64(n)
			if err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling %s: %v", path, err)
				}
				break
			}
		}
	}
	_ = f.Sync()
	return total
}

// TestFullDiskNotReady puts node-3's data dir on a small tmpfs the test
// mounts, lets node-3 lead two groups under the checker's load, then fills
// the filesystem. node-3 must report not-ready in /readyz within 5 s of the
// disk filling, lead no group while it cannot write (the others keep
// accepting writes), stay up, and return to ready by itself once the space is
// freed, with every acknowledged series kept: the checker's sweep finds no
// acknowledged series rejected, and every replica of every group ends with
// the same series at the same applied index.
func TestFullDiskNotReady(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64m,mode=0755"); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): the full-disk test needs root with mount permission", mnt, err)
	}
	// Registered before the cluster: cleanups run last-first, so the nodes
	// are killed before the filesystem is unmounted.
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})

	opts := defaultClusterOptions()
	opts.dataDirs = map[string]string{"node-3": filepath.Join(mnt, "node-3")}
	c := newCluster(t, opts)
	n3 := c.nodes[2]
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("before the disk fills")

	// node-3 leads groups 0 and 1, so the fill hits a leader's log appends.
	for g := range 2 {
		adminRetry(t, fmt.Sprintf("move group %d to node-3", g), func(ctx context.Context) error {
			l, _ := c.leaderOf(g)
			if l == n3 {
				return nil
			}
			if l == nil {
				return fmt.Errorf("group %d has no leader", g)
			}
			_, err := c.admin(l).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g), ToId: n3.id})
			if err == nil {
				if now, _ := c.leaderOf(g); now != n3 {
					return fmt.Errorf("group %d led by %v after the transfer", g, now)
				}
			}
			return err
		})
	}
	ck.waitProgress("node-3 leading groups 0 and 1")

	filler := filepath.Join(mnt, "filler")
	written := fill(t, filler)
	full := time.Now()
	t.Logf("filled the tmpfs with %d MiB", written>>20)

	// The bar: not ready within 5 s of the disk filling.
	var code int
	var body string
	for {
		code, body = readyz(n3)
		if code == http.StatusServiceUnavailable {
			break
		}
		if time.Since(full) > 5*time.Second {
			t.Fatalf("node-3 still answers /readyz %d %q 5 s after its disk filled", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("node-3 not ready %v after the disk filled: %s", time.Since(full).Round(time.Millisecond), body)
	if !strings.Contains(body, "disk not writable") {
		t.Errorf("/readyz does not say the disk is the reason: %q", body)
	}

	// Leadership handed away; the cluster keeps taking writes without it.
	waitUntil(t, "node-3 to lead no group", func() bool {
		for g := range groups {
			if l, _ := c.leaderOf(g); l == n3 {
				return false
			}
		}
		return true
	})
	ck.waitProgress("node-3's disk full")
	time.Sleep(5 * time.Second) // stay full across elections and compactions
	if !n3.running() {
		t.Fatalf("node-3 exited while its disk was full")
	}
	if code, body := readyz(n3); code != http.StatusServiceUnavailable {
		t.Fatalf("node-3 ready again (%d %q) while its disk is still full", code, body)
	}
	for g := range groups {
		if l, _ := c.leaderOf(g); l == n3 {
			t.Errorf("node-3 leads group %d while its disk is full", g)
		}
	}

	// Space returns: node-3 recovers by itself.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitUntil(t, "node-3 ready again after space returned", func() bool {
		code, body = readyz(n3)
		return code == http.StatusOK
	})
	t.Logf("node-3 ready %v after the space returned", time.Since(freed).Round(time.Millisecond))
	ck.waitProgress("after node-3's disk recovered")

	ck.finish()
	sameEverywhere(t, c)
}

// sameEverywhere waits until every node has applied the same index of every
// group and then requires the same series count there: replicas of one log
// prefix hold the same state, so a replica that lost entries shows.
func sameEverywhere(t *testing.T, c *cluster) {
	t.Helper()
	var last string
	start := time.Now()
	for time.Since(start) < progressTimeout {
		ngs := c.nodeGroups()
		if len(ngs) != len(c.nodes) {
			last = fmt.Sprintf("%d of %d nodes answer", len(ngs), len(c.nodes))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		done := true
		for g := range groups {
			var ref *api.GroupState
			for _, n := range c.nodes {
				gs := groupState(ngs[n], g)
				switch {
				case ref == nil:
					ref = gs
				case gs.AppliedIndex != ref.AppliedIndex:
					done = false
					last = fmt.Sprintf("group %d: applied %d on %s vs %d", g, gs.AppliedIndex, n.id, ref.AppliedIndex)
				case gs.Series != ref.Series:
					t.Fatalf("group %d at applied index %d: %s holds %d series, %s %d", g, gs.AppliedIndex, c.nodes[0].id, ref.Series, n.id, gs.Series)
				}
			}
		}
		if done {
			for g := range groups {
				t.Logf("group %d: %d series on every node at index %d", g, groupState(ngs[c.nodes[0]], g).Series, groupState(ngs[c.nodes[0]], g).AppliedIndex)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("replicas did not converge within %v: %s", progressTimeout, last)
}
