// Package powerfs is a wal.FS for tests that simulates power loss. It
// passes reads and writes to the real files but remembers, per file, what
// was written since the file's last sync. A power cut (Freeze, then Cut)
// makes every later write fail, as a dead machine's would, and rewrites
// each file as the disk could hold it after the cut: the contents as of
// the last sync, plus none, all, or a random subset of the writes since,
// the last kept one possibly torn at a random byte. Files removed since
// the directory's last sync may come back (their removal was never made
// durable): the newest removals, in order, as a journalling file system
// would lose them.
//
// It is a fake disk and says so: it cannot lose what the kernel's page
// cache or the drive's own cache would lose in other ways, and directory
// creations are taken as durable at once (the log syncs the directory
// right after creating a segment). Production uses the OS (wal.OSFS).
package powerfs
