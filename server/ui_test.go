package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
)

// screenshotsEnv makes TestDashboard write its screenshots to docs/screenshots
// (the images docs/dashboard.md shows) instead of only taking them.
const screenshotsEnv = "TOLLGATE_UPDATE_SCREENSHOTS"

// chromiumPath finds a Chromium or Chrome binary; "" when none is installed.
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestDashboard drives the web dashboard of a real three-node cluster (raft,
// gRPC, gossip and HTTP on loopback) in headless Chromium and asserts on what
// the page shows a person: three zones with a live member each, a tenant at 90%
// of its limit marked near limit, the tenant's own page, and a stopped node
// turning failed.
func TestDashboard(t *testing.T) {
	chrome := chromiumPath()
	if chrome == "" {
		t.Skip("no chromium binary on PATH: install Debian's chromium (apt-get install chromium; .ci/run does) to run the dashboard test")
	}
	const limit = 400 // max_series for every tenant; group share 100 with P=64, G=4
	tc := startCluster(t, 3, func(i int, c *Config) {
		c.Node.HTTPAddr = "127.0.0.1:0"
		c.Tracking.DefaultMaxSeries = limit
	})
	// The browser opens the dashboard of a node that leads a group, so the
	// request and series rates it counts itself are not all zero; the node
	// killed later is another one.
	dash := tc.leader(0)
	victim := len(tc.nodes) - 1
	if tc.nodes[victim] == dash {
		victim--
	}
	base := "http://" + dash.HTTPAddr() + "/ui/"

	// acme: 90 series in each of the 4 groups = 360 of 400 (90%, near limit).
	// globex: 40 per group (40%). initech grows a little while the browser
	// watches, so the rates on the page are real.
	for g := range 4 {
		if rej := tc.trackLeader(g, "acme", g*16, hashesIn(100, g*16, 90)); len(rej) != 0 {
			t.Fatalf("acme: %d of 90 rejected in group %d below its share", len(rej), g)
		}
		if rej := tc.trackLeader(g, "globex", g*16+1, hashesIn(200, g*16+1, 40)); len(rej) != 0 {
			t.Fatalf("globex: %d of 40 rejected in group %d", len(rej), g)
		}
	}
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var loadWG sync.WaitGroup
	loadWG.Add(1)
	go func() { defer loadWG.Done(); dashboardLoad(loadCtx, tc) }()
	defer func() { stopLoad(); loadWG.Wait() }()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1360, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// Bounds the whole browser session: only catches a hung browser.
	bctx, cancelTimeout := context.WithTimeout(bctx, 5*time.Minute)
	defer cancelTimeout()

	// The nodes have an admin token, so the dashboard's data needs a
	// credential: the token the page would ask for (a prompt, which would
	// block a headless browser), kept for this tab before the page loads.
	origin := "http://" + dash.HTTPAddr()
	if err := chromedp.Do(bctx, chromedp.Navigate(origin+"/healthz")); err != nil {
		t.Fatalf("open %s/healthz in chromium: %v", origin, err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`sessionStorage.setItem("tollgate-token", "`+testToken+`"); true`)); err != nil {
		t.Fatalf("token for the dashboard: %v", err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(base)); err != nil {
		t.Fatalf("open %s in chromium: %v", base, err)
	}

	// Overview: three zones, each with its member alive; every group led.
	waitPage(t, bctx, "three zones with one alive member each", `Array.from(document.querySelectorAll(".zone")).map(z => z.innerText)`,
		func(zones []string) bool {
			if len(zones) != 3 {
				return false
			}
			for i, z := range zones {
				z = strings.ToLower(z)
				if !strings.Contains(z, fmt.Sprintf("zone-%c", 'a'+i)) || !strings.Contains(z, fmt.Sprintf("n%d", i+1)) ||
					!strings.Contains(z, "alive") || strings.Contains(z, "failed") {
					return false
				}
			}
			return true
		})
	waitPage(t, bctx, "four groups, each with a leader and three voters", `Array.from(document.querySelectorAll("tr[data-group]")).map(r => r.innerText)`,
		func(rows []string) bool {
			if len(rows) != 4 {
				return false
			}
			for _, r := range rows {
				if strings.Contains(r, "no leader") || !strings.Contains(r, "n1") || !strings.Contains(r, "n2") ||
					!strings.Contains(r, "n3") || strings.Contains(r, "?") {
					return false
				}
			}
			return true
		})
	waitPage(t, bctx, "cards show 3/3 members alive, measured rates and one tenant near limit", `Array.from(document.querySelectorAll(".card")).map(c => c.innerText)`,
		func(cards []string) bool {
			all := strings.ToLower(strings.Join(cards, "\n"))
			return strings.Contains(all, "members alive\n3 / 3") && strings.Contains(all, "tenants near limit\n1 / 3") &&
				!strings.Contains(all, "measuring")
		})
	// The rates and sparklines fill in as the page keeps polling.
	waitPage(t, bctx, "rates measured over at least 8 s", `[document.querySelector("p.small") ? document.querySelector("p.small").innerText : ""]`,
		func(v []string) bool {
			var secs int
			i := strings.Index(v[0], "over the last ")
			if i < 0 {
				return false
			}
			_, err := fmt.Sscanf(v[0][i:], "over the last %d s", &secs)
			return err == nil && secs >= 8
		})
	assertNoForeignResources(t, bctx, "http://"+dash.HTTPAddr())
	shot(t, bctx, "overview")

	// Tenants: sorted by usage, acme first and highlighted as near its limit.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`a[data-nav="tenants"]`))); err != nil {
		t.Fatalf("click Tenants: %v", err)
	}
	waitPage(t, bctx, "acme first, at 90% and near limit; globex ok", `Array.from(document.querySelectorAll("tr[data-tenant]")).map(r => r.className + " :: " + r.innerText)`,
		func(rows []string) bool {
			if len(rows) < 3 {
				return false
			}
			acme, globex := rows[0], strings.Join(rows, "\n")
			return strings.Contains(acme, "row-near") && strings.Contains(acme, "acme") && strings.Contains(acme, "90%") &&
				strings.Contains(acme, "near limit") && strings.Contains(acme, "360") &&
				strings.Contains(globex, "globex") && strings.Contains(globex, "40%")
		})
	waitPage(t, bctx, "globex not near limit", `Array.from(document.querySelectorAll('tr[data-tenant="globex"]')).map(r => r.innerText)`,
		func(rows []string) bool {
			return len(rows) == 1 && strings.Contains(rows[0], "ok") && !strings.Contains(rows[0], "near")
		})
	shot(t, bctx, "tenants")

	// Tenant page: reached by clicking the tenant, per-group usage against shares.
	// The tenants table is re-rendered on every poll: a click that lands
	// while its row is replaced is lost (seen on a loaded machine), so the
	// link is clicked again until the page changes.
	clickUntil(t, bctx, `tr[data-tenant="acme"] a`, `[document.querySelector("h1") ? document.querySelector("h1").innerText : ""]`,
		func(h []string) bool { return strings.Contains(h[0], "acme") })
	waitPage(t, bctx, "acme's page: 360 of 400, near limit", `[document.querySelector("h1") ? document.querySelector("h1").innerText : "", ...Array.from(document.querySelectorAll(".card")).map(c => c.innerText)]`,
		func(parts []string) bool {
			all := strings.Join(parts, "\n")
			return strings.Contains(parts[0], "acme") && strings.Contains(parts[0], "near limit") &&
				strings.Contains(all, "360") && strings.Contains(all, "400") && strings.Contains(all, "90%")
		})
	waitPage(t, bctx, "acme's four groups at 90 of a 100 share", `Array.from(document.querySelectorAll("tr[data-group]")).map(r => r.innerText)`,
		func(rows []string) bool {
			if len(rows) != 4 {
				return false
			}
			for _, r := range rows {
				if !strings.Contains(r, "90") || !strings.Contains(r, "100") || !strings.Contains(r, "near limit") {
					return false
				}
			}
			return true
		})
	shot(t, bctx, "tenant")

	// A tenant whose series all land in group 0: group 0 borrows the other
	// groups' headroom (movable shares), so their shares drop to 0. A share
	// of 0 of a limited tenant is headroom lent away, not "unlimited" (the
	// page once showed ∞ there).
	if rej := tc.trackLeader(0, "hooli", 0, hashesIn(400, 0, limit)); len(rej) != 0 {
		t.Fatalf("hooli: %d of %d rejected in group 0 at the tenant's limit", len(rej), limit)
	}
	// A fragment change is not a page load: set it in the page.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`location.hash = "#tenant/hooli"; true`)); err != nil {
		t.Fatalf("open hooli's page: %v", err)
	}
	waitPage(t, bctx, "hooli's group 0 at a share of 400, groups 1-3 at a share of 0 lent away, nothing unlimited",
		`Array.from(document.querySelectorAll("tr[data-group]")).map(r => Array.from(r.cells).map(c => c.innerText.trim()).join("|"))`,
		func(rows []string) bool {
			if len(rows) != 4 {
				return false
			}
			for g, r := range rows {
				c := strings.Split(r, "|") // group, partitions, active, share, usage, status
				if len(c) != 6 || strings.Contains(r, "∞") || strings.Contains(strings.ToLower(r), "unlimited") {
					return false
				}
				if g == 0 && (c[2] != "400" || c[3] != "400" || c[5] != "at share") {
					return false
				}
				if g > 0 && (c[2] != "0" || c[3] != "0" || c[5] != "lent away") {
					return false
				}
			}
			return true
		})

	// A tenant at 21% of its limit whose series all sit in group 1, at 85 of
	// that group's 100 share: near a group share, not near its limit, and the
	// tenants page says which (a tenant at 77% read "near limit" beside one
	// at 78% read "ok", with nothing to tell them apart).
	if rej := tc.trackLeader(1, "umbrella", 16, hashesIn(500, 16, 85)); len(rej) != 0 {
		t.Fatalf("umbrella: %d of 85 rejected in group 1", len(rej))
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`location.hash = "#tenants"; true`)); err != nil {
		t.Fatalf("open the tenants page: %v", err)
	}
	waitPage(t, bctx, "umbrella near a group share (group 1), not near its limit", `Array.from(document.querySelectorAll('tr[data-tenant="umbrella"]')).map(r => r.innerText)`,
		func(rows []string) bool {
			return len(rows) == 1 && strings.Contains(rows[0], "near a group share") && strings.Contains(rows[0], "group 1") &&
				strings.Contains(rows[0], "21%") && !strings.Contains(rows[0], "near limit")
		})

	// Kill the victim: its gossip stops without a leave message — what kill
	// -9 looks like to the others — and then the rest of it stops. The page
	// must turn it failed.
	stopLoad()
	loadWG.Wait()
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`a[data-nav="overview"]`))); err != nil {
		t.Fatalf("click Overview: %v", err)
	}
	dead := tc.nodes[victim]
	deadID := dead.cfg.Node.ID
	if err := dead.members.Shutdown(); err != nil {
		t.Fatalf("shut down %s's gossip: %v", deadID, err)
	}
	stop(t, dead)
	tc.nodes[victim] = nil
	waitPage(t, bctx, deadID+" failed, the other two alive", `Array.from(document.querySelectorAll("[data-member]")).map(m => m.innerText)`,
		func(ms []string) bool {
			if len(ms) != 3 {
				return false
			}
			for i, m := range ms {
				want := "alive"
				if i == victim {
					want = "failed"
				}
				if !strings.Contains(m, fmt.Sprintf("n%d", i+1)) || !strings.Contains(m, want) {
					return false
				}
			}
			return true
		})
	waitPage(t, bctx, "2/3 alive, every group led by a live node, "+deadID+"'s replicas unknown",
		`[...Array.from(document.querySelectorAll(".card")).map(c => c.innerText), ...Array.from(document.querySelectorAll("tr[data-group]")).map(r => r.innerText)]`,
		func(parts []string) bool {
			all := strings.ToLower(strings.Join(parts, "\n"))
			if !strings.Contains(all, "members alive\n2 / 3") || !strings.Contains(all, deadID+" failed") {
				return false
			}
			rows := 0
			for _, p := range parts {
				if strings.Contains(p, deadID+" ?") {
					rows++
				}
				if strings.Contains(p, "no leader") {
					return false
				}
			}
			return rows == 4
		})
	shot(t, bctx, "node-failed")
}

// dashboardLoad sends a little traffic to each group's leader until ctx ends:
// globex refreshes its series and initech adds a few new ones, so the page's
// request and series rates show real, non-zero numbers.
func dashboardLoad(ctx context.Context, tc *testCluster) {
	clients := map[string]api.TrackerClient{}
	for _, s := range tc.nodes {
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
		if err != nil {
			return // no load: the rates on the page read 0
		}
		defer cc.Close()
		clients[s.cfg.Node.ID] = api.NewTrackerClient(cc)
	}
	added := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for g := range 4 {
			var c api.TrackerClient
			for _, s := range tc.nodes {
				if s.Raft(g).State() == raft.Leader {
					c = clients[s.cfg.Node.ID]
				}
			}
			if c == nil {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, _ = c.TrackSeries(rctx, &api.TrackSeriesRequest{Tenant: "globex", Partition: uint32(g*16 + 1), Hashes: hashesIn(200, g*16+1, 40)})
			// initech grows by one series per group every third tick and
			// stops at 70: below the near-limit mark of its 100 share.
			_, _ = c.TrackSeries(rctx, &api.TrackSeriesRequest{Tenant: "initech", Partition: uint32(g*16 + 2), Hashes: hashesIn(300, g*16+2, added/3+1)})
			cancel()
		}
		if added/3+1 < 70 {
			added++
		}
	}
}

// waitPage evaluates js (returning a list of strings) in the page until check
// accepts it. The deadline is generous: it only catches a page that never gets
// there, and the last value seen is in the failure.
// clickUntil clicks the element at sel until check holds for js's value
// (up to a minute), at most every 2 s.
func clickUntil(t *testing.T, ctx context.Context, sel, js string, check func([]string) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Click waits for the element: bounded, since the page may have
		// changed already.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := chromedp.Do(cctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		for until := time.Now().Add(2 * time.Second); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
			if v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js)); err == nil && check(v) {
				return
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("click %s: the page did not change (last click: %v)", sel, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitPage(t *testing.T, ctx context.Context, what, js string, check func([]string) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last []string
	var lastErr error
	for {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js))
		if err == nil {
			last, lastErr = v, nil
			if check(v) {
				return
			}
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("dashboard never showed %s; last seen (err %v):\n%s", what, lastErr, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// assertNoForeignResources checks that everything the page loaded came from
// the node itself: no CDN, no external font.
func assertNoForeignResources(t *testing.T, ctx context.Context, origin string) {
	t.Helper()
	urls, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`performance.getEntriesByType("resource").map(e => e.name)`))
	if err != nil {
		t.Fatalf("list loaded resources: %v", err)
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, origin+"/") {
			t.Errorf("dashboard loaded %s from outside the node (%s)", u, origin)
		}
	}
}

// shot takes a full-page screenshot and, with TOLLGATE_UPDATE_SCREENSHOTS=1,
// writes it to docs/screenshots/<name>.png.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if os.Getenv(screenshotsEnv) == "" {
		return
	}
	dir := filepath.Join("..", "docs", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatalf("write screenshot: %v", err)
	}
	t.Logf("wrote %s (%d bytes)", p, len(png))
}
