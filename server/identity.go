package server

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Node identity (package nodeid holds the file): a node whose disk is
// replaced comes back under the same node id with a new incarnation, and the
// raft transport refuses every connection meant for the earlier one
// (raftnode/identity.go): it cannot vote as its former self or count
// towards a quorum in its place. A group leader replaces the earlier
// incarnation with the new one (cluster/incarnation.go); until then the node
// reports why it takes no part.

// setClusterID records cid in identity.json, the raft transport and gossip.
func (s *Server) setClusterID(cid, how string) {
	if err := s.ident.SetClusterID(cid); err != nil {
		s.log.Error("cluster id", "err", err)
		return
	}
	s.host.SetClusterID(cid)
	if s.members != nil {
		if err := s.members.SetClusterID(cid); err != nil {
			s.log.Warn("gossip cluster id", "err", err)
		}
	}
	s.log.Info("cluster id recorded in the data dir", "cluster_id", cid, "how", how)
}

// refusedIncarnations remembers, per group, the last raft connection refused
// because it was meant for another incarnation of this node: a peer still
// lists the earlier incarnation (or a plain address this new data dir cannot
// stand for). The node reports it as its reason not to be ready.
type refusedIncarnations struct {
	mu    sync.Mutex
	last  map[int]refusal
	other refusal // last connection from another cluster
	// counter counts refusals by reason (tollgate_raft_refused_connections_total).
	counter *prometheus.CounterVec
}

type refusal struct {
	at            time.Time
	named, remote string
}

// registerIdentityMetrics adds the identity metrics to the node's registry.
func (s *Server) registerIdentityMetrics() {
	s.refused.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_raft_refused_connections_total",
		Help: "Raft connections this node refused: meant for another incarnation of it (its data dir was replaced; reason incarnation) or from another cluster (reason cluster).",
	}, []string{"reason"})
	s.metrics.reg.MustRegister(s.refused.counter)
}

// identityRecent bounds how long a refusal keeps the node not ready: peers
// redial within a second or two while they list the earlier incarnation.
const identityRecent = 10 * time.Second

func (r *refusedIncarnations) note(group int, named, cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counter != nil {
		reason := "incarnation"
		if cluster != "" {
			reason = "cluster"
		}
		r.counter.WithLabelValues(reason).Inc()
	}
	if cluster != "" {
		r.other = refusal{at: time.Now(), remote: cluster}
		return
	}
	if r.last == nil {
		r.last = map[int]refusal{}
	}
	r.last[group] = refusal{at: time.Now(), named: named}
}

// identityReason says why this node takes no part in some group because of
// its identity, or "".
func (s *Server) identityReason() string {
	if s.ident == nil {
		return ""
	}
	s.refused.mu.Lock()
	defer s.refused.mu.Unlock()
	var gs []int
	named := ""
	for g, r := range s.refused.last {
		if time.Since(r.at) < identityRecent {
			gs = append(gs, g)
			named = r.named
		}
	}
	if len(gs) > 0 {
		slices.Sort(gs)
		earlier := "an earlier incarnation"
		if named != "" {
			earlier += " (" + named + ")"
		}
		return fmt.Sprintf("this data dir is a new incarnation (%s) of node %s and groups %v still list %s: it takes no part in them until their leader removes the earlier incarnation and adds this one; leaders do that by themselves once removing it leaves a quorum of up-to-date voters; by hand, for each group G: tollgate raft remove-server --group G --id %s, then tollgate raft add-voter --group G --id %s",
			s.ident.Incarnation, s.cfg.Node.ID, gs, earlier, s.cfg.Node.ID, s.cfg.Node.ID)
	}
	if o := s.refused.other; !o.at.IsZero() && time.Since(o.at) < identityRecent {
		return fmt.Sprintf("raft peers of another cluster (%s) are calling this node, which belongs to cluster %s: check --join and the raft addresses", o.remote, s.ident.ClusterID())
	}
	if why := s.joinRefused.Load(); why != nil {
		return why.(string)
	}
	return ""
}
