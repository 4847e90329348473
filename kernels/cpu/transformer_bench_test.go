package cpu_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// BenchmarkLayerNorm is a GPT's layer norm (1024 rows of 256), forward and
// backward, in float32 and bfloat16 (which computes in float32): the two
// should take about the same time.
func BenchmarkLayerNorm(b *testing.B) {
	p := provider(b)
	const rows, d = 1024, 256
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		data := func(shape ...int) *tensor.Tensor {
			if dt == tensor.BFloat16 {
				return randBF16(shape...)
			}
			return randTensor(dt, shape...)
		}
		x, dy, gamma, beta := data(rows, d), data(rows, d), data(d), data(d)
		y, dx := tensor.New(dt, rows, d), tensor.New(dt, rows, d)
		dgamma, dbeta := tensor.New(dt, d), tensor.New(dt, d)
		stats := tensor.New(tensor.Float32, rows, 2) // float32 for either
		b.Run(dt.String()+"/forward", func(b *testing.B) {
			for b.Loop() {
				if err := p.LayerNorm(y, stats, x, gamma, beta, 1e-5); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(dt.String()+"/backward", func(b *testing.B) {
			for b.Loop() {
				if err := p.LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAttention is a GPT's causal attention (16 sequences of 64, 4
// heads of 64, q, k and v packed), forward and backward, in float32 and
// bfloat16.
func BenchmarkAttention(b *testing.B) {
	p := provider(b)
	const n, s, h, e = 16, 64, 4, 64
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		data := func(shape ...int) *tensor.Tensor {
			if dt == tensor.BFloat16 {
				return randBF16(shape...)
			}
			return randTensor(dt, shape...)
		}
		qkv, do := data(n, s, h, 3, e), data(n, s, h, e)
		o, dqkv := tensor.New(dt, n, s, h, e), tensor.New(dt, n, s, h, 3, e)
		lse := tensor.New(tensor.Float32, n, h, s)
		b.Run(dt.String()+"/forward", func(b *testing.B) {
			for b.Loop() {
				if err := p.Attention(o, lse, qkv, nil, nil, true); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(dt.String()+"/backward", func(b *testing.B) {
			for b.Loop() {
				if err := p.AttentionBackward(dqkv, nil, nil, do, qkv, nil, nil, o, lse, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAdamW is one AdamW step over 4M float32 parameters.
func BenchmarkAdamW(b *testing.B) {
	p := provider(b)
	const n = 1 << 22
	param, grad, m, v := randTensor(tensor.Float32, n), randTensor(tensor.Float32, n), tensor.New(tensor.Float32, n), tensor.New(tensor.Float32, n)
	a := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 3}
	for b.Loop() {
		if err := p.AdamW(a, param, grad, m, v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*28*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}
