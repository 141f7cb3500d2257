package server

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/ui"
)

// The dashboard's API (/api/v1/overview, served by package ui): what this
// node knows of the cluster, its groups and its tenants.

// Overview is /api/v1/overview (ui.Overview).
type Overview = ui.Overview

func (s *Server) overviewHandler() http.Handler {
	return ui.OverviewHandler(ui.OverviewConfig{Build: s.overview, Page: pageParams, DefaultTop: defaultOverviewTop,
		Gatherer: s.metrics.reg, Logger: s.log})
}

// overview reads the node's overview, all but the rates, and their inputs.
func (s *Server) overview(ctx context.Context) (Overview, int64, uint64) {
	ov := Overview{
		Node: s.cfg.Node.ID, Zone: s.cfg.Node.Zone, NotReadyReason: s.NotReadyReason(),
		Time: time.Now().UTC(), Partitions: s.cfg.Layout.Partitions, NearLimitFraction: s.cfg.Summaries.NearLimitFraction,
	}
	ov.Ready = ov.NotReadyReason == ""

	// Every alive member's per-group raft state, through the admin Status
	// fan-out, as the node's own work: the peers see this node's node
	// credential (nodeauth.go), not the page's caller.
	sctx, cancel := context.WithTimeout(forward.Own(ctx), 3*time.Second)
	defer cancel()
	nodes := map[string]map[int]*api.GroupState{}
	if resp, err := s.admin.Status(sctx, &api.StatusRequest{}); err == nil {
		for _, n := range resp.Nodes {
			gs := map[int]*api.GroupState{}
			for _, g := range n.Groups {
				gs[int(g.Group)] = g
			}
			nodes[n.NodeId] = gs
		}
	}

	view, _ := s.view.get()
	zones := map[string]*ui.ZoneOverview{}
	health := map[string]string{}
	if view != nil {
		for _, m := range view.Members {
			mo := ui.MemberOverview{ID: m.Id, Zone: m.Zone, GRPC: m.GrpcAddress, Status: m.Status, Health: m.Status, Self: m.Id == s.cfg.Node.ID}
			if m.Status == membership.StatusAlive && nodes[m.Id] == nil {
				mo.Health = "unreachable"
			}
			for _, g := range m.GroupsLed {
				mo.GroupsLed = append(mo.GroupsLed, int(g))
			}
			if off, ok := s.clock.OffsetFromMedian(m.Id); ok {
				ns := int64(off)
				mo.ClockOffsetNs, mo.ClockOutOfBound = &ns, off > s.cfg.Clock.MaxOffset || off < -s.cfg.Clock.MaxOffset
			}
			health[m.Id] = mo.Health
			z := zones[m.Zone]
			if z == nil {
				z = &ui.ZoneOverview{Zone: m.Zone}
				zones[m.Zone] = z
			}
			z.Members = append(z.Members, mo)
		}
	}
	for _, z := range zones {
		slices.SortFunc(z.Members, func(a, b ui.MemberOverview) int { return strings.Compare(a.ID, b.ID) })
		ov.Zones = append(ov.Zones, *z)
	}
	slices.SortFunc(ov.Zones, func(a, b ui.ZoneOverview) int { return strings.Compare(a.Zone, b.Zone) })

	var active int64
	var applied uint64
	for g, f := range s.servedFSMs() {
		lo, hi := f.PartitionRange()
		st := f.Stats()
		gov := ui.GroupOverview{Group: g, Partitions: [2]int{lo, hi}, Series: st.Series, Tenants: st.Tenants}
		if view != nil && g < len(view.GroupInfo) {
			gi := view.GroupInfo[g]
			gov.Leader = gi.LeaderId
			for _, id := range gi.Voters {
				vo := ui.VoterOverview{ID: id}
				if gs := nodes[id][g]; gs != nil && health[id] != membership.StatusFailed {
					vo.Known, vo.State = true, gs.RaftState
					vo.AppliedIndex, vo.CommitIndex, vo.LastIndex = gs.AppliedIndex, gs.CommitIndex, gs.LastIndex
				}
				gov.Voters = append(gov.Voters, vo)
			}
		}
		if gs := nodes[gov.Leader][g]; gs != nil {
			gov.Series, gov.Tenants = int64(gs.Series), int(gs.Tenants)
		}
		active += gov.Series
		top := f.AppliedIndex()
		for _, v := range gov.Voters {
			top = max(top, v.AppliedIndex)
		}
		applied += top
		ov.Groups = append(ov.Groups, gov)
	}

	ov.Tenants = s.tenantOverview()
	return ov, active, applied
}

// tenantOverview sums each tenant's active series over this node's replicas,
// most used first.
func (s *Server) tenantOverview() []ui.TenantOverview {
	limits := s.currentLimits()
	byName := map[string]*ui.TenantOverview{}
	for g, f := range s.servedFSMs() {
		share := s.groupShares(g)
		for _, t := range f.Tenants() {
			a := t.Active()
			to := byName[t.Name]
			if to == nil {
				to = &ui.TenantOverview{Tenant: t.Name, Limit: limits.For(t.Name).MaxSeries}
				byName[t.Name] = to
			}
			to.Active += a
			if s.nearShare(a, share(t.Name)) {
				to.NearGroups = append(to.NearGroups, g)
			}
		}
	}
	out := make([]ui.TenantOverview, 0, len(byName))
	for _, to := range byName {
		if to.Active == 0 && len(to.NearGroups) == 0 {
			continue // registered once, every series expired: not worth a row
		}
		if to.Limit > 0 {
			to.Fraction = float64(to.Active) / float64(to.Limit)
		}
		to.Near = len(to.NearGroups) > 0 || (to.Limit > 0 && to.Fraction >= s.cfg.Summaries.NearLimitFraction)
		out = append(out, *to)
	}
	slices.SortFunc(out, func(a, b ui.TenantOverview) int {
		if a.Fraction != b.Fraction {
			if a.Fraction > b.Fraction {
				return -1
			}
			return 1
		}
		if a.Active != b.Active {
			if a.Active > b.Active {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Tenant, b.Tenant)
	})
	return out
}
