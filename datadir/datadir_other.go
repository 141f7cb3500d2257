//go:build !unix

package datadir

import (
	"errors"
	"os"
)

var errLocked = errors.New("locked by another process")

// lockFile is a no-op where flock is not available: the data dir is then not
// protected against a second node (Tollgate is built and tested on unix).
func lockFile(*os.File) error { return nil }

// FilesystemUsage is not measured where statfs is not available.
func FilesystemUsage(string) (avail, size uint64, err error) {
	return 0, 0, errors.New("filesystem usage is not measured on this platform")
}
