//go:build unix

package server

import (
	"errors"
	"os"
	"syscall"
)

var errLocked = errors.New("locked by another process")

// lockFile takes an exclusive, non-blocking flock. The kernel drops it when the
// process exits, however it exits, so a crash never leaves a stale lock.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}
