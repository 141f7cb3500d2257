package partmove

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/layout/handoff"
)

// Nonce names the move of partition p from group from to group to in a
// raise to n groups: fixed by the plan, so a coordinator that restarts (a new
// group 0 leader) reuses it and finds the move's state in the groups' logs.
func Nonce(p, from, to, n int) uint64 {
	return uint64(n)<<48 | uint64(from)<<32 | uint64(to)<<16 | uint64(p)
}

// Run is the coordinator: while this node leads group 0 it moves every
// partition whose owner in the layout table differs from the raised count's
// target (layout.RaiseTarget), one move at a time, until stop closes. A
// failed step is retried after a pause; nothing is kept between steps but
// the replicated state, so leadership may move at any point.
func (s *Service) Run(stop <-chan struct{}, every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !s.cfg.Port.Leads(0) {
			continue
		}
		s.Pass(ctx)
	}
}

// Pass runs the moves the table needs now, until none is left, a step fails
// or ctx ends; it returns the number of partitions still away from their
// target and the last error.
func (s *Service) Pass(ctx context.Context) (pending int, err error) {
	for ctx.Err() == nil {
		tab := s.cfg.Layout()
		if tab.Groups <= s.cfg.Base {
			// Never raised: nothing to move (a table set by hand, in tests,
			// moves routing only and is left alone).
			s.progress.Store(&Progress{})
			return 0, nil
		}
		target := layout.RaiseTarget(s.cfg.Partitions, s.cfg.Base, tab.Groups)
		var next *handoff.Move
		pending = 0
		for p := range s.cfg.Partitions {
			if from, to := tab.GroupOf(p), target[p]; from != to {
				pending++
				if next == nil {
					next = &handoff.Move{Nonce: Nonce(p, from, to, tab.Groups), Partition: p, From: from, To: to}
				}
			}
		}
		s.cfg.Metrics.Pending(pending)
		prog := Progress{Target: tab.Groups, Pending: pending}
		if next == nil {
			s.progress.Store(&prog)
			return 0, nil
		}
		prog.Current = fmt.Sprintf("partition %d: group %d → %d", next.Partition, next.From, next.To)
		s.progress.Store(&prog)
		start := time.Now()
		series, err := s.move(ctx, *next)
		if err != nil {
			prog.Err = err.Error()
			s.progress.Store(&prog)
			s.cfg.Log.Warn("partition move: a step failed; retrying", "partition", next.Partition, "from", next.From, "to", next.To, "err", err)
			return pending, err
		}
		s.cfg.Metrics.Moved(series, time.Since(start))
		s.cfg.Log.Info("partition moved", "partition", next.Partition, "from", next.From, "to", next.To, "series", series, "took", time.Since(start).Round(time.Millisecond))
	}
	return pending, ctx.Err()
}

// move drives one move to its end: each step is handoff.Next of the two
// groups' applied state and the layout's owner, exactly as the simulation
// (layout/handoff) checks it.
func (s *Service) move(ctx context.Context, m handoff.Move) (series int64, err error) {
	for step := 0; step < 16; step++ {
		if step > 0 && s.stepPause > 0 {
			select { // fault tests: land kills between steps
			case <-ctx.Done():
				return series, ctx.Err()
			case <-time.After(s.stepPause):
			}
		}
		src, err := s.state(ctx, m.From, m.Nonce)
		if err != nil {
			return series, fmt.Errorf("state of group %d: %w", m.From, err)
		}
		dst, err := s.state(ctx, m.To, m.Nonce)
		if err != nil {
			return series, fmt.Errorf("state of group %d: %w", m.To, err)
		}
		sg := &handoff.Group{Outbox: map[uint64]handoff.Transfer{}}
		if len(src.GetOutbox()) > 0 {
			sg.Outbox[m.Nonce] = handoff.Transfer{Nonce: m.Nonce}
		}
		dg := &handoff.Group{Seen: map[uint64]bool{m.Nonce: dst.GetReceived()}}
		owner := s.cfg.Layout().GroupOf(m.Partition)
		switch handoff.Next(m, sg, dg, owner).Kind {
		case handoff.ProposeGive:
			c, cctx, err := s.client(ctx, m.From)
			if err != nil {
				return series, err
			}
			r, err := c.Give(cctx, &api.MoveGiveRequest{Group: uint32(m.From), Nonce: m.Nonce, Partition: uint32(m.Partition), To: uint32(m.To)})
			if err != nil {
				return series, fmt.Errorf("give: %w", err)
			}
			if r.GetRefused() != "" {
				return series, fmt.Errorf("give refused: %s", r.GetRefused())
			}
			series = r.GetSeries()
			s.cfg.Metrics.Step("give")
		case handoff.DeliverReceive:
			c, cctx, err := s.client(ctx, m.To)
			if err != nil {
				return series, err
			}
			r, err := c.Receive(cctx, &api.MoveReceiveRequest{Group: uint32(m.To), Transfer: src.GetOutbox()})
			if err != nil {
				return series, fmt.Errorf("receive: %w", err)
			}
			if r.GetRefused() != "" {
				return series, fmt.Errorf("receive refused: %s", r.GetRefused())
			}
			series = max(series, r.GetSeries())
			s.cfg.Metrics.Step("receive")
		case handoff.Route:
			cur := s.cfg.Layout()
			if _, err := s.cfg.ProposeLayout(ctx, cur.Move(m.Partition, m.To)); err != nil {
				return series, fmt.Errorf("route: %w", err)
			}
			s.cfg.Metrics.Step("route")
		case handoff.ProposeComplete:
			c, cctx, err := s.client(ctx, m.From)
			if err != nil {
				return series, err
			}
			if _, err := c.Complete(cctx, &api.MoveCompleteRequest{Group: uint32(m.From), Nonce: m.Nonce}); err != nil {
				return series, fmt.Errorf("complete: %w", err)
			}
			s.cfg.Metrics.Step("complete")
		case handoff.Done:
			return series, nil
		}
	}
	return series, fmt.Errorf("move of partition %d not done after 16 steps", m.Partition)
}

func (s *Service) state(ctx context.Context, g int, nonce uint64) (*api.MoveStateResponse, error) {
	c, cctx, err := s.client(ctx, g)
	if err != nil {
		return nil, err
	}
	return c.State(cctx, &api.MoveStateRequest{Group: uint32(g), Nonce: nonce})
}

// local calls this node's own service (it leads the group).
type local struct{ s *Service }

func (l local) Give(ctx context.Context, in *api.MoveGiveRequest, _ ...grpc.CallOption) (*api.MoveGiveResponse, error) {
	return l.s.Give(ctx, in)
}

func (l local) Receive(ctx context.Context, in *api.MoveReceiveRequest, _ ...grpc.CallOption) (*api.MoveReceiveResponse, error) {
	return l.s.Receive(ctx, in)
}

func (l local) Complete(ctx context.Context, in *api.MoveCompleteRequest, _ ...grpc.CallOption) (*api.MoveCompleteResponse, error) {
	return l.s.Complete(ctx, in)
}

func (l local) State(ctx context.Context, in *api.MoveStateRequest, _ ...grpc.CallOption) (*api.MoveStateResponse, error) {
	return l.s.State(ctx, in)
}
