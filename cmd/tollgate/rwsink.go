package main

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/spf13/cobra"
)

// rwsink is a remote-write receiver that stores nothing: it decodes every
// request (1.0 or 2.0) and counts samples and distinct series per tenant. The
// demo's gateway writes to it, and a benchmark can use it to see the
// gateway's own cost without a backend's.
type rwsink struct {
	tenantHeader string
	mu           sync.Mutex
	series       map[string]map[uint64]struct{}
	samples      *prometheus.CounterVec
	distinct     *prometheus.GaugeVec
}

func newRWSinkCmd() *cobra.Command {
	var listen, tenantHeader string
	cmd := &cobra.Command{
		Use:   "rwsink",
		Short: "A remote-write receiver that keeps nothing but counts: samples and distinct series per tenant on /metrics",
		Long: `Accept Prometheus remote write (1.0 and 2.0) on POST /api/v1/write and
/api/v1/push, decode every request, answer 204 and count samples
(tollgate_rwsink_samples_total{tenant}) and distinct series
(tollgate_rwsink_series{tenant}) by the tenant header. Nothing is stored. The
compose demo's gateway writes to it; point a gateway's --upstream at it to
measure the gateway without a backend's cost.`,
		Example: `  tollgate rwsink --listen 127.0.0.1:7399`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			reg := prometheus.NewRegistry()
			s := newRWSink(tenantHeader, reg)
			mux := http.NewServeMux()
			mux.HandleFunc("/api/v1/write", s.serve)
			mux.HandleFunc("/api/v1/push", s.serve)
			mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			mux.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ready\n") })
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
				defer c()
				srv.Shutdown(sctx)
			}()
			fmt.Fprintf(cmd.OutOrStdout(), "tollgate rwsink: http://%s/api/v1/write\n", l.Addr())
			if err := srv.Serve(l); err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7399", "listen address")
	cmd.Flags().StringVar(&tenantHeader, "tenant-header", "X-Scope-OrgID", "header naming the tenant (absent: \"\")")
	return cmd
}

func newRWSink(tenantHeader string, reg prometheus.Registerer) *rwsink {
	s := &rwsink{tenantHeader: tenantHeader, series: map[string]map[uint64]struct{}{},
		samples:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rwsink_samples_total", Help: "Samples received, by tenant."}, []string{"tenant"}),
		distinct: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tollgate_rwsink_series", Help: "Distinct series received since the start, by tenant."}, []string{"tenant"}),
	}
	reg.MustRegister(s.samples, s.distinct)
	return s
}

func (s *rwsink) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	raw, err := snappy.Decode(nil, body)
	if err != nil {
		http.Error(w, "snappy: "+err.Error(), http.StatusBadRequest)
		return
	}
	_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var hashes []uint64
	samples := 0
	b := labels.NewScratchBuilder(16)
	if params["proto"] == "io.prometheus.write.v2.Request" {
		var req writev2.Request
		if err := req.Unmarshal(raw); err != nil {
			http.Error(w, "protobuf: "+err.Error(), http.StatusBadRequest)
			return
		}
		for _, ts := range req.Timeseries {
			ls, err := ts.ToLabels(&b, req.Symbols)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			hashes = append(hashes, ls.Hash())
			samples += len(ts.Samples) + len(ts.Histograms)
		}
		w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", fmt.Sprint(samples))
	} else {
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			http.Error(w, "protobuf: "+err.Error(), http.StatusBadRequest)
			return
		}
		for _, ts := range req.Timeseries {
			hashes = append(hashes, ts.ToLabels(&b, nil).Hash())
			samples += len(ts.Samples) + len(ts.Histograms)
		}
	}
	tenant := r.Header.Get(s.tenantHeader)
	s.mu.Lock()
	m := s.series[tenant]
	if m == nil {
		m = map[uint64]struct{}{}
		s.series[tenant] = m
	}
	for _, h := range hashes {
		m[h] = struct{}{}
	}
	n := len(m)
	s.mu.Unlock()
	s.samples.WithLabelValues(tenant).Add(float64(samples))
	s.distinct.WithLabelValues(tenant).Set(float64(n))
	w.WriteHeader(http.StatusNoContent)
}
