package linear

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Param is one parameter of a model as checkpoints name and lay it out: a
// layer's (LayerParams) or one the model holds itself (HeldParam).
type Param struct {
	Name  string         // "up.weight", as PyTorch names a Linear's parameters
	Spec  placement.Spec // its global shape and layout
	layer *Layer
	bias  bool
	t     *tensor.Tensor // a tensor held outside a layer (HeldParam)
}

// HeldParam is a parameter that a model holds itself, outside any layer (an
// embedding table, a layer norm's weight), t its shard on this rank laid out
// as spec: saved and loaded with the layers' parameters.
func HeldParam(name string, spec placement.Spec, t *tensor.Tensor) Param {
	return Param{Name: name, Spec: spec, t: t}
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

// planRecord is a rank's part of a save before anything is written: the
// bytes of its file (0: it writes none), the free space where it writes, and
// why it cannot take part (a tensor that would not download, a folder it
// cannot create or measure). Rank 0's also names the newest complete
// checkpoint, the last good one should the save fail.
type planRecord struct {
	Need     int64             `json:"need"`
	Space    ckpt.Space        `json:"space"`
	Fail     *ckpt.RankFailure `json:"fail,omitempty"`
	LastGood string            `json:"last_good,omitempty"`
}

// fileRecord is what a rank wrote, for rank 0's index: its file, its boxes,
// and the tensors it holds (a pipeline stage's ranks hold their stage's).
type fileRecord struct {
	File    string                      `json:"file"`
	Info    *ckpt.FileInfo              `json:"info"`
	Boxes   map[string][2][]int         `json:"boxes"` // tensor -> offset, shape
	Tensors map[string]*ckpt.TensorInfo `json:"tensors,omitempty"`
	Fail    *ckpt.RankFailure           `json:"fail,omitempty"`
}

// verdict is rank 0's end of a save: committed, or why not, and what became
// of the temporary folder.
type verdict struct {
	Fail      *ckpt.RankFailure `json:"fail,omitempty"`
	Committed bool              `json:"committed"`
	Removed   bool              `json:"removed"`
	RemoveErr string            `json:"remove_error,omitempty"`
}

// SaveOptions says where and how to save.
type SaveOptions struct {
	Root string  // the folder of checkpoints
	Step int     // the step the parameters are at
	Keep int     // checkpoints to keep (<= 0: all)
	FS   ckpt.FS // nil: the OS's
	// View is the view of the world whose ranks the parameters' layouts
	// are laid over (a pipeline stage's, each stage holding its own
	// parameters; collective.World.View), nil: the world; Mesh names the
	// world's mesh in the index ("": the parameters').
	View *collective.World
	Mesh string
}

// SaveParams writes a checkpoint of ps (every rank calls it): each parameter
// box is written once, by the lowest rank holding it, into that rank's
// safetensors file in a temporary folder. The ranks agree on the outcome at
// each stage, so that every rank returns the same error, naming every rank
// that failed (a *ckpt.SaveError):
//
//  1. rank 0 removes the temporary folders of saves that never finished;
//     then each writing rank measures the free space where it writes, and
//     the ranks exchange the bytes they will write and the space they see:
//     a file system that cannot take its ranks' files (ckpt.CheckSpace)
//     fails the save before anything is written;
//  2. each rank writes and fsyncs its file; the ranks exchange what they
//     wrote, or why they could not (ENOSPC, EIO);
//  3. rank 0 commits (writes the index and renames the folder into place,
//     ckpt.Commit) if every rank wrote its file, else removes the temporary
//     folder; every rank learns which.
//
// A rank dying at any point leaves the previous checkpoint whole and the
// unfinished folder ignored: the others fail with the collective's error
// (naming the dead rank), and rank 0, if it is not the one that died and
// commits nothing, removes the folder (another rank cannot know that rank 0
// will not commit it; a later save removes what is left).
func SaveParams(ctx context.Context, w *collective.World, ps []Param, o SaveOptions) error {
	fsys := o.FS
	if fsys == nil {
		fsys = ckpt.OS
	}
	rank := w.Rank()
	tmp := ckpt.TempDir(o.Root, o.Step)
	se := &ckpt.SaveError{Step: o.Step, Root: o.Root}
	collectiveErr := func(err error) error {
		return fmt.Errorf("checkpoint step %d not saved: %w", o.Step, err)
	}

	// 1. Plan: what each rank writes, against the space where it writes.
	var plan planRecord
	fail := func(err error) *ckpt.RankFailure { f := ckpt.FailureOf(rank, err); return &f }
	if rank == 0 {
		if err := ckpt.RemoveTemps(fsys, o.Root); err != nil {
			plan.Fail = fail(err)
		}
		plan.LastGood = ckpt.Newest(fsys, o.Root)
	}
	// Every rank measures after rank 0 removed what was left.
	if err := barrier(ctx, w); err != nil {
		return collectiveErr(err)
	}
	rec := fileRecord{File: fmt.Sprintf("rank-%05d.safetensors", rank), Boxes: map[string][2][]int{}, Tensors: tensorInfos(ps)}
	local := rank
	if o.View != nil {
		local = o.View.Rank()
	}
	sh, err := localShards(ps, local, &rec)
	if err == nil && len(sh.entries) > 0 {
		if plan.Need, err = ckpt.FileSize(sh.entries, sh.meta); err == nil {
			if err = fsys.MkdirAll(o.Root); err == nil {
				plan.Space, err = fsys.Space(o.Root)
			}
		}
	}
	if err != nil && plan.Fail == nil {
		plan.Fail = fail(err)
	}
	plans, err := gather[planRecord](ctx, w, plan)
	if err != nil {
		return collectiveErr(err)
	}
	se.LastGood = plans[0].LastGood
	var sp []ckpt.SpacePlan
	for r, p := range plans {
		if p.Fail != nil {
			se.Failures = append(se.Failures, *p.Fail)
		}
		sp = append(sp, ckpt.SpacePlan{Rank: r, Need: p.Need, Space: p.Space})
	}
	if len(se.Failures) == 0 {
		se.Failures = ckpt.CheckSpace(o.Root, sp)
	}
	if len(se.Failures) > 0 {
		se.Checked = true
		return se
	}

	// 2. Write.
	err = fsys.MkdirAll(tmp)
	if err == nil && len(sh.entries) > 0 {
		rec.Info, err = ckpt.WriteFile(fsys, filepath.Join(tmp, rec.File), sh.entries, sh.data, sh.meta)
	}
	if err != nil {
		rec.Info, rec.Fail = nil, fail(err)
	}
	recs, err := gather[fileRecord](ctx, w, rec)
	if err != nil {
		if rank == 0 { // it commits nothing now: the folder is garbage
			fsys.RemoveAll(tmp)
		}
		return collectiveErr(err)
	}
	for _, r := range recs {
		if r.Fail != nil {
			se.Failures = append(se.Failures, *r.Fail)
		}
	}

	// 3. Rank 0 commits, or removes what the ranks wrote; every rank learns
	// which.
	var v verdict
	if rank == 0 {
		if len(se.Failures) > 0 {
			if err := fsys.RemoveAll(tmp); err != nil {
				v.RemoveErr = err.Error()
			} else {
				v.Removed = true
			}
		} else if err := ckpt.Commit(fsys, o.Root, index(ps, o.Step, o.Mesh, recs), o.Keep); err != nil {
			v.Fail, v.Committed = fail(err), errors.Is(err, ckpt.ErrAfterCommit)
			// Commit removes the folder when it fails before the rename.
			if _, serr := fsys.Stat(tmp); !v.Committed && errors.Is(serr, fs.ErrNotExist) {
				v.Removed = true
			}
		} else {
			v.Committed = true
		}
	}
	vs, err := gather[verdict](ctx, w, v)
	if err != nil {
		return collectiveErr(err)
	}
	v = vs[0]
	if v.Fail != nil {
		se.Failures = append(se.Failures, *v.Fail)
	}
	if len(se.Failures) == 0 {
		return nil
	}
	se.Committed, se.Removed, se.RemoveErr = v.Committed, v.Removed, v.RemoveErr
	if v.Committed {
		se.LastGood = ckpt.StepDir(o.Root, o.Step)
	}
	return se
}

// tensorInfos are the index's entries of ps, without their boxes.
func tensorInfos(ps []Param) map[string]*ckpt.TensorInfo {
	out := map[string]*ckpt.TensorInfo{}
	for _, p := range ps {
		out[p.Name] = &ckpt.TensorInfo{Shape: p.Spec.Shape, DType: tensor.Float32.String(), Placements: placement.FormatList(p.Spec.Placements)}
	}
	return out
}

// index is the checkpoint's index, from what every rank wrote: the tensors
// every rank holds (the union, for pipeline stages), their boxes.
func index(ps []Param, step int, mesh string, recs []fileRecord) *ckpt.Index {
	if mesh == "" {
		mesh = ps[0].Spec.Mesh.String()
	}
	idx := &ckpt.Index{Step: step, Mesh: mesh, Tensors: tensorInfos(ps), Files: map[string]*ckpt.FileInfo{}}
	for _, r := range recs {
		for name, t := range r.Tensors {
			if idx.Tensors[name] == nil {
				idx.Tensors[name] = t
			}
		}
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
	return idx
}

// gather exchanges one JSON record per rank over the world.
func gather[T any](ctx context.Context, w *collective.World, v T) ([]T, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	all, err := collective.AllGatherBytes(ctx, w, b)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(all))
	for r, raw := range all {
		if err := json.Unmarshal(raw, &out[r]); err != nil {
			return nil, fmt.Errorf("rank %d's record: %v", r, err)
		}
	}
	return out, nil
}

func barrier(ctx context.Context, w *collective.World) error {
	g, err := w.WorldGroup(ctx)
	if err != nil {
		return err
	}
	return g.Barrier(ctx)
}

// shards is what a rank writes: its boxes of the parameters it owns.
type shards struct {
	entries []ckpt.Entry
	data    [][]byte
	meta    map[string]string
}

// localShards collects the boxes this rank owns (none: it writes no file),
// recording them in rec.
func localShards(ps []Param, rank int, rec *fileRecord) (shards, error) {
	sh := shards{meta: map[string]string{"format": "meshrun"}}
	for _, p := range ps {
		if !owns(p.Spec, rank) {
			continue
		}
		h, err := tensor.Download(p.Tensor())
		if err != nil {
			return shards{}, err
		}
		shape, off := p.Spec.Local(rank)
		sh.entries = append(sh.entries, ckpt.Entry{Name: p.Name, DType: tensor.Float32, Shape: shape})
		sh.data = append(sh.data, tensor.HostBytes(h))
		rec.Boxes[p.Name] = [2][]int{off, shape}
	}
	return sh, nil
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
