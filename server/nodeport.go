package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/nodeport"
)

// nodePort is this server as nodeport.Port: what every capability (metering,
// runtime config, movable shares) is given of the node. Each capability's
// host embeds it and adds its own state.
type nodePort struct{ s *Server }

var _ nodeport.Port = nodePort{}

func (p nodePort) NodeID() string   { return p.s.cfg.Node.ID }
func (p nodePort) Groups() int      { return p.s.servedGroups() } // grows with a raise (groups.go)
func (p nodePort) Leads(g int) bool { return p.s.leads(g) }
func (p nodePort) Hosts(g int) bool { return p.s.hostsGroup(g) }

// entryMinute stamps a module entry: the group's time, as admission stamps
// tracking entries, never behind the time the FSM has applied.
func (p nodePort) entryMinute(g int) int64 {
	return max(p.s.clock.GroupMinute(g), p.s.fsms[g].Now())
}

func (p nodePort) Append(g int, typ byte, payload []byte) (func(context.Context) (any, error), error) {
	data, err := fsm.AppendModuleEntry(nil, typ, p.entryMinute(g), payload)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "group %d: encode entry type %d: %v", g, typ, err)
	}
	wait, err := p.s.appendVersioned(g, typ, data)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (any, error) {
		resp, _, err := wait(ctx)
		return resp, err
	}, nil
}

func (p nodePort) Propose(ctx context.Context, g int, typ byte, payload []byte) (any, error) {
	wait, err := p.Append(g, typ, payload)
	if err != nil {
		return nil, err
	}
	return wait(ctx)
}

func (p nodePort) LeaderConn(ctx context.Context, g int) (*grpc.ClientConn, context.Context, error) {
	if p.s.peers == nil {
		return nil, nil, status.Error(codes.Unavailable, "node starting: no peer connections yet")
	}
	return p.s.peers.Leader(ctx, p.s.cfg.Node.ID, g, p.s.leaderOf)
}

func (p nodePort) PeerConn(addr string) (*grpc.ClientConn, error) {
	if p.s.peers == nil {
		return nil, status.Error(codes.Unavailable, "node starting: no peer connections yet")
	}
	return p.s.peers.Conn(addr)
}
