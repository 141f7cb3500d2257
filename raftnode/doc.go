// Package raftnode hosts the G raft groups of one Tollgate node.
//
// Each group is an independent hashicorp/raft instance with its own log,
// stable store and snapshots; all groups of a node share one TCP port. The
// package knows nothing about the application: the caller passes one
// raft.FSM per group to New and wires everything else (leader sessions,
// readiness, metrics) on top of Host.Raft(g) and Config.LeaderNotify.
//
// # Transport: one port, many groups
//
// hashicorp/raft's NetworkTransport speaks a wire format without any group
// id, so every group gets its own raft.StreamLayer (GroupLayer) on a shared
// Mux. A dialing layer opens a TCP connection, runs the TLS client handshake
// if TLS is configured, and then writes a 7-byte header before handing the
// connection to raft:
//
//	+--------+--------+--------+--------+---------+-----------------+
//	|  'T'   |  'G'   |  'R'   |  'F'   | version | group (uint16   |
//	|        |        |        |        |  = 1    |  big-endian)    |
//	+--------+--------+--------+--------+---------+-----------------+
//	 byte 0                                byte 4   bytes 5-6
//
// followed by raft's own byte stream for that group, unchanged. The Mux's
// accept loop hands each new connection to a goroutine that (under a
// handshake deadline, so a silent client cannot stall anything) runs the TLS
// server handshake if configured, reads the header and passes the connection
// to the group's Accept. At most MuxConfig.MaxPendingConns connections (a
// quarter of them from one IP address) may be in that handshake at once; one
// beyond is closed as it is accepted, before a byte is read or a goroutine
// started, so a flood of idle connections costs the node only the accepts
// and leaves slots for the peers. A bad magic, an unknown version or a group not
// registered on this node closes the connection (logged); nothing is ever
// written back. Closing one group's layer leaves the listener and the other
// groups untouched; closing the Mux closes everything.
//
// # Disk layout
//
//	<DataDir>/
//	  wal/             every group's raft log, one shared write-ahead log
//	                   (package wal: <seq>.wal segments, LOCK)
//	  groups           the group list, once a group was added at runtime
//	  group-0/
//	    raft.db        raft-boltdb/v2: stable store only (term, vote)
//	    snapshots/     snapshot store in raft's file format (<term>-<index>-<ms>/{meta.json,state.bin}; snapstore.go)
//	  group-1/
//	  ...
//
// All groups append to the one log, and whatever they append while a write
// is being made durable goes into the next write: one fdatasync per round
// for all groups, where a log per group in bbolt paid two per group. A
// data dir of the previous version, whose logs are in raft.db, has each
// group's log moved into the shared one when the group opens (logstore.go;
// idempotent, raft.db's copy is deleted last).
//
// Each group's log is wrapped in an in-memory raft.LogCache (512 entries). On
// restart raft restores the newest readable snapshot into the FSM and
// replays the committed log entries that follow it; a group is bootstrapped
// only if raft.HasExistingState reports nothing on disk.
//
// # A damaged snapshot
//
// A group keeps two snapshots (DefaultSnapshotRetain): raft skips one it
// cannot read (CRC mismatch, unreadable meta.json) and restores the older.
// That needs the log to reach back to the older one's index+1, which with
// the defaults (snapshots ≥ 4,096 entries apart, 2,048 kept) it usually
// does not, and raft then panics on the first entry it lacks. So before
// raft.NewRaft, New does what raft would (snapcheck.go): it opens the
// snapshots newest first through the snapshot store (snapstore.go: raft's
// FileSnapshotStore format, on the log's file layer, with the new
// directory synced before its rename), which verifies the CRC, and if it had to skip one and the log's FirstIndex is past the
// readable one's index+1, it refuses the group with a SnapshotCorruptError
// (errors.Is ErrSnapshotCorrupt; CorruptGroups lists them) naming the
// group, the damaged file, the missing entries and the remedy: wipe the
// node's data dir and let the peers restore it, or seed a single node from
// a backup. The check reads the newest state file once more at start
// (mostly from the page cache afterwards); raft's restore of the snapshot
// it verified skips its own CRC pass (checkedSnapshots), so the CRC is
// still computed once.
// Chosen over keeping TrailingLogs above the snapshot spacing (twice the
// log on disk and at replay, and the spacing has no upper bound) and over
// rejoining in place as an empty replica (a voter would forget entries and
// votes it acknowledged; the wiped-disk path does it safely as a new
// incarnation). The server keeps such a node up and not ready instead of
// exiting into a restart loop (docs/operations.md).
//
// # Groups added at runtime
//
// AddGroup creates group G (the next id: ids stay dense, 0..G-1, so
// Raft(g) and every loop over Groups() stay what they were) on a running
// host and joins it to everything the boot groups have: a layer on the
// Mux, a log in the shared WAL, raft.db and snapshots/ in group-<G>/, the
// leadership queue, succession, disk watching, readiness and Shutdown. The
// group list is replaced copy-on-write, so readers (Raft, Groups,
// WaitReady, the disk watcher) take no lock; AddGroup calls are serialised
// with each other and with Shutdown.
//
// How a restart learns which groups exist: from the group list, a 20-byte
// file <DataDir>/groups holding the group count under a CRC-32C
// (grouplist.go has the byte format), written durably (temporary file,
// fsync, rename, fsync of the directory) after the group is built and
// before AddGroup returns. New opens max(Config.Groups, that count). Not
// from the WAL or the group directories: a group whose log was emptied by
// a snapshot install has no WAL entries, and a directory alone does not
// say whether AddGroup finished. A damaged list stops New with
// ErrGroupListCorrupt naming the file, rather than silently dropping a
// group this node votes in. A crash after the group was built and before
// the list was written leaves the group's state on disk unlisted: the host
// starts without it, and the next AddGroup of that id picks the state up
// (a voter that was down meanwhile, as far as its group can tell).
//
// # Disaster recovery
//
// SeedGroup writes a group's FSM snapshot (e.g. from a backup file) into an
// empty data dir as a raft snapshot whose configuration is this node alone,
// and records its term; New then restores it and the node elects itself
// leader of the group. HasState tells whether a data dir already holds raft
// state (seeding refuses it).
//
// # Disk health
//
// Every write to a group's stores is watched and the data dir is probed
// every DiskCheckInterval (disk.go). While the disk refuses writes,
// DiskError says why, the Host hands away the leadership of the groups it
// leads, a refused log append fails the pending Applies with ErrDiskWrite,
// and a refused term/vote write is retried rather than returned (raft would
// panic). All of it clears by itself once writes succeed again.
//
// # Elections: the successor campaigns
//
// When a group's leader dies, its survivors do not both campaign: a survivor
// that is not the group's successor (the first voter other than the silent
// leader in an order of the voters by ID, rotated by the group's number) asks
// the successor to campaign at once (TimeoutNow) and holds off that round, so
// the vote does not split (succession.go). A TimeoutNow from anyone but the
// leader is refused while the receiver leads or heard the leader within
// HeartbeatTimeout. Config.MayCampaign still decides whether this node may
// ask for votes at all (gate.go).
//
// A leader whose process died is usually found long before the heartbeat
// timeout: when a connection it dialed to this node ends, this node dials
// its raft port, and a refused connection (no process listens) makes the
// successor campaign at once and the other survivor hold off for it
// (leaderdown.go). A timeout or an answering port proves nothing and leaves
// the election to the timers.
//
// # Lifecycle
//
//	h, err := raftnode.New(cfg, func(g int) raft.FSM { return fsms[g] })
//	h.BootstrapCluster(servers)   // new multi-node cluster, on one node only
//	h.WaitReady(ctx)              // leaders known, local state recovered
//	h.Raft(g).Apply(...)          // on the leader of g
//	h.Shutdown()
//
//	h.AddGroup(ctx, h.Groups(), fsm) // a new group on a running host
//	h.BootstrapGroup(g, servers)      // on its voters, identical servers
//
// Multi-node growth (add-voter / remove-server) is done with the raft API
// of each group (Raft(g).AddVoter, RemoveServer) by the caller; the
// transport needs nothing more. TLS on the raft port is Config.ServerTLS +
// Config.ClientTLS.
package raftnode
