// Package groupclock is the time a raft group stamps on its entries: a
// clock that advances as real time does, whichever node leads and however
// wrong that node's wall clock is.
//
// Each node keeps one Clock per group. As a follower it observes the times
// carried by the entries it applies (the minute of admission entries, the
// millisecond time of metering entries) and extends the latest one with its
// own monotonic clock: an estimate of the group's time that no wall clock
// moves. A node that becomes leader freezes that estimate as its base and
// stamps its wall clock clamped to [base, base+bound] (advancing with
// monotonic time), where bound is the cluster's maximum clock offset: a fast
// leader moves the group's time ahead by at most the bound, a slow one does
// not hold it back, and the time never goes backwards. A node that has not
// watched the group long enough to trust its estimate (just started) stamps
// its wall clock when the caller vouches for it (its measured offset to its
// peers is within the bound), else it too is held to base+bound.
//
// The package reads no clock of its own: the wall and monotonic sources are
// injected, so tests drive every case deterministically.
package groupclock
