//go:build unix

package datadir

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

// FilesystemUsage returns the bytes available to an unprivileged writer and
// the size of the filesystem holding dir.
func FilesystemUsage(dir string) (avail, size uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), uint64(st.Blocks) * uint64(st.Bsize), nil
}
