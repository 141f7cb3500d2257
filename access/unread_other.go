//go:build !unix

package access

import "net"

// unread: without a portable peek, no connection counts as having unread
// bytes (the cap then treats a health check not yet read like any fresh
// connection).
func unread(net.Conn) bool { return false }
