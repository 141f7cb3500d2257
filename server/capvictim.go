package server

import (
	"net"
	"time"
)

// victimLocked picks the connection a new one displaces at the HTTP
// connection cap (c.mu held), or nil when the new one is to be refused:
// an idle connection (one that has not sent a request yet, or is between
// keep-alive requests) of the IP address that holds the most idle
// connections, the one idle longest; with none idle, the request in
// progress longest once it is older than minBusy.
//
// Choosing by address first keeps one client's flood from displacing
// everyone else's fresh connections: a health check's connection is idle
// from its accept until the server reads its request, and under a burst of
// idle connections from elsewhere it was once the longest idle of the
// set and closed before it was read (61 of 674 /healthz probes reset
// during a 50,000-connection flood).
func (c *connCap) victimLocked() net.Conn {
	idleBy := map[string]int{}
	for _, st := range c.conns {
		if !st.idleSince.IsZero() {
			idleBy[st.ip]++
		}
	}
	top, most := "", 0
	for ip, n := range idleBy {
		if n > most || (n == most && ip < top) {
			top, most = ip, n
		}
	}
	var victim, busy net.Conn
	var oldest, oldestBusy time.Time
	for k, st := range c.conns {
		switch {
		case !st.idleSince.IsZero():
			if st.ip == top && (victim == nil || st.idleSince.Before(oldest)) {
				victim, oldest = k, st.idleSince
			}
		case busy == nil || st.activeSince.Before(oldestBusy):
			busy, oldestBusy = k, st.activeSince
		}
	}
	if victim == nil && busy != nil && time.Since(oldestBusy) >= c.minBusy {
		victim = busy
	}
	return victim
}

// remoteHost is conn's remote IP address (its whole address if not TCP).
func remoteHost(conn net.Conn) string {
	if tcp, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return conn.RemoteAddr().String()
}
