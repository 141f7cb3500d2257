// Package powerfs is a wal.FS for tests that simulates power loss. It
// passes reads and writes to the real files but remembers, per file, what
// was written since the file's last sync. A power cut (Freeze, then Cut)
// makes every later write fail, as a dead machine's would, and rewrites
// each file as the disk could hold it after the cut: the contents as of
// the last sync, plus none, all, or a random subset of the writes since,
// the last kept one possibly torn at a random byte.
//
// Directory entries follow their own rule: a file created, or removed,
// since its directory's last sync (SyncDir) is not durable. A cut may take
// a created file away (with whatever was synced into it) and may bring a
// removed one back with its durable contents; each such entry is lost or
// kept on its own, in no order, since POSIX orders nothing a directory
// sync has not made durable. The log has no renames, so the layer has none.
//
// It is a fake disk and says so: it cannot lose what the kernel's page
// cache or the drive's own cache would lose in other ways, and it does not
// model directories themselves (the log's directory is made durable when
// it is created). Production uses the OS (wal.OSFS).
package powerfs
