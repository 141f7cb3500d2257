package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// The raft and gossip ports bound what a stranger's connections cost
// before they authenticate: the raft mux caps the connections still in
// their handshake (raftnode.MuxConfig.MaxPendingConns), the gossip
// transport its open TCP streams (membership.Config.MaxStreams). These
// are their metrics.

func (s *Server) registerRaftCapMetrics(h *raftnode.Host) {
	s.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_raft_pending_connections",
			Help: "Connections to the raft port still in their handshake (TLS, authenticated header); at most --raft-max-pending-conns."},
			func() float64 { return float64(h.MuxStats().Pending) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_raft_pending_refused_total",
			Help: "Connections to the raft port closed on accept because --raft-max-pending-conns (or its quarter per IP address) was reached."},
			func() float64 { return float64(h.MuxStats().Refused) }),
		// A leader whose raft port refuses connections is dead: its
		// groups' successors campaign at once (raftnode/leaderdown.go).
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_raft_leader_probes_total",
			Help: "Probes of a leader's raft port made after one of its connections to this node ended."},
			func() float64 { return float64(h.LeaderDownStats().Probes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_raft_leader_probes_refused_total",
			Help: "Probes of a leader's raft port that were refused: the leader's process was gone."},
			func() float64 { return float64(h.LeaderDownStats().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_raft_dead_leader_elections_total",
			Help: "Elections this node started at once, as its group's successor, on finding the leader's raft port refusing connections (instead of waiting out the heartbeat timeout)."},
			func() float64 { return float64(h.LeaderDownStats().Campaigns) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_raft_dead_leader_held_out_total",
			Help: "Elections this node started after holding off 500 ms for a dead leader's successor that did not become leader (its campaign failed)."},
			func() float64 { return float64(h.LeaderDownStats().HeldOut) }))
}

func (s *Server) registerGossipCapMetrics(m *membership.Membership) {
	s.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_gossip_streams",
			Help: "Inbound gossip TCP streams open; at most --gossip-max-streams."},
			func() float64 { return float64(m.StreamStats().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_gossip_streams_refused_total",
			Help: "Inbound gossip TCP connections closed on accept because --gossip-max-streams (or its quarter per IP address) was reached."},
			func() float64 { return float64(m.StreamStats().Refused) }))
}
