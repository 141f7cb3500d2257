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
// The log's LOCK file and its directory listing stay on the OS: they hold
// no data a power cut could lose. Creations and removals of segments are
// made durable with SyncDir (the rules are in the package doc, Durability).
//
// raftnode's snapshot store (raftnode/snapstore.go) writes through the same
// layer, so that a power cut in the middle of a snapshot can be simulated
// too: it also makes and renames directories and lists them. A directory
// entry made by Mkdir or Rename is, like a created file's, durable only
// once its parent directory is synced.
type FS interface {
	// OpenFile opens a file (os.OpenFile's flags).
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	ReadFile(name string) ([]byte, error)
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// SyncDir makes dir's entries (created, removed, renamed) durable.
	SyncDir(dir string) error
	// Mkdir makes a directory (its entry in the parent needs SyncDir).
	Mkdir(name string, perm os.FileMode) error
	// Rename renames a file or directory; the target must not exist
	// (the new entry, and the old one's removal, need SyncDir of the
	// parent).
	Rename(oldname, newname string) error
	// ReadDir lists a directory, sorted by name (os.ReadDir).
	ReadDir(name string) ([]os.DirEntry, error)
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

// Mkdir is os.Mkdir.
func (OSFS) Mkdir(name string, perm os.FileMode) error { return os.Mkdir(name, perm) }

// Rename is os.Rename.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// ReadDir is os.ReadDir.
func (OSFS) ReadDir(name string) ([]os.DirEntry, error) { return os.ReadDir(name) }

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
