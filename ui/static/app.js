// Tollgate dashboard: polls this node's JSON API once a second and renders one
// of three pages chosen by the URL fragment (#overview, #tenants,
// #tenant/NAME). Plain DOM code on purpose: no framework, no build step, and
// nothing loaded from outside the node.
"use strict";
(function () {
  const POLL_MS = 1000;
  const HISTORY = 90; // points kept for the sparklines (1.5 min at 1 poll/s)

  const state = {
    overview: null, // last /api/v1/overview
    overviewError: "",
    tenantList: null, // fallback list when the overview carries no tenants
    tenantListError: "",
    tenant: null, // last /api/v1/tenants/{name} for the tenant page
    tenantName: "",
    tenantError: "",
    history: [],
    lastOK: 0,
    inflight: false,
  };

  // ---- helpers ---------------------------------------------------------

  function esc(s) {
    return String(s === undefined || s === null ? "" : s).replace(/[&<>"']/g, (c) =>
      ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function num(x) { const n = Number(x); return Number.isFinite(n) ? n : 0; }
  function fmtInt(n) { return Math.round(num(n)).toLocaleString("en-US"); }
  function fmtRate(x) {
    x = num(x);
    if (x === 0) return "0";
    if (Math.abs(x) < 10) return x.toFixed(1);
    return Math.round(x).toLocaleString("en-US");
  }
  function fmtPct(f) { f = num(f) * 100; return (f > 0 && f < 1 ? f.toFixed(1) : Math.round(f)) + "%"; }
  // pick returns the first field present: the tenant endpoints are evolving,
  // so the page accepts the names it knows of rather than break on a rename.
  function pick(obj, ...names) {
    if (!obj) return undefined;
    for (const n of names) if (obj[n] !== undefined && obj[n] !== null) return obj[n];
    return undefined;
  }
  function tenantLink(name) { return "#tenant/" + encodeURIComponent(name); }
  function route() {
    const h = decodeURIComponent(location.hash.replace(/^#/, ""));
    if (h.startsWith("tenant/")) return { page: "tenant", tenant: h.slice("tenant/".length) };
    if (h === "tenants") return { page: "tenants" };
    return { page: "overview" };
  }

  // A node with scoped credentials answers 401 without a token: ask once
  // for one with the read scope and keep it for this browser tab only.
  let askedToken = false;
  async function getJSON(path) {
    const tok = sessionStorage.getItem("tollgate-token");
    const r = await fetch(path, { cache: "no-store", headers: tok ? { Authorization: "Bearer " + tok } : {} });
    if (r.status === 401 && !askedToken) {
      askedToken = true;
      const t = window.prompt("This node requires a credential with the read scope. Token:");
      if (t && t.trim()) {
        sessionStorage.setItem("tollgate-token", t.trim());
        return getJSON(path);
      }
    }
    const text = await r.text();
    if (!r.ok) {
      const e = new Error(text.trim() || r.statusText);
      e.status = r.status;
      throw e;
    }
    return JSON.parse(text);
  }

  function sparkline(values, cls) {
    const w = 160, h = 34;
    const open = `<svg class="spark ${cls}" width="100%" height="${h}" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" aria-hidden="true">`;
    if (values.length < 2) return open + "</svg>";
    const lo = Math.min(...values), hi = Math.max(...values);
    const span = hi - lo || 1;
    // A short history still spans a third of the width, so the first
    // seconds show a line rather than a tick at the right edge.
    const step = w / (Math.max(values.length, HISTORY / 3) - 1);
    const x0 = w - step * (values.length - 1);
    const pts = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 3 - ((v - lo) / span) * (h - 6)).toFixed(1)}`);
    return open + `<polyline points="${pts.join(" ")}"/></svg>`;
  }

  function usageBar(fraction, near) {
    const f = Math.max(0, Math.min(1, num(fraction)));
    const cls = num(fraction) >= 1 ? "full" : near ? "near" : "";
    return `<div class="bar ${cls}"><div style="width:${(f * 100).toFixed(1)}%"></div></div>`;
  }

  // A tenant is near its limit overall (≥ the near-limit fraction of
  // max_series) or in a group (≥ that fraction of the group's share): the
  // second can make a tenant at 77% "near" beside one at 78% that is "ok", so
  // the pill says which, and the groups are listed beside it.
  function tenantStatus(t, nearFraction) {
    if (!t.limit) return `<span class="pill grey">unlimited</span>`;
    if (t.fraction >= 1) return `<span class="pill red">at limit</span>`;
    if (t.near && t.fraction >= nearFraction) return `<span class="pill amber">near limit</span>`;
    if (t.near) return `<span class="pill amber" title="below ${fmtPct(nearFraction)} of max_series overall, but at least that much of its share in a group">near a group share</span>`;
    return `<span class="pill green">ok</span>`;
  }

  // tenants returns the tenant rows with normalised field names, from the
  // overview or, for a server without it, the tenant list endpoint.
  function tenants() {
    const ov = state.overview;
    const near = ov ? num(ov.near_limit_fraction) || 0.85 : 0.85;
    const raw = ov && Array.isArray(ov.tenants) ? ov.tenants : state.tenantList;
    if (!Array.isArray(raw)) return null;
    return raw.map((t) => {
      const active = num(pick(t, "active", "active_series", "series"));
      const limit = num(pick(t, "limit", "max_series"));
      let fraction = pick(t, "fraction", "fraction_of_limit");
      fraction = fraction === undefined ? (limit ? active / limit : 0) : num(fraction);
      let isNear = pick(t, "near_limit", "near");
      isNear = isNear === undefined ? limit > 0 && fraction >= near : Boolean(isNear);
      return { name: String(pick(t, "tenant", "name", "id")), active, limit, fraction, near: isNear, nearGroups: t.near_groups || [] };
    }).sort((a, b) => b.fraction - a.fraction || b.active - a.active || a.name.localeCompare(b.name));
  }

  // ---- pages -----------------------------------------------------------

  function renderOverview(ov) {
    const members = ov.zones.flatMap((z) => z.members || []);
    const alive = members.filter((m) => m.health === "alive").length;
    const groups = ov.groups || [];
    const led = groups.filter((g) => g.leader).length;
    const r = ov.rates || {};
    const ts = tenants() || [];
    const nearCount = ts.filter((t) => t.near).length;
    const hist = state.history;

    const cards = [
      card("Members alive", `${alive} / ${members.length}`, alive < members.length ? "bad" : "good",
        members.filter((m) => m.health !== "alive").map((m) => `${esc(m.id)} ${esc(m.health)}`).join(", ") || "all healthy"),
      card("Groups with a leader", `${led} / ${groups.length}`, led < groups.length ? "bad" : "good",
        led < groups.length ? "some groups cannot accept writes" : "every group accepts writes"),
      card("Active series", fmtInt(r.active_series), "",
        `${r.window_seconds ? (num(r.active_series_change_per_second) >= 0 ? "+" : "") + fmtRate(r.active_series_change_per_second) + " /s" : "measuring…"}` +
        sparkline(hist.map((p) => p.active), "blue")),
      card("Raft entries /s", r.window_seconds ? fmtRate(r.raft_entries_per_second) : "…", "",
        "applied, all groups" + sparkline(hist.map((p) => p.entries), "blue")),
      card("Requests /s", r.window_seconds ? fmtRate(r.requests_per_second) : "…", num(r.request_errors_per_second) > 0 ? "warn" : "",
        `answered by ${esc(ov.node)} · ${fmtRate(r.request_errors_per_second)} errors /s` + sparkline(hist.map((p) => p.requests), "green")),
      card("New series /s", r.window_seconds ? fmtRate(r.series_created_per_second) : "…", "",
        `in groups ${esc(ov.node)} leads · ${fmtRate(r.series_refreshed_per_second)} refreshed · <span class="${num(r.series_rejected_per_second) > 0 ? "redtext" : ""}">${fmtRate(r.series_rejected_per_second)} rejected</span>` +
        sparkline(hist.map((p) => p.created), "green")),
      card("Tenants near limit", `${nearCount} / ${ts.length}`, nearCount ? "warn" : "good",
        `<a href="#tenants">≥ ${fmtPct(ov.near_limit_fraction)} of max_series</a>`),
    ];

    const zones = ov.zones.map((z) => `
      <div class="zone" data-zone="${esc(z.zone)}">
        <h3>${esc(z.zone)}</h3>
        ${(z.members || []).map(memberCard).join("")}
      </div>`).join("");

    const rows = groups.map((g) => {
      const applied = (g.voters || []).filter((v) => v.known).map((v) => num(v.applied_index));
      const top = applied.length ? Math.max(...applied) : 0;
      const voters = (g.voters || []).map((v) => {
        if (!v.known) return `<span class="voter unknown" title="did not answer">${esc(v.id)} <b>?</b></span>`;
        const lag = top - num(v.applied_index);
        const cls = [v.id === g.leader ? "lead" : "", lag > 1000 ? "lag" : ""].join(" ");
        return `<span class="voter ${cls}" title="${esc(v.state)}: applied ${fmtInt(v.applied_index)}, commit ${fmtInt(v.commit_index)}, last ${fmtInt(v.last_index)}">` +
          `${esc(v.id)} <b>${fmtInt(v.applied_index)}</b>${lag > 0 ? ` <i>−${fmtInt(lag)}</i>` : ""}</span>`;
      }).join("");
      return `<tr data-group="${g.group}">
        <td class="num">${g.group}</td>
        <td>${g.partitions[0]}–${g.partitions[1] - 1}</td>
        <td>${g.leader ? `<b>${esc(g.leader)}</b>` : `<span class="pill red">no leader</span>`}</td>
        <td class="num">${fmtInt(g.series)}</td>
        <td class="num">${fmtInt(g.tenants)}</td>
        <td>${voters}</td></tr>`;
    }).join("");

    return `
      <section class="cards">${cards.join("")}</section>
      <p class="muted small">Rates over the last ${r.window_seconds ? Math.round(r.window_seconds) + " s" : "seconds"}.
        Active series and raft entries are cluster-wide (each group's leader); requests and new series are what <b>${esc(ov.node)}</b> counted itself:
        open the dashboard of another node for its share.</p>
      <h2>Cluster by zone</h2>
      <section class="zones">${zones || `<p class="muted">No members known yet.</p>`}</section>
      <h2>Raft groups</h2>
      <table class="grid">
        <thead><tr><th class="num">Group</th><th>Partitions</th><th>Leader</th><th class="num">Active series</th><th class="num">Tenants</th><th>Voters · applied index</th></tr></thead>
        <tbody>${rows}</tbody>
      </table>`;
  }

  function card(title, value, cls, sub) {
    return `<div class="card ${cls}"><div class="ctitle">${esc(title)}</div><div class="cvalue">${value}</div><div class="csub">${sub}</div></div>`;
  }

  function memberCard(m) {
    const pill = { alive: "green", failed: "red", unreachable: "amber", leaving: "grey", left: "grey" }[m.health] || "grey";
    const led = (m.groups_led || []);
    return `<div class="member h-${esc(m.health)}" data-member="${esc(m.id)}">
      <div class="mhead"><span class="mname">${esc(m.id)}</span>${m.self ? `<span class="you">this node</span>` : ""}
        <span class="pill ${pill} health">${esc(m.health)}</span></div>
      <div class="mdetail">gRPC ${esc(m.grpc) || "—"}</div>
      <div class="mdetail">${led.length ? `leads group${led.length > 1 ? "s" : ""} ${led.join(", ")}` : "leads no group"}</div>
      ${m.clock_offset_ns === undefined ? "" : `<div class="mdetail${m.clock_out_of_bound ? " bad" : ""}">clock ${fmtOffset(m.clock_offset_ns)} from the cluster's${m.clock_out_of_bound ? ": out of bound, may not lead" : ""}</div>`}
    </div>`;
  }

  // fmtOffset prints a signed clock offset in ns with a readable unit.
  function fmtOffset(ns) {
    const a = Math.abs(ns), sign = ns < 0 ? "−" : "+";
    if (a >= 60e9) return `${sign}${(a / 60e9).toFixed(1)} min`;
    if (a >= 1e9) return `${sign}${(a / 1e9).toFixed(2)} s`;
    return `${sign}${(a / 1e6).toFixed(1)} ms`;
  }

  function renderTenants(ov) {
    const ts = tenants();
    if (ts === null) {
      return `<h1>Tenants</h1><p class="notice">${state.tenantListError ? esc(state.tenantListError) : "Loading…"}</p>`;
    }
    const near = ts.filter((t) => t.near).length;
    const frac = ov ? ov.near_limit_fraction : 0.85;
    const rows = ts.map((t) => `
      <tr class="${t.fraction >= 1 ? "row-full" : t.near ? "row-near" : ""}" data-tenant="${esc(t.name)}">
        <td><a href="${tenantLink(t.name)}">${esc(t.name)}</a></td>
        <td class="num">${fmtInt(t.active)}</td>
        <td class="num">${t.limit ? fmtInt(t.limit) : "∞"}</td>
        <td><div class="usage">${t.limit ? usageBar(t.fraction, t.near) : ""}<span class="pct">${t.limit ? fmtPct(t.fraction) : ""}</span></div></td>
        <td>${tenantStatus(t, frac)}${t.near && t.nearGroups.length ? ` <span class="muted small">group${t.nearGroups.length > 1 ? "s" : ""} ${t.nearGroups.join(", ")}</span>` : ""}</td>
      </tr>`).join("");
    return `
      <h1>Tenants</h1>
      <p class="lead">${ts.length} tenant${ts.length === 1 ? "" : "s"} with active series ·
        <b class="${near ? "ambertext" : ""}">${near} near limit</b>
        <span class="muted">(≥ ${fmtPct(frac)} of max_series, overall or in one group's share)</span></p>
      ${ts.length ? `<table class="grid tenants">
        <thead><tr><th>Tenant</th><th class="num">Active series</th><th class="num">Limit</th><th>Usage</th><th>Status</th></tr></thead>
        <tbody>${rows}</tbody></table>` : `<p class="muted">No tenant has active series.</p>`}`;
  }

  function renderTenant(name, ov) {
    const head = `<p class="crumbs"><a href="#tenants">Tenants</a> › ${esc(name)}</p>`;
    if (state.tenantError) return head + `<h1>${esc(name)}</h1><p class="notice">${esc(state.tenantError)}</p>`;
    const t = state.tenant;
    if (!t || state.tenantName !== name) return head + `<h1>${esc(name)}</h1><p class="muted">Loading…</p>`;
    if (t.known === false || t.exists === false) {
      return head + `<h1>${esc(name)}</h1><p class="notice">Tenant “${esc(name)}” is unknown to this node: it has never tracked a series here.</p>`;
    }
    const perGroup = pick(t, "series_per_group", "per_group", "active_per_group") || [];
    const shares = pick(t, "share_per_group", "shares", "group_shares") || [];
    const limit = num(pick(t, "max_series", "limit"));
    const total = num(pick(t, "series", "active", "active_series"));
    const nearFrac = ov ? num(ov.near_limit_fraction) || 0.85 : 0.85;
    const fraction = limit ? total / limit : 0;
    const groups = ov ? ov.groups || [] : [];
    let nearGroups = 0;
    // A group's share is 0 in two different cases: the tenant has no limit
    // (every share is 0 = unlimited), or it has one and the group lent all
    // its headroom to other groups (movable shares). Only the first is
    // unlimited; the second is a share of 0, at share once anything is in it.
    const rows = perGroup.map((n, g) => {
      const share = num(shares[g]);
      const unlimited = !limit;
      const lent = !unlimited && share <= 0;
      const f = share > 0 ? num(n) / share : lent && num(n) > 0 ? 1 : 0;
      const isNear = share > 0 && f >= nearFrac;
      if (isNear) nearGroups++;
      const parts = groups[g] ? `${groups[g].partitions[0]}–${groups[g].partitions[1] - 1}` : "";
      const statusPill = unlimited ? `<span class="pill grey">unlimited</span>` :
        f >= 1 ? `<span class="pill red">at share</span>` :
        lent ? `<span class="pill grey" title="this group lent its headroom to other groups; it borrows back before refusing">lent away</span>` :
        isNear ? `<span class="pill amber">near limit</span>` : `<span class="pill green">ok</span>`;
      return `<tr class="${f >= 1 ? "row-full" : isNear ? "row-near" : ""}" data-group="${g}">
        <td class="num">${g}</td><td>${parts}</td>
        <td class="num">${fmtInt(n)}</td><td class="num">${unlimited ? "∞" : fmtInt(share)}</td>
        <td><div class="usage">${share > 0 ? usageBar(f, isNear) : ""}<span class="pct">${share > 0 ? fmtPct(f) : ""}</span></div></td>
        <td>${statusPill}</td>
      </tr>`;
    }).join("");
    const near = (limit && fraction >= nearFrac) || nearGroups > 0;
    const status = !limit ? `<span class="pill grey">unlimited</span>` : fraction >= 1 ? `<span class="pill red">at limit</span>` :
      near ? `<span class="pill amber">near limit</span>` : `<span class="pill green">ok</span>`;
    return head + `
      <h1>${esc(name)} ${status}</h1>
      <section class="cards">
        ${card("Active series", fmtInt(total), "", "on this node's replicas")}
        ${card("Limit (max_series)", limit ? fmtInt(limit) : "unlimited", "", "split into group shares")}
        ${card("Usage", limit ? fmtPct(fraction) : "—", near ? "warn" : "good", limit ? usageBar(fraction, near) : "")}
        ${card("Groups near their share", `${nearGroups} / ${perGroup.length}`, nearGroups ? "warn" : "good", `≥ ${fmtPct(nearFrac)} of the group share`)}
      </section>
      <h2>Per group</h2>
      <p class="muted small">Series are admitted per raft group against that group's share of max_series. With movable shares (the default) a group at its share first borrows unused headroom from the other groups, so the tenant is refused only at its limit; with static shares it is refused in the group.</p>
      <table class="grid">
        <thead><tr><th class="num">Group</th><th>Partitions</th><th class="num">Active series</th><th class="num">Share</th><th>Usage of share</th><th>Status</th></tr></thead>
        <tbody>${rows}</tbody>
      </table>`;
  }

  // ---- polling and rendering ---------------------------------------------

  function render() {
    const rt = route();
    for (const a of document.querySelectorAll("[data-nav]")) {
      a.classList.toggle("active", a.dataset.nav === rt.page || (rt.page === "tenant" && a.dataset.nav === "tenants"));
    }
    const ov = state.overview;
    const nodeEl = document.getElementById("node");
    if (ov) {
      nodeEl.innerHTML = `served by <b>${esc(ov.node)}</b> · ${esc(ov.zone)} · ` +
        (ov.ready ? `<span class="pill green">ready</span>` : `<span class="pill amber" title="${esc(ov.not_ready_reason)}">not ready: ${esc(ov.not_ready_reason)}</span>`);
    }
    const banner = document.getElementById("banner");
    const stale = state.lastOK && Date.now() - state.lastOK > 3 * POLL_MS;
    const msg = state.overviewError ? (stale || !ov ? state.overviewError : "") : "";
    banner.hidden = !msg;
    banner.textContent = msg;

    let html;
    if (rt.page === "tenants") html = renderTenants(ov);
    else if (rt.page === "tenant") html = renderTenant(rt.tenant, ov);
    else html = ov ? renderOverview(ov) : `<p class="muted">Waiting for the node…</p>`;
    const page = document.getElementById("page");
    page.dataset.page = rt.page;
    page.innerHTML = html;
    document.title = rt.page === "tenant" ? `${rt.tenant} · Tollgate` : rt.page === "tenants" ? "Tenants · Tollgate" : "Tollgate";
    document.getElementById("updated").textContent = state.lastOK
      ? `updated ${new Date(state.lastOK).toLocaleTimeString()} · polling every ${POLL_MS / 1000} s` : "";
  }

  async function poll() {
    if (state.inflight) return; // a slow node must not pile up requests
    state.inflight = true;
    const rt = route();
    try {
      try {
        const ov = await getJSON("../api/v1/overview");
        if (!Array.isArray(ov.zones)) ov.zones = [];
        state.overview = ov;
        state.overviewError = "";
        state.lastOK = Date.now();
        const r = ov.rates || {};
        // No rate before the server has two samples: skip, or every line
        // would start with a fake climb from zero.
        if (r.window_seconds) state.history.push({
          active: num(r.active_series), entries: num(r.raft_entries_per_second),
          requests: num(r.requests_per_second), created: num(r.series_created_per_second),
        });
        if (state.history.length > HISTORY) state.history.shift();
      } catch (e) {
        state.overviewError = e.status === 404
          ? "This node has no /api/v1/overview: the dashboard needs a newer server."
          : `Cannot reach this node: ${e.message}`;
      }
      if (state.overview && !Array.isArray(state.overview.tenants) && rt.page !== "overview") {
        try {
          state.tenantList = await getJSON("../api/v1/tenants");
          if (!Array.isArray(state.tenantList)) state.tenantList = pick(state.tenantList, "tenants") || [];
          state.tenantListError = "";
        } catch (e) {
          state.tenantListError = e.status === 404 ? "The tenant list needs a newer server." : `Tenant list: ${e.message}`;
        }
      }
      if (rt.page === "tenant") {
        try {
          const t = await getJSON("../api/v1/tenants/" + encodeURIComponent(rt.tenant));
          state.tenant = t;
          state.tenantName = rt.tenant;
          state.tenantError = "";
        } catch (e) {
          state.tenant = null;
          state.tenantError = e.status === 404 ? `Tenant “${rt.tenant}” is unknown to this node: it has never tracked a series here.`
            : e.status === 400 ? `Not a valid tenant id: ${e.message}` : `Cannot load the tenant: ${e.message}`;
        }
      }
    } finally {
      state.inflight = false;
    }
    render();
  }

  window.addEventListener("hashchange", () => {
    state.tenantError = "";
    render();
    poll();
  });
  poll();
  setInterval(poll, POLL_MS);
})();
