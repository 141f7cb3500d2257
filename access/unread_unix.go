//go:build unix

package access

import (
	"net"
	"syscall"
)

// unread reports whether bytes the peer sent on conn wait in the kernel,
// not yet read by the server: recv(MSG_PEEK|MSG_DONTWAIT) on the socket.
// It goes through RawConn.Control, not RawConn.Read: Read would queue
// behind the server's own blocked read of the connection.
func unread(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var has bool
	var b [1]byte
	_ = rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		has = err == nil && n > 0
	})
	return has
}
