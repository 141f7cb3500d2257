// Package powerfs is a wal.FS for tests that simulates power loss. It
// passes reads and writes to the real files but remembers, per file, what
// was written since the file's last sync. A power cut (Freeze, then Cut)
// makes every later write fail, as a dead machine's would, and rewrites
// each file as the disk could hold it after the cut: the contents as of
// the last sync, plus none, all, or a random subset of the writes since,
// the last kept one possibly torn at a random byte.
//
// Directory entries follow their own rule: a file or directory created
// (OpenFile with O_CREATE, Mkdir), removed, or renamed since its
// directory's last sync (SyncDir) is not durable. A cut may take a created
// entry away (a file with whatever was synced into it, a directory with
// everything in it), bring a removed one back (a file with its durable
// contents, a directory empty), and undo a rename; each such entry is lost
// or kept on its own, in no order, since POSIX orders nothing a directory
// sync has not made durable. A rename is durable once the new name's
// directory is synced; renaming over an existing entry is refused (not
// modelled). The snapshot store (raftnode/snapstore.go) is what makes and
// renames directories; the log only creates and removes files.
//
// It is a fake disk and says so: it cannot lose what the kernel's page
// cache or the drive's own cache would lose in other ways, and directories
// that existed before the disk first saw them (the data dir, the log's
// directory) are taken as durable. Production uses the OS (wal.OSFS).
package powerfs
