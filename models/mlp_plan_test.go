package models_test

import (
	"errors"
	"testing"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
)

// TestPlanMLP: PlanMLP names and lays out the parameters as the block NewMLP
// builds does, without allocating them, and refuses what NewMLP refuses.
func TestPlanMLP(t *testing.T) {
	for _, mesh := range []string{"1", "tp=3", "dp=2,tp=2"} {
		for _, sp := range []bool{false, true} {
			m, err := placement.ParseMesh(mesh)
			if err != nil {
				t.Fatal(err)
			}
			cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 8, FFN: 22, SequenceParallel: sp, Seed: 1, LR: 0.05}
			ps, err := models.PlanMLP(cfg)
			if err != nil {
				t.Fatalf("%s sp=%v: %v", mesh, sp, err)
			}
			b, err := models.NewMLP(cfg, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := b.Params()
			if len(ps) != len(want) {
				t.Fatalf("%s sp=%v: %d params, want %d", mesh, sp, len(ps), len(want))
			}
			for i := range ps {
				if ps[i].Name != want[i].Name || !ps[i].Spec.Equal(want[i].Spec) || ps[i].Tensor() != nil {
					t.Errorf("%s sp=%v: param %d is %s %s (tensor %v), want %s %s", mesh, sp, i, ps[i].Name, ps[i].Spec, ps[i].Tensor() != nil, want[i].Name, want[i].Spec)
				}
			}
		}
	}
	cfg := models.MLPConfig{Mesh: placement.MustMesh([]int{2}, []string{"tp"}), Tokens: 0, Hidden: 8, FFN: 16}
	if _, err := models.PlanMLP(cfg); !errors.Is(err, linear.ErrConfig) {
		t.Errorf("no tokens: %v", err)
	}
	if _, err := models.NewMLP(cfg, 0, nil); !errors.Is(err, linear.ErrConfig) {
		t.Errorf("NewMLP, no tokens: %v", err)
	}
}
