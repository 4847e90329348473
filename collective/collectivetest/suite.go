// Package collectivetest is the conformance suite every collective transport
// passes, through the device-aware Communicator: every op, every reduction,
// float32 and float64, sizes 0, 1, uneven and larger than a chunk, groups of 1
// to 5 ranks, the groups of 2-D meshes, and placement plans executed by
// package redistribute against placement/placementref — once on host buffers (the host backend) and once on simulated
// device buffers (the staged backend, its rounds smaller than the sizes).
package collectivetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/ncclfake"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Factory builds n connected Worlds (ranks 0..n-1) with opts; the suite closes
// them.
type Factory func(t testing.TB, n int, opts collective.Options) []*collective.World

// SuiteOptions are the options the suite runs with: small chunks, a small
// direct threshold and small staging rounds so that rings, pipelining, chunk
// and round boundaries are exercised at test sizes.
func SuiteOptions() collective.Options {
	return collective.Options{Job: "conformance", ChunkBytes: 4 << 10, SmallBytes: 1 << 10, StageBytes: 2 << 10, DataTimeout: 30 * time.Second}
}

// RunRanks runs fn on every rank concurrently and returns the errors by rank.
func RunRanks(ws []*collective.World, fn func(w *collective.World) error) []error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(w)
		}()
	}
	wg.Wait()
	return errs
}

func must(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// Buffers is where the suite's buffers live.
type Buffers int

const (
	// Host buffers go to the host backend.
	Host Buffers = iota
	// Sim buffers (kernels/sim device memory, one device per rank: sim:r)
	// go to the staged backend.
	Sim
	// NCCL buffers are sim buffers (one device per rank, as NCCL needs)
	// given to the nccl backend over package ncclfake (Options:
	// NCCLOptions).
	NCCL
)

func (b Buffers) String() string { return [...]string{"host", "sim", "nccl"}[b] }

// NCCLOptions returns o with the nccl backend over the fake library for sim
// buffers, and fake.Resolve and fake.Current set to sim's.
func NCCLOptions(o collective.Options, fake ncclfake.Options) collective.Options {
	fake.Resolve, fake.Current = sim.Resolve, sim.Current
	o.Collectives = collective.BackendNCCL
	o.Backends = append(o.Backends, ncclfake.Backend(tensor.Sim, fake))
	return o
}

// Options returns o as buffers b need it (NCCL: the fake library's backend).
func (b Buffers) Options(o collective.Options) collective.Options {
	if b == NCCL {
		return NCCLOptions(o, ncclfake.Options{})
	}
	return o
}

// Memories returns one memory per rank for buffers b: host memory, or the
// memory of sim device r for rank r (separate devices).
func (b Buffers) Memories(n int) []tensor.Memory {
	ms := make([]tensor.Memory, n)
	for r := range ms {
		ms[r] = tensor.Host
		if b != Host {
			ms[r] = sim.NewMemory(r)
		}
	}
	return ms
}

// env is the worlds and each rank's memory.
type env struct {
	ws   []*collective.World
	mems []tensor.Memory
	want string // the backend the communicators must be
}

// comm returns w's communicator of ranks for its memory's device.
func (e *env) comm(w *collective.World, ranks []int) (collective.Communicator, error) {
	c, err := w.Communicator(context.Background(), ranks, e.mems[w.Rank()])
	if err == nil && c.Backend() != e.want {
		err = fmt.Errorf("backend %s for %v buffers, want %s", c.Backend(), e.mems[w.Rank()].Device(), e.want)
	}
	return c, err
}

// onWorld runs f on every rank with its communicator of the whole world
// (comm's) and fails t with the first rank's error.
func (e *env) onWorld(t testing.TB, f func(w *collective.World, c collective.Communicator) error) {
	t.Helper()
	must(t, RunRanks(e.ws, func(w *collective.World) error {
		c, err := e.comm(w, worldRanks(len(e.ws)))
		if err != nil {
			return err
		}
		return f(w, c)
	}))
}

// put copies x into a new tensor of rank r's memory.
func put[T collective.Float](e *env, r int, x []T) *tensor.Tensor {
	var h *tensor.Tensor
	switch v := any(x).(type) {
	case []float32:
		h, _ = tensor.FromFloat32(v, len(v))
	case []float64:
		h, _ = tensor.FromFloat64(v, len(v))
	case []tensor.BF16:
		h, _ = tensor.FromBFloat16(v, len(v))
	}
	d, err := tensor.Upload(e.mems[r], h)
	if err != nil {
		panic(err)
	}
	return d
}

// alloc returns a new tensor of n elements of T in rank r's memory.
func alloc[T collective.Float](e *env, r, n int) *tensor.Tensor {
	return put(e, r, make([]T, n))
}

// get copies t back to a host slice.
func get[T collective.Float](t *tensor.Tensor) []T {
	h, err := tensor.Download(t)
	if err != nil {
		panic(err)
	}
	var z T
	switch any(z).(type) {
	case float32:
		return any(h.Float32()).([]T)
	case tensor.BF16:
		return any(h.BFloat16()).([]T)
	default:
		return any(h.Float64()).([]T)
	}
}

// Run runs the whole suite against f, on host buffers and on sim buffers.
func Run(t *testing.T, f Factory) { RunOn(t, f, Host, Sim) }

// RunOn runs the whole suite against f, on each of the buffers bs.
func RunOn(t *testing.T, f Factory, bs ...Buffers) {
	for _, b := range bs {
		t.Run("buffers="+b.String(), func(t *testing.T) { runOn(t, f, b) })
	}
	// Point to point stays a host Group's.
	t.Run("send_recv", func(t *testing.T) {
		ws := f(t, 3, SuiteOptions())
		defer closeAll(ws)
		testSendRecv[float64](t, ws)
	})
}

func runOn(t *testing.T, f Factory, b Buffers) {
	want := [...]string{collective.BackendHost, collective.BackendStaged, collective.BackendNCCL}[b]
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			ws := f(t, n, b.Options(SuiteOptions()))
			defer closeAll(ws)
			e := &env{ws: ws, mems: b.Memories(n), want: want}
			sizes := []int{0, 1, 2, n - 1, n + 1, 7, 255, 1000, 3001}
			if !testing.Short() {
				sizes = append(sizes, 20011)
			}
			t.Run("all_reduce", func(t *testing.T) {
				testAllReduce[float32](t, e, sizes)
				testAllReduce[float64](t, e, sizes[:6])
				testAllReduce[tensor.BF16](t, e, sizes)
			})
			t.Run("all_gather", func(t *testing.T) {
				testAllGather[float32](t, e, sizes)
				testAllGather[float64](t, e, sizes[:6])
				testAllGather[tensor.BF16](t, e, sizes)
			})
			t.Run("reduce_scatter", func(t *testing.T) {
				testReduceScatter[float32](t, e, sizes)
				testReduceScatter[float64](t, e, sizes[:6])
				testReduceScatter[tensor.BF16](t, e, sizes)
			})
			t.Run("all_to_all", func(t *testing.T) {
				testAllToAll[float32](t, e)
				testAllToAll[float64](t, e)
				testAllToAll[tensor.BF16](t, e)
			})
			t.Run("broadcast", func(t *testing.T) { testBroadcast[float32](t, e, sizes); testBroadcast[tensor.BF16](t, e, sizes[:7]) })
			t.Run("bf16_bound", func(t *testing.T) { testBF16Bound(t, e) })
			if b == NCCL {
				// The library moved the device buffers itself: nothing
				// crossed through host memory.
				for r, m := range e.mems {
					if tr := m.Transfers(); tr.StagedD2H.Calls != 0 || tr.StagedH2D.Calls != 0 {
						t.Errorf("rank %d: nccl buffers were staged: %+v", r, tr)
					}
				}
			}
			if b == Sim && n > 1 {
				// The device buffers crossed through host memory, in several
				// rounds per call: counted as staging, never as transfers.
				for r, m := range e.mems {
					tr := m.Transfers()
					if tr.StagedD2H.Calls == 0 || tr.StagedH2D.Calls == 0 {
						t.Errorf("rank %d: no staging counted: %+v", r, tr)
					}
				}
			}
			t.Run("barrier", func(t *testing.T) {
				e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
					for i := 0; i < 3; i++ {
						if err := c.Barrier(context.Background()); err != nil {
							return err
						}
					}
					return nil
				})
			})
		})
	}
	for _, m := range []string{"dp=2,tp=2", "a=2,b=3"} {
		t.Run("mesh="+m, func(t *testing.T) {
			mesh, _ := placement.ParseMesh(m)
			ws := f(t, mesh.Size(), b.Options(SuiteOptions()))
			defer closeAll(ws)
			e := &env{ws: ws, mems: b.Memories(mesh.Size()), want: want}
			testMesh(t, e, mesh)
			testPlans(t, e, mesh)
		})
	}
}

func closeAll(ws []*collective.World) {
	for _, w := range ws {
		w.Close()
	}
}

// value is rank r's element i: small integers so sums are exact in float32.
func value(seed, r, i int) float64 { return float64((seed*31+r*7+i*13)%17 - 8) }

func fill[T collective.Float](x []T, seed, r, off int) {
	for i := range x {
		x[i] = fromF64[T](value(seed, r, off+i))
	}
}

// fromF64 and f64 convert suite values (small integers, exact in every dtype)
// to and from an element type.
func fromF64[T collective.Float](v float64) T {
	var z T
	if _, ok := any(z).(tensor.BF16); ok {
		return any(tensor.ToBF16(float32(v))).(T)
	}
	return T(v)
}

func f64[T collective.Float](x T) float64 {
	if b, ok := any(x).(tensor.BF16); ok {
		return float64(b.Float32())
	}
	return float64(x)
}

// closeT compares with the element type's precision: sums of the suite's small
// integers are exact, averages are rounded once (half a bfloat16 epsilon).
func closeT[T collective.Float](got T, want float64) bool {
	if _, ok := any(got).(tensor.BF16); ok {
		return math.Abs(f64(got)-want) <= tensor.BF16Epsilon/2*math.Abs(want)
	}
	return close64(f64(got), want)
}

func reduceRef(op collective.ReduceOp, vals []float64) float64 {
	v := vals[0]
	for _, x := range vals[1:] {
		switch op {
		case collective.Max:
			v = max(v, x)
		case collective.Min:
			v = min(v, x)
		default:
			v += x
		}
	}
	if op == collective.Avg {
		v /= float64(len(vals))
	}
	return v
}

func close64(a, b float64) bool {
	d := a - b
	return d < 1e-5 && d > -1e-5
}

func worldRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}
