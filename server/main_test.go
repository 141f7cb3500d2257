package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
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
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "TOLLGATE_FLOOD: want mode,addr,n")
		return 2
	}
	mode, addr := parts[0], parts[1]
	n, err := strconv.Atoi(parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
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
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dial %d: %v\n", i, err)
			continue // the node may be refusing: that is what is tested
		}
		conns = append(conns, c)
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
	}
	fmt.Printf("ready %d\n", len(conns))
	if mode == "slow" || mode == "slow-headers" || mode == "slow-public" {
		go func() {
			for range time.Tick(time.Second) {
				for _, c := range conns {
					_, _ = c.Write([]byte(" "))
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}
