package server

import (
	"net"
	"net/http"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
	"github.com/tollgate-io/tollgate/service/sampling"
)

// The backlog controller (service/sampling.Owner) on this node: it runs
// while the node leads the runtime config's order group.

// samplingCtl is the node's owner; State adds what /api/v1/status and the
// admin API show.
type samplingCtl struct{ *sampling.Owner }

// SamplingControllerState is the controller's state for /api/v1/status and
// `tollgate limits get`.
type SamplingControllerState struct{ sampling.OwnerState }

func (st SamplingControllerState) proto() *api.SamplingControllerStatus { return st.Proto() }

// State returns the controller state as this node knows it.
func (sc *samplingCtl) State() SamplingControllerState {
	return SamplingControllerState{sc.Owner.State()}
}

func (s *Server) setupSampling() error {
	s.sampling = &samplingCtl{sampling.NewOwner(sampling.OwnerConfig{
		Port:       nodePort{s},
		Replica:    func() *runtimecfg.Document { return s.rcfg.mods[runtimecfgsvc.OrderGroup].Current() },
		Newest:     s.RuntimeConfig,
		LeaderOf:   func(g int) string { id, _ := s.leaderOf(g); return id },
		SetLimits:  s.rcfg.svc.SetLimits,
		MapError:   grpcError,
		Clock:      s.cfg.Clock.Now,
		Logger:     s.log,
		Registerer: s.metrics.reg,
	})}
	return nil
}

func (s *Server) startSampling() {
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.sampling.Run(s.closing) }()
}

func (s *Server) configServer() api.ConfigServer { return s.sampling.ConfigServer(s.rcfg.svc) }

// backlogHandler serves POST /api/v1/backlog behind the admin rule.
func (s *Server) backlogHandler() http.Handler {
	h := sampling.NewHandler(s.sampling, s.cfg.Clock.Now)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var remote net.IP
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			remote = net.ParseIP(host)
		}
		switch s.adminVerdictFor(remote, r.Header.Values("Authorization")) {
		case adminNotLoopback:
			writeJSONError(w, http.StatusForbidden, "backlog: no admin token is configured on this node, so only loopback clients may report; start the server with --admin-token-file")
			return
		case adminBadToken:
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate admin"`)
			writeJSONError(w, http.StatusUnauthorized, "backlog: missing or wrong admin token (header \"Authorization: Bearer <token>\")")
			return
		}
		h.ServeHTTP(w, r)
	})
}
