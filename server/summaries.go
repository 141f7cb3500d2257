package server

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/service/summaries"
)

// summaryMaxSilence: a follower that heard nothing from its group's leader for
// longer stops serving that group's summary (its replica may be behind a
// partition), so clients ask another node.
const summaryMaxSilence = 3 * time.Second

// summarySource reads this node's replicas for the summary hub.
type summarySource struct{ s *Server }

func (src summarySource) Replica(g int) (uint64, string) {
	s := src.s
	if !s.hostsGroup(g) {
		return 0, fmt.Sprintf("node %s holds no replica of group %d", s.cfg.Node.ID, g)
	}
	if halted, why := s.fsms[g].Halted(); halted {
		return 0, fmt.Sprintf("group %d is halted on %s: %s", g, s.cfg.Node.ID, why)
	}
	if !s.host.GroupLoaded(g) {
		return 0, fmt.Sprintf("group %d is replaying its local state on %s", g, s.cfg.Node.ID)
	}
	r := s.host.Raft(g)
	if r.State() != raft.Leader {
		last := r.LastContact()
		if last.IsZero() {
			return 0, fmt.Sprintf("group %d on %s: no contact with a leader yet", g, s.cfg.Node.ID)
		}
		if silent := time.Since(last); silent > summaryMaxSilence {
			return 0, fmt.Sprintf("group %d on %s: no contact with a leader for %v", g, s.cfg.Node.ID, silent.Round(time.Second))
		}
	}
	return s.fsms[g].AppliedIndex(), ""
}

func (src summarySource) Near(g int) []string { return src.s.closeToLimit(g) }

// startSummaries creates the summary hub (before startGRPC registers its
// service) and runs it until the node stops.
func (s *Server) startSummaries() error {
	hub, err := summaries.New(summaries.Config{Groups: s.cfg.Layout.Groups, Source: summarySource{s}, NodeID: s.cfg.Node.ID, Logger: s.log})
	if err != nil {
		return fmt.Errorf("summary hub: %w", err)
	}
	s.summaries = hub
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		go func() { <-s.stop; cancel() }()
		hub.Run(ctx)
	}()
	s.metrics.reg.MustRegister(hub.Collectors()...)
	return nil
}

// summariesAddGroup streams group g's summaries from when it is served
// (groups.go).
func (s *Server) summariesAddGroup(g int) {
	if err := s.summaries.AddGroup(g); err != nil {
		s.log.Warn("near-limit summaries: add group", "group", g, "err", err)
	}
}

// registerSummaries adds the Summaries service to the gRPC server.
func (s *Server) registerSummaries(g *grpc.Server) {
	if s.summaries != nil {
		api.RegisterSummariesServer(g, summaries.NewService(s.summaries, s.closing))
	}
}
