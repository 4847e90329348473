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
	withPeer := flag.Bool("peer", false, "also measure OpenBLAS in-process (needs -tags openblas)")
	rounds := flag.Int("rounds", 5, "alternating rounds per measurement (with -peer)")
	flag.BoolVar(&useCPUTime, "cputime", false, "time by the thread's CPU clock, not the wall clock (only with -threads 1: ignores time descheduled on a busy machine)")
	var blk cpu.Blocking
	flag.IntVar(&blk.MC, "mc", 0, "override MC (0: default)")
	flag.IntVar(&blk.KC, "kc", 0, "override KC (0: default)")
	flag.IntVar(&blk.NC, "nc", 0, "override NC (0: default)")
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
		fmt.Printf("peak\t%d\tfma\t-\t-\t-\t-\t%.1f\n", *threads, peakGFLOPS(*threads, *minTime))
		return
	}
	p, err := cpu.New(cpu.Options{Kernel: *kernel, Block: blk})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "cpu provider, %s micro-kernel, blocking %+v, GOMAXPROCS=%d\n", p.Kernel(), p.Blocking(), *threads)
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
		mine := ops(p, c)
		var theirs []op
		if peer != nil {
			theirs = ops(peer, c)
		}
		for i, op := range mine {
			if *onlyOp != "" && op.name != *onlyOp {
				continue
			}
			if peer == nil {
				g := measure(op.run, op.flops, *minTime)
				fmt.Printf("meshrun\t%d\t%s\t%s\t%d\t%d\t%d\t%.1f\n", *threads, c.Name, op.name, c.M, c.K, c.N, g)
				continue
			}
			var gm, gp float64
			slice := *minTime / time.Duration(*rounds)
			for r := 0; r < *rounds; r++ {
				gm = max(gm, measure(op.run, op.flops, slice))
				gp = max(gp, measure(theirs[i].run, op.flops, slice))
			}
			fmt.Printf("meshrun\t%d\t%s\t%s\t%d\t%d\t%d\t%.1f\n", *threads, c.Name, op.name, c.M, c.K, c.N, gm)
			fmt.Printf("openblas\t%d\t%s\t%s\t%d\t%d\t%d\t%.1f\n", *threads, c.Name, op.name, c.M, c.K, c.N, gp)
		}
	}
}

type op struct {
	name  string
	flops float64
	run   func()
}

func randT(rng *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.Float32, shape...)
	for i := range t.Float32() {
		t.Float32()[i] = rng.Float32()*2 - 1
	}
	return t
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func ops(p kernels.Kernels, c Case) []op {
	rng := rand.New(rand.NewPCG(1, 2))
	flops := 2 * float64(c.M) * float64(c.K) * float64(c.N)
	if !c.Linear {
		a, b, out := randT(rng, c.M, c.K), randT(rng, c.K, c.N), tensor.New(tensor.Float32, c.M, c.N)
		g := kernels.GemmParams{M: c.M, N: c.N, K: c.K, Alpha: 1, DType: tensor.Float32}
		return []op{{"gemm", flops, func() { check(p.Gemm(g, kernels.GemmOperands{A: a, B: b, C: out})) }}}
	}
	x, w, bias := randT(rng, c.M, c.K), randT(rng, c.N, c.K), randT(rng, c.N)
	y, dy := tensor.New(tensor.Float32, c.M, c.N), randT(rng, c.M, c.N)
	dx, dw := tensor.New(tensor.Float32, c.M, c.K), tensor.New(tensor.Float32, c.N, c.K)
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
