package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the file in the data dir a running node holds an exclusive
// lock on. Two processes on one data dir would each open the raft stores and
// write divergent logs; refusing the second at once is the only safe answer.
const LockFile = "LOCK"

// Dir is a data dir this process holds exclusively until Release.
type Dir struct {
	path string
	lock *os.File
	// Fresh: the dir did not exist or held nothing before this start (a LOCK
	// file alone counts as nothing: no node wrote state there). A start that
	// fails removes what it wrote to a fresh dir, so the next attempt does not
	// find a half-initialised node (a layout file, a bootstrapped raft log).
	Fresh   bool
	created bool // the dir itself was created by this start
}

// Open creates dir if needed and takes its lock, or fails at once naming
// the process that holds it.
func Open(dir string) (*Dir, error) {
	d := &Dir{path: dir}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		d.Fresh, d.created = true, true
	case err != nil:
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	default:
		d.Fresh = len(entries) == 0 || (len(entries) == 1 && entries[0].Name() == LockFile)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: open lock file: %w", dir, err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		if errors.Is(err, errLocked) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = fmt.Sprintf("another process (pid %d)", pid)
				}
			}
			return nil, fmt.Errorf("data dir %s is in use by %s: each tollgate node needs its own --data-dir; stop the other node first", dir, holder)
		}
		return nil, fmt.Errorf("data dir %s: lock %s: %w", dir, path, err)
	}
	d.lock = f
	// The pid is for the message above only; the lock itself is the flock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return d, nil
}

// Release drops the lock. With wipe, what this start wrote to a fresh dir is
// removed first (the dir itself too when this start created it), while the lock
// still keeps other starts out.
func (d *Dir) Release(wipe bool) error {
	if d == nil || d.lock == nil {
		return nil
	}
	var errs []error
	if wipe && d.Fresh {
		if d.created {
			errs = append(errs, os.RemoveAll(d.path))
		} else if entries, err := os.ReadDir(d.path); err == nil {
			for _, e := range entries {
				errs = append(errs, os.RemoveAll(filepath.Join(d.path, e.Name())))
			}
		} else {
			errs = append(errs, err)
		}
	}
	errs = append(errs, d.lock.Close())
	d.lock = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("data dir %s: %w", d.path, err)
	}
	return nil
}
