// Package testports hands tests loopback ports that are free for both TCP and
// UDP (a node's gossip port is both), drawn from a range of the caller's
// choosing below the kernel's ephemeral range.
//
// Why not port 0: a test that starts a separate process must name the port
// before the process binds it, and between "free" and "bound" a kernel-chosen
// port can go to any outgoing connection (one test opens 21,000 of them). A
// port below the ephemeral range only goes to another listener, and giving
// each package its own range keeps suites that run beside each other apart:
// faulttest restarts nodes on their ports while other packages run.
//
// A Range never hands out the same port twice in one test binary.
package testports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

// Range picks ports in [Lo, Hi).
type Range struct {
	Lo, Hi int

	mu   sync.Mutex
	used map[int]bool
}

// Pick returns a port of the range that was free for TCP and UDP on
// 127.0.0.1 when it looked, and that this Range never returned before.
func (r *Range) Pick() (int, error) {
	if r.Lo < 1 || r.Hi > 65536 || r.Hi <= r.Lo {
		return 0, fmt.Errorf("testports: bad range [%d, %d)", r.Lo, r.Hi)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used == nil {
		r.used = map[int]bool{}
	}
	for range 1000 {
		p := r.Lo + rand.IntN(r.Hi-r.Lo)
		if r.used[p] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = u.Close()
		r.used[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("testports: no free loopback port in [%d, %d) after 1000 tries", r.Lo, r.Hi)
}
