package linear

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/tensor"
)

// Shard returns rank's shard of a whole tensor laid out per spec. A partial sum
// is held by the rank at coordinate 0 of each partial mesh dim (the others hold
// zeros); other partial ops hold copies. Both reduce back to the whole tensor
// exactly.
func Shard(global *tensor.Tensor, spec placement.Spec, rank int) (*tensor.Tensor, error) {
	if !slices.Equal(global.Shape(), spec.Shape) {
		return nil, fmt.Errorf("%w: tensor of shape %v for spec %s", ErrConfig, global.Shape(), spec)
	}
	box := spec.LocalBox(rank)
	out := tensor.New(global.DType(), box.Shape...)
	whole := tensor.Whole(spec.Shape)
	switch out.DType() {
	case tensor.Float32:
		tensor.CopyBox(out.Float32(), box, global.Float32(), whole)
	default:
		tensor.CopyBox(out.Float64(), box, global.Float64(), whole)
	}
	coords := spec.Mesh.Coords(rank)
	for i, p := range spec.Placements {
		if q, ok := p.(placement.Partial); ok && q.Op == placement.Sum && coords[i] != 0 {
			zero(out)
		}
	}
	return out, nil
}

func zero(t *tensor.Tensor) {
	if t.DType() == tensor.Float32 {
		clear(t.Float32())
	} else {
		clear(t.Float64())
	}
}

// Gather assembles the whole tensor on every rank from this rank's shard laid
// out per spec, by redistributing it to replicated (partial sums are reduced),
// and returns it in host memory (a copy from the device, counted). It is for
// checking and dumping results; the layer never calls it.
func Gather(ctx context.Context, w *collective.World, spec placement.Spec, local *tensor.Tensor) (*tensor.Tensor, error) {
	ps := make([]placement.Placement, len(spec.Placements))
	for i := range ps {
		ps[i] = placement.Replicate{}
	}
	steps, err := placement.Plan(spec, spec.WithPlacements(ps...))
	if err != nil {
		return nil, err
	}
	c, err := local.Clone()
	if err != nil {
		return nil, err
	}
	out, _, err := redistribute.Execute(ctx, w, steps, c, nil)
	if err != nil {
		return nil, err
	}
	host, err := tensor.Download(out)
	if err != nil {
		return nil, err
	}
	// What this gathered on a device is not needed there any more.
	if !out.OnHost() {
		m := tensor.MemoryOf(out)
		if out != c {
			err = m.Free(out)
		}
		err = errors.Join(err, m.Free(c))
	}
	if err != nil {
		return nil, err
	}
	return host.Reshape(spec.Shape...)
}
