// Package datadir holds a node's data dir for one process: Open creates it
// if needed and takes an exclusive lock (a flock on its LOCK file, which the
// kernel drops however the process ends), refusing a second process at once
// with the pid that holds it; Release drops the lock and, for a start that
// failed in a dir it found empty, removes what that start wrote, so a retry
// starts clean. FilesystemUsage reads the space left where the dir lives.
//
// The node (package server) holds its dir for its lifetime; offline tools
// (package recovery) hold it while they rewrite raft state.
package datadir
