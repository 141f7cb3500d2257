package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
)

// DropTenant removes a tenant's series from every group: the receiving node
// checks what it can of the version gate (so a cluster mid-upgrade refuses
// before anything changes), then asks each group's leader, in parallel, to
// append a drop-tenant entry. A forwarded call (req.Group set) handles that
// one group on its leader.
func (a *adminService) DropTenant(ctx context.Context, req *api.DropTenantRequest) (*api.DropTenantResponse, error) {
	s := a.s
	if err := api.ValidateTenantID(req.Tenant); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "drop-tenant: %v", err)
	}
	if req.Group != nil {
		g, err := a.checkGroup(*req.Group)
		if err != nil {
			return nil, err
		}
		gd, err := a.dropTenantGroup(ctx, g, req.Tenant)
		if err != nil {
			return nil, err
		}
		return &api.DropTenantResponse{Tenant: req.Tenant, Groups: []*api.GroupDrop{gd}, Removed: gd.Removed}, nil
	}

	// Pre-check every group whose configuration this node knows; each leader
	// checks again (authoritatively) before appending.
	var lags []string // each lagging node once, whatever the number of groups
	var lagGroups []string
	need, _ := fsm.LookupEntryType(fsm.EntryDropTenant)
	groups := s.servedGroups() // a raise's groups too: partitions moved there hold the tenant's series
	for g := range groups {
		if !s.hostsGroup(g) {
			continue
		}
		if ok, lagging := s.groupSupports(g, need.Since); !ok && !s.vers.skipGate.Load() {
			lagGroups = append(lagGroups, fmt.Sprint(g))
			for _, l := range lagging {
				if !slices.Contains(lags, l) {
					lags = append(lags, l)
				}
			}
		}
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		return nil, status.Errorf(codes.FailedPrecondition, "drop-tenant %s: %s (groups %s); %s needs cluster version %d: finish the rolling upgrade first (nothing was changed)",
			req.Tenant, strings.Join(lags, ", "), strings.Join(lagGroups, ","), need.Name, need.Since)
	}

	type result struct {
		gd  *api.GroupDrop
		err error
	}
	res := make([]result, groups)
	var wg sync.WaitGroup
	for g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[g].gd, res[g].err = a.dropTenantGroup(ctx, g, req.Tenant)
		}()
	}
	wg.Wait()

	resp := &api.DropTenantResponse{Tenant: req.Tenant}
	var failed []string
	var dropped []string
	code := codes.OK
	for g, r := range res {
		if r.err != nil {
			st := status.Convert(r.err)
			failed = append(failed, st.Message())
			// FailedPrecondition (a lagging node) says more than a transient
			// Unavailable, so it wins.
			if code == codes.OK || st.Code() == codes.FailedPrecondition {
				code = st.Code()
			}
			continue
		}
		resp.Groups = append(resp.Groups, r.gd)
		resp.Removed += r.gd.Removed
		dropped = append(dropped, fmt.Sprint(g))
	}
	if len(failed) > 0 {
		done := "no group was changed"
		if len(dropped) > 0 {
			done = "dropped in groups " + strings.Join(dropped, ",")
		}
		return nil, status.Errorf(code, "drop-tenant %s: %s (%s; repeating the call is safe)", req.Tenant, strings.Join(failed, "; "), done)
	}
	slices.SortFunc(resp.Groups, func(x, y *api.GroupDrop) int { return int(x.Group) - int(y.Group) })
	s.log.Warn("admin: tenant dropped", "tenant", req.Tenant, "removed", resp.Removed)
	return resp, nil
}

// dropTenantGroup appends a drop-tenant entry to group g on its leader: here
// when this node leads g, else forwarded once.
func (a *adminService) dropTenantGroup(ctx context.Context, g int, tenant string) (*api.GroupDrop, error) {
	s := a.s
	c, fctx, err := a.leaderClient(ctx, g)
	if err != nil {
		return nil, err
	}
	if c != nil {
		gr := uint32(g)
		resp, err := c.DropTenant(fctx, &api.DropTenantRequest{Tenant: tenant, Group: &gr})
		if err != nil {
			return nil, err
		}
		for _, gd := range resp.Groups {
			if int(gd.Group) == g {
				return gd, nil
			}
		}
		return nil, status.Errorf(codes.Internal, "group %d: the leader's answer has no entry for the group", g)
	}
	f := s.fsms[g]
	// The group's clock stamps the entry, never behind the group's time.
	now := max(s.clock.GroupMinute(g), f.Now())
	out, index, err := s.proposeVersioned(ctx, g, fsm.EntryDropTenant, fsm.AppendDropTenant(nil, now, tenant))
	if err != nil {
		return nil, err
	}
	dr, ok := out.(fsm.DropResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "group %d: drop-tenant applied with an unexpected result %T", g, out)
	}
	s.log.Info("admin: drop-tenant applied", "group", g, "tenant", tenant, "removed", dr.Removed, "index", index)
	return &api.GroupDrop{Group: uint32(g), Removed: uint64(dr.Removed), Index: index, LeaderId: s.cfg.Node.ID}, nil
}
