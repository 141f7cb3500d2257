package seriesmap

import (
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"unsafe"
)

const (
	// A bucket is 8 keys, one cache line; the minutes of a segment's buckets
	// follow all its keys, 8 bytes per bucket.
	slotsPerBucket = 8
	// wordsPerBucket is the backing-array cost of one bucket: its keys plus one
	// word holding their minutes.
	wordsPerBucket = slotsPerBucket + 1

	// mixer is odd, so h*mixer is a bijection of uint64, and the high bits of
	// the product depend on every bit of h. Both the segment index and the
	// home bucket are read from the high bits of x = h*mixer.
	mixer = 0x9e3779b97f4a7c15

	// Load factors, in 1/256ths of a segment's slots.
	maxLoad256      = 243 // grow when an insert would exceed 95% full
	shrinkLoad256   = 102 // Cleanup rebuilds a segment smaller below 40% full
	shrinkTarget256 = 205 // ... sized for 80% full, far from both thresholds
	splitLoad256    = 218 // the halves of a split segment are sized for 85% full

	// A growth picks the largest allocation at most growNum/growDen times the
	// current one (see growBytes), 1.2× within the allocator's size classes
	// (up to 32 KB) and 1.25× above, where allocations are whole pages: the
	// load right after a growth is at least 95% / 1.25 = 76%, so memory stays
	// under 9 / 0.76 ≈ 11.85 bytes per entry, plus the fixed per-table cost.
	// Below smallBytes, where the fixed cost dominates anyway, segments
	// double, to rehash less.
	growNum      = 6
	growDen      = 5
	growNumLarge = 5
	growDenLarge = 4
	smallBytes   = 1024

	// maxSegBytes bounds a segment's backing array: a segment that would grow
	// past it is split in two instead (while the directory bound allows). So a
	// large table grows in steps of at most ~300 KB, rebuilt within the CPU
	// caches, instead of rehashing everything into a fresh array at once.
	maxSegBytes = 256 << 10
	// splitEntries is what each half of a split segment at the size limit
	// holds: FromSorted gives a segment no more on average.
	splitEntries = maxSegBytes / 8 / wordsPerBucket * slotsPerBucket * splitLoad256 / 256
	// mergeEntries: two buddy segments holding at most this many entries
	// together are merged by Cleanup. It is well below a split's size (95% of
	// maxSegBytes/9 slots), so that merges and splits cannot alternate.
	mergeEntries = maxSegBytes / 8 / wordsPerBucket * slotsPerBucket * 45 / 100
	// A directory is doubled only if it then has at most one entry per
	// minEntriesPerDir entries of the table, so keys crafted to share long
	// prefixes of h*mixer make segments grow instead of the directory.
	minEntriesPerDir = 128

	// maxSmallAlloc is the largest size class probed; larger allocations are
	// rounded up to pages of pageBytes.
	maxSmallAlloc = 32 << 10
	pageBytes     = 8 << 10
	// Arrays freed by a rebuild are recycled if at least this large (smaller
	// ones are cheap to allocate).
	recycleMinBytes = 512
)

// sizeClasses lists the byte sizes the Go allocator rounds small allocations up
// to, probed at init.
var sizeClasses = probeSizeClasses()

// probeSizeClasses finds the allocator's size classes up to maxSmallAlloc by
// asking append for the capacity it rounds each size up to. Only growth targets
// depend on it: if the runtime rounds differently, a table wastes some memory,
// nothing else.
func probeSizeClasses() []int {
	var cs []int
	for n := 1; n <= maxSmallAlloc; {
		c := cap(slices.Grow([]byte(nil), n))
		cs = append(cs, c)
		n = c + 1
	}
	return cs
}

// pools recycle freed segment arrays: smallPools[i] holds arrays of
// sizeClasses[i] bytes, largePools[i] arrays of i pages, as pointers to their
// first word. A segment's array is referenced by nothing but the segment, so it
// is free as soon as a rebuild replaced it. Reusing it saves the allocator's
// work and garbage collections; arrays left in a pool are dropped by the GC as
// usual.
var (
	smallPools = make([]sync.Pool, len(sizeClasses))
	largePools [maxSegBytes*growNumLarge/growDenLarge/pageBytes + 1]sync.Pool
)

// allocSize returns the size the allocator gives a request of size bytes.
func allocSize(size int) int {
	if size <= maxSmallAlloc {
		i, _ := slices.BinarySearch(sizeClasses, size)
		return sizeClasses[i]
	}
	return (size + pageBytes - 1) &^ (pageBytes - 1)
}

// pool returns the pool for arrays of size bytes, or nil.
func pool(size int) *sync.Pool {
	if size < recycleMinBytes {
		return nil
	}
	if size <= maxSmallAlloc {
		if i, ok := slices.BinarySearch(sizeClasses, size); ok {
			return &smallPools[i]
		}
		return nil
	}
	if size%pageBytes == 0 && size/pageBytes < len(largePools) {
		return &largePools[size/pageBytes]
	}
	return nil
}

// allocWords returns a zeroed array of at least n words, with its length set
// to the capacity the allocator gives such a request.
func allocWords(n int) []uint64 {
	size := allocSize(n * 8)
	if p := pool(size); p != nil {
		if w, _ := p.Get().(*uint64); w != nil {
			buf := unsafe.Slice(w, size/8)
			clear(buf)
			return buf
		}
	}
	buf := slices.Grow([]uint64(nil), n)
	return buf[:cap(buf)]
}

// freeWords recycles buf, which must no longer be referenced.
func freeWords(buf []uint64) {
	if p := pool(cap(buf) * 8); p != nil {
		p.Put(&buf[:1][0])
	}
}

// growBytes returns the size of the allocation a segment holding cur bytes
// grows into: the largest allocator size (size class or page multiple) at most
// the growth limit times cur (see growNum), or the smallest one above cur if
// there is none.
func growBytes(cur int) int {
	limit := cur * growNum / growDen
	switch {
	case cur < smallBytes:
		limit = 2 * cur
	case cur >= maxSmallAlloc:
		limit = cur * growNumLarge / growDenLarge
	}
	best := 0
	for _, c := range sizeClasses {
		if c > limit {
			if best == 0 && c > cur {
				best = c
			}
			break
		}
		if c > cur {
			best = c
		}
	}
	if limit > sizeClasses[len(sizeClasses)-1] {
		if g := limit &^ (pageBytes - 1); g > max(cur, best) {
			best = g
		}
	}
	if best == 0 {
		best = (cur + pageBytes) &^ (pageBytes - 1)
	}
	return best
}

// seg is one open-addressing hash table. A Table is one seg, or when large a
// directory of them.
type seg struct {
	// data holds nb buckets: keys in data[:nb*8] (bucket b is data[b*8:b*8+8],
	// 0 = empty slot), then their minutes, 8 bytes per bucket, in
	// data[nb*8:nb*9]. Its length is its capacity, which the allocator rounded
	// up to a size class; words past nb*9 are unused.
	data   []uint64
	nb     uint32 // number of buckets
	count  uint32 // number of keys stored
	growAt uint32 // count above which an insert grows or splits the segment
	// ld is the local depth: all keys of the segment share the top ld bits of
	// h*mixer, and the home bucket is computed from the bits below them.
	ld uint8
	// The zero hash cannot be stored in data; Table keeps it here, in its own
	// seg (unused in directory segments, where it costs no space).
	hasZero bool
	zeroMin uint8
}

// Table maps 64-bit series hashes to a one-byte minute. See the package
// documentation for the layout. Use New to make one.
//
// A Table is not safe for concurrent use: callers must serialize every call
// that modifies it (Put, PutMany, Cleanup) with all other calls. Calls that
// only read it (Len, Get, Range, AppendTo, Clone, MemoryBytes) may run
// concurrently with each other.
type Table struct {
	seg            // the whole table while dir is nil
	dir *directory // segments of a large table
}

// directory is extendible hashing over segments: the segment of x = h*mixer is
// segs[x >> (64-depth)]; a segment of local depth ld fills the 1<<(depth-ld)
// consecutive entries whose index starts with its ld-bit prefix.
type directory struct {
	segs  []*seg
	depth uint8 // ≥ 1
	count int   // keys in all segments
}

// New returns an empty table with room for about sizeHint entries before it
// grows. sizeHint 0 allocates nothing until the first Put.
func New(sizeHint int) *Table {
	t := &Table{}
	if sizeHint > 0 {
		t.seg.alloc(bucketsFor(sizeHint, maxLoad256))
	}
	return t
}

// bucketsFor returns the number of buckets holding n entries at load/256.
func bucketsFor(n int, load256 int) int {
	slots := (n*256 + load256 - 1) / load256
	return max(1, (slots+slotsPerBucket-1)/slotsPerBucket)
}

// Len returns the number of entries.
func (t *Table) Len() int {
	n := int(t.count)
	if t.dir != nil {
		n = t.dir.count
	}
	if t.hasZero {
		n++
	}
	return n
}

// MemoryBytes returns the bytes held by the table: backing arrays, segment and
// directory structs, and the Table struct itself.
func (t *Table) MemoryBytes() int {
	n := int(unsafe.Sizeof(*t)) + cap(t.data)*8
	if d := t.dir; d != nil {
		n += int(unsafe.Sizeof(*d)) + cap(d.segs)*8
		d.each(func(s *seg) bool {
			n += int(unsafe.Sizeof(*s)) + cap(s.data)*8
			return true
		})
	}
	return n
}

// each calls fn once for every segment of d, in directory order, until fn
// returns false; it reports whether fn never did.
func (d *directory) each(fn func(*seg) bool) bool {
	for i := 0; i < len(d.segs); {
		s := d.segs[i]
		if !fn(s) {
			return false
		}
		i += 1 << (d.depth - s.ld)
	}
	return true
}

// segFor returns the segment holding x = h*mixer.
func (t *Table) segFor(x uint64) *seg {
	if t.dir == nil {
		return &t.seg
	}
	return t.dir.segs[x>>((64-t.dir.depth)&63)]
}

// home returns the bucket x = h*mixer is searched from: fastrange of the bits
// below the segment's prefix.
func (s *seg) home(x uint64) uint32 {
	hi, _ := bits.Mul64(x<<(s.ld&63), uint64(s.nb))
	return uint32(hi)
}

// bucket returns the keys of bucket b.
func (s *seg) bucket(b uint32) *[slotsPerBucket]uint64 {
	i := uint(b) * slotsPerBucket
	return (*[slotsPerBucket]uint64)(s.data[i : i+slotsPerBucket])
}

// mins returns the minutes of bucket b, byte i for slot i. (Minutes are only
// ever accessed as bytes, so the layout does not depend on byte order.)
func (s *seg) mins(b uint32) *[slotsPerBucket]uint8 {
	return (*[slotsPerBucket]uint8)(unsafe.Pointer(&s.data[uint(s.nb)*slotsPerBucket+uint(b)]))
}

// b2u converts a bool to 0 or 1; the compiler makes it a SETcc, not a branch.
func b2u(b bool) uint {
	var u uint
	if b {
		u = 1
	}
	return u
}

// match returns a bit mask of the slots of k holding h, without branches.
func match(k *[slotsPerBucket]uint64, h uint64) uint {
	return b2u(k[0] == h) | b2u(k[1] == h)<<1 | b2u(k[2] == h)<<2 | b2u(k[3] == h)<<3 |
		b2u(k[4] == h)<<4 | b2u(k[5] == h)<<5 | b2u(k[6] == h)<<6 | b2u(k[7] == h)<<7
}

// Get returns the minute of h and whether h is present.
func (t *Table) Get(h uint64) (min uint8, ok bool) {
	if h == 0 {
		return t.zeroMin, t.hasZero
	}
	x := h * mixer
	s := t.segFor(x)
	nb := s.nb
	if nb == 0 {
		return 0, false
	}
	b := s.home(x)
	for {
		// Scanning with branches (rather than match) lets the CPU run ahead
		// into the next lookup while this bucket is being fetched: a loop of
		// Get on hits measured 1.17× slower with GetMany's whole-bucket tests.
		k := s.bucket(b)
		empty := false
		for i, v := range k {
			if v == h {
				return s.mins(b)[i], true
			}
			if v == 0 {
				empty = true
			}
		}
		if empty {
			return 0, false
		}
		if b++; b == nb {
			b = 0
		}
	}
}

// getChunk is how many lookups GetMany starts before finishing any: enough
// cache misses in flight to cover a memory round trip (a core tracks about
// ten), few enough for the per-chunk state to stay in registers and L1.
const getChunk = 8

// GetMany is Get for every hash of hs: mins[i] and found[i] are Get(hs[i]).
// mins and found must be at least as long as hs.
//
// Why not Get in a loop: in a table larger than the CPU caches nearly every
// lookup misses the cache twice (its key bucket, then its minutes), and a
// loop of Get waits for most of those misses one after the other. GetMany
// works in chunks: it first computes each hash's home bucket and loads the
// bucket's first key (independent loads, so their misses overlap), then scans
// the buckets, now cached, and reads the minutes of the hits, again without
// any load depending on another hash's. It tests a bucket whole (a mask of
// the slots equal to the hash, then whether any slot is free) rather than
// slot by slot: the lookup of a new series misses, crosses a run of full
// buckets, and a branch per slot on "is it free" mispredicts in the last one
// (BenchmarkLookupAbsent: 0.61× the time per key on one 1M-series table).
func (t *Table) GetMany(hs []uint64, mins []uint8, found []bool) {
	mins, found = mins[:len(hs)], found[:len(hs)]
	var segs [getChunk]*seg
	var homes [getChunk]uint32
	var first [getChunk]uint64
	for base := 0; base < len(hs); base += getChunk {
		chunk := hs[base:min(base+getChunk, len(hs))]
		for j, h := range chunk {
			x := h * mixer
			s := t.segFor(x)
			segs[j] = s
			if s.nb == 0 {
				continue
			}
			b := s.home(x)
			homes[j] = b
			first[j] = s.data[uint(b)*slotsPerBucket]
		}
		for j, h := range chunk {
			i := base + j
			s := segs[j]
			switch {
			case h == 0:
				mins[i], found[i] = t.zeroMin, t.hasZero
				continue
			case s.nb == 0:
				mins[i], found[i] = 0, false
				continue
			case first[j] == h:
				mins[i], found[i] = s.mins(homes[j])[0], true
				continue
			}
			b, nb := homes[j], s.nb
			mins[i], found[i] = 0, false
			for {
				// Whole-bucket masks, not a scan with a branch per slot: a
				// miss (every new series) crosses several buckets, and a
				// branch on each slot being empty mispredicts in the last.
				k := s.bucket(b)
				eq := b2u(k[0] == h) | b2u(k[1] == h)<<1 | b2u(k[2] == h)<<2 | b2u(k[3] == h)<<3 |
					b2u(k[4] == h)<<4 | b2u(k[5] == h)<<5 | b2u(k[6] == h)<<6 | b2u(k[7] == h)<<7
				if eq != 0 {
					mins[i], found[i] = s.mins(b)[bits.TrailingZeros(eq)], true
					break
				}
				if k[0] == 0 || k[1] == 0 || k[2] == 0 || k[3] == 0 || k[4] == 0 || k[5] == 0 || k[6] == 0 || k[7] == 0 {
					break
				}
				if b++; b == nb {
					b = 0
				}
			}
		}
	}
}

// Put sets the minute of h to m, inserting h if absent. It reports whether h
// was inserted.
func (t *Table) Put(h uint64, m uint8) (created bool) {
	if h == 0 {
		created = !t.hasZero
		t.hasZero, t.zeroMin = true, m
		return created
	}
	x := h * mixer
	s := t.segFor(x)
	switch s.put(h, x, m) {
	case putUpdated:
		return false
	case putInserted:
		if t.dir != nil {
			t.dir.count++
		}
		return true
	}
	// h is absent and its segment full: make room, then place h.
	t.grow(s, x)
	t.segFor(x).insertNew(h, x, m)
	if t.dir != nil {
		t.dir.count++
	}
	return true
}

// Results of seg.put.
const (
	putUpdated = iota
	putInserted
	putFull // absent, and the segment must grow first
)

// put is Put within one segment for non-zero h, without branches on slot
// positions, and leaving growth to the caller.
func (s *seg) put(h, x uint64, m uint8) int {
	nb := s.nb
	if nb == 0 {
		return putFull
	}
	b := s.home(x)
	for {
		k := s.bucket(b)
		// match(k, h), written out: the compiler does not inline it.
		eq := b2u(k[0] == h) | b2u(k[1] == h)<<1 | b2u(k[2] == h)<<2 | b2u(k[3] == h)<<3 |
			b2u(k[4] == h)<<4 | b2u(k[5] == h)<<5 | b2u(k[6] == h)<<6 | b2u(k[7] == h)<<7
		if eq != 0 {
			s.mins(b)[bits.TrailingZeros(eq)] = m
			return putUpdated
		}
		// Has the bucket a free slot? Tested inline: a call to match per
		// bucket of a long run costs more than the test.
		if k[0] == 0 || k[1] == 0 || k[2] == 0 || k[3] == 0 || k[4] == 0 || k[5] == 0 || k[6] == 0 || k[7] == 0 {
			e := match(k, 0)
			if s.count >= s.growAt {
				return putFull
			}
			i := bits.TrailingZeros(e)
			k[i] = h
			s.mins(b)[i] = m
			s.count++
			return putInserted
		}
		if b++; b == nb {
			b = 0
		}
	}
}

// PutMany sets the minute of every hash in hs to m, inserting those absent, and
// returns how many were inserted. It is equivalent to calling Put for each,
// and faster on tables larger than the CPU caches: it works through hs in
// chunks, first loading the home bucket of every hash of a chunk, so that the
// cache misses overlap, then updating them.
func (t *Table) PutMany(hs []uint64, m uint8) (created int) {
	const chunk = 16
	for len(hs) > 0 {
		c := hs[:min(chunk, len(hs))]
		hs = hs[len(c):]
		var touch uint64
		for _, h := range c {
			x := h * mixer
			s := t.segFor(x)
			if s.nb != 0 {
				b := s.home(x)
				touch += s.bucket(b)[0] + uint64(s.mins(b)[0])
			}
		}
		runtime.KeepAlive(touch) // the loads must happen
		for _, h := range c {
			if h != 0 {
				x := h * mixer
				switch t.segFor(x).put(h, x, m) {
				case putUpdated:
					continue
				case putInserted:
					created++
					if t.dir != nil {
						t.dir.count++
					}
					continue
				}
			}
			if t.Put(h, m) { // zero hash, or growth
				created++
			}
		}
	}
	return created
}

// insertNew places key h (x = h*mixer), known to be absent and non-zero, into
// the first bucket with a free slot from its home. The caller ensures there is
// room.
func (s *seg) insertNew(h, x uint64, m uint8) {
	nb := s.nb
	b := s.home(x)
	for {
		k := s.bucket(b)
		if e := match(k, 0); e != 0 {
			i := bits.TrailingZeros(e)
			k[i] = h
			s.mins(b)[i] = m
			s.count++
			return
		}
		if b++; b == nb {
			b = 0
		}
	}
}

// grow makes room for one more key in s, the segment of x: it rebuilds s
// larger, or splits it in two when it is at its size limit.
func (t *Table) grow(s *seg, x uint64) {
	cur := cap(s.data) * 8
	if cur < maxSegBytes || !t.canSplit(s) {
		s.resize(max(int(s.nb)+1, growBytes(cur)/(8*wordsPerBucket)))
		return
	}
	if t.dir == nil {
		// Move the table's only segment into a new directory.
		ns := new(seg)
		*ns = t.seg
		ns.hasZero, ns.zeroMin = false, 0
		t.dir = &directory{segs: []*seg{ns}, count: int(ns.count)}
		t.seg = seg{hasZero: t.hasZero, zeroMin: t.zeroMin}
		s = ns
	}
	d := t.dir
	if s.ld == d.depth {
		segs := make([]*seg, 2*len(d.segs))
		for i, p := range d.segs {
			segs[2*i], segs[2*i+1] = p, p
		}
		d.segs = segs
		d.depth++
	}
	lo, hi := s.split()
	span := 1 << (d.depth - lo.ld) // directory entries per half
	first := int(x>>(64-d.depth)) &^ (2*span - 1)
	for i := range span {
		d.segs[first+i] = lo
		d.segs[first+span+i] = hi
	}
}

// canSplit reports whether s may be split rather than grown: it must not be
// at the last bit of the keys, and the directory must stay small compared
// with the table.
func (t *Table) canSplit(s *seg) bool {
	if s.ld >= 63 {
		return false
	}
	if t.dir == nil {
		return int(s.count) >= 2*minEntriesPerDir
	}
	d := t.dir
	return s.ld < d.depth || 2*len(d.segs)*minEntriesPerDir <= d.count
}

// split distributes the keys of s over two new segments by bit 63-ld of
// h*mixer and returns them: lo gets the keys with the bit clear. s is reused
// as lo.
func (s *seg) split() (lo, hi *seg) {
	old := *s
	bit := uint64(1) << (63 - old.ld)
	n1 := 0
	for b := range old.nb {
		for _, h := range old.bucket(b) {
			if h != 0 && h*mixer&bit != 0 {
				n1++
			}
		}
	}
	n0 := int(old.count) - n1
	lo, hi = s, &seg{ld: old.ld + 1}
	*lo = seg{ld: old.ld + 1}
	lo.alloc(bucketsFor(max(n0, 1), splitLoad256))
	hi.alloc(bucketsFor(max(n1, 1), splitLoad256))
	lo.fill(bit, 0, &old)
	hi.fill(bit, bit, &old)
	freeWords(old.data)
	return lo, hi
}

// alloc gives the empty segment s at least minBuckets buckets: as many as fit
// in the allocator size class that holds minBuckets, so no rounding is wasted.
func (s *seg) alloc(minBuckets int) {
	s.data = allocWords(minBuckets * wordsPerBucket)
	nb := len(s.data) / wordsPerBucket
	s.nb = uint32(nb)
	s.count = 0
	// growAt keeps at least one slot free, so probes terminate and cleanup
	// finds a bucket that had a free slot.
	s.growAt = uint32(min(nb*slotsPerBucket*maxLoad256/256, nb*slotsPerBucket-1))
}

// resize rebuilds s with at least minBuckets buckets.
func (s *seg) resize(minBuckets int) {
	old := *s
	s.alloc(minBuckets)
	s.fill(0, 0, &old)
	freeWords(old.data)
}

// fill inserts into s, which must be freshly allocated (empty) and large
// enough, every key of the segments srcs whose mixed hash x has x&mask == want.
// Homes are monotone in x for any bucket count, so walking the sources'
// buckets in order fills s nearly sequentially.
func (s *seg) fill(mask, want uint64, srcs ...*seg) {
	var buf [512]uint8
	p := s.placer(&buf)
	for _, src := range srcs {
		if src.nb == 0 {
			continue
		}
		snb := uint(src.nb)
		p.add(src.data[:snb*slotsPerBucket], unsafe.Slice((*uint8)(unsafe.Pointer(&src.data[snb*slotsPerBucket])), snb*slotsPerBucket), mask, want)
	}
	s.count = p.n
}

// placer inserts keys known to be distinct and absent into a segment that only
// gains keys (a fresh one being filled). While a segment only gains keys, the
// used slots of a bucket are a prefix, so a byte per bucket counting them
// tells where the next key goes without reading keys.
type placer struct {
	used []uint8 // used slots per bucket
	keys []uint64
	mins []uint8
	ld   uint8
	n    uint32 // keys in the segment
}

// placer returns a placer for the empty segment s, counting in buf when it is
// large enough.
func (s *seg) placer(buf *[512]uint8) placer {
	nb := uint(s.nb)
	var used []uint8
	if nb <= uint(len(buf)) {
		used = buf[:nb]
		clear(used)
	} else {
		used = make([]uint8, nb)
	}
	return placer{
		used: used,
		keys: s.data[:nb*slotsPerBucket],
		mins: unsafe.Slice((*uint8)(unsafe.Pointer(&s.data[nb*slotsPerBucket])), nb*slotsPerBucket),
		ld:   s.ld & 63,
		n:    s.count,
	}
}

// add places every non-zero key of hs whose mixed hash x has x&mask == want,
// with its minute from ms, in the first bucket from its home with a free slot.
func (p *placer) add(hs []uint64, ms []uint8, mask, want uint64) {
	// Locals, not p's fields, in the loop: a store through p per key would
	// keep ld and n in memory (this is growth's inner loop).
	used, keys, mins, ld, n := p.used, p.keys, p.mins, p.ld, p.n
	nb := uint(len(used))
	ms = ms[:len(hs)]
	for i, h := range hs {
		x := h * mixer
		if h == 0 || x&mask != want {
			continue
		}
		hb, _ := bits.Mul64(x<<ld, uint64(nb))
		b := uint(hb)
		for used[b] == slotsPerBucket {
			if b++; b == nb {
				b = 0
			}
		}
		j := b*slotsPerBucket + uint(used[b])
		used[b]++
		keys[j] = h
		mins[j] = ms[i]
		n++
	}
	p.n = n
}

// FromSorted returns a table mapping hashes[i] to minutes[i], as Put for each
// in turn would, or an error if hashes is not strictly ascending (how a
// snapshot stores a table) or the lengths differ.
//
// Why not Put in a loop: ascending hashes land on random buckets, so on a
// table larger than the CPU caches every Put misses the cache, one after the
// other; restoring a node's snapshots was mostly that. FromSorted instead
// counts the keys per segment, copies them into one contiguous run per
// segment, and fills each segment from its run, so random writes stay within
// one segment's array (at most maxSegBytes). Segments are sized as New sizes
// a table (95% full, so a restored node holds no more memory than the one
// that wrote the snapshot) and hold at most 85% of a segment at the size
// limit, so each grows on its own when inserts come, never all at once.
// (Keys crafted to crowd one segment are inserted one by one.)
func FromSorted(hashes []uint64, minutes []uint8) (*Table, error) {
	if len(minutes) != len(hashes) {
		return nil, fmt.Errorf("seriesmap: %d hashes but %d minutes", len(hashes), len(minutes))
	}
	for i := 1; i < len(hashes); i++ {
		if hashes[i] <= hashes[i-1] {
			return nil, fmt.Errorf("seriesmap: hash %d (%#x) not above the one before it (%#x)", i, hashes[i], hashes[i-1])
		}
	}
	t := &Table{}
	if len(hashes) > 0 && hashes[0] == 0 {
		t.hasZero, t.zeroMin = true, minutes[0]
		hashes, minutes = hashes[1:], minutes[1:]
	}
	n := len(hashes)
	if n == 0 {
		return t, nil
	}
	perSeg := splitEntries
	if n <= perSeg {
		t.seg.alloc(bucketsFor(n, maxLoad256))
		var buf [512]uint8
		p := t.seg.placer(&buf)
		p.add(hashes, minutes, 0, 0)
		t.count = p.n
		return t, nil
	}
	depth := uint8(bits.Len(uint((n - 1) / perSeg))) // ≥ 1: 2^depth segments of ≤ perSeg expected entries
	shift := (64 - depth) & 63
	starts := make([]int, 1<<depth+1)
	for _, h := range hashes {
		starts[(h*mixer)>>shift+1]++
	}
	for i := 1; i < len(starts); i++ {
		if starts[i] > 2*perSeg {
			// Keys crafted to share a prefix of h*mixer would crowd one
			// segment's home buckets into a fraction of it, and filling that
			// probes quadratically. Insert them one by one instead: growth
			// splits such a segment by its deeper bits as it fills.
			nt := New(0)
			nt.hasZero, nt.zeroMin = t.hasZero, t.zeroMin
			for j, h := range hashes {
				nt.Put(h, minutes[j])
			}
			return nt, nil
		}
		starts[i] += starts[i-1]
	}
	// Copy the keys grouped by segment, then fill each segment from its group.
	hs := make([]uint64, n)
	ms := make([]uint8, n)
	next := slices.Clone(starts[:len(starts)-1])
	for i, h := range hashes {
		si := (h * mixer) >> shift
		j := next[si]
		next[si]++
		hs[j], ms[j] = h, minutes[i]
	}
	d := &directory{segs: make([]*seg, 1<<depth), depth: depth, count: n}
	var buf [512]uint8
	for i := range d.segs {
		s := &seg{ld: depth}
		lo, hi := starts[i], starts[i+1]
		if hi > lo {
			s.alloc(bucketsFor(hi-lo, maxLoad256))
			p := s.placer(&buf)
			p.add(hs[lo:hi], ms[lo:hi], 0, 0)
			s.count = p.n
		}
		d.segs[i] = s
	}
	t.dir = d
	return t, nil
}

// Cleanup removes every entry whose minute m has expired[m] set, and returns how
// many it removed. It may rebuild segments smaller, or merge them, when they
// are left underfull.
func (t *Table) Cleanup(expired *[256]bool) (removed int) {
	if t.hasZero && expired[t.zeroMin] {
		t.hasZero, t.zeroMin = false, 0
		removed++
	}
	d := t.dir
	if d == nil {
		return removed + t.seg.cleanup(expired)
	}
	n := 0
	d.each(func(s *seg) bool {
		n += s.cleanup(expired)
		return true
	})
	if n > 0 {
		d.count -= n
		t.merge()
	}
	return removed + n
}

// merge joins buddy segments that together hold at most mergeEntries, halves
// the directory while no segment needs its last level, and drops the directory
// when one segment is left.
func (t *Table) merge() {
	d := t.dir
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(d.segs); {
			s := d.segs[i]
			span := 1 << (d.depth - s.ld)
			if s.ld == 0 || i&span != 0 {
				i += span
				continue
			}
			b := d.segs[i+span] // its buddy, if of the same depth
			if b.ld != s.ld || int(s.count+b.count) > mergeEntries {
				i += span
				continue
			}
			m := &seg{ld: s.ld - 1}
			if n := int(s.count + b.count); n > 0 {
				m.alloc(bucketsFor(n, shrinkTarget256))
				m.fill(0, 0, s, b)
			}
			freeWords(s.data)
			freeWords(b.data)
			for j := range 2 * span {
				d.segs[i+j] = m
			}
			changed = true
			i += 2 * span
		}
	}
	for d.depth > 1 {
		for i := 0; i < len(d.segs); i += 2 {
			if d.segs[i].ld == d.depth {
				return
			}
		}
		for i := range len(d.segs) / 2 {
			d.segs[i] = d.segs[2*i]
		}
		clear(d.segs[len(d.segs)/2:])
		d.segs = slices.Clip(d.segs[:len(d.segs)/2])
		d.depth--
	}
	if s := d.segs[0]; s.ld == 0 {
		t.data, t.nb, t.count, t.growAt, t.ld = s.data, s.nb, s.count, s.growAt, 0
		t.dir = nil
	}
}

// cleanup removes the expired entries of s and returns how many it removed.
//
// Removal is done in place. The probing invariant is: an entry in bucket p
// whose home is h has every bucket of the cyclic range [h, p) full (no free
// slot); lookups rely on it to stop at the first bucket with a free slot.
// Clearing slots breaks it for entries whose range crossed a bucket that now
// has a free slot. cleanup restores it in one pass:
//
//  1. While clearing, it notes a bucket f that had a free slot before any
//     clearing (growAt guarantees one). No entry's range [h, p) contains f, so
//     no entry's probe path crosses from f to s = f+1: numbering buckets s,
//     s+1, …, s+nb-1, every entry's home is at or before its position.
//  2. It clears the expired slots.
//  3. It walks the buckets in that order. Each entry not in its home bucket is
//     moved to the first bucket with a free slot in [h, p) if there is one,
//     else left where it is (then [h, p) is full). Either way its range is
//     full when it is placed. Entries only move backwards, into buckets
//     already walked, and slots are only vacated in the bucket being walked,
//     q. Vacating a slot in q can only break an entry whose range contains q,
//     that is one placed beyond q; but every entry already placed sits at or
//     before q, and entries not yet walked will be placed again when their
//     bucket is. Filling slots never breaks the invariant. So after the walk
//     every entry satisfies it.
//
// If few entries are left, it rebuilds s smaller instead of step 3.
func (s *seg) cleanup(expired *[256]bool) (removed int) {
	nb := s.nb
	if s.count == 0 {
		return 0
	}
	free := uint32(0) // a bucket with a free slot before clearing
	foundFree := false
	for b := range nb {
		k, ms := s.bucket(b), s.mins(b)
		for i, h := range k {
			if h == 0 {
				if !foundFree {
					free, foundFree = b, true
				}
				continue
			}
			if expired[ms[i]] {
				k[i], ms[i] = 0, 0
				removed++
			}
		}
	}
	if removed == 0 {
		return 0
	}
	s.count -= uint32(removed)
	if s.count == 0 {
		freeWords(s.data)
		s.data, s.nb, s.growAt = nil, 0, 0
		return removed
	}
	if int(s.count)*256 < int(nb)*slotsPerBucket*shrinkLoad256 {
		if n := bucketsFor(int(s.count), shrinkTarget256); n < int(nb) {
			s.resize(n)
			return removed
		}
	}
	q := free + 1
	for range nb {
		if q == nb {
			q = 0
		}
		s.replace(q)
		q++
	}
	return removed
}

// replace moves every entry of bucket q that is not in its home bucket to the
// first bucket with a free slot between its home and q, if any (see cleanup).
func (s *seg) replace(q uint32) {
	nb := s.nb
	k, ms := s.bucket(q), s.mins(q)
	for i, h := range k {
		if h == 0 {
			continue
		}
		for b := s.home(h * mixer); b != q; {
			d := s.bucket(b)
			if e := match(d, 0); e != 0 {
				j := bits.TrailingZeros(e)
				d[j], s.mins(b)[j] = h, ms[i]
				k[i], ms[i] = 0, 0
				break
			}
			if b++; b == nb {
				b = 0
			}
		}
	}
}

// Clone returns a deep copy of t.
func (t *Table) Clone() *Table {
	c := &Table{seg: t.seg}
	c.data = slices.Clone(t.data)
	if d := t.dir; d != nil {
		cd := &directory{segs: make([]*seg, len(d.segs)), depth: d.depth, count: d.count}
		for i := 0; i < len(d.segs); {
			s := d.segs[i]
			cs := new(seg)
			*cs = *s
			cs.data = slices.Clone(s.data)
			span := 1 << (d.depth - s.ld)
			for j := range span {
				cd.segs[i+j] = cs
			}
			i += span
		}
		c.dir = cd
	}
	return c
}

// AppendTo appends every entry's hash to hashes and its minute to mins, in no
// particular order, and returns the extended slices.
func (t *Table) AppendTo(hashes []uint64, mins []uint8) ([]uint64, []uint8) {
	hashes = slices.Grow(hashes, t.Len())
	mins = slices.Grow(mins, t.Len())
	t.Range(func(h uint64, m uint8) bool {
		hashes = append(hashes, h)
		mins = append(mins, m)
		return true
	})
	return hashes, mins
}

// Range calls fn for every entry, in no particular order, until fn returns
// false. fn must not modify t.
func (t *Table) Range(fn func(h uint64, min uint8) bool) {
	if t.hasZero && !fn(0, t.zeroMin) {
		return
	}
	if t.dir == nil {
		t.seg.rangeKeys(fn)
		return
	}
	t.dir.each(func(s *seg) bool { return s.rangeKeys(fn) })
}

// rangeKeys calls fn for every key of s until fn returns false, and reports
// whether it went through all of them.
func (s *seg) rangeKeys(fn func(h uint64, min uint8) bool) bool {
	for b := range s.nb {
		k, ms := s.bucket(b), s.mins(b)
		for i, h := range k {
			if h != 0 && !fn(h, ms[i]) {
				return false
			}
		}
	}
	return true
}
