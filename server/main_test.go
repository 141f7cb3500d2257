package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestMain doubles as the attacker of the connection-flood test: run with
// TOLLGATE_FLOOD=mode,addr,n the test binary opens n connections to addr
// from its own process (one process has fewer file descriptors than 20,000
// connections need), prints "ready", and holds them until stdin closes.
func TestMain(m *testing.M) {
	if spec := os.Getenv("TOLLGATE_FLOOD"); spec != "" {
		os.Exit(flood(spec))
	}
	os.Exit(m.Run())
}

func flood(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) == 4 { // a fourth field: this attacker's loopback source address 127.0.0.(1+k)
		floodSrc, _ = strconv.Atoi(parts[3])
		parts = parts[:3]
	}
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "TOLLGATE_FLOOD: want mode,addr,n[,src]")
		return 2
	}
	mode, addr := parts[0], parts[1]
	n, err := strconv.Atoi(parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	raiseNoFile(n + 1024)
	switch {
	case strings.HasPrefix(mode, "grpc-incomplete:"):
		msgLen, _ := strconv.Atoi(strings.TrimPrefix(mode, "grpc-incomplete:"))
		fmt.Printf("ready %d\n", floodGRPCIncomplete(addr, n, msgLen))
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case mode == "h2-idle":
		fmt.Printf("ready %d\n", floodH2Idle(addr, n))
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	}
	var conns []net.Conn
	var mu sync.Mutex
	dialMany(addr, n, func(i int, c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		switch {
		case mode == "idle" && i%2 == 0:
			// A keep-alive connection that made one request and went idle.
			fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = bufio.NewReader(c).ReadString('\n')
		case mode == "slow":
			// A request whose body never finishes.
			fmt.Fprint(c, "POST /api/v1/backlog HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
		case mode == "slow-public":
			// A request to a public route whose body never finishes:
			// nothing refuses it, and the server drains the body after
			// the answer.
			fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
		case mode == "slow-headers":
			// A request whose headers never finish (nothing to
			// authenticate yet).
			fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		}
		// mode "tcp-idle": a connection that never sends a byte (the raft
		// and gossip ports).
	})
	fmt.Printf("ready %d\n", len(conns))
	if mode == "slow" || mode == "slow-headers" || mode == "slow-public" {
		go func() {
			for range time.Tick(time.Second) {
				mu.Lock()
				cs := conns
				mu.Unlock()
				for _, c := range cs {
					_, _ = c.Write([]byte(" "))
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// floodSrc picks this attacker's loopback source address, 127.0.0.(1+floodSrc):
// one source address has only the kernel's ~28,000 ephemeral ports per
// destination, so a flood of 50,000 connections to one port comes from
// several attacker processes with a source address each.
var floodSrc int

// raiseNoFile lifts this process's soft RLIMIT_NOFILE towards want, up to
// its hard limit (the parent splits a flood across processes so that each
// fits under it).
func raiseNoFile(want int) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur >= uint64(want) {
		return
	}
	rl.Cur = min(uint64(want), rl.Max)
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
}

// dialMany opens n connections to addr with 32 dialers (from floodSrc's
// source address) and hands each to fn, from several goroutines.
func dialMany(addr string, n int, fn func(i int, c net.Conn)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				d := net.Dialer{Timeout: 10 * time.Second}
				if floodSrc > 0 {
					d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+floodSrc))}
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					fmt.Fprintf(os.Stderr, "dial %d: %v\n", i, err)
					continue // the node may be refusing: that is what is tested
				}
				fn(i, c)
			}
		}()
	}
	wg.Wait()
}
