package layout

import (
	"errors"
	"fmt"
)

// ErrLowerGroups is wrapped by Raise when asked for fewer groups than the
// table has: groups are only ever added (a group's series, usage and share
// would have nowhere to go).
var ErrLowerGroups = errors.New("the group count can only be raised")

// Raise returns the table that adds groups t.Groups..n-1 to t, empty: the same
// owners, Groups = n and the epoch one higher. Raising to the count t already
// has returns t itself and changed = false, so that re-running a raise that
// committed is a no-op. n must be in [t.Groups, partitions]; a lower n is
// refused with ErrLowerGroups, a higher one with ErrInvalidTable.
func (t *Table) Raise(n int) (next *Table, changed bool, err error) {
	p := t.Partitions()
	switch {
	case n < t.Groups:
		return nil, false, fmt.Errorf("%w: the cluster runs %d groups and %d were asked", ErrLowerGroups, t.Groups, n)
	case n > p || n > MaxGroups:
		return nil, false, fmt.Errorf("%w: groups = %d: must be at most partitions = %d", ErrInvalidTable, n, p)
	case n == t.Groups:
		return t, false, nil
	}
	next = &Table{Epoch: t.Epoch + 1, Groups: n, Owner: append([]uint16(nil), t.Owner...)}
	return next, true, nil
}

// GroupSpan is group g's contiguous partition range [lo, hi) in a cluster
// whose layout was created with base groups and has since been raised to
// more: groups below base keep their arithmetic range, groups added by a
// raise own nothing (lo = hi = 0) until partitions are handed to them.
// Until the hand-off exists this equals every raised table's Owned(g).
func GroupSpan(g, partitions, base int) (lo, hi int) {
	if g >= base {
		return 0, 0
	}
	return GroupRange(g, partitions, base)
}

// RaiseTarget is where each partition goes once a cluster created with base
// groups has been raised to n (base ≤ n ≤ partitions): each new group, in
// order, takes the upper half of the range of the group holding the most
// partitions (the lowest id among equals). Raising 4 → 8 thus hands each old
// group's upper half to one new group, and a later 8 → 16 splits those again:
// ranges stay contiguous, a count that doubles leaves the groups within two
// partitions of each other (other counts leave the groups not yet split at
// about twice the size of the others until the next doubling), and the
// target depends on (partitions, base, n) alone, so a restarted coordinator
// plans the same moves.
func RaiseTarget(partitions, base, n int) []int {
	owner := make([]int, partitions)
	type span struct{ lo, hi int }
	spans := make([]span, n)
	for g := range base {
		lo, hi := GroupRange(g, partitions, base)
		spans[g] = span{lo, hi}
	}
	for j := base; j < n; j++ {
		big := 0
		for g := 1; g < j; g++ {
			if spans[g].hi-spans[g].lo > spans[big].hi-spans[big].lo {
				big = g
			}
		}
		s := spans[big]
		mid := s.lo + (s.hi-s.lo+1)/2
		spans[big], spans[j] = span{s.lo, mid}, span{mid, s.hi}
	}
	for g, s := range spans {
		for p := s.lo; p < s.hi; p++ {
			owner[p] = g
		}
	}
	return owner
}
