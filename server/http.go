package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/ui"
)

func (s *Server) startHTTP() error {
	if s.cfg.HTTPAddr == "-" {
		return nil
	}
	lis, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", s.cfg.HTTPAddr, err)
	}
	s.httpLis = lis
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if why := s.NotReadyReason(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /api/v1/status", s.handleStatus)
	mux.HandleFunc("GET /api/v1/tenants/{tenant}", s.handleTenant)
	mux.Handle("GET /api/v1/overview", s.overviewHandler())
	mux.Handle("GET /ui/", ui.Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// GroupStatus is one group's row in /api/v1/status.
type GroupStatus struct {
	Group        int    `json:"group"`
	Partitions   [2]int `json:"partitions"`
	State        string `json:"state"`
	Leader       string `json:"leader"`
	AppliedIndex uint64 `json:"applied_index"`
	Series       int64  `json:"series"`
	Tenants      int    `json:"tenants"`
	NearLimit    int    `json:"tenants_near_limit"`
}

// NodeStatus is /api/v1/status.
type NodeStatus struct {
	Node   string        `json:"node"`
	Zone   string        `json:"zone"`
	GRPC   string        `json:"grpc"`
	Raft   string        `json:"raft"`
	Ready  bool          `json:"ready"`
	Groups []GroupStatus `json:"groups"`
}

// Status returns this node's view of its groups.
func (s *Server) Status() NodeStatus {
	st := NodeStatus{Node: s.cfg.NodeID, Zone: s.cfg.Zone, GRPC: s.GRPCAddr(), Raft: s.RaftAddr(), Ready: s.Ready()}
	for g, f := range s.fsms {
		r := s.host.Raft(g)
		_, leader := r.LeaderWithID()
		fs := f.Stats()
		lo, hi := f.PartitionRange()
		st.Groups = append(st.Groups, GroupStatus{
			Group: g, Partitions: [2]int{lo, hi}, State: r.State().String(), Leader: string(leader),
			AppliedIndex: fs.AppliedIndex, Series: fs.Series, Tenants: fs.Tenants, NearLimit: len(s.closeToLimit(g)),
		})
	}
	return st
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Status())
}

// TenantUsage is /api/v1/tenants/{tenant}: the tenant's active series per group as
// this replica sees them, with the group shares of its current max_series.
type TenantUsage struct {
	Tenant    string  `json:"tenant"`
	MaxSeries int64   `json:"max_series"`
	Series    int64   `json:"series"`
	PerGroup  []int64 `json:"series_per_group"`
	Shares    []int64 `json:"share_per_group"`
}

// Usage returns a tenant's usage on this node's replicas.
func (s *Server) Usage(tenant string) TenantUsage {
	u := TenantUsage{Tenant: tenant, MaxSeries: s.limits.Get().For(tenant).MaxSeries}
	for _, f := range s.fsms {
		n := f.TenantActive(tenant)
		lo, hi := f.PartitionRange()
		u.Series += n
		u.PerGroup = append(u.PerGroup, n)
		u.Shares = append(u.Shares, GroupShare(u.MaxSeries, hi-lo, s.cfg.Partitions))
	}
	return u
}

func (s *Server) handleTenant(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	if err := api.ValidateTenantID(tenant); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Usage(tenant))
}
