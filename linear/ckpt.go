package linear

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Param is one parameter of a model as checkpoints name and lay it out.
type Param struct {
	Name  string         // "up.weight", as PyTorch names a Linear's parameters
	Spec  placement.Spec // its global shape and layout
	layer *Layer
	bias  bool
	t     *tensor.Tensor // a tensor held outside a layer (the GPT's)
}

// Tensor returns the parameter's shard on this rank (float32, on the device).
func (p Param) Tensor() *tensor.Tensor {
	if p.layer == nil {
		return p.t
	}
	if p.bias {
		return p.layer.B
	}
	return p.layer.W
}

// LayerParams lists a layer's parameters, named prefix.weight and prefix.bias.
func LayerParams(prefix string, l *Layer) []Param {
	ps := []Param{{Name: prefix + ".weight", Spec: l.Config.W, layer: l}}
	if l.Config.B != nil {
		ps = append(ps, Param{Name: prefix + ".bias", Spec: *l.Config.B, layer: l, bias: true})
	}
	return ps
}

// Params lists the block's parameters: up.weight [ffn, hidden], up.bias [ffn],
// down.weight [hidden, ffn], down.bias [hidden] (float32).
func (m *MLP) Params() []Param {
	return append(LayerParams("up", m.Up), LayerParams("down", m.Down)...)
}

// Expect checks, before any rank loads, that c holds every parameter with its
// global shape (float32).
func Expect(c *ckpt.Checkpoint, ps []Param) error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, c.Expect(p.Name, p.Spec.Shape, tensor.Float32))
	}
	return errors.Join(errs...)
}

// owns reports whether rank writes its shard of spec: the lowest rank holding
// that box writes it, so replicas write nothing twice.
func owns(spec placement.Spec, rank int) bool {
	shape, off := spec.Local(rank)
	for r := 0; r < rank; r++ {
		s, o := spec.Local(r)
		if slices.Equal(s, shape) && slices.Equal(o, off) {
			return false
		}
	}
	return true
}

// fileRecord is what a rank wrote, for rank 0's index.
type fileRecord struct {
	File  string              `json:"file"`
	Info  *ckpt.FileInfo      `json:"info"`
	Boxes map[string][2][]int `json:"boxes"` // tensor -> offset, shape
	Err   string              `json:"error,omitempty"`
}

// SaveOptions says where and how to save.
type SaveOptions struct {
	Root string  // the folder of checkpoints
	Step int     // the step the parameters are at
	Keep int     // checkpoints to keep (<= 0: all)
	FS   ckpt.FS // nil: the OS's
}

// SaveParams writes a checkpoint of ps (every rank calls it): each parameter
// box is written once, by the lowest rank holding it, into that rank's
// safetensors file in a temporary folder; once every rank has written and
// fsynced its file, rank 0 writes the index and renames the folder into place
// (ckpt.Commit). A rank dying at any point leaves the previous checkpoint
// whole and the unfinished folder ignored. Every rank returns the same error.
func SaveParams(ctx context.Context, w *collective.World, ps []Param, o SaveOptions) error {
	fsys := o.FS
	if fsys == nil {
		fsys = ckpt.OS
	}
	rank := w.Rank()
	tmp := ckpt.TempDir(o.Root, o.Step)
	rec := fileRecord{File: fmt.Sprintf("rank-%05d.safetensors", rank), Boxes: map[string][2][]int{}}
	err := fsys.MkdirAll(tmp)
	if err == nil {
		err = writeShards(fsys, tmp, &rec, ps, rank)
	}
	if err != nil {
		rec.Err = err.Error()
	}
	// Every rank learns what every rank wrote (or why it could not).
	b, _ := json.Marshal(rec)
	all, err := collective.AllGatherBytes(ctx, w, b)
	if err != nil {
		return err
	}
	recs := make([]fileRecord, len(all))
	var failed []string
	for r, raw := range all {
		if err := json.Unmarshal(raw, &recs[r]); err != nil {
			return fmt.Errorf("checkpoint: rank %d's record: %v", r, err)
		}
		if recs[r].Err != "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r, recs[r].Err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("checkpoint of step %d not saved: %s", o.Step, strings.Join(failed, "; "))
	}
	var commitErr string
	if rank == 0 {
		idx := &ckpt.Index{Step: o.Step, Mesh: ps[0].Spec.Mesh.String(), Tensors: map[string]*ckpt.TensorInfo{}, Files: map[string]*ckpt.FileInfo{}}
		for _, p := range ps {
			idx.Tensors[p.Name] = &ckpt.TensorInfo{Shape: p.Spec.Shape, DType: tensor.Float32.String(), Placements: placement.FormatList(p.Spec.Placements)}
		}
		for _, r := range recs {
			if r.Info == nil {
				continue
			}
			idx.Files[r.File] = r.Info
			for name, bx := range r.Boxes {
				t := idx.Tensors[name]
				t.Boxes = append(t.Boxes, ckpt.Box{File: r.File, Offset: bx[0], Shape: bx[1]})
			}
		}
		if err := ckpt.Commit(fsys, o.Root, idx, o.Keep); err != nil {
			commitErr = err.Error()
		}
	}
	// Every rank returns rank 0's verdict.
	all, err = collective.AllGatherBytes(ctx, w, []byte(commitErr))
	if err != nil {
		return err
	}
	if len(all[0]) > 0 {
		return fmt.Errorf("checkpoint of step %d not committed: %s", o.Step, all[0])
	}
	return nil
}

// writeShards writes the boxes this rank owns into its file (none: no file).
func writeShards(fsys ckpt.FS, dir string, rec *fileRecord, ps []Param, rank int) error {
	var entries []ckpt.Entry
	var data [][]byte
	for _, p := range ps {
		if !owns(p.Spec, rank) {
			continue
		}
		h, err := tensor.Download(p.Tensor())
		if err != nil {
			return err
		}
		shape, off := p.Spec.Local(rank)
		entries = append(entries, ckpt.Entry{Name: p.Name, DType: tensor.Float32, Shape: shape})
		data = append(data, tensor.HostBytes(h))
		rec.Boxes[p.Name] = [2][]int{off, shape}
	}
	if len(entries) == 0 {
		return nil
	}
	info, err := ckpt.WriteFile(fsys, filepath.Join(dir, rec.File), entries, data, map[string]string{"format": "meshrun"})
	rec.Info = info
	return err
}

// LoadParams replaces ps's shards with checkpoint c's (every rank calls it,
// after Expect passed), whatever mesh wrote them. First each rank verifies the
// checksums of every block its boxes touch (reading through a small scratch
// buffer); then the ranks agree; only if every rank's data verified does any
// rank read its boxes into its parameters, in place. An error (ckpt.ErrCorrupt,
// naming the file, tensor and block) is the same on every rank, and leaves
// every weight as it was.
func LoadParams(ctx context.Context, w *collective.World, c *ckpt.Checkpoint, ps []Param) error {
	rank := w.Rank()
	var mine error
	for _, p := range ps {
		shape, off := p.Spec.Local(rank)
		if mine = c.Check(p.Name, off, shape); mine != nil {
			break
		}
	}
	msg := ""
	if mine != nil {
		msg = mine.Error()
	}
	all, err := collective.AllGatherBytes(ctx, w, []byte(msg))
	if err != nil {
		return err
	}
	for r, m := range all {
		if len(m) > 0 {
			if r == rank {
				return mine
			}
			return fmt.Errorf("%w: rank %d: %s", ckpt.ErrCorrupt, r, m)
		}
	}
	for _, p := range ps {
		if err := p.read(c, rank); err != nil {
			return fmt.Errorf("checkpoint verified but not read whole: %w", err)
		}
	}
	return nil
}

// read reads the parameter's box from c into its shard, in place: straight
// into host memory, or through a host buffer into device memory.
func (p Param) read(c *ckpt.Checkpoint, rank int) error {
	shape, off := p.Spec.Local(rank)
	t := p.Tensor()
	if t.OnHost() {
		return c.ReadChecked(p.Name, off, shape, tensor.HostBytes(t))
	}
	h := tensor.New(tensor.Float32, shape...)
	if err := c.ReadChecked(p.Name, off, shape, tensor.HostBytes(h)); err != nil {
		return err
	}
	if n := h.Bytes(); n > 0 {
		return tensor.MemoryOf(t).Write(t, 0, tensor.HostBytes(h), tensor.Transfer)
	}
	return nil
}
