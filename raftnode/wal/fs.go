package wal

import (
	"os"
	"syscall"
)

// FS is the file layer under the log's segment files: what the log writes,
// syncs, truncates and removes goes through it. Production uses the OS
// directly (Options.FS nil: osFS). Tests put a layer here that remembers
// what was written since the last sync and, on a simulated power cut,
// throws some or all of it away (package raftnode/wal/powerfs).
//
// The LOCK file and the directory listing stay on the OS: they hold no
// data a power cut could lose. Creations and removals of segments are made
// durable with SyncDir (the rules are in the package doc, Durability).
type FS interface {
	// OpenFile opens a segment (os.OpenFile's flags).
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	ReadFile(name string) ([]byte, error)
	Remove(name string) error
	// SyncDir makes dir's entries (created, removed files) durable.
	SyncDir(dir string) error
}

// File is an open segment.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	// Datasync makes the file's data durable (fdatasync).
	Datasync() error
	Close() error
}

// OSFS is the operating system's file layer, the one production uses.
type OSFS struct{}

// OpenFile opens name with os.OpenFile.
func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// ReadFile is os.ReadFile.
func (OSFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// Remove is os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// SyncDir fsyncs the directory.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

type osFile struct{ *os.File }

func (f osFile) Datasync() error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
