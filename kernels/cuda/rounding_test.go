//go:build cuda

package cuda_test

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/tensor"
)

// TestBF16EpilogueRounding: a bfloat16 GEMM with the bias epilogue (and
// bias+GELU's aux), on cuBLASLt and on the fallback plan, classified element
// by element against the exact product r and bias b: rounded once,
// bf16(r + b) (the kernels' contract), or twice, bf16(bf16(r) + b). It
// fails on any element rounded neither way, and on a path that rounds
// twice.
func TestBF16EpilogueRounding(t *testing.T) {
	for _, s := range [][3]int{{64, 64, 64}, {5, 33, 47}, {1, 17, 9}} {
		t.Run(fmt.Sprintf("%dx%dx%d", s[0], s[1], s[2]), func(t *testing.T) { epilogueRounding(t, s[0], s[1], s[2]) })
	}
}

// epilogueRounding is TestBF16EpilogueRounding at one shape.
func epilogueRounding(t *testing.T, m, n, k int) {
	rng := rand.New(rand.NewSource(7))
	host := func(rows, cols int) (*tensor.Tensor, []float64) {
		x := make([]float32, rows*cols)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		h, _ := tensor.FromFloat32(x, rows, cols)
		b, err := tensor.Convert(h, tensor.BFloat16)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := tensor.Convert(b, tensor.Float32)
		v := make([]float64, len(x))
		for i, e := range f.Float32() {
			v[i] = float64(e)
		}
		return b, v
	}
	a, av := host(m, k)
	w, wv := host(n, k)
	bias, bv := host(1, n)
	bf := func(x float64) float64 {
		h, _ := tensor.FromFloat32([]float32{float32(x)}, 1)
		b, _ := tensor.Convert(h, tensor.BFloat16)
		f, _ := tensor.Convert(b, tensor.Float32)
		return float64(f.Float32()[0])
	}
	for _, noLt := range []bool{false, true} {
		for _, epi := range []kernels.Epilogue{kernels.EpilogueBias, kernels.EpilogueBiasGelu} {
			name := fmt.Sprintf("lt=%v/%v", !noLt, epi)
			p, err := cuda.New(0, cuda.Options{NoLt: noLt})
			if err != nil {
				t.Skipf("no CUDA device: %v", err)
			}
			up := func(h *tensor.Tensor) *tensor.Tensor {
				d, err := tensor.Upload(p.Memory(), h)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			y, _ := p.Memory().Alloc(tensor.BFloat16, m, n)
			var aux *tensor.Tensor
			if epi == kernels.EpilogueBiasGelu {
				aux, _ = p.Memory().Alloc(tensor.BFloat16, m, n)
			}
			g := kernels.GemmParams{M: m, N: n, K: k, TransB: true, Alpha: 1, DType: tensor.BFloat16, Epilogue: epi}.Normalized()
			if err := p.Gemm(g, kernels.GemmOperands{A: up(a), B: up(w), C: y, Bias: up(bias), Aux: aux}); err != nil {
				t.Fatal(err)
			}
			out := y
			if aux != nil {
				out = aux // the pre-activation, bias added
			}
			d, err := tensor.Download(out)
			if err != nil {
				t.Fatal(err)
			}
			f, _ := tensor.Convert(d, tensor.Float32)
			once, twice, neither := 0, 0, 0
			for i := range m {
				for j := range n {
					r := 0.0
					for c := range k {
						r += av[i*k+c] * wv[j*k+c]
					}
					got := float64(f.Float32()[i*n+j])
					s, dd := bf(r+bv[j]), bf(bf(r)+bv[j])
					switch {
					case got == s:
						once++
					case got == dd:
						twice++
					default:
						neither++
						if neither <= 3 {
							t.Logf("%s: [%d,%d] = %v: r %v, b %v, once %v, twice %v", name, i, j, got, r, bv[j], s, dd)
						}
					}
				}
			}
			t.Logf("%s: %d elements rounded once, %d only as rounded twice (product, then sum), %d neither", name, once, twice, neither)
			if neither > 0 || twice > 0 {
				t.Errorf("%s: %d elements rounded twice, %d neither way", name, twice, neither)
			}
			p.Close()
		}
	}
}
