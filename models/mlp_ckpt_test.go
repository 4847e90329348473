package models_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"path/filepath"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// train runs the block on mesh for steps (after loading path when given,
// saving at saveAt into root when > 0) and returns rank 0's losses and, after
// loading, every parameter gathered whole.
func train(t *testing.T, mesh string, steps int, load, root string, saveAt int) ([]float64, map[string][]byte) {
	t.Helper()
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 10, FFN: 22, Seed: 5, LR: 0.05}
	var c *ckpt.Checkpoint
	if load != "" {
		if c, err = ckpt.Open(ckpt.OS, load); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var losses []float64
	loaded := map[string][]byte{}
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		d, err := providers.New("cpu", nil)
		if err != nil {
			return err
		}
		b, err := models.NewMLP(cfg, w.Rank(), d)
		if err != nil {
			return err
		}
		if c != nil {
			if err := linear.Expect(c, b.Params()); err != nil {
				return err
			}
			if err := linear.LoadParams(ctx, w, c, b.Params()); err != nil {
				return err
			}
			for _, p := range b.Params() {
				full, err := linear.Gather(ctx, w, p.Spec, shard(b, p.Name))
				if err != nil {
					return err
				}
				if w.Rank() == 0 {
					mu.Lock()
					loaded[p.Name] = append([]byte(nil), hostBytes(full)...)
					mu.Unlock()
				}
			}
		}
		rt := linear.Runtime{World: w, Kernels: d}
		for s := 1; s <= steps; s++ {
			loss, err := b.Step(ctx, rt)
			if err != nil {
				return err
			}
			if w.Rank() == 0 {
				mu.Lock()
				losses = append(losses, loss)
				mu.Unlock()
			}
			if s == saveAt {
				if err := linear.SaveParams(ctx, w, b.Params(), linear.SaveOptions{Root: root, Step: s, Keep: 3}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return losses, loaded
}

// TestCheckpointReshard: saved on tp=4 after 5 steps, the parameters load
// bitwise on dp=2,tp=2, tp=3 (uneven) and one rank, and 5 more steps give the
// uninterrupted run's losses within 1e-6.
func TestCheckpointReshard(t *testing.T) {
	root := t.TempDir()
	full, _ := train(t, "tp=4", 10, "", root, 5)
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	if c.Index.Step != 5 || c.Index.Mesh != "tp=4" {
		t.Fatalf("checkpoint step %d mesh %s", c.Index.Step, c.Index.Mesh)
	}
	// Replicas write nothing twice: up.bias is split over tp, down.bias
	// replicated (one box, in rank 0's file).
	if n := len(c.Index.Tensors["down.bias"].Boxes); n != 1 {
		t.Fatalf("down.bias stored %d times", n)
	}
	saved := map[string][]byte{}
	for _, name := range c.Names() {
		tt, err := c.ReadAll(name)
		if err != nil {
			t.Fatal(err)
		}
		saved[name] = hostBytes(tt)
	}
	for _, mesh := range []string{"dp=2,tp=2", "tp=3", "1"} {
		losses, loaded := train(t, mesh, 5, root, "", 0)
		for name, want := range saved {
			if !bytes.Equal(loaded[name], want) {
				t.Errorf("%s: %s differs from the saved one", mesh, name)
			}
		}
		for i, l := range losses {
			if want := full[5+i]; math.Abs(l-want) > 1e-6*math.Abs(want) {
				t.Errorf("%s: step %d loss %v, uninterrupted %v", mesh, 6+i, l, want)
			}
		}
	}
}

// TestCheckpointCorruptAgreed: a flipped data byte read by one rank fails the
// load on every rank, naming the file, and no rank replaces a weight.
func TestCheckpointCorruptAgreed(t *testing.T) {
	root := t.TempDir()
	train(t, "tp=2", 1, "", root, 1)
	flipLast(t, root)
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	m := placement.MustMesh([]int{2}, []string{"tp"})
	cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 10, FFN: 22, Seed: 5, LR: 0.05}
	errs := make([]error, 2)
	untouched := make([]bool, 2)
	job.InProcess(context.Background(), 2, func(ctx context.Context, w *collective.World) error {
		d, _ := providers.New("cpu", nil)
		b, err := models.NewMLP(cfg, w.Rank(), d)
		if err != nil {
			return err
		}
		before := append([]byte(nil), hostBytes(b.Up.W)...)
		errs[w.Rank()] = linear.LoadParams(ctx, w, c, b.Params())
		untouched[w.Rank()] = bytes.Equal(before, hostBytes(b.Up.W))
		return nil
	})
	for r, err := range errs {
		if !errors.Is(err, ckpt.ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(".safetensors")) || !untouched[r] {
			t.Fatalf("rank %d: %v (weights untouched: %v)", r, err, untouched[r])
		}
	}
}

func shard(b *models.MLP, name string) *tensor.Tensor {
	for _, p := range b.Params() {
		if p.Name == name {
			return p.Tensor()
		}
	}
	return nil
}

func hostBytes(t *tensor.Tensor) []byte {
	h, err := tensor.Download(t)
	if err != nil {
		panic(err)
	}
	return tensor.HostBytes(h)
}

// flipLast inverts the last byte of rank 1's file of the newest checkpoint.
func flipLast(t *testing.T, root string) {
	t.Helper()
	steps, err := ckpt.Steps(ckpt.OS, root)
	if err != nil || len(steps) == 0 {
		t.Fatal(steps, err)
	}
	ckpttest.FlipByte(t, filepath.Join(ckpt.StepDir(root, steps[len(steps)-1]), "rank-00001.safetensors"), -1)
}
