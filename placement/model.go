package placement

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// Model prices plans in time: an alpha–beta model of each collective (a fixed
// latency per message, a bandwidth per rank) and the local op's arithmetic at
// a measured rate. Every choice the planners make minimizes a Model's time,
// and what `launcher plan` prints is that time.
//
// A collective call costs Gamma (launching it, agreeing on it), and over a
// group of p ranks runs as a ring: an all-gather, a
// reduce-scatter and an all-to-all send p-1 messages per rank, an all-reduce
// 2(p-1) (reduce-scatter then all-gather), and each rank sends (p-1)/p of its
// larger buffer (an all-reduce twice that). Buffers are the largest local
// shard of any rank: the slowest rank sets the time.
type Model struct {
	// Name says where the figures come from ("default cpu shm", or the
	// transport and machine worker calibrate measured).
	Name string `json:"name"`
	// Gamma is the fixed time of one collective call, in seconds.
	Gamma float64 `json:"gamma_s"`
	// Alpha is the time one message costs besides its bytes, in seconds.
	Alpha float64 `json:"alpha_s"`
	// Beta is the bytes per second one rank sends in a collective.
	Beta float64 `json:"beta_bytes_per_s"`
	// Flops is the local provider's rate, floating-point operations per second
	// (a multiply-add is two).
	Flops float64 `json:"flops_per_s"`
	// ElemBytes is the size of one element (4 for float32).
	ElemBytes int `json:"elem_bytes"`
}

// DefaultModel is the model of a planner given none (DefaultPlanner), in
// round figures from what `launcher run -n 2 calibrate` measured over the shm
// transport and the pure-Go float32 GEMM on a 2-core development machine (AMD
// EPYC, Zen 5) on 2026-11-23: a 4-byte all-gather took a median of 1.7 to
// 22 µs (two modes: a waiting rank spinning or asleep), a 16 MiB one moved
// 4.2 to 5.6 GB/s per rank, a 512³ GEMM ran at 188 to 194 GFLOP/s per rank.
// Other machines are better described by their own calibration (launcher
// plan --model FILE).
var DefaultModel = Model{Name: "default: cpu, shm transport", Gamma: 5e-6, Alpha: 5e-6, Beta: 5e9, Flops: 190e9, ElemBytes: 4}

// Validate refuses a model that cannot price anything.
func (m Model) Validate() error {
	ok := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
	nonneg := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
	if !nonneg(m.Gamma) || !nonneg(m.Alpha) || !ok(m.Beta) || !ok(m.Flops) || m.ElemBytes <= 0 || m.ElemBytes > 64 {
		return fmt.Errorf("%w: model %q: gamma %g s, alpha %g s, beta %g B/s, flops %g/s, %d bytes per element: want gamma, alpha >= 0 and the others > 0",
			ErrInvalid, m.Name, m.Gamma, m.Alpha, m.Beta, m.Flops, m.ElemBytes)
	}
	return nil
}

// WithElemBytes is m pricing elements of n bytes.
func (m Model) WithElemBytes(n int) Model { m.ElemBytes = n; return m }

// DecodeModel reads a model as worker calibrate writes it (JSON) from r;
// name says where it came from in errors (a file's path). Unknown fields and
// bad figures are errors. The caller opens the file: placement does no I/O.
func DecodeModel(r io.Reader, name string) (Model, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	m := Model{ElemBytes: 4}
	if err := dec.Decode(&m); err != nil {
		return Model{}, fmt.Errorf("%w: model %s: %v", ErrInvalid, name, err)
	}
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("%w (in %s)", err, name)
	}
	return m, nil
}

// Picos is a modelled time in picoseconds: integer, so that equal plans tie
// exactly and sums do not depend on their order.
type Picos int64

// Seconds is p in seconds.
func (p Picos) Seconds() float64 { return float64(p) * 1e-12 }

func (p Picos) String() string {
	s := p.Seconds()
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	case s >= 1e-6 || s == 0:
		return fmt.Sprintf("%.3g µs", s*1e6)
	}
	return fmt.Sprintf("%.3g ns", s*1e9)
}

// picos converts seconds to Picos, saturating.
func picos(s float64) Picos {
	if s >= math.MaxInt64/1e12 {
		return math.MaxInt64
	}
	return Picos(math.Round(s * 1e12))
}

// SatPicos is a+b for times a, b >= 0, saturating like SatAdd.
func SatPicos(a, b Picos) Picos { return Picos(SatAdd(int64(a), int64(b))) }

// Compute is the modelled time of n multiply-adds.
func (m Model) Compute(n int64) Picos { return picos(2 * float64(n) / m.Flops) }

// MaxLocalElems is the number of elements of the largest local shard any rank
// holds. Each tensor dim's shard size depends only on the coordinates of the
// mesh dims sharding it, and no mesh dim shards two, so the largest shard is
// the product of each dim's largest piece: ceil(n / the product of its
// sharders' sizes), for balanced and chunk splits alike.
func (s Spec) MaxLocalElems() int64 {
	var div [MaxTensorDims]int64
	for d := range s.Shape {
		if d < len(div) {
			div[d] = 1
		}
	}
	for i, p := range s.Placements {
		if sh, ok := p.(Shard); ok && sh.Dim < len(div) && sh.Dim < len(s.Shape) {
			div[sh.Dim] *= int64(s.Mesh.Dim(i))
		}
	}
	n := int64(1)
	for d, size := range s.Shape {
		q := int64(1)
		if d < len(div) {
			q = div[d]
		}
		var ok bool
		if n, ok = MulSize(n, (int64(size)+q-1)/q); !ok {
			return math.MaxInt64
		}
	}
	return n
}

// Time is the modelled time of one step: zero for a local step or a group of
// one rank.
func (m Model) Time(st Step) Picos {
	if !st.Moves() {
		return 0
	}
	p := float64(st.GroupSize())
	var msgs, elems float64
	switch st.Kind {
	case AllGather:
		msgs, elems = p-1, float64(st.To.MaxLocalElems())*(p-1)/p
	case ReduceScatter, AllToAll:
		msgs, elems = p-1, float64(st.From.MaxLocalElems())*(p-1)/p
	case AllReduce:
		msgs, elems = 2*(p-1), 2*float64(st.From.MaxLocalElems())*(p-1)/p
	}
	return picos(m.Gamma + msgs*m.Alpha + elems*float64(m.ElemBytes)/m.Beta)
}

// PlanTime sums the modelled time of steps.
func (m Model) PlanTime(steps []Step) Picos {
	var t Picos
	for _, st := range steps {
		t = SatPicos(t, m.Time(st))
	}
	return t
}
