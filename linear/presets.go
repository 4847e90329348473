package linear

import (
	"fmt"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
)

// Presets lists the preset layouts (package layout) with a line of help each.
func Presets() []string { return layout.Presets() }

// Preset builds the Config of a preset layout (layout.Preset) for x[M, K],
// W[N, K], b[N] (no bias when bias is false) on mesh, all gradients needed.
// On a 2-D mesh such as dp=2,tp=2 it is the dp x tp layout: tokens split over
// dp.
func Preset(name string, mesh placement.Mesh, m, k, n int, bias bool) (Config, error) {
	l, err := layout.Preset(name, mesh, m, k, n, bias)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return ConfigOf(name, l), nil
}

// ConfigOf is the Config of a laid-out layer (package layout), every
// gradient needed: what a model builds each of its layers from, its name
// the layer's.
func ConfigOf(name string, l layout.Layer) Config {
	return Config{Name: name, X: l.X, W: l.W, B: l.B, Out: l.Out, Grads: AllGrads}
}
