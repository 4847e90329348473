package job

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/tensor"
)

// ringCase is one ring attention verify checks: the sequence split over
// the mesh's cp dim, sequences over dp, heads over tp.
type ringCase struct {
	mesh    placement.Mesh
	s       int
	causal  bool
	layout  ring.Layout
	command string
}

// ringMeshes lists the meshes of world ranks verify runs ring attention on:
// cp over all of them, then every 2-D mesh of cp with dp or tp, then every
// 3-D mesh of dp, cp and tp (each dim at least 2).
func ringMeshes(world int) []placement.Mesh {
	return meshesOf(world, "cp", [][2]string{{"dp", "cp"}, {"cp", "tp"}}, [3]string{"dp", "cp", "tp"})
}

// ringCases: causal zigzag and contiguous, and full attention, at a length
// no split divides (4·cp+1); quick keeps causal zigzag.
func ringCases(m placement.Mesh, quick bool) []ringCase {
	d, _ := m.DimIndex("cp")
	cp := m.Dim(d)
	var out []ringCase
	for _, c := range []struct {
		causal bool
		l      ring.Layout
	}{{true, ring.Zigzag}, {true, ring.Contiguous}, {false, ring.Zigzag}} {
		rc := ringCase{mesh: m, s: 4*cp + 1, causal: c.causal, layout: c.l}
		rc.command = fmt.Sprintf("ring attention S=%d, %s, causal %v", rc.s, c.l, c.causal)
		out = append(out, rc)
		if quick {
			break
		}
	}
	return out
}

// ringSizes are verify's sequences per dp rank, heads per tp rank and
// head dims.
const ringHeadsPerRank, ringE, ringF = 2, 8, 6

// runRingCase runs one case on this rank and compares its rows, heads and
// sequence with the whole attention computed here in float64.
func runRingCase(ctx context.Context, w *collective.World, k kernels.Kernels, c ringCase) (bool, string, error) {
	m, rank := c.mesh, w.Rank()
	coord := func(name string) (int, int, int) {
		d, err := m.DimIndex(name)
		if err != nil {
			return -1, 0, 1
		}
		return d, m.Coords(rank)[d], m.Dim(d)
	}
	cpDim, cpAt, cp := coord("cp")
	_, dpAt, dp := coord("dp")
	_, tpAt, tp := coord("tp")
	b, h := dp, ringHeadsPerRank*tp
	rng := rand.New(rand.NewPCG(uint64(c.s), uint64(m.Size())))
	draw := func(width int) *tensor.Tensor {
		x := tensor.New(tensor.Float64, b, c.s, h, width)
		for i := range x.Float64() {
			x.Float64()[i] = float64(float32(2*rng.Float64() - 1))
		}
		return x
	}
	q, kk, v, do := draw(ringE), draw(ringE), draw(ringF), draw(ringF)
	g, err := redistribute.MeshGroup(ctx, w, m, cpDim)
	if err != nil {
		return false, "", err
	}
	a, err := ring.New(ring.Config{Group: g, Kernels: k, Causal: c.causal, Layout: c.layout, S: c.s, B: 1, H: ringHeadsPerRank,
		E: ringE, F: ringF, Rank: cpAt, Size: cp})
	if err != nil {
		return false, "", err
	}
	pos := ring.Positions(a.Local())
	part := func(x *tensor.Tensor) *tensor.Tensor {
		return ringPart(x, dpAt, pos, tpAt*ringHeadsPerRank, ringHeadsPerRank)
	}
	o, lse, err := a.Forward(ctx, part(q), part(kk), part(v))
	if err != nil {
		return false, "", err
	}
	dq, dk, dv, err := a.Backward(ctx, part(do))
	if err != nil {
		return false, "", err
	}
	// The whole attention, every rank alike.
	wo, wl := tensor.New(tensor.Float64, b, c.s, h, ringF), tensor.New(tensor.Float64, b, h, c.s)
	if err := k.Attention(wo, wl, q, kk, v, c.causal); err != nil {
		return false, "", err
	}
	wdq, wdk, wdv := tensor.New(tensor.Float64, b, c.s, h, ringE), tensor.New(tensor.Float64, b, c.s, h, ringE), tensor.New(tensor.Float64, b, c.s, h, ringF)
	if err := k.AttentionBackward(wdq, wdk, wdv, do, q, kk, v, wo, wl, c.causal); err != nil {
		return false, "", err
	}
	for _, r := range []struct {
		name      string
		got, want *tensor.Tensor
	}{{"o", o, part(wo)}, {"dq", dq, part(wdq)}, {"dk", dk, part(wdk)}, {"dv", dv, part(wdv)}, {"lse", lse, ringLSE(wl, dpAt, pos, tpAt*ringHeadsPerRank, ringHeadsPerRank)}} {
		var d, big float64
		for i, x := range r.want.Float32() {
			d, big = max(d, math.Abs(float64(r.got.Float32()[i]-x))), max(big, math.Abs(float64(x)))
		}
		if d > 2e-6*max(big, 1) {
			return false, fmt.Sprintf("rank %d: %s differs by %.3g (largest value %.3g)", rank, r.name, d, big), nil
		}
	}
	return true, "", nil
}

// ringPart is a rank's share of x [B, S, H, w] (float64) as float32:
// sequence batch, positions pos, heads [h0, h0+hn).
func ringPart(x *tensor.Tensor, batch int, pos []int, h0, hn int) *tensor.Tensor {
	s, h, w := x.Dim(1), x.Dim(2), x.Dim(3)
	out := tensor.New(tensor.Float32, 1, len(pos), hn, w)
	for i, p := range pos {
		for j := range hn {
			src := x.Float64()[((batch*s+p)*h+h0+j)*w:][:w]
			dst := out.Float32()[(i*hn+j)*w:][:w]
			for c, v := range src {
				dst[c] = float32(v)
			}
		}
	}
	return out
}

// ringLSE is a rank's share of lse [B, H, S] as float32 [1, hn, len(pos)].
func ringLSE(l *tensor.Tensor, batch int, pos []int, h0, hn int) *tensor.Tensor {
	h, s := l.Dim(1), l.Dim(2)
	out := tensor.New(tensor.Float32, 1, hn, len(pos))
	for j := range hn {
		for i, p := range pos {
			out.Float32()[j*len(pos)+i] = float32(l.Float64()[(batch*h+h0+j)*s+p])
		}
	}
	return out
}
