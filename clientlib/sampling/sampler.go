package sampling

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// OtherKind and OtherKey collect the counts of kinds and keys beyond the bounds
// in Options, so a caller passing unbounded names cannot grow a client's memory.
// Neither is a valid kind name, so neither collides with a configured kind.
const (
	OtherKind = "_other"
	OtherKey  = "_other"
)

// DefaultMaxKinds is Options.MaxKinds when left at 0.
const DefaultMaxKinds = 64

// Options configure a Sampler. The zero value is ready to use.
type Options struct {
	// Rand returns uniform 64-bit values for ShouldSample. nil uses math/rand/v2's
	// runtime source, which is per-thread, lock-free and safe for concurrent use.
	// A custom source must be safe for concurrent use if the Sampler is shared;
	// tests pass a seeded one to make decisions reproducible.
	Rand func() uint64
	// MaxKinds bounds the kinds counted separately in Stats (0: DefaultMaxKinds).
	// Kinds in the rates always count separately; other kinds beyond the bound
	// count under OtherKind.
	MaxKinds int
	// MaxKeys bounds the keys counted separately in Stats.Keys; 0 disables
	// per-key counts (the hot path then skips one map lookup). Once MaxKeys keys
	// are tracked, a (key, kind) pair not yet tracked counts under OtherKey.
	// Each tracked (key, kind) pair costs 512 bytes of striped counters.
	MaxKeys int
}

// Sampler decides ShouldSample from the rates snapshot in force. It is safe for
// concurrent use; decisions take no lock.
type Sampler struct {
	table atomic.Pointer[table]
	rand  func() uint64

	maxKinds, maxKeys int

	// Counters live outside the table so they survive Update. The maps are
	// copy-on-write: readers load a pointer, writers (first sight of a kind or
	// key, under mu) publish a new map.
	mu       sync.Mutex
	kinds    atomic.Pointer[map[string]*counters]
	keys     atomic.Pointer[map[keyKind]*counters]
	keyCount int                 // distinct keys in keys, under mu
	keySeen  map[string]struct{} // under mu
	keysFull atomic.Bool

	updates, refused atomic.Uint64
}

type keyKind struct{ key, kind string }

// counters are striped: each decision adds to the stripe chosen by three low
// bits of its 64-bit draw (random, or the mixed item hash, so uniform and
// independent of the high bits that decide), so cores deciding at once mostly
// touch different cache lines instead of all contending for one.
type counters struct {
	stripes [counterStripes]stripe
}

const counterStripes = 8

// stripe is padded to a cache line against false sharing.
type stripe struct {
	sampled, dropped atomic.Uint64
	_                [48]byte
}

func (c *counters) add(ok bool, x uint64) {
	st := &c.stripes[x&(counterStripes-1)]
	if ok {
		st.sampled.Add(1)
	} else {
		st.dropped.Add(1)
	}
}

func (c *counters) counts() Counts {
	var n Counts
	for i := range c.stripes {
		n.Sampled += c.stripes[i].sampled.Load()
		n.Dropped += c.stripes[i].dropped.Load()
	}
	return n
}

// table is an immutable compiled Rates: thresholds per kind index, one row per
// key plus the default row.
type table struct {
	rates Rates
	kinds map[string]kindEntry
	// few lists the kinds when there are at most fewKinds of them: a scan
	// comparing a handful of short strings beats hashing the kind.
	few      []kindName
	keys     map[string][]rate
	defaults []rate
}

const fewKinds = 8

type kindName struct {
	name string
	kindEntry
}

type kindEntry struct {
	idx int
	c   *counters
}

// rate is one effective rate: the percentage for reports and the threshold the
// hot path compares a 53-bit uniform value with (2^53 = always, 0 = never).
type rate struct {
	threshold uint64
	percent   float64
}

const one53 = 1 << 53

func makeRate(keyPct, globalPct float64) rate {
	p := keyPct * globalPct / 100
	return rate{threshold: uint64(p / 100 * one53), percent: p}
}

func (t *table) kind(kind string) (kindEntry, bool) {
	if len(t.kinds) > fewKinds {
		e, ok := t.kinds[kind]
		return e, ok
	}
	for i := range t.few {
		if t.few[i].name == kind {
			return t.few[i].kindEntry, true
		}
	}
	return kindEntry{}, false
}

// New returns a Sampler with the built-in rates (version 0: everything 100%).
func New(o Options) *Sampler {
	s := &Sampler{rand: o.Rand, maxKinds: o.MaxKinds, maxKeys: o.MaxKeys, keySeen: map[string]struct{}{}}
	if s.rand == nil {
		s.rand = rand.Uint64
	}
	if s.maxKinds <= 0 {
		s.maxKinds = DefaultMaxKinds
	}
	kinds := map[string]*counters{}
	keys := map[keyKind]*counters{}
	s.kinds.Store(&kinds)
	s.keys.Store(&keys)
	s.table.Store(&table{})
	return s
}

// Update validates r and makes it the snapshot in force. It refuses (with
// ErrStaleVersion) a version older than the one in force, and a same version
// with different rates; re-pushing the same snapshot is a no-op. r is copied:
// the caller may reuse its maps.
func (s *Sampler) Update(r Rates) error {
	if err := r.Validate(); err != nil {
		s.refused.Add(1)
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.table.Load()
	switch {
	case r.Version < cur.rates.Version:
		s.refused.Add(1)
		return fmt.Errorf("%w: got version %d, version %d is in force", ErrStaleVersion, r.Version, cur.rates.Version)
	case r.Version == cur.rates.Version:
		if r.equal(cur.rates) {
			return nil
		}
		s.refused.Add(1)
		return fmt.Errorf("%w: version %d is in force with different rates", ErrStaleVersion, r.Version)
	}
	s.table.Store(s.compile(r.clone()))
	s.updates.Add(1)
	return nil
}

// compile builds the table for r; called under mu (it registers counters).
func (s *Sampler) compile(r Rates) *table {
	t := &table{rates: r, kinds: map[string]kindEntry{}, keys: make(map[string][]rate, len(r.Keys))}
	var names []string
	addKinds := func(m map[string]float64) {
		for k := range m {
			if _, ok := t.kinds[k]; !ok {
				t.kinds[k] = kindEntry{idx: len(names)}
				names = append(names, k)
			}
		}
	}
	addKinds(r.Global)
	addKinds(r.Default)
	for _, m := range r.Keys {
		addKinds(m)
	}
	for _, k := range names {
		e := t.kinds[k]
		e.c = s.kindCountersLocked(k, true)
		t.kinds[k] = e
		if len(names) <= fewKinds {
			t.few = append(t.few, kindName{k, e})
		}
	}
	row := func(own map[string]float64) []rate {
		out := make([]rate, len(names))
		for i, k := range names {
			keyPct, ok := own[k]
			if !ok {
				keyPct, ok = r.Default[k]
			}
			if !ok {
				keyPct = 100
			}
			g, ok := r.Global[k]
			if !ok {
				g = 100
			}
			out[i] = makeRate(keyPct, g)
		}
		return out
	}
	t.defaults = row(nil)
	for key, own := range r.Keys {
		t.keys[key] = row(own)
	}
	return t
}

// ShouldSample reports whether one unit of traffic of kind from key is kept,
// drawing a fresh random number: independent decisions at the effective rate.
func (s *Sampler) ShouldSample(key, kind string) bool {
	return s.decide(key, kind, s.rand())
}

// ShouldSampleItem reports whether the item with hash itemHash is kept. The
// decision depends only on the hash and the effective rate, so every Sampler
// holding the same rates agrees on it.
func (s *Sampler) ShouldSampleItem(key, kind string, itemHash uint64) bool {
	return s.decide(key, kind, Mix(itemHash))
}

func (s *Sampler) decide(key, kind string, x uint64) bool {
	t := s.table.Load()
	ok := true
	var c *counters
	if e, known := t.kind(kind); known {
		row := t.defaults
		if own, has := t.keys[key]; has {
			row = own
		}
		ok = x>>11 < row[e.idx].threshold
		c = e.c
	} else {
		c = s.kindCounters(kind)
	}
	c.add(ok, x)
	if s.maxKeys > 0 {
		s.keyCounters(key, kind).add(ok, x)
	}
	return ok
}

// Mix is the fixed 64-bit mixer (the splitmix64 finaliser) ShouldSampleItem
// applies to item hashes, exported so other languages' clients can reproduce
// decisions: an item is kept when Mix(hash)>>11 < percent/100 × 2^53.
func Mix(h uint64) uint64 {
	h += 0x9e3779b97f4a7c15
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return h ^ h>>31
}

// Rate returns the effective percentage (key × global) for key and kind.
func (s *Sampler) Rate(key, kind string) float64 {
	t := s.table.Load()
	e, known := t.kind(kind)
	if !known {
		return 100
	}
	if own, has := t.keys[key]; has {
		return own[e.idx].percent
	}
	return t.defaults[e.idx].percent
}

// Version returns the version of the rates in force (0: built-in defaults).
func (s *Sampler) Version() uint64 { return s.table.Load().rates.Version }

// Rates returns a copy of the rates in force.
func (s *Sampler) Rates() Rates { return s.table.Load().rates.clone() }

func (s *Sampler) kindCounters(kind string) *counters {
	if c, ok := (*s.kinds.Load())[kind]; ok {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kindCountersLocked(kind, false)
}

// kindCountersLocked finds or adds kind's counters; configured kinds are
// always added, others only below maxKinds (else they share OtherKind's).
func (s *Sampler) kindCountersLocked(kind string, configured bool) *counters {
	cur := *s.kinds.Load()
	if c, ok := cur[kind]; ok {
		return c
	}
	if !configured && len(cur) >= s.maxKinds {
		if c, ok := cur[OtherKind]; ok {
			return c
		}
		kind = OtherKind
	}
	next := make(map[string]*counters, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	c := &counters{}
	next[kind] = c
	s.kinds.Store(&next)
	return c
}

func (s *Sampler) keyCounters(key, kind string) *counters {
	kk := keyKind{key, kind}
	m := *s.keys.Load()
	if c, ok := m[kk]; ok {
		return c
	}
	if s.keysFull.Load() {
		if c, ok := m[keyKind{OtherKey, kind}]; ok {
			return c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := *s.keys.Load()
	if c, ok := cur[kk]; ok {
		return c
	}
	if _, seen := s.keySeen[key]; !seen {
		if len(s.keySeen) >= s.maxKeys {
			s.keysFull.Store(true)
			kk = keyKind{OtherKey, kind}
			if c, ok := cur[kk]; ok {
				return c
			}
		} else {
			s.keySeen[key] = struct{}{}
		}
	}
	next := make(map[keyKind]*counters, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	c := &counters{}
	next[kk] = c
	s.keys.Store(&next)
	return c
}

// Counts are decisions since New.
type Counts struct {
	Sampled uint64 `json:"sampled"`
	Dropped uint64 `json:"dropped"`
}

// Stats is a snapshot of a Sampler's counters.
type Stats struct {
	// Version of the rates in force.
	Version uint64 `json:"version"`
	// Updates accepted and refused (invalid or stale) since New.
	Updates uint64 `json:"updates"`
	Refused uint64 `json:"refused"`
	// Kinds counts decisions by kind (OtherKind: kinds beyond Options.MaxKinds).
	Kinds map[string]Counts `json:"kinds"`
	// Keys counts decisions by key and kind, with Options.MaxKeys > 0
	// (OtherKey: keys beyond the bound).
	Keys map[string]map[string]Counts `json:"keys,omitempty"`
}

// Stats returns the current counters. Counters are read one by one while
// decisions go on, so a snapshot is not an atomic cut across kinds.
func (s *Sampler) Stats() Stats {
	st := Stats{Version: s.Version(), Updates: s.updates.Load(), Refused: s.refused.Load(), Kinds: map[string]Counts{}}
	for k, c := range *s.kinds.Load() {
		st.Kinds[k] = c.counts()
	}
	if s.maxKeys > 0 {
		st.Keys = map[string]map[string]Counts{}
		for kk, c := range *s.keys.Load() {
			m := st.Keys[kk.key]
			if m == nil {
				m = map[string]Counts{}
				st.Keys[kk.key] = m
			}
			m[kk.kind] = c.counts()
		}
	}
	return st
}
