package linear

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/tensor"
)

// Data holds the whole tensors of one linear run, float32: x[..., K], w[N, K],
// b[N] (nil: no bias) and dy[..., N].
type Data struct {
	X, W, B, DY *tensor.Tensor
}

// RandomData draws a run's tensors from seed, the same on every rank.
func RandomData(xShape []int, n int, bias bool, seed uint64) *Data {
	rng := rand.New(rand.NewPCG(seed, 0x6d657368))
	k := xShape[len(xShape)-1]
	yShape := append(slices.Clone(xShape[:len(xShape)-1]), n)
	d := &Data{X: randomTensor(rng, xShape, 1), W: randomTensor(rng, []int{n, k}, 1/math.Sqrt(float64(max(k, 1)))), DY: randomTensor(rng, yShape, 1)}
	if bias {
		d.B = randomTensor(rng, []int{n}, 1)
	}
	return d
}

func randomTensor(rng *rand.Rand, shape []int, scale float64) *tensor.Tensor {
	t := tensor.New(tensor.Float32, shape...)
	for i := range t.Float32() {
		t.Float32()[i] = float32((rng.Float64()*2 - 1) * scale)
	}
	return t
}

// RoundTo rounds the data to values dtype dt holds exactly (bfloat16: to
// nearest even), so that a run in dt and the float64 reference start from the
// same numbers.
func (d *Data) RoundTo(dt tensor.DType) error {
	if dt == tensor.Float32 {
		return nil
	}
	for _, t := range []**tensor.Tensor{&d.X, &d.W, &d.B, &d.DY} {
		if *t == nil {
			continue
		}
		r, err := tensor.Convert(*t, dt)
		if err != nil {
			return err
		}
		if *t, err = tensor.Convert(r, tensor.Float32); err != nil {
			return err
		}
	}
	return nil
}

// Reference computes y, dx, dw and db of whole tensors in float64.
func Reference(d *Data) (y, dx, dw, db []float64) { return reference(d, false) }

// Magnitudes computes, for every element of y, dx, dw and db, the sum of the
// magnitudes of the terms Reference adds: the scale of its rounding errors.
func Magnitudes(d *Data) (y, dx, dw, db []float64) { return reference(d, true) }

func reference(d *Data, abs bool) (y, dx, dw, db []float64) {
	xs := d.X.Shape()
	k := xs[len(xs)-1]
	m := d.X.Len() / max(k, 1)
	if k == 0 {
		m = tensor.NumElements(xs[:len(xs)-1])
	}
	n := d.W.Dim(0)
	x, w, dyv := d.X.Float32(), d.W.Float32(), d.DY.Float32()
	f := func(v float32) float64 {
		if abs {
			return math.Abs(float64(v))
		}
		return float64(v)
	}
	y = make([]float64, m*n)
	dx = make([]float64, m*k)
	dw = make([]float64, n*k)
	db = make([]float64, n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			if d.B != nil {
				s = f(d.B.Float32()[j])
			}
			for p := 0; p < k; p++ {
				s += f(x[i*k+p]) * f(w[j*k+p])
			}
			y[i*n+j] = s
			g := f(dyv[i*n+j])
			db[j] += g
			for p := 0; p < k; p++ {
				dx[i*k+p] += g * f(w[j*k+p])
				dw[j*k+p] += g * f(x[i*k+p])
			}
		}
	}
	return y, dx, dw, db
}

// RelErr is max|got - want| / max|want| (absolute when want is all zeros).
func RelErr(got *tensor.Tensor, want []float64) float64 {
	var diff, scale float64
	for i, w := range want {
		diff = max(diff, math.Abs(got.At(i)-w))
		scale = max(scale, math.Abs(w))
	}
	if scale == 0 {
		return diff
	}
	return diff / scale
}

// BoundErr is max over elements of |got - want| / mag, the error of each
// element relative to the magnitudes of the terms that made it (0/0 is 0).
func BoundErr(got *tensor.Tensor, want, mag []float64) float64 {
	worst := 0.0
	for i, w := range want {
		d := math.Abs(got.At(i) - w)
		switch {
		case d == 0:
		case mag[i] == 0:
			return math.Inf(1)
		default:
			worst = max(worst, d/mag[i])
		}
	}
	return worst
}

// Tolerance is the largest error Check may report for a run in dtype dt over
// ranks ranks whose longest contraction (K, N or the tokens) is k. float32
// (RelErr): 1e-5. bfloat16 (BoundErr): the inputs are exact, every product is
// exact in float32, the float32 sums err by at most k·2^-24 of the magnitude,
// and each rounding to bfloat16 by at most 2^-8 of it: one when a result is
// stored, one when a float32 gradient is cast for the wire, one per hop of a
// reduction (at most ranks-1), so (2 + ranks)·2^-8 + k·2^-24.
func Tolerance(dt tensor.DType, ranks, k int) float64 {
	if dt == tensor.BFloat16 {
		return float64(2+ranks)*tensor.BF16Epsilon/2 + float64(k)*0x1p-24
	}
	return 1e-5
}

// Comm is one kind of collective a run executed (or planned): how many and the
// elements rank 0 passed in, per tensor.
type Comm struct {
	Kind     string `json:"kind"`
	Tensor   string `json:"tensor"`
	MeshDims []int  `json:"mesh_dims"`
	Count    int    `json:"count"`
	Bytes    int64  `json:"bytes"`
}

// Result is one run of a layer on this rank.
type Result struct {
	Y, DX, DW, DB *tensor.Tensor // this rank's results, laid out per the plan
	Executed      []Comm         // collectives this rank ran, merged by kind/tensor/dims
	Forward       time.Duration
	Backward      time.Duration
	// Moved is what forward, backward and the gradient reduction copied
	// between host and device (the inputs' upload before them excluded).
	Moved tensor.Transfers
}

// Run runs one forward and backward of a layer on this rank with the whole
// tensors d (each rank takes its shards, copied to the rank's device), and
// reduces the weight gradients. The results stay on the device.
func Run(ctx context.Context, rt Runtime, l *Layer, d *Data) (*Result, error) {
	w, err := Shard(d.W, l.Config.W, l.rank)
	if err != nil {
		return nil, err
	}
	var b *tensor.Tensor
	if l.B != nil {
		if d.B == nil {
			return nil, fmt.Errorf("%w: the layer has a bias, the data none", ErrConfig)
		}
		if b, err = Shard(d.B, *l.Config.B, l.rank); err != nil {
			return nil, err
		}
	}
	if err := l.SetParams(w, b); err != nil {
		return nil, err
	}
	x, err := Shard(d.X, l.X, l.rank)
	if err != nil {
		return nil, err
	}
	dy, err := Shard(d.DY, l.Bwd.DY.Spec, l.rank)
	if err != nil {
		return nil, err
	}
	for _, t := range []**tensor.Tensor{&x, &dy} {
		h, err := tensor.Convert(*t, l.Compute())
		if err != nil {
			return nil, err
		}
		if *t, err = tensor.Upload(rt.Kernels, h); err != nil {
			return nil, err
		}
	}
	var log []redistribute.Executed
	var names []string
	inner := rt.Record
	rt.Record = func(name string, ex redistribute.Executed) {
		if inner != nil {
			inner(name, ex)
		}
		if len(ex.Group) > 1 && ex.Kind.Moves() {
			log = append(log, ex)
			names = append(names, name)
		}
	}
	res := &Result{}
	before := rt.Kernels.Transfers()
	t0 := time.Now()
	y, saved, err := l.Forward(ctx, rt, x)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	dx, err := l.Backward(ctx, rt, dy, saved)
	if err != nil {
		return nil, err
	}
	dw, db, err := l.Reduce(ctx, rt)
	if err != nil {
		return nil, err
	}
	res.Forward, res.Backward = t1.Sub(t0), time.Since(t1)
	res.Moved = rt.Kernels.Transfers().Sub(before)
	res.Y, res.DX, res.DW, res.DB = y, dx, dw, db
	for i, ex := range log {
		res.Executed = addComm(res.Executed, Comm{Kind: ex.Kind.String(), Tensor: names[i], MeshDims: ex.MeshDims, Count: 1, Bytes: ex.Bytes})
	}
	return res, nil
}

func addComm(cs []Comm, c Comm) []Comm {
	for i := range cs {
		if cs[i].Kind == c.Kind && cs[i].Tensor == c.Tensor && slices.Equal(cs[i].MeshDims, c.MeshDims) {
			cs[i].Count += c.Count
			cs[i].Bytes += c.Bytes
			return cs
		}
	}
	cs = append(cs, c)
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Tensor != cs[j].Tensor {
			return cs[i].Tensor < cs[j].Tensor
		}
		return cs[i].Kind < cs[j].Kind
	})
	return cs
}

// Planned lists the collectives the layer's plans promise, merged as Result.Executed
// merges what ran (bytes of rank 0's buffers: the weight and bias gradients in
// the wire dtype, everything else in the compute dtype).
func (l *Layer) Planned() []Comm {
	var cs []Comm
	for _, c := range append(l.Fwd.Collectives(), l.Bwd.Collectives()...) {
		size := l.Compute().Size()
		if c.Tensor == "dw" || c.Tensor == "db" {
			size = l.Wire().Size()
		}
		cs = addComm(cs, Comm{Kind: c.Step.Kind.String(), Tensor: c.Tensor, MeshDims: c.Step.MeshDims, Count: 1, Bytes: c.Elems() * int64(size)})
	}
	return cs
}

// Check assembles a run's results on every rank and compares them with the
// float64 reference; it returns the error per tensor: RelErr for float32
// layers, BoundErr for bfloat16 ones (see Tolerance). Every rank must call it
// (it gathers).
func Check(ctx context.Context, w *collective.World, l *Layer, d *Data, r *Result) (map[string]float64, error) {
	ry, rdx, rdw, rdb := Reference(d)
	my, mdx, mdw, mdb := Magnitudes(d)
	mags := map[string][]float64{"y": my, "dx": mdx, "dw": mdw, "db": mdb}
	errs := map[string]float64{}
	type item struct {
		name  string
		spec  placement.Spec
		t     *tensor.Tensor
		want  []float64
		wants bool
	}
	items := []item{{"y", l.Fwd.Final.Spec, r.Y, ry, true}}
	for _, g := range l.Bwd.Grads {
		switch g.Input {
		case "x":
			items = append(items, item{"dx", g.Final.Spec, r.DX, rdx, true})
		case "w":
			items = append(items, item{"dw", g.Final.Spec, r.DW, rdw, true})
		case "b":
			items = append(items, item{"db", g.Final.Spec, r.DB, rdb, true})
		}
	}
	for _, it := range items {
		if it.t == nil {
			return nil, fmt.Errorf("linear %s: no %s computed", l.Name, it.name)
		}
		full, err := Gather(ctx, w, it.spec, it.t)
		if err != nil {
			return nil, fmt.Errorf("gathering %s: %w", it.name, err)
		}
		if l.Compute() == tensor.Float32 {
			errs[it.name] = RelErr(full, it.want)
		} else {
			errs[it.name] = BoundErr(full, it.want, mags[it.name])
		}
	}
	return errs, nil
}
