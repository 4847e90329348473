package linear

import (
	"fmt"
	"sort"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// presets are the usual layouts of a linear layer x[M, K] · W[N, K]ᵀ + b[N] on a
// mesh whose last dim is tensor parallel (tp) and whose other dims, if any, are
// data parallel (dp: tokens split over them). On a 1-D mesh there is no dp.
var presets = map[string]struct {
	help string
	// x, w, b: placement on the tp dim; dp dims always shard x's tokens (dim 0)
	// and replicate W and b. out: the output's placement on tp ("" = default).
	x, w, b, out placement.Placement
	dataParallel bool // every mesh dim, tp included, splits tokens
}{
	"replicated":      {help: "everything replicated, no communication", x: placement.Replicate{}, w: placement.Replicate{}, b: placement.Replicate{}},
	"column":          {help: "Megatron column parallel: W split by output features, y split by columns", x: placement.Replicate{}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}},
	"column-gather":   {help: "column parallel with y gathered", x: placement.Replicate{}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}, out: placement.Replicate{}},
	"row":             {help: "Megatron row parallel: x and W split by input features, y all-reduced, bias added once", x: placement.Shard{Dim: 1}, w: placement.Shard{Dim: 1}, b: placement.Replicate{}, out: placement.Replicate{}},
	"data-parallel":   {help: "tokens split over every mesh dim, W and b replicated, weight gradients all-reduced", dataParallel: true, w: placement.Replicate{}, b: placement.Replicate{}},
	"sequence-column": {help: "sequence parallel column: tokens split on tp, gathered before the GEMM, dx reduce-scattered", x: placement.Shard{Dim: 0}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}},
	"sequence-row":    {help: "sequence parallel row: y reduce-scattered to tokens split on tp", x: placement.Shard{Dim: 1}, w: placement.Shard{Dim: 1}, b: placement.Replicate{}, out: placement.Shard{Dim: 0}},
}

// Presets lists the preset names with a line of help each.
func Presets() []string {
	var out []string
	for n, p := range presets {
		out = append(out, fmt.Sprintf("%-16s %s", n, p.help))
	}
	sort.Strings(out)
	return out
}

// Preset builds the Config of a preset layout for x[M, K], W[N, K], b[N] (no bias
// when bias is false) on mesh, all gradients needed. On a 2-D mesh such as
// dp=2,tp=2 it is the dp x tp layout: tokens split over dp.
func Preset(name string, mesh placement.Mesh, m, k, n int, bias bool) (Config, error) {
	p, ok := presets[name]
	if !ok {
		var names []string
		for n := range presets {
			names = append(names, n)
		}
		sort.Strings(names)
		return Config{}, fmt.Errorf("%w: unknown preset %q (known: %s)", ErrConfig, name, strings.Join(names, ", "))
	}
	nd := mesh.NDim()
	xs, ws, bs := make([]placement.Placement, nd), make([]placement.Placement, nd), make([]placement.Placement, nd)
	var out []placement.Placement
	for i := 0; i < nd-1; i++ {
		xs[i], ws[i], bs[i] = placement.Shard{Dim: 0}, placement.Replicate{}, placement.Replicate{}
	}
	xs[nd-1], ws[nd-1], bs[nd-1] = p.x, p.w, p.b
	if p.dataParallel {
		xs[nd-1] = placement.Shard{Dim: 0}
	}
	if p.out != nil {
		out = make([]placement.Placement, nd)
		copy(out, xs[:nd-1])
		out[nd-1] = p.out
	}
	cfg := Config{Name: name, Out: out, Grads: AllGrads}
	var err error
	if cfg.X, err = placement.NewSpec([]int{m, k}, mesh, xs...); err != nil {
		return Config{}, err
	}
	if cfg.W, err = placement.NewSpec([]int{n, k}, mesh, ws...); err != nil {
		return Config{}, err
	}
	if bias {
		b, err := placement.NewSpec([]int{n}, mesh, bs...)
		if err != nil {
			return Config{}, err
		}
		cfg.B = &b
	}
	return cfg, nil
}
