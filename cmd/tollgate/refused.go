package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-io/tollgate/raftnode"
)

// A node that refuses to open a raft group because the group's newest
// snapshot is damaged and its log no longer reaches the older one
// (raftnode.ErrSnapshotCorrupt) cannot fix that by restarting: exiting
// would only make a supervisor restart it in a loop, each start failing the
// same way. Instead the process stays up without serving: /healthz answers
// ok (it is alive, so a liveness probe does not restart it either),
// /readyz answers 503 with the error (group, file, remedy) and /metrics
// has tollgate_ready 0 and tollgate_raft_group_refused{group} 1, until it
// is stopped (docs/operations.md, "A group refused at start").

// refusedHandler serves /healthz, /readyz and /metrics of a refused node.
func refusedHandler(cause error) http.Handler {
	reg := prometheus.NewRegistry()
	ready := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_ready",
		Help: "1 if the node is ready to serve (what /readyz answers 200 for), else 0."})
	refused := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tollgate_raft_group_refused",
		Help: "1 for a raft group this node refused to open at start (a damaged snapshot it cannot fall back from; see /readyz)."}, []string{"group"})
	reg.MustRegister(ready, refused)
	for _, e := range raftnode.CorruptGroups(cause) {
		refused.WithLabelValues(strconv.Itoa(e.Group)).Set(1)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not ready: refused to start: "+cause.Error(), http.StatusServiceUnavailable)
	})
	return mux
}

// serveRefused logs cause at ERROR and serves refusedHandler on addr until
// ctx ends; it then returns cause, so the exit status still says the node
// did not run. With no HTTP address ("-") it returns cause at once.
func serveRefused(ctx context.Context, addr string, log *slog.Logger, cause error) error {
	for _, e := range raftnode.CorruptGroups(cause) {
		log.Error("raft group refused at start: damaged snapshot", "group", e.Group, "path", e.Path, "err", e)
	}
	if addr == "-" || addr == "" {
		return cause
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(cause, fmt.Errorf("http listen %s: %w", addr, err))
	}
	srv := &http.Server{Handler: refusedHandler(cause), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	log.Error("node not serving: a raft group was refused at start; /readyz says why; stop the node (SIGTERM) to fix it", "http", lis.Addr().String())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return cause
}
