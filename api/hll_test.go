package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/axiomhq/hyperloglog"
)

// TestHLLPosMatchesAxiomhq: our registers are exactly the dense registers of
// github.com/axiomhq/hyperloglog for the same 64-bit values, so the library
// serves as the reference implementation of the register convention.
func TestHLLPosMatchesAxiomhq(t *testing.T) {
	for _, p := range []uint8{4, 11, 14, 18} {
		ref, err := hyperloglog.NewSketch(p, false)
		if err != nil {
			t.Fatal(err)
		}
		regs := make([]uint8, 1<<p)
		r := rand.New(rand.NewPCG(1, uint64(p)))
		for range 50_000 {
			x := MixHash(r.Uint64())
			ref.InsertHash(x)
			i, v := HLLPos(x, p)
			regs[i] = max(regs[i], v)
		}
		bin, err := ref.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		// Dense encoding: version, p, b, sparse flag, uint32 length, registers.
		if n := binary.BigEndian.Uint32(bin[4:8]); n != 1<<p || !bytes.Equal(bin[8:], regs) {
			t.Fatalf("p=%d: registers differ from axiomhq's", p)
		}
	}
}

// TestHLLEstimateAccuracy: the estimator stays within 4 standard errors from
// empty through the linear-counting range to the large range, where the
// classic estimator needs a switch or bias tables. (4σ because 32 points are
// checked: at 3σ one of them would be outside about one run in ten; the
// 3σ bar at the documented cardinalities is service/partitionlimit's TestMergedAccuracy.)
func TestHLLEstimateAccuracy(t *testing.T) {
	for _, p := range []uint8{4, 8, 11, 14} {
		m := uint32(1) << p
		regs := make([]uint8, m)
		var h HLLHistogram
		h.Reset(m)
		if e := HLLEstimate(&h, p); e != 0 {
			t.Fatalf("p=%d: empty sketch estimates %v", p, e)
		}
		r := rand.New(rand.NewPCG(2, uint64(p)))
		n := 0
		bound := 4 * HLLStdError(int(p))
		for _, target := range []int{10, 100, 1000, 3000, 10_000, 30_000, 100_000, 300_000} {
			for ; n < target; n++ {
				i, v := HLLPos(MixHash(r.Uint64()), p)
				if v > regs[i] {
					h.Raise(regs[i], v)
					regs[i] = v
				}
			}
			est := HLLEstimate(&h, p)
			if rel := math.Abs(est-float64(n)) / float64(n); rel > bound && math.Abs(est-float64(n)) > 3 {
				t.Errorf("p=%d n=%d: estimate %.0f, error %.2f%% > 4σ = %.2f%%", p, n, est, 100*rel, 100*bound)
			}
		}
	}
}

func TestValidatePrecision(t *testing.T) {
	for p := range 25 {
		err := ValidateHLLPrecision(p)
		if (err == nil) != (p >= 4 && p <= 18) {
			t.Errorf("precision %d: err = %v", p, err)
		}
	}
}

func TestValidateSketchRegisters(t *testing.T) {
	const p = 11
	dense := make([]byte, 2048)
	dense[7] = 3
	cases := []struct {
		name string
		s    *Sketch
		ok   bool
	}{
		{"empty", &Sketch{}, true},
		{"dense", &Sketch{Dense: dense}, true},
		{"sparse", &Sketch{Sparse: []uint32{HLLSparseEntry(0, 1), HLLSparseEntry(2047, 53)}}, true},
		// 54 = 65−p: a register hashing never sets (see saturated).
		{"sparse saturated", &Sketch{Sparse: []uint32{HLLSparseEntry(0, 1), HLLSparseEntry(2047, 54)}}, false},
		{"dense saturated", &Sketch{Dense: append(append([]byte{}, dense[:2047]...), 54)}, false},
		{"truncated dense", &Sketch{Dense: dense[:2047]}, false},
		{"long dense", &Sketch{Dense: append(dense, 0)}, false},
		{"dense value too large", &Sketch{Dense: append(append([]byte{}, dense[:2047]...), 55)}, false},
		{"both", &Sketch{Dense: dense, Sparse: []uint32{HLLSparseEntry(1, 1)}}, false},
		{"sparse index out of range", &Sketch{Sparse: []uint32{HLLSparseEntry(2048, 1)}}, false},
		{"sparse unordered", &Sketch{Sparse: []uint32{HLLSparseEntry(5, 1), HLLSparseEntry(5, 2)}}, false},
		{"sparse zero value", &Sketch{Sparse: []uint32{HLLSparseEntry(5, 0)}}, false},
		{"sparse value too large", &Sketch{Sparse: []uint32{HLLSparseEntry(5, 55)}}, false},
	}
	for _, c := range cases {
		err := ValidateSketchRegisters(c.s, p)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidSketch) {
			t.Errorf("%s: %v does not wrap ErrInvalidSketch", c.name, err)
		}
	}
}

// FuzzSketchDecoder: any bytes, read as a dense array or as sparse entries at
// any precision, are either refused with ErrInvalidSketch or decode to
// registers in range that re-encode to the same sketch. Never a panic.
func FuzzSketchDecoder(f *testing.F) {
	f.Add(uint8(11), false, make([]byte, 2048))
	f.Add(uint8(4), true, []byte{0, 0, 0, 1, 0, 0, 0, 0x41})
	f.Add(uint8(30), true, []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p uint8, sparse bool, data []byte) {
		s := &Sketch{}
		if sparse {
			for i := 0; i+4 <= len(data); i += 4 {
				s.Sparse = append(s.Sparse, binary.BigEndian.Uint32(data[i:]))
			}
		} else {
			s.Dense = data
		}
		if ValidateHLLPrecision(int(p)) != nil {
			return // callers check the precision first
		}
		if err := ValidateSketchRegisters(s, p); err != nil {
			if !errors.Is(err, ErrInvalidSketch) {
				t.Fatalf("error %v does not wrap ErrInvalidSketch", err)
			}
			return
		}
		m := uint32(1) << p
		var back []uint32
		ForEachSketchRegister(s, func(idx uint32, v uint8) {
			if idx >= m || v == 0 || v > HLLMaxValue(p) {
				t.Fatalf("decoded register %d = %d out of range at p=%d", idx, v, p)
			}
			back = append(back, HLLSparseEntry(idx, v))
		})
		if err := ValidateSketchRegisters(&Sketch{Sparse: back}, p); err != nil {
			t.Fatalf("re-encoded sketch invalid: %v", err)
		}
		if sparse && len(back) != len(s.Sparse) {
			t.Fatalf("sparse round trip: %d entries in, %d out", len(s.Sparse), len(back))
		}
	})
}

// TestHLLEstimateFinite: a histogram with every register at its maximum (a
// merge of pushes can build one) has no finite estimate; HLLEstimate
// answers HLLMaxEstimate instead of +Inf, which JSON cannot carry.
func TestHLLEstimateFinite(t *testing.T) {
	for _, p := range []uint8{4, 11, 14, 18} {
		m := uint32(1) << p
		var h HLLHistogram
		h[HLLMaxValue(p)] = m
		if est := HLLEstimate(&h, p); math.IsInf(est, 0) || math.IsNaN(est) || est != HLLMaxEstimate {
			t.Errorf("p=%d, all registers saturated: estimate %v, want %v", p, est, float64(HLLMaxEstimate))
		}
		h[HLLMaxValue(p)], h[HLLMaxValue(p)-1] = m-1, 1
		if est := HLLEstimate(&h, p); math.IsInf(est, 0) || est > HLLMaxEstimate {
			t.Errorf("p=%d, all but one saturated: estimate %v", p, est)
		}
	}
}
