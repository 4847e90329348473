// Package kerneltest is the conformance suite every kernels provider runs: each op
// against a float64 reference, at sizes around block boundaries (0, 1, tile-1,
// tile, tile+1), odd leading dims, every transpose, several alpha/beta, with NaN
// guard bands around outputs to catch stray writes and NaN in outputs that must
// not be read, and bit-identical results across thread counts.
package kerneltest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Config tells the suite how to drive a provider.
type Config struct {
	// New returns the provider under test. threads is a hint (0 = default);
	// providers that cannot honour it ignore it and set Deterministic false.
	New func(threads int) (kernels.Kernels, error)
	// Deterministic: results must be bit-identical for threads = 1 and 2.
	Deterministic bool
	// Memory is the memory of the provider's device (nil: host memory).
	Memory tensor.Memory
	// DTypes to test; nil means the provider's (its DTypes method), or float32
	// and float64. bfloat16 runs the GEMMs with bfloat16 and float32 outputs.
	DTypes []tensor.DType
	// Short runs fewer shapes (for slow providers).
	Short bool
}

// guard is the number of NaN elements on each side of every output.
const guard = 19

// buf is a host tensor viewed inside a larger NaN-filled slice.
type buf struct {
	all  []float64 // the values as float64 (for the reference)
	t    *tensor.Tensor
	raw  any // []float32 or []float64 including guards
	size int
}

func newBuf(rng *rand.Rand, dt tensor.DType, fill string, shape ...int) *buf {
	n := tensor.NumElements(shape)
	b := &buf{size: n, all: make([]float64, n)}
	for i := range b.all {
		switch fill {
		case "nan":
			b.all[i] = math.NaN()
		case "rand":
			v := float32(rng.Float64()*2 - 1)
			if dt == tensor.BFloat16 { // exact bfloat16 values
				v = tensor.ToBF16(v).Float32()
			}
			b.all[i] = float64(v)
		}
	}
	var err error
	switch dt {
	case tensor.Float32:
		raw := make([]float32, n+2*guard)
		for i := range raw {
			raw[i] = float32(math.NaN())
		}
		for i, v := range b.all {
			raw[guard+i] = float32(v)
		}
		b.raw = raw
		b.t, err = tensor.FromFloat32(raw[guard:guard+n:guard+n], shape...)
	case tensor.BFloat16:
		raw := make([]tensor.BF16, n+2*guard)
		for i := range raw {
			raw[i] = tensor.ToBF16(float32(math.NaN()))
		}
		for i, v := range b.all {
			raw[guard+i] = tensor.ToBF16(float32(v))
		}
		b.raw = raw
		b.t, err = tensor.FromBFloat16(raw[guard:guard+n:guard+n], shape...)
	default:
		raw := make([]float64, n+2*guard)
		for i := range raw {
			raw[i] = math.NaN()
		}
		copy(raw[guard:], b.all)
		b.raw = raw
		b.t, err = tensor.FromFloat64(raw[guard:guard+n:guard+n], shape...)
	}
	if err != nil {
		panic(err)
	}
	return b
}

// checkGuards fails if anything outside [guard, guard+size) was written.
func (b *buf) checkGuards(t *testing.T, what string) {
	t.Helper()
	bad := func(i int) { t.Errorf("%s: guard element %d written", what, i) }
	switch raw := b.raw.(type) {
	case []float32:
		for i := range raw {
			if (i < guard || i >= guard+b.size) && !math.IsNaN(float64(raw[i])) {
				bad(i)
				return
			}
		}
	case []float64:
		for i := range raw {
			if (i < guard || i >= guard+b.size) && !math.IsNaN(raw[i]) {
				bad(i)
				return
			}
		}
	case []tensor.BF16:
		for i := range raw {
			if (i < guard || i >= guard+b.size) && !math.IsNaN(float64(raw[i].Float32())) {
				bad(i)
				return
			}
		}
	}
}

func (b *buf) value(i int) float64 { return b.t.At(i) }

// env runs ops on host or device tensors.
type env struct {
	t   *testing.T
	cfg Config
	k   kernels.Kernels
}

func (e *env) mem() tensor.Memory {
	if e.cfg.Memory == nil {
		return tensor.Host
	}
	return e.cfg.Memory
}

func (e *env) dev(b *buf) *tensor.Tensor {
	if b == nil {
		return nil
	}
	d, err := tensor.Upload(e.mem(), b.t)
	if err != nil {
		e.t.Fatalf("to device: %v", err)
	}
	return d
}

func (e *env) back(dst *buf, d *tensor.Tensor) {
	if d.OnHost() {
		return
	}
	if err := e.mem().Read(tensor.HostBytes(dst.t), d, 0, tensor.Transfer); err != nil {
		e.t.Fatalf("to host: %v", err)
	}
}

// compare checks got against want with a bound scaled by mag (the sum of the
// magnitudes that went into each element) and K: float32 or float64 rounding per
// step, as got's dtype says (bfloat16 results are summed in float32), and for a
// bfloat16 result one final rounding, half a bfloat16 epsilon (2^-8) relative.
func compare(t *testing.T, what string, _ tensor.DType, got *buf, want, mag []float64, k int) {
	t.Helper()
	dt := got.t.DType()
	eps := 1.2e-7
	if dt == tensor.Float64 {
		eps = 2.3e-16
	}
	errs := 0
	for i := range want {
		g := got.value(i)
		tol := 4 * eps * float64(k+4) * (mag[i] + 1e-30)
		if dt == tensor.BFloat16 {
			tol += tensor.BF16Epsilon / 2 * (math.Abs(want[i]) + tol)
		}
		if math.IsNaN(want[i]) != math.IsNaN(g) || math.Abs(g-want[i]) > tol {
			if errs < 5 {
				t.Errorf("%s: element %d = %v, want %v (tol %.3g)", what, i, g, want[i], tol)
			}
			errs++
		}
	}
	if errs > 5 {
		t.Errorf("%s: %d elements wrong", what, errs)
	}
	got.checkGuards(t, what)
}

// outs are the output dtypes tested for inputs of dt: bfloat16 GEMMs write
// bfloat16 or float32.
func outs(dt tensor.DType) []tensor.DType {
	if dt == tensor.BFloat16 {
		return []tensor.DType{tensor.BFloat16, tensor.Float32}
	}
	return []tensor.DType{dt}
}

// outParams sets p's output dtype (0 when it is the input's).
func outParams(p kernels.GemmParams, out tensor.DType) kernels.GemmParams {
	p.OutDType = 0
	if out != p.DType {
		p.OutDType = out
	}
	return p
}

// Run runs the whole suite.
func Run(t *testing.T, cfg Config) {
	k, err := cfg.New(0)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	dts := cfg.DTypes
	if dts == nil {
		dts = []tensor.DType{tensor.Float32, tensor.Float64}
		if p, ok := k.(interface{ DTypes() []tensor.DType }); ok {
			dts = p.DTypes()
		}
	}
	for _, dt := range dts {
		t.Run(dt.String(), func(t *testing.T) {
			e := &env{t: t, cfg: cfg, k: k}
			if err := e.probe(dt); err != nil {
				// A provider that lists a dtype its device memory cannot hold:
				// reported, not hidden, but not the suite's to fail on.
				t.Skipf("%v listed but refused on %v memory: %v", dt, e.mem().Device(), err)
			}
			t.Run("Gemm", func(t *testing.T) { e.t = t; testGemm(e, dt) })
			t.Run("GemmBatched", func(t *testing.T) { e.t = t; testGemmBatched(e, dt) })
			if dt != tensor.BFloat16 { // GemvParams are float32 or float64; M = 1 GEMMs cover bfloat16
				t.Run("Gemv", func(t *testing.T) { e.t = t; testGemv(e, dt) })
			}
			t.Run("Linear", func(t *testing.T) { e.t = t; testLinear(e, dt) })
			t.Run("Matmul", func(t *testing.T) { e.t = t; testMatmul(e, dt) })
			t.Run("Grouped", func(t *testing.T) { e.t = t; testGrouped(e, dt) })
			t.Run("Gelu", func(t *testing.T) { e.t = t; testGelu(e, dt) })
			t.Run("Epilogues", func(t *testing.T) { e.t = t; testEpilogues(e, dt) })
			t.Run("Elementwise", func(t *testing.T) { e.t = t; testElementwise(e, dt) })
			t.Run("EmptyOperands", func(t *testing.T) { e.t = t; testEmptyTransformer(e, dt) })
			t.Run("Errors", func(t *testing.T) { e.t = t; testErrors(e, dt) })
			if cfg.Deterministic {
				t.Run("ThreadCountInvariance", func(t *testing.T) { testDeterminism(t, cfg, dt) })
			}
		})
	}
}

// probe runs one small GEMM of dt and reports whether the device's memory
// refuses the dtype (tensor.ErrDType); other failures are left to the suite.
func (e *env) probe(dt tensor.DType) error {
	if e.cfg.Memory == nil {
		return nil
	}
	rng := rand.New(rand.NewPCG(0, 0))
	a, b, c := newBuf(rng, dt, "rand", 2, 3), newBuf(rng, dt, "rand", 3, 2), newBuf(rng, dt, "nan", 2, 2)
	err := e.k.Gemm(kernels.GemmParams{M: 2, N: 2, K: 3, Alpha: 1, DType: dt},
		kernels.GemmOperands{A: e.dev(a), B: e.dev(b), C: e.dev(c)})
	if errors.Is(err, tensor.ErrDType) {
		return err
	}
	return nil
}

// edge sizes around the tiles providers use (4, 6, 8, 16, 24, 48) and their blocks.
var gemmShapes = [][3]int{ // M, N, K
	{0, 5, 3}, {4, 0, 3}, {3, 4, 0}, {1, 1, 1}, {1, 17, 9}, {1, 49, 300},
	{2, 3, 5}, {3, 47, 7}, {5, 48, 8}, {6, 49, 1}, {7, 16, 33}, {8, 15, 16},
	{9, 17, 17}, {15, 24, 2}, {16, 23, 31}, {17, 25, 64}, {23, 95, 3}, {24, 96, 65},
	{25, 97, 5}, {47, 8, 13}, {48, 1, 40}, {49, 2, 257}, {65, 100, 130},
}

var bigGemmShapes = [][3]int{{200, 150, 520}, {130, 300, 300}, {257, 97, 33}}

// deepGemmShapes split K into several cache blocks on every bfloat16 path (a
// bfloat16 C is then written once, from float32 sums kept between blocks).
var deepGemmShapes = [][3]int{{21, 70, 4501}, {9, 50, 2049}}

var alphaBetas = [][2]float64{{1, 0}, {1, 1}, {0.5, -2}, {0, 0.5}, {-1.5, 0}}

// gemmRef returns the reference result and per-element magnitude bound.
func gemmRef(p kernels.GemmParams, a, b, c []float64) (want, mag []float64) {
	want = append([]float64(nil), c...)
	mag = make([]float64, len(c))
	for bi := 0; bi < p.BatchCount; bi++ {
		for i := 0; i < p.M; i++ {
			for j := 0; j < p.N; j++ {
				var s, m float64
				for k := 0; k < p.K && p.Alpha != 0; k++ {
					var av, bv float64
					if p.TransA {
						av = a[bi*p.StrideA+k*p.LDA+i]
					} else {
						av = a[bi*p.StrideA+i*p.LDA+k]
					}
					if p.TransB {
						bv = b[bi*p.StrideB+j*p.LDB+k]
					} else {
						bv = b[bi*p.StrideB+k*p.LDB+j]
					}
					s += av * bv
					m += math.Abs(av * bv)
				}
				ci := bi*p.StrideC + i*p.LDC + j
				cv := 0.0
				if p.Beta != 0 {
					cv = c[ci]
				}
				want[ci] = p.Alpha*s + p.Beta*cv
				mag[ci] = math.Abs(p.Alpha)*m + math.Abs(p.Beta*cv)
			}
		}
	}
	return want, mag
}

func (e *env) runGemm(dt tensor.DType, p kernels.GemmParams, rng *rand.Rand, name string) {
	t := e.t
	p = p.Normalized()
	la, lb, lc := p.Lens()
	a := newBuf(rng, dt, "rand", la)
	b := newBuf(rng, dt, "rand", lb)
	fill := "rand"
	if p.Beta == 0 {
		fill = "nan"
	}
	c := newBuf(rng, p.Out(), fill, lc)
	// Elements of C between rows (ld > N) must keep their value: make them NaN
	// and expect NaN back.
	if lc > 0 {
		for bi := 0; bi < p.BatchCount; bi++ {
			for i := 0; i < p.M; i++ {
				for j := p.N; j < p.LDC; j++ {
					idx := bi*p.StrideC + i*p.LDC + j
					if idx < lc {
						c.all[idx] = math.NaN()
						setAt(c.t, idx, math.NaN())
					}
				}
			}
		}
	}
	want, mag := gemmRef(p, a.all, b.all, c.all)
	for i := range want {
		if mag[i] == 0 && math.IsNaN(want[i]) {
			mag[i] = 1
		}
	}
	dc := e.dev(c)
	if err := e.k.Gemm(p, kernels.GemmOperands{A: e.dev(a), B: e.dev(b), C: dc}); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	e.back(c, dc)
	compare(t, name, p.Out(), c, want, mag, p.K)
}

func setAt(t *tensor.Tensor, i int, v float64) {
	switch t.DType() {
	case tensor.Float32:
		t.Float32()[i] = float32(v)
	case tensor.BFloat16:
		t.BFloat16()[i] = tensor.ToBF16(float32(v))
	default:
		t.Float64()[i] = v
	}
}

func testGemm(e *env, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(1, uint64(dt)))
	shapes := gemmShapes
	if !e.cfg.Short {
		shapes = append(shapes, bigGemmShapes...)
		if dt == tensor.BFloat16 {
			shapes = append(shapes, deepGemmShapes...)
		}
	}
	for _, out := range outs(dt) {
		for si, s := range shapes {
			for tr := 0; tr < 4; tr++ {
				for ai, ab := range alphaBetas {
					e.gemmCase(dt, out, si, s, tr, ai, ab, rng)
				}
			}
		}
	}
}

// gemmCase runs one GEMM of testGemm: shape s, transposes tr, alpha/beta ab.
func (e *env) gemmCase(dt, out tensor.DType, si int, s [3]int, tr, ai int, ab [2]float64, rng *rand.Rand) {
	if (si+tr+ai)%2 == 1 && s[0]*s[1]*s[2] > 20000 {
		return // the big shapes get half the combinations
	}
	p := outParams(kernels.GemmParams{TransA: tr&1 != 0, TransB: tr&2 != 0, M: s[0], N: s[1], K: s[2],
		Alpha: ab[0], Beta: ab[1], DType: dt}, out)
	odd := (si+ai)%2 == 1
	if odd {
		p = p.Normalized()
		p.LDA += 3
		p.LDB += 5
		p.LDC += 7
	}
	name := fmt.Sprintf("%v_M%d_N%d_K%d_tA%v_tB%v_a%v_b%v_odd%v", out, s[0], s[1], s[2], p.TransA, p.TransB, ab[0], ab[1], odd)
	e.runGemm(dt, p, rng, name)
}

func testGemmBatched(e *env, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(2, uint64(dt)))
	for _, out := range outs(dt) {
		for tr := 0; tr < 4; tr++ {
			p := outParams(kernels.GemmParams{TransA: tr&1 != 0, TransB: tr&2 != 0, M: 9, N: 50, K: 17,
				Alpha: 1, Beta: 0.5, BatchCount: 3, DType: dt}, out).Normalized()
			p.StrideA += 11
			p.StrideC += 13
			e.runGemm(dt, p, rng, fmt.Sprintf("%v_batch3_tr%d", out, tr))
			p1 := p
			p1.M = 1
			p1.StrideA, p1.StrideC = 0, 0
			e.runGemm(dt, p1, rng, fmt.Sprintf("%v_batch3_M1_tr%d", out, tr))
			// Empty dimensions: nothing to compute (M, N = 0), or C = beta·C (K = 0).
			for _, s := range [][3]int{{0, 5, 3}, {4, 0, 3}, {4, 5, 0}} {
				pe := outParams(kernels.GemmParams{TransA: tr&1 != 0, TransB: tr&2 != 0, M: s[0], N: s[1], K: s[2],
					Alpha: 1, Beta: 0.5, BatchCount: 3, DType: dt}, out).Normalized()
				e.runGemm(dt, pe, rng, fmt.Sprintf("%v_batch3_M%d_N%d_K%d_tr%d", out, s[0], s[1], s[2], tr))
			}
		}
	}
}
