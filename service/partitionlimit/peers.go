package partitionlimit

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// Peer is another node to exchange sketches with.
type Peer struct {
	ID, Addr string
}

// PeerConfig configures RunPeers.
type PeerConfig struct {
	// Peers lists the other live nodes (not this one); called every round.
	Peers func() []Peer
	// Dial returns a connection to addr (the server's peer pool).
	Dial func(addr string) (grpc.ClientConnInterface, error)
	// Interval between rounds; 0 = 200ms. A round sends each peer what
	// changed since the previous successful send.
	Interval time.Duration
	// Timeout of one push; 0 = 2s.
	Timeout time.Duration
	// MaxBatch caps the sketches of one push; 0 = 4096.
	MaxBatch int
}

type peerState struct {
	c           *Cursor
	incarnation string
	cancel      context.CancelFunc
	done        chan struct{}
}

// RunPeers forwards what changes on this hub to every peer until ctx ends:
// per peer, a goroutine and a cursor collect the changed sketches (except
// those the peer sent itself), so a slow or dead peer delays no other. A
// failed send, or a peer whose incarnation changed (it restarted empty),
// makes the next send carry every sketch. Forwarding what came from one peer
// to the others is redundant in a full mesh and harmless (merges are
// idempotent and a merge that changes nothing is not forwarded again), and it
// lets changes cross a mesh with a broken link.
func (h *Hub) RunPeers(ctx context.Context, cfg PeerConfig) {
	if cfg.Interval == 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 4096
	}
	peers := map[Peer]*peerState{}
	stop := func(p Peer, ps *peerState) {
		ps.cancel()
		<-ps.done
		ps.c.Close()
		delete(peers, p)
	}
	defer func() {
		for p, ps := range peers {
			stop(p, ps)
		}
	}()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		seen := map[Peer]bool{}
		for _, p := range cfg.Peers() {
			if p.ID == "" || p.ID == h.cfg.NodeID || p.Addr == "" {
				continue
			}
			seen[p] = true
			if peers[p] == nil {
				pctx, cancel := context.WithCancel(ctx)
				ps := &peerState{c: h.NewCursor(p.ID, true), cancel: cancel, done: make(chan struct{})}
				peers[p] = ps
				go func() {
					defer close(ps.done)
					h.peerLoop(pctx, cfg, p, ps)
				}()
			}
		}
		for p, ps := range peers {
			if !seen[p] {
				stop(p, ps)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *Hub) peerLoop(ctx context.Context, cfg PeerConfig, p Peer, ps *peerState) {
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		h.sendPeer(ctx, cfg, p, ps)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *Hub) sendPeer(ctx context.Context, cfg PeerConfig, p Peer, ps *peerState) {
	cc, err := cfg.Dial(p.Addr)
	if err != nil {
		h.st.peerErrors.Add(1)
		return
	}
	client := api.NewSketchesClient(cc)
	for {
		sk := ps.c.Take(cfg.MaxBatch)
		req := &api.PushSketchesRequest{Precision: uint32(h.p), Sketches: sk, Origin: h.cfg.NodeID}
		// An empty push is sent too, once per round: its answer carries the
		// peer's incarnation, so a restart is noticed even when nothing changes.
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		resp, err := client.PushSketches(cctx, req)
		cancel()
		if err != nil {
			h.st.peerErrors.Add(1)
			ps.c.MarkAll() // resend everything once the peer answers again
			return
		}
		h.st.bytesToPeers.Add(uint64(proto.Size(req)))
		if ps.incarnation != resp.Incarnation {
			restarted := ps.incarnation != ""
			ps.incarnation = resp.Incarnation
			if restarted {
				h.cfg.Logger.Info("sketch peer restarted; sending it every sketch", "peer", p.ID)
				ps.c.MarkAll()
				continue
			}
		}
		if len(sk) < cfg.MaxBatch {
			return
		}
	}
}
