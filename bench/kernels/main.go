// Command kernels measures the cpu provider's GEMMs in GFLOP/s on the shapes of
// bench/kernels/run.sh and prints one tab-separated line per measurement:
//
//	impl  threads  case  op  M  K  N  gflops
//
// Built with the openblas tag and run with -peer, it also measures OpenBLAS
// through the openblas provider in the same process, alternating with meshrun
// round by round, so both see the same background load (impl "openblas").
// run.sh adds numpy's OpenBLAS (peer.py) and prints the comparison table.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// Case is one benchmark shape: a square GEMM or a linear layer (M, K, N).
type Case struct {
	Name    string
	M, K, N int
	Linear  bool
}

// Cases are the shapes of docs/kernels.md.
var Cases = []Case{
	{"gemm1024", 1024, 1024, 1024, false},
	{"gemm2048", 2048, 2048, 2048, false},
	{"linear", 1, 4096, 4096, true},
	{"linear", 8, 4096, 4096, true},
	{"linear", 512, 1024, 4096, true},
	{"linear", 2048, 1024, 4096, true},
	{"linear", 4096, 4096, 1024, true},
}

func main() {
	threads := flag.Int("threads", 1, "GOMAXPROCS (the cores the rank owns)")
	minTime := flag.Duration("mintime", 400*time.Millisecond, "time per measurement")
	kernel := flag.String("kernel", "", "micro-kernel (avx512, avx2, go; default: best)")
	only := flag.String("only", "", "run only cases whose name or M_K_N contains this")
	onlyOp := flag.String("op", "", "run only this op (gemm, forward, backward_input, backward_weight)")
	peak := flag.Bool("peak", false, "measure the FMA peak instead")
	peakBF16 := flag.Bool("peakbf16", false, "measure the VDPBF16PS peak instead (AVX512_BF16)")
	withPeer := flag.Bool("peer", false, "also measure OpenBLAS in-process (needs -tags openblas)")
	rounds := flag.Int("rounds", 5, "alternating rounds per measurement")
	withBF16 := flag.Bool("bf16", true, "also measure bfloat16 GEMMs (impl meshrun-bf16)")
	withF32 := flag.Bool("f32", true, "measure float32 GEMMs (impl meshrun; -f32=false: bfloat16 only)")
	bf16Path := flag.String("bf16path", "", "bfloat16 path (avx512bf16, avx512, go; default: best)")
	flag.BoolVar(&useCPUTime, "cputime", false, "time by the thread's CPU clock, not the wall clock (only with -threads 1: ignores time descheduled on a busy machine)")
	var blk cpu.Blocking
	flag.IntVar(&blk.MC, "mc", 0, "override MC (0: default)")
	flag.IntVar(&blk.KC, "kc", 0, "override KC (0: default)")
	flag.IntVar(&blk.NC, "nc", 0, "override NC (0: default)")
	var bblk cpu.Blocking
	flag.IntVar(&bblk.MC, "bmc", 0, "override the bfloat16 MC (0: default)")
	flag.IntVar(&bblk.KC, "bkc", 0, "override the bfloat16 KC (0: default)")
	flag.IntVar(&bblk.NC, "bnc", 0, "override the bfloat16 NC (0: default)")
	flag.Parse()
	runtime.GOMAXPROCS(*threads)
	if useCPUTime {
		if *threads != 1 {
			fmt.Fprintln(os.Stderr, "-cputime needs -threads 1")
			os.Exit(2)
		}
		runtime.LockOSThread()
	}
	if *peak {
		fmt.Printf("peak\t%d\tfma\t-\t-\t-\t-\t%.1f\n", *threads, peakGFLOPS(*threads, *minTime, false))
		return
	}
	if *peakBF16 {
		if !hasDPBF16() {
			fmt.Fprintln(os.Stderr, "-peakbf16: this CPU has no AVX512_BF16")
			os.Exit(2)
		}
		fmt.Printf("peak\t%d\tdpbf16\t-\t-\t-\t-\t%.1f\n", *threads, peakGFLOPS(*threads, *minTime, true))
		return
	}
	p, err := cpu.New(cpu.Options{Kernel: *kernel, Block: blk, BF16: *bf16Path, BF16Block: bblk})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "cpu provider, %s micro-kernel, blocking %+v, bfloat16 path %s, blocking %+v, GOMAXPROCS=%d\n",
		p.Kernel(), p.Blocking(), p.BF16Kernel(), p.BF16Blocking(), *threads)
	var peer kernels.Kernels
	if *withPeer {
		var desc string
		if peer, desc = newPeer(*threads); peer == nil {
			fmt.Fprintln(os.Stderr, "-peer needs a binary built with -tags openblas")
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "peer: OpenBLAS %s, %d thread(s)\n", desc, *threads)
	}
	for _, c := range Cases {
		key := fmt.Sprintf("%s_%d_%d_%d", c.Name, c.M, c.K, c.N)
		if *only != "" && !strings.Contains(key, *only) {
			continue
		}
		var impls []impl
		if *withF32 || !*withBF16 {
			impls = append(impls, impl{"meshrun", ops(p, c, tensor.Float32)})
		}
		if peer != nil {
			impls = append(impls, impl{"openblas", ops(peer, c, tensor.Float32)})
		}
		if *withBF16 {
			impls = append(impls, impl{"meshrun-bf16", ops(p, c, tensor.BFloat16)})
		}
		for i, o := range impls[0].ops {
			if *onlyOp != "" && o.name != *onlyOp {
				continue
			}
			best := make([]float64, len(impls))
			slice := *minTime / time.Duration(*rounds)
			for r := 0; r < *rounds; r++ {
				for k, im := range impls {
					best[k] = max(best[k], measure(im.ops[i].run, o.flops, slice))
				}
			}
			for k, im := range impls {
				fmt.Printf("%s\t%d\t%s\t%s\t%d\t%d\t%d\t%.1f\n", im.name, *threads, c.Name, o.name, c.M, c.K, c.N, best[k])
			}
		}
	}
}

// impl is one implementation's ops for a case.
type impl struct {
	name string
	ops  []op
}

type op struct {
	name  string
	flops float64
	run   func()
}

func randT(rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	t := tensor.New(dt, shape...)
	for i := 0; i < t.Len(); i++ {
		v := rng.Float32()*2 - 1
		if dt == tensor.BFloat16 {
			t.BFloat16()[i] = tensor.ToBF16(v)
		} else {
			t.Float32()[i] = v
		}
	}
	return t
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

// ops returns the case's GEMMs with operands and outputs of dt: a square GEMM,
// or a linear layer's forward (with its bias) and both backward GEMMs.
func ops(p kernels.Kernels, c Case, dt tensor.DType) []op {
	rng := rand.New(rand.NewPCG(1, 2))
	flops := 2 * float64(c.M) * float64(c.K) * float64(c.N)
	if !c.Linear {
		a, b, out := randT(rng, dt, c.M, c.K), randT(rng, dt, c.K, c.N), tensor.New(dt, c.M, c.N)
		g := kernels.GemmParams{M: c.M, N: c.N, K: c.K, Alpha: 1, DType: dt}
		return []op{{"gemm", flops, func() { check(p.Gemm(g, kernels.GemmOperands{A: a, B: b, C: out})) }}}
	}
	x, w, bias := randT(rng, dt, c.M, c.K), randT(rng, dt, c.N, c.K), randT(rng, dt, c.N)
	y, dy := tensor.New(dt, c.M, c.N), randT(rng, dt, c.M, c.N)
	dx, dw := tensor.New(dt, c.M, c.K), tensor.New(dt, c.N, c.K)
	return []op{
		{"forward", flops, func() { check(kernels.LinearForward(p, y, x, w, bias)) }},
		{"backward_input", flops, func() { check(kernels.LinearBackwardInput(p, dx, dy, w)) }},
		{"backward_weight", flops, func() { check(kernels.LinearBackwardWeight(p, dw, dy, x, false)) }},
	}
}

// measure returns the best GFLOP/s over repeated calls (after one warm-up call)
// for at least minTime and at least 3 calls.
func measure(run func(), flops float64, minTime time.Duration) float64 {
	run()
	best := time.Duration(1<<63 - 1)
	start := time.Now()
	for n := 0; n < 3 || time.Since(start) < minTime; n++ {
		t := now()
		run()
		best = min(best, now()-t)
	}
	return flops / best.Seconds() / 1e9
}

var useCPUTime bool

// now is the wall clock, or the calling thread's CPU clock with -cputime.
func now() time.Duration {
	if useCPUTime {
		return threadCPUTime()
	}
	return time.Duration(time.Now().UnixNano())
}
