package access

import (
	"net"
	"time"
)

// victimLocked picks the connection a new one displaces at the HTTP
// connection cap (c.mu held), or nil when the new one is to be refused.
// In order:
//
//  1. an idle connection (between keep-alive requests, or accepted more
//     than minBusy ago without a request) of the IP address holding the
//     most such, the one idle longest;
//  2. the request in progress longest, once it is older than minBusy;
//  3. a connection accepted less than minBusy ago that has not sent a
//     request yet, of the address holding the most such, the oldest; not
//     where the cap answers liveness checks itself (AnswerHealthBeyondCap).
//
// A health check's connection is idle from its accept until the server
// reads its request. Taking the longest-idle connection overall closed it
// under a burst of idle connections from elsewhere, or beside slow
// requests, before it was read (61 of 674 /healthz probes reset during a
// 50,000-connection flood): here it is taken only after every slow request
// and, among fresh connections, after those of the address that floods.
func (c *ConnCap) victimLocked() net.Conn {
	now := time.Now()
	fresh := func(st *capState) bool {
		return st.activeSince.IsZero() && now.Sub(st.idleSince) < c.minBusy
	}
	pick := func(ok func(*capState) bool) net.Conn {
		by := map[string]int{}
		for _, st := range c.conns {
			if ok(st) {
				by[st.ip]++
			}
		}
		top, most := "", 0
		for ip, n := range by {
			if n > most || (n == most && ip > top) {
				top, most = ip, n
			}
		}
		var v net.Conn
		var oldest time.Time
		for k, st := range c.conns {
			if ok(st) && st.ip == top && (v == nil || st.idleSince.Before(oldest)) {
				v, oldest = k, st.idleSince
			}
		}
		return v
	}
	if v := pick(func(st *capState) bool { return !st.idleSince.IsZero() && !fresh(st) }); v != nil {
		return v
	}
	var busy net.Conn
	var oldestBusy time.Time
	for k, st := range c.conns {
		if st.idleSince.IsZero() && (busy == nil || st.activeSince.Before(oldestBusy)) {
			busy, oldestBusy = k, st.activeSince
		}
	}
	if busy != nil && now.Sub(oldestBusy) >= c.minBusy {
		return busy
	}
	if c.health {
		// Rule 3 is off where the cap answers liveness checks itself: a
		// fresh connection may be a health check the server has not read
		// yet (on a loaded node, tens of milliseconds), and displacing it
		// reset the check; the newcomer is triaged instead, where a
		// health check is answered at once (triage).
		return nil
	}
	return pick(func(st *capState) bool { return !st.idleSince.IsZero() && fresh(st) })
}

// remoteHost is conn's remote IP address (its whole address if not TCP).
func remoteHost(conn net.Conn) string {
	if tcp, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return conn.RemoteAddr().String()
}
