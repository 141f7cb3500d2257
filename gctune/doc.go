// Package gctune keeps the Go heap's garbage in proportion to what a
// Tollgate node holds: a fixed headroom, not a fixed ratio.
//
// The runtime's default (GOGC=100) lets the heap grow to twice its live size
// before collecting. A node's live heap is mostly its series tables: long
// lived, pointer-free arrays that a collection does not scan. At 100 M series
// that is ~1.4 GB live and, with GOGC=100, ~2.5 GB resident: most of the
// difference is garbage from requests waiting for the next collection.
// Tuning sets the collector's percentage so that the allowed garbage is about
// Headroom bytes: 100 % for a small heap (nothing changes for a dev node or a
// test), down to MinPercent for a large one. Collections then come more often
// on a large node, and each costs little, because the tables are not scanned.
//
// The process's own GOGC, when set, wins: Run does nothing.
package gctune
