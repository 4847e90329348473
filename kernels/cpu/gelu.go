package cpu

import (
	"math"
	"sync"

	"github.com/meshrun/meshrun/kernels"
)

// The float32 GELU: tanh through exp, exp through a range reduction to
// [-ln2/2, ln2/2] and a degree-6 polynomial, all in float32 arithmetic. tanh is
// accurate to about 1e-7 absolute, which is what GELU needs (its error is
// 0.5·|x|·δ). float64 tensors keep the reference formula.

const (
	log2e   = 1.44269504088896340736
	ln2Hi   = 0.693145751953125         // ln 2 rounded to 16 bits: k·ln2Hi is exact
	ln2Lo   = 1.42860682030941723212e-6 // ln 2 - ln2Hi
	tanhMax = 9                         // tanh(9) rounds to 1 in float32
)

// exp32 is e^x for x in [0, 2·tanhMax].
func exp32(x float32) float32 {
	k := float32(int32(x*log2e + 0.5))
	r := x - k*ln2Hi - k*ln2Lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}

// tanh32 is tanh(u) to about 1e-7 absolute.
func tanh32(u float32) float32 {
	a := u
	if a < 0 {
		a = -a
	}
	t := float32(1)
	if a < tanhMax {
		t = 1 - 2/(exp32(2*a)+1)
	}
	if u < 0 {
		return -t
	}
	return t
}

func gelu32(x float32) float32 {
	u := float32(kernels.GeluSqrt2OverPi) * (x + float32(kernels.GeluCoeff)*x*x*x)
	return 0.5 * x * (1 + tanh32(u))
}

func geluGrad32(x float32) float32 {
	const c, k = float32(kernels.GeluSqrt2OverPi), float32(kernels.GeluCoeff)
	t := tanh32(c * (x + k*x*x*x))
	return 0.5*(1+t) + 0.5*x*(1-t*t)*c*(1+3*k*x*x)
}

// geluBlocks computes whole 16-element blocks (len(x) a multiple of 16): y =
// gelu(x), or with backward y = dy·gelu'(x). The AVX-512 version replaces it
// where the machine has it; the tail of a tensor always goes through gelu32, so
// an element's bits depend only on its position, not on the thread count.
var geluBlocks = func(y, dy, x []float32, backward bool) {
	for i, v := range x {
		if backward {
			y[i] = dy[i] * geluGrad32(v)
		} else {
			y[i] = gelu32(v)
		}
	}
}

// geluJob is one GELU over a tensor, split in parts on 16-element boundaries.
type geluJob struct {
	y, dy, x []float32
	backward bool
	parts    int
	wg       sync.WaitGroup
}

var geluJobs freeList[geluJob]

func (j *geluJob) run(part int) {
	blocks := len(j.x) / 16
	lo, hi := span(blocks, j.parts, part)
	lo, hi = lo*16, hi*16
	var dy []float32
	if j.backward {
		dy = j.dy[lo:hi]
	}
	geluBlocks(j.y[lo:hi], dy, j.x[lo:hi], j.backward)
}

// gelu32s runs a float32 GELU on up to threads cores.
func gelu32s(y, dy, x []float32, backward bool, threads int) {
	n := len(x)
	y = y[:n]
	if backward {
		dy = dy[:n]
	}
	body := n &^ 15
	const grain = 1 << 14 // elements per part, at least
	j := geluJobs.get()
	j.y, j.dy, j.x, j.backward = y[:body], nil, x[:body], backward
	if backward {
		j.dy = dy[:body]
	}
	j.parts = max(1, min(threads, body/grain))
	parallel(j, j.parts, &j.wg)
	j.y, j.dy, j.x = nil, nil, nil
	geluJobs.put(j)
	for i := body; i < n; i++ {
		if backward {
			y[i] = dy[i] * geluGrad32(x[i])
		} else {
			y[i] = gelu32(x[i])
		}
	}
}
