package history

import "slices"

// pset is an immutable set of uint64 with structural sharing: Insert copies
// only the path from the root to one leaf, so a state per step of a long
// history costs a few hundred bytes, not a copy of the whole set. porcupine
// keeps the state of every step it has linearised (its cache), which is
// what made a sorted-slice state grow with the square of the series a key
// accumulates.
//
// Shape: a 16-way trie on successive 4-bit digits of a mixed value (mix),
// with leaves of at most psetLeaf values (sorted). A subtree is a leaf
// exactly when it holds at most psetLeaf values (or is at the last digit),
// and the set only grows, so the shape depends on the set alone, not on
// the order of insertion: two equal sets have equal shapes, and equal
// compares them subtree by subtree, stopping at shared (pointer-equal)
// ones.
type pset struct {
	root *pnode
	n    int
	sum  uint64 // Σ mix(v): an order-free hash of the set
}

const (
	psetLeaf   = 8
	psetDigits = 16 // 16 digits of 4 bits: the whole 64-bit mixed value
)

type pnode struct {
	vals []uint64    // a leaf: sorted values (by value)
	kids *[16]*pnode // an inner node (vals nil)
	cnt  int         // values below
}

// mix spreads the bits of v (the SplitMix64 finaliser) so that the trie
// stays balanced whatever the values look like.
func mix(v uint64) uint64 {
	v ^= v >> 30
	v *= 0xbf58476d1ce4e5b9
	v ^= v >> 27
	v *= 0x94d049bb133111eb
	v ^= v >> 31
	return v
}

func digit(m uint64, depth int) int { return int(m >> (60 - 4*depth) & 0xf) }

// Len is the number of values.
func (s pset) Len() int { return s.n }

// Contains reports whether v is in the set.
func (s pset) Contains(v uint64) bool {
	m := mix(v)
	n := s.root
	for depth := 0; n != nil; depth++ {
		if n.kids == nil {
			_, ok := slices.BinarySearch(n.vals, v)
			return ok
		}
		n = n.kids[digit(m, depth)]
	}
	return false
}

// Insert returns the set with v added (s itself when v is in it already).
func (s pset) Insert(v uint64) pset {
	if s.Contains(v) {
		return s
	}
	m := mix(v)
	return pset{root: insert(s.root, v, m, 0), n: s.n + 1, sum: s.sum + m}
}

func insert(n *pnode, v, m uint64, depth int) *pnode {
	if n == nil {
		return &pnode{vals: []uint64{v}, cnt: 1}
	}
	if n.kids == nil {
		i, _ := slices.BinarySearch(n.vals, v)
		vals := slices.Insert(slices.Clip(n.vals), i, v) // a new array: n is shared
		if len(vals) <= psetLeaf || depth == psetDigits-1 {
			return &pnode{vals: vals, cnt: len(vals)}
		}
		// Split into an inner node: the shape depends only on the values.
		kids := new([16]*pnode)
		for _, x := range vals {
			d := digit(mix(x), depth)
			kids[d] = insert(kids[d], x, mix(x), depth+1)
		}
		return &pnode{kids: kids, cnt: len(vals)}
	}
	kids := *n.kids
	d := digit(m, depth)
	kids[d] = insert(kids[d], v, m, depth+1)
	return &pnode{kids: &kids, cnt: n.cnt + 1}
}

// equal reports whether a and b hold the same values.
func (s pset) equal(t pset) bool {
	return s.n == t.n && s.sum == t.sum && equalNodes(s.root, t.root)
}

func equalNodes(a, b *pnode) bool {
	switch {
	case a == b:
		return true
	case a == nil || b == nil || a.cnt != b.cnt || (a.kids == nil) != (b.kids == nil):
		return false
	case a.kids == nil:
		return slices.Equal(a.vals, b.vals)
	}
	for i := range a.kids {
		if !equalNodes(a.kids[i], b.kids[i]) {
			return false
		}
	}
	return true
}

// some returns up to k of the values, sorted (for descriptions).
func (s pset) some(k int) []uint64 {
	var out []uint64
	var walk func(n *pnode)
	walk = func(n *pnode) {
		if n == nil || len(out) >= k {
			return
		}
		if n.kids == nil {
			out = append(out, n.vals...)
			return
		}
		for _, c := range n.kids {
			walk(c)
		}
	}
	walk(s.root)
	slices.Sort(out)
	return out[:min(k, len(out))]
}
