package api

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// HyperLogLog arithmetic shared by clientlib/partitionlimit (the hot path) and
// package service/partitionlimit (the nodes): the register convention, the wire codec of a
// Sketch and the cardinality estimator. Clients and nodes must agree on all
// three bit for bit, which is why they live here and not on either side.

// Precision bounds of the per-partition sketches: m = 2^p registers.
const (
	MinHLLPrecision     = 4
	MaxHLLPrecision     = 18
	DefaultHLLPrecision = 11
)

// DefaultHLLWindowMinutes is the sliding window of the per-partition
// sketches when none is configured. Clients and nodes must use the same
// window, so both sides' defaults are this one constant.
const DefaultHLLWindowMinutes = 20

// ErrInvalidSketch is wrapped by every ValidateSketch failure.
var ErrInvalidSketch = errors.New("invalid sketch")

// ValidateHLLPrecision accepts 4..18.
func ValidateHLLPrecision(p int) error {
	if p < MinHLLPrecision || p > MaxHLLPrecision {
		return fmt.Errorf("hll precision %d: must be in [%d, %d] (2^p registers; 11 = 2048 registers, ±2.3%% standard error)", p, MinHLLPrecision, MaxHLLPrecision)
	}
	return nil
}

// HLLStdError is the relative standard error 1.04/√m of a sketch of precision p.
func HLLStdError(p int) float64 { return 1.04 / math.Sqrt(float64(uint64(1)<<p)) }

// MixHash scrambles a series hash before it enters a sketch. Partitions are
// ranges of the hash's top bits (Partition), and the register index is the top
// bits too: unmixed, every hash of one partition would fall into the same few
// registers. The finaliser of MurmurHash3 is a bijection, so distinct series
// stay distinct.
func MixHash(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// HLLPos returns the register index (top p bits of x) and the value it
// proposes (1 + leading zeros of the other 64−p bits, so 1..65−p). This is the
// convention of github.com/axiomhq/hyperloglog's dense registers.
func HLLPos(x uint64, p uint8) (idx uint32, val uint8) {
	idx = uint32(x >> (64 - p))
	w := x<<p | 1<<(p-1)
	return idx, uint8(bits.LeadingZeros64(w)) + 1
}

// HLLMaxValue is the largest register value at precision p.
func HLLMaxValue(p uint8) uint8 { return 65 - p }

// HLLHistogram counts registers by value: h[v] = number of registers holding
// v. Keeping it up to date as registers rise (h[old]--, h[new]++) makes an
// estimate O(64) instead of O(m).
type HLLHistogram [64]uint32

// Reset sets the histogram of m empty registers.
func (h *HLLHistogram) Reset(m uint32) {
	*h = HLLHistogram{}
	h[0] = m
}

// Raise records one register moving from old to new.
func (h *HLLHistogram) Raise(old, new uint8) {
	h[old]--
	h[new]++
}

// HLLEstimate is Ertl's improved raw estimator ("New cardinality estimation
// algorithms for HyperLogLog sketches", 2017, algorithm 6) computed from the
// register histogram. Unlike the classic estimator it needs neither a
// linear-counting switch nor bias tables, and it is unbiased from 0 to far
// beyond 10M at every precision, with relative standard error ≈ 1.04/√m.
func HLLEstimate(h *HLLHistogram, p uint8) float64 {
	m := float64(uint64(1) << p)
	q := int(64 - p)
	if float64(h[0]) == m {
		return 0
	}
	z := m * hllTau(1-float64(h[q+1])/m)
	for k := q; k >= 1; k-- {
		z = 0.5 * (z + float64(h[k]))
	}
	z += m * hllSigma(float64(h[0])/m)
	if z == 0 {
		// Every register at its maximum: no finite estimate exists (the
		// formula divides by zero). Validated pushes never hold such a
		// register, but merges of several may; say "the whole hash space".
		return HLLMaxEstimate
	}
	return min(m*m/(2*math.Ln2*z), HLLMaxEstimate)
}

// HLLMaxEstimate bounds every estimate: no more than 2^64 distinct 64-bit
// hashes exist, and an estimate must stay a finite number (it is served as
// JSON, which has no infinity).
const HLLMaxEstimate = 1 << 64

// hllSigma is σ(x) = x + Σ_{k≥1} x^(2^k)·2^(k−1), summed until it stops changing.
func hllSigma(x float64) float64 {
	if x == 1 {
		return math.Inf(1)
	}
	y, z := 1.0, x
	for {
		x *= x
		prev := z
		z += x * y
		y += y
		if z == prev {
			return z
		}
	}
}

// hllTau is τ(x) = (1 − x − Σ_{k≥1} (1 − x^(2^−k))²·2^−k) / 3.
func hllTau(x float64) float64 {
	if x == 0 || x == 1 {
		return 0
	}
	y, z := 1.0, 1-x
	for {
		x = math.Sqrt(x)
		prev := z
		y *= 0.5
		z -= (1 - x) * (1 - x) * y
		if z == prev {
			return z / 3
		}
	}
}

// HLLSparseEntry packs one register for Sketch.sparse.
func HLLSparseEntry(idx uint32, val uint8) uint32 { return idx<<6 | uint32(val) }

// HLLSparseSplit unpacks one Sketch.sparse entry.
func HLLSparseSplit(e uint32) (idx uint32, val uint8) { return e >> 6, uint8(e & 63) }

// ValidateSketchRegisters checks a sketch's registers against precision p: a
// dense array of exactly 2^p bytes each ≤ 65−p, or sparse entries with
// strictly increasing indexes < 2^p and values in 1..65−p, not both. It says
// which register is wrong. Tenant, partition and minute are the caller's to
// check (they depend on the node's configuration).
func ValidateSketchRegisters(s *Sketch, p uint8) error {
	m := uint32(1) << p
	maxV := HLLMaxValue(p)
	switch {
	case len(s.Dense) > 0 && len(s.Sparse) > 0:
		return fmt.Errorf("%w: both dense and sparse registers set; send one", ErrInvalidSketch)
	case len(s.Dense) > 0:
		if uint32(len(s.Dense)) != m {
			return fmt.Errorf("%w: %d dense registers, precision %d needs exactly %d", ErrInvalidSketch, len(s.Dense), p, m)
		}
		for i, v := range s.Dense {
			if v > maxV {
				return fmt.Errorf("%w: register %d = %d, at most %d at precision %d", ErrInvalidSketch, i, v, maxV, p)
			}
			if v == maxV {
				return saturated(i, v, p)
			}
		}
	default:
		next := uint32(0)
		for i, e := range s.Sparse {
			idx, v := HLLSparseSplit(e)
			switch {
			case idx >= m:
				return fmt.Errorf("%w: sparse entry %d: register %d out of range, precision %d has %d", ErrInvalidSketch, i, idx, p, m)
			case idx < next:
				return fmt.Errorf("%w: sparse entry %d: register %d not after the previous entry (indexes must increase strictly)", ErrInvalidSketch, i, idx)
			case v == 0 || v > maxV:
				return fmt.Errorf("%w: sparse entry %d: register %d = %d, must be in [1, %d] at precision %d", ErrInvalidSketch, i, idx, v, maxV, p)
			case v == maxV:
				return saturated(int(idx), v, p)
			}
			next = idx + 1
		}
	}
	return nil
}

// saturated refuses a register at its maximum 65−p. A hashed series sets it
// only when the 64−p low bits of its hash are all zero (odds 2^−(64−p) per
// series: never, in practice), while a sketch with every register there
// has no finite estimate; such registers come from a broken or hostile
// client, not from hashing.
func saturated(idx int, v, p uint8) error {
	return fmt.Errorf("%w: register %d = %d is saturated (the maximum at precision %d); registers built by hashing series never reach it", ErrInvalidSketch, idx, v, p)
}

// ForEachSketchRegister calls fn for every non-zero register of a sketch that
// passed ValidateSketchRegisters.
func ForEachSketchRegister(s *Sketch, fn func(idx uint32, val uint8)) {
	if len(s.Dense) > 0 {
		for i, v := range s.Dense {
			if v != 0 {
				fn(uint32(i), v)
			}
		}
		return
	}
	for _, e := range s.Sparse {
		fn(HLLSparseSplit(e))
	}
}
