package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/tensor"
)

// Sentinel errors; wrapped with the file and tensor they concern.
var (
	// ErrFormat reports a file or index that is not what it says it is.
	ErrFormat = errors.New("ckpt: bad checkpoint")
	// ErrCorrupt reports data whose checksum does not match the index.
	ErrCorrupt = errors.New("ckpt: corrupt checkpoint data")
	// ErrMismatch reports a checkpoint that does not fit the model.
	ErrMismatch = errors.New("ckpt: checkpoint does not fit the model")
	// ErrNone reports a folder without a complete checkpoint.
	ErrNone = errors.New("ckpt: no checkpoint")
	// ErrAfterCommit reports a failure after a checkpoint was committed
	// (renamed into place): it is whole, what followed failed.
	ErrAfterCommit = errors.New("ckpt: checkpoint committed, then")
)

// Layout names.
const (
	// IndexFile is the index of a checkpoint folder.
	IndexFile = "index.json"
	// Format is the index's format tag.
	Format = "meshrun-checkpoint/1"
	// BlockSize is the unit of the data checksums: a reader verifies the
	// blocks it reads.
	BlockSize = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Index describes one checkpoint: every tensor's global shape, dtype and
// placements, which box of it each file holds, and each file's size and
// checksums.
type Index struct {
	Format  string                 `json:"format"`
	Step    int                    `json:"step"`
	Mesh    string                 `json:"mesh"` // the mesh that wrote it
	Tensors map[string]*TensorInfo `json:"tensors"`
	Files   map[string]*FileInfo   `json:"files"`
	Meta    map[string]string      `json:"meta,omitempty"`
}

// TensorInfo is one tensor of a checkpoint.
type TensorInfo struct {
	Shape      []int  `json:"shape"`
	DType      string `json:"dtype"`
	Placements string `json:"placements,omitempty"` // as written, e.g. "[R,S(0)]"
	Boxes      []Box  `json:"boxes"`
}

// Box is a dense block of a tensor (global offset and shape) stored in File
// under the tensor's name.
type Box struct {
	File   string `json:"file"`
	Offset []int  `json:"offset"`
	Shape  []int  `json:"shape"`
}

// Bounds is the block of the tensor b holds.
func (b Box) Bounds() tensor.Box { return tensor.Box{Offset: b.Offset, Shape: b.Shape} }

// FileInfo is one file of a checkpoint: its size, the CRC-32C of the whole
// file, and the CRC-32C of each BlockSize block of its data section.
type FileInfo struct {
	Size   int64    `json:"size"`
	CRC32C uint32   `json:"crc32c"`
	Blocks []uint32 `json:"block_crc32c"`
}

// WriteFile writes a safetensors file holding entries (their data in data,
// one slice each, in order) and fsyncs it; it returns the file's size and
// checksums. Data goes to the file in ioChunk writes straight from the slices
// (no staging copy), the checksums computed on the way.
func WriteFile(fsys FS, name string, entries []Entry, data [][]byte, meta map[string]string) (*FileInfo, error) {
	return writeFile(fsys, name, entries, data, meta, true)
}

// ioChunk is the size of each write and read: large enough for few system
// calls, small enough that the kernel neither throttles one huge copy nor
// faults a huge untouched buffer in page by page.
const ioChunk = 4 << 20

func writeFile(fsys FS, name string, entries []Entry, data [][]byte, meta map[string]string, sync bool) (*FileInfo, error) {
	if len(entries) != len(data) {
		return nil, fmt.Errorf("ckpt: %d entries, %d data", len(entries), len(data))
	}
	hdr, err := EncodeHeader(entries, meta)
	if err != nil {
		return nil, err
	}
	for i, e := range entries {
		if int64(len(data[i])) != e.End-e.Begin {
			return nil, fmt.Errorf("ckpt: tensor %q: %d bytes of data for %v %v", e.Name, len(data[i]), e.DType, e.Shape)
		}
	}
	f, err := fsys.Create(name)
	if err != nil {
		return nil, err
	}
	w := &checksumWriter{w: f}
	if _, err = w.Write(hdr); err == nil {
		w.data = true
		for _, d := range data {
			for len(d) > 0 && err == nil {
				k := min(len(d), ioChunk)
				_, err = w.Write(d[:k])
				d = d[k:]
			}
		}
	}
	if err == nil {
		w.finish()
		if sync {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: writing %s: %w", name, err)
	}
	return &FileInfo{Size: w.n, CRC32C: w.crc, Blocks: w.blocks}, nil
}

// checksumWriter computes the whole-file CRC and, once data is set, the CRC
// of each BlockSize block of what follows.
type checksumWriter struct {
	w      io.Writer
	n      int64
	crc    uint32
	data   bool
	block  uint32
	inBlk  int
	blocks []uint32
}

func (c *checksumWriter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, castagnoli, p)
	c.n += int64(len(p))
	if c.data {
		for q := p; len(q) > 0; {
			k := min(len(q), BlockSize-c.inBlk)
			c.block = crc32.Update(c.block, castagnoli, q[:k])
			c.inBlk += k
			q = q[k:]
			if c.inBlk == BlockSize {
				c.blocks = append(c.blocks, c.block)
				c.block, c.inBlk = 0, 0
			}
		}
	}
	return c.w.Write(p)
}

func (c *checksumWriter) finish() {
	if c.inBlk > 0 {
		c.blocks = append(c.blocks, c.block)
		c.block, c.inBlk = 0, 0
	}
}

// StepDir is the folder of the checkpoint of step under root; TempDir is where
// it is written before it is complete.
func StepDir(root string, step int) string {
	return filepath.Join(root, fmt.Sprintf("step-%08d", step))
}

// TempDir is the folder a checkpoint of step is written into; Commit renames
// it to StepDir.
func TempDir(root string, step int) string {
	return filepath.Join(root, fmt.Sprintf(".tmp-step-%08d", step))
}

// stepOf parses a StepDir name.
func stepOf(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "step-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// Steps lists the complete checkpoints under root (folders step-N holding an
// index), oldest first.
func Steps(fsys FS, root string) ([]int, error) {
	ents, err := fsys.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range ents {
		n, ok := stepOf(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if _, err := fsys.Stat(filepath.Join(root, e.Name(), IndexFile)); err == nil {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	return steps, nil
}

// Commit finishes the checkpoint of step written into TempDir(root, step): it
// writes the index there, fsyncs, renames the folder to StepDir(root, step)
// and fsyncs root, so that a crash at any moment leaves either the whole new
// checkpoint or none of it. Then it removes all but the newest keep
// checkpoints (keep <= 0 keeps all) and the temporary folders of saves that
// never finished. A failure before the rename removes the temporary folder
// (it holds space the next save needs); one after it wraps ErrAfterCommit.
func Commit(fsys FS, root string, idx *Index, keep int) error {
	tmp, final := TempDir(root, idx.Step), StepDir(root, idx.Step)
	if err := commit(fsys, tmp, final, idx); err != nil {
		if rerr := fsys.RemoveAll(tmp); rerr != nil {
			return fmt.Errorf("%w; removing %s: %v", err, tmp, rerr)
		}
		return err
	}
	if err := tidy(fsys, root, keep); err != nil {
		return fmt.Errorf("%w: %w", ErrAfterCommit, err)
	}
	return nil
}

// commit writes the index into tmp, fsyncs and renames tmp to final.
func commit(fsys FS, tmp, final string, idx *Index) error {
	idx.Format = Format
	b, err := json.MarshalIndent(idx, "", " ")
	if err != nil {
		return err
	}
	f, err := fsys.Create(filepath.Join(tmp, IndexFile))
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ckpt: writing the index: %w", err)
	}
	if err := fsys.SyncDir(tmp); err != nil {
		return err
	}
	if err := fsys.RemoveAll(final); err != nil { // a step saved again
		return err
	}
	return fsys.Rename(tmp, final)
}

// tidy, after a commit, makes it durable and removes the checkpoints beyond
// the newest keep and the temporary folders of saves that never finished.
func tidy(fsys FS, root string, keep int) error {
	if err := fsys.SyncDir(root); err != nil {
		return err
	}
	steps, err := Steps(fsys, root)
	if err != nil {
		return err
	}
	if keep > 0 && len(steps) > keep {
		for _, s := range steps[:len(steps)-keep] {
			if err := fsys.RemoveAll(StepDir(root, s)); err != nil {
				return err
			}
		}
	}
	return RemoveTemps(fsys, root)
}

// Checkpoint is an opened, checked checkpoint.
type Checkpoint struct {
	// Dir is the checkpoint's folder ("" for a single safetensors file).
	Dir   string
	Index *Index
	fs    FS
	files map[string]*openFile
}

type openFile struct {
	path string
	info *FileInfo // nil: no checksums (a plain safetensors file)
	hdr  *Header
}

// Open opens the checkpoint at path: a checkpoint folder (holding index.json),
// a folder of checkpoints (the newest complete one), or a plain safetensors
// file (one file holding every tensor whole, no checksums). It checks
// everything but the data before returning: the index, every file's presence,
// size and header against the index, and that each tensor's boxes tile it
// exactly. Errors name the file and the tensor.
func Open(fsys FS, path string) (*Checkpoint, error) {
	st, err := fsys.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNone, err)
	}
	if !st.IsDir() {
		return openSafetensors(fsys, path, st.Size())
	}
	if _, err := fsys.Stat(filepath.Join(path, IndexFile)); err != nil {
		steps, err := Steps(fsys, path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNone, err)
		}
		if len(steps) == 0 {
			return nil, fmt.Errorf("%w: %s holds no complete checkpoint (no step-N folder with %s)", ErrNone, path, IndexFile)
		}
		path = StepDir(path, steps[len(steps)-1])
	}
	c := &Checkpoint{Dir: path, fs: fsys, files: map[string]*openFile{}}
	if err := c.readIndex(); err != nil {
		return nil, err
	}
	return c, c.check()
}

func (c *Checkpoint) readIndex() error {
	name := filepath.Join(c.Dir, IndexFile)
	f, err := c.fs.Open(name)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFormat, err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	idx := &Index{}
	if err := dec.Decode(idx); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrFormat, name, err)
	}
	if idx.Format != Format {
		return fmt.Errorf("%w: %s: format %q (want %q)", ErrFormat, name, idx.Format, Format)
	}
	c.Index = idx
	return nil
}

// check verifies the index against the files (everything but the data).
func (c *Checkpoint) check() error {
	idx := c.Index
	for fname, info := range idx.Files {
		if fname != filepath.Base(fname) || fname == IndexFile {
			return fmt.Errorf("%w: index names file %q", ErrFormat, fname)
		}
		if info == nil {
			return fmt.Errorf("%w: index entry of %s is empty", ErrFormat, fname)
		}
		path := filepath.Join(c.Dir, fname)
		st, err := c.fs.Stat(path)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, path, missing(err))
		}
		if st.Size() != info.Size {
			return fmt.Errorf("%w: %s: %d bytes, the index says %d (truncated or replaced)", ErrFormat, path, st.Size(), info.Size)
		}
		hdr, err := c.header(path, info.Size)
		if err != nil {
			return err
		}
		if want := (hdr.DataLen + BlockSize - 1) / BlockSize; int64(len(info.Blocks)) != want {
			return fmt.Errorf("%w: %s: %d block checksums for %d data bytes", ErrFormat, path, len(info.Blocks), hdr.DataLen)
		}
		c.files[fname] = &openFile{path: path, info: info, hdr: hdr}
	}
	used := map[string]int{}
	for name, t := range idx.Tensors {
		if t == nil {
			return fmt.Errorf("%w: tensor %q has no entry", ErrFormat, name)
		}
		dt, err := tensor.ParseDType(t.DType)
		if err != nil {
			return fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		for _, b := range t.Boxes {
			f, ok := c.files[b.File]
			if !ok {
				return fmt.Errorf("%w: tensor %q: box in %q, a file the index does not list", ErrFormat, name, b.File)
			}
			e, ok := f.hdr.Entry(name)
			if !ok {
				return fmt.Errorf("%w: %s: no tensor %q, the index puts a box of it there", ErrFormat, f.path, name)
			}
			if e.DType != dt || !slices.Equal(e.Shape, b.Shape) {
				return fmt.Errorf("%w: %s: tensor %q is %v %v, the index says %v %v", ErrFormat, f.path, name, e.DType, e.Shape, dt, b.Shape)
			}
			used[b.File]++
		}
		if err := tiles(t.Shape, t.Boxes); err != nil {
			return fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
	}
	for fname, f := range c.files {
		if used[fname] != len(f.hdr.Entries) {
			return fmt.Errorf("%w: %s holds %d tensors, the index %d boxes in it", ErrFormat, f.path, len(f.hdr.Entries), used[fname])
		}
	}
	return nil
}

func missing(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("file missing")
	}
	return err
}

func (c *Checkpoint) header(path string, size int64) (*Header, error) {
	f, err := c.fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, path, missing(err))
	}
	defer f.Close()
	h, err := ReadHeader(f, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// tiles checks that boxes lie in shape, do not overlap and cover it.
func tiles(shape []int, boxes []Box) error {
	var vol int64
	for i, b := range boxes {
		if len(b.Offset) != len(shape) || len(b.Shape) != len(shape) {
			return fmt.Errorf("box %v+%v in a tensor of shape %v", b.Offset, b.Shape, shape)
		}
		v := int64(1)
		for d := range shape {
			if b.Offset[d] < 0 || b.Shape[d] < 0 || b.Offset[d]+b.Shape[d] > shape[d] {
				return fmt.Errorf("box %v+%v outside shape %v", b.Offset, b.Shape, shape)
			}
			v *= int64(b.Shape[d])
		}
		vol += v
		for _, o := range boxes[:i] {
			if overlap(b, o) {
				return fmt.Errorf("boxes %v+%v and %v+%v overlap", b.Offset, b.Shape, o.Offset, o.Shape)
			}
		}
	}
	if vol != int64(tensor.NumElements(shape)) {
		return fmt.Errorf("the boxes hold %d of the %d elements", vol, tensor.NumElements(shape))
	}
	return nil
}

func overlap(a, b Box) bool { return !a.Bounds().Intersect(b.Bounds()).Empty() }

// openSafetensors opens a plain safetensors file as a checkpoint: one file,
// every tensor whole in it, no checksums to verify.
func openSafetensors(fsys FS, path string, size int64) (*Checkpoint, error) {
	c := &Checkpoint{fs: fsys, files: map[string]*openFile{}}
	hdr, err := c.header(path, size)
	if err != nil {
		return nil, err
	}
	base := filepath.Base(path)
	c.files[base] = &openFile{path: path, hdr: hdr}
	c.Index = &Index{Format: Format, Tensors: map[string]*TensorInfo{}, Files: map[string]*FileInfo{base: {Size: size}}, Meta: hdr.Meta}
	// A file that ckpt.Convert wrote says which step and mesh it came from.
	if s, err := strconv.Atoi(hdr.Meta["step"]); err == nil && s >= 0 {
		c.Index.Step = s
	}
	c.Index.Mesh = hdr.Meta["mesh"]
	for _, e := range hdr.Entries {
		c.Index.Tensors[e.Name] = &TensorInfo{Shape: e.Shape, DType: e.DType.String(),
			Boxes: []Box{{File: base, Offset: make([]int, len(e.Shape)), Shape: e.Shape}}}
	}
	return c, nil
}

// Names lists the checkpoint's tensors, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.Index.Tensors))
	for n := range c.Index.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Files lists the checkpoint's files, sorted.
func (c *Checkpoint) Files() []string {
	names := make([]string, 0, len(c.files))
	for n := range c.files {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DType is a tensor's dtype.
func (c *Checkpoint) DType(name string) tensor.DType {
	dt, _ := tensor.ParseDType(c.Index.Tensors[name].DType)
	return dt
}

// Expect checks that the checkpoint holds tensor name with shape and dtype.
func (c *Checkpoint) Expect(name string, shape []int, dt tensor.DType) error {
	t, ok := c.Index.Tensors[name]
	if !ok {
		return fmt.Errorf("%w: no tensor %q (it has %s)", ErrMismatch, name, strings.Join(c.Names(), ", "))
	}
	if !slices.Equal(t.Shape, shape) || c.DType(name) != dt {
		return fmt.Errorf("%w: tensor %q is %s %v, the model wants %v %v", ErrMismatch, name, t.DType, t.Shape, dt, shape)
	}
	return nil
}
