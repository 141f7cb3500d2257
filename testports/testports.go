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
// A Range never hands out the same port twice in one test binary, and never
// a port another live test binary on this machine was handed (by any
// Range): each pick is reserved with an exclusive flock on a file named
// after the port in a directory under the system's temporary directory
// (tollgate-testports), held until the process exits, when the kernel
// releases it. Without that, two test runs on one machine (how flakiness
// is hunted here, and how CI's own checks can overlap) picked the same
// port: a fault test's node, restarted on its port after a SIGKILL, found
// it bound by the other run's node ("bind: address already in use").
package testports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
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
		if r.used[p] || !reserve(p) {
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

// reserveDir holds one lock file per reserved port.
var reserveDir = filepath.Join(os.TempDir(), "tollgate-testports")

// held keeps the reservations' files open (their locks with them) for the
// life of the process.
var held struct {
	mu    sync.Mutex
	files []*os.File
}

// reserve takes port p for this process, across processes: false when
// another live process holds it. A machine where the lock directory cannot
// be made (a read-only temporary directory) falls back to no reservation.
func reserve(p int) bool {
	if err := os.MkdirAll(reserveDir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(reserveDir, fmt.Sprintf("%d.lock", p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return false // another process (or another Range here) holds it
	}
	held.mu.Lock()
	held.files = append(held.files, f)
	held.mu.Unlock()
	return true
}
