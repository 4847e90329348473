package ckpt_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/tensor"
)

// global is a float32 tensor whose elements are their own indices.
func global(shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.Float32, shape...)
	for i := range t.Float32() {
		t.Float32()[i] = float32(i)
	}
	return t
}

// box copies box off+shape out of g.
func box(g *tensor.Tensor, off, shape []int) *tensor.Tensor {
	out := tensor.New(tensor.Float32, shape...)
	gs := g.Shape()
	for i := range out.Float32() {
		// index in the box -> global
		rem, gi := i, 0
		idx := make([]int, len(shape))
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d] = rem % shape[d]
			rem /= shape[d]
		}
		for d := range shape {
			gi = gi*gs[d] + idx[d] + off[d]
		}
		out.Float32()[i] = g.Float32()[gi]
	}
	return out
}

// write saves a [rows, cols] tensor "w" split by columns in parts (boxes), and
// "b" whole in part 0's file, as one checkpoint of step under root.
func write(t *testing.T, root string, step, rows, cols, parts int) (w, b *tensor.Tensor) {
	t.Helper()
	w, b = global(rows, cols), global(rows)
	tmp := ckpt.TempDir(root, step)
	if err := ckpt.OS.MkdirAll(tmp); err != nil {
		t.Fatal(err)
	}
	idx := &ckpt.Index{Step: step, Mesh: fmt.Sprint(parts), Tensors: map[string]*ckpt.TensorInfo{
		"w": {Shape: []int{rows, cols}, DType: "float32", Placements: "[S(1)]"},
		"b": {Shape: []int{rows}, DType: "float32", Placements: "[R]"},
	}, Files: map[string]*ckpt.FileInfo{}}
	for p := 0; p < parts; p++ {
		lo, hi := p*cols/parts, (p+1)*cols/parts
		name := fmt.Sprintf("rank-%05d.safetensors", p)
		wb := box(w, []int{0, lo}, []int{rows, hi - lo})
		entries := []ckpt.Entry{{Name: "w", DType: tensor.Float32, Shape: wb.Shape()}}
		data := [][]byte{tensor.HostBytes(wb)}
		idx.Tensors["w"].Boxes = append(idx.Tensors["w"].Boxes, ckpt.Box{File: name, Offset: []int{0, lo}, Shape: wb.Shape()})
		if p == 0 {
			entries = append(entries, ckpt.Entry{Name: "b", DType: tensor.Float32, Shape: []int{rows}})
			data = append(data, tensor.HostBytes(b))
			idx.Tensors["b"].Boxes = []ckpt.Box{{File: name, Offset: []int{0}, Shape: []int{rows}}}
		}
		info, err := ckpt.WriteFile(ckpt.OS, filepath.Join(tmp, name), entries, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		idx.Files[name] = info
	}
	if err := ckpt.Commit(ckpt.OS, root, idx, 2); err != nil {
		t.Fatal(err)
	}
	return w, b
}

// TestReshard: a tensor saved in 4 column boxes reads back as any box (3-way
// uneven splits, rows, a single element, the whole), exactly.
func TestReshard(t *testing.T) {
	root := t.TempDir()
	rows, cols := 300, 1000 // > one checksum block per file
	w, b := write(t, root, 7, rows, cols, 4)
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	if c.Index.Step != 7 || c.Dir != ckpt.StepDir(root, 7) {
		t.Fatalf("opened %s step %d", c.Dir, c.Index.Step)
	}
	for _, bx := range [][2][]int{
		{{0, 0}, {rows, 334}}, {{0, 334}, {rows, 333}}, {{0, 667}, {rows, 333}},
		{{100, 0}, {50, cols}}, {{299, 999}, {1, 1}}, {{0, 0}, {rows, cols}}, {{7, 240}, {3, 30}},
	} {
		got := tensor.New(tensor.Float32, bx[1]...)
		if err := c.Read("w", bx[0], bx[1], tensor.HostBytes(got)); err != nil {
			t.Fatal(err)
		}
		if want := box(w, bx[0], bx[1]); !bytes.Equal(tensor.HostBytes(got), tensor.HostBytes(want)) {
			t.Fatalf("box %v: wrong values", bx)
		}
	}
	gotB, err := c.ReadAll("b")
	if err != nil || !bytes.Equal(tensor.HostBytes(gotB), tensor.HostBytes(b)) {
		t.Fatalf("b: %v", err)
	}
	if err := c.Verify(); err != nil {
		t.Fatal(err)
	}
	if err := c.Expect("w", []int{rows, cols}, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	if err := c.Expect("w", []int{rows, cols + 1}, tensor.Float32); !errors.Is(err, ckpt.ErrMismatch) {
		t.Fatalf("wrong shape accepted: %v", err)
	}
	// Keep 2: a third checkpoint removes the first.
	write(t, root, 8, 4, 4, 2)
	write(t, root, 9, 4, 4, 1)
	if steps, _ := ckpt.Steps(ckpt.OS, root); fmt.Sprint(steps) != "[8 9]" {
		t.Fatalf("steps %v", steps)
	}
}

// TestCorruption: every kind of damage is an error naming the file (and the
// tensor where one is concerned), found before data is used.
func TestCorruption(t *testing.T) {
	rows, cols := 300, 1000
	file := func(root string) string { return filepath.Join(ckpt.StepDir(root, 1), "rank-00001.safetensors") }
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, root string)
		kind   error
		want   string
		onRead bool // found by the read of the data, not by Open
	}{
		{"flipped data byte", func(t *testing.T, root string) { ckpttest.FlipByte(t, file(root), -1000) }, ckpt.ErrCorrupt, `tensor "w": block`, true},
		{"flipped header byte", func(t *testing.T, root string) { ckpttest.FlipByte(t, file(root), 20) }, ckpt.ErrFormat, "rank-00001.safetensors", false},
		{"truncated", func(t *testing.T, root string) {
			st, _ := os.Stat(file(root))
			os.Truncate(file(root), st.Size()-5)
		}, ckpt.ErrFormat, "truncated", false},
		{"missing file", func(t *testing.T, root string) { os.Remove(file(root)) }, ckpt.ErrFormat, "file missing", false},
		{"bad index", func(t *testing.T, root string) {
			os.WriteFile(filepath.Join(ckpt.StepDir(root, 1), ckpt.IndexFile), []byte("{"), 0o644)
		}, ckpt.ErrFormat, "index.json", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, 1, rows, cols, 4)
			tc.damage(t, root)
			c, err := ckpt.Open(ckpt.OS, root)
			if tc.onRead {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				err = c.Read("w", []int{0, 0}, []int{rows, cols}, make([]byte, rows*cols*4))
			}
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v naming %q", err, tc.kind, tc.want)
			}
			t.Log(err)
			if tc.onRead {
				// The whole-file check (ckpt inspect) names the tensor and block too.
				if err := c.Verify(); !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("verify: got %v, want %v naming %q", err, tc.kind, tc.want)
				}
			}
		})
	}
	// A folder whose only save never finished holds no checkpoint.
	root := t.TempDir()
	os.MkdirAll(ckpt.TempDir(root, 3), 0o755)
	if _, err := ckpt.Open(ckpt.OS, root); !errors.Is(err, ckpt.ErrNone) {
		t.Fatalf("unfinished save taken for a checkpoint: %v", err)
	}
}

// TestPlainSafetensors: a single safetensors file opens as a checkpoint.
func TestPlainSafetensors(t *testing.T) {
	name := filepath.Join(t.TempDir(), "model.safetensors")
	x, y := global(3, 4), global(5)
	y16, _ := tensor.Convert(y, tensor.BFloat16)
	_, err := ckpt.WriteFile(ckpt.OS, name, []ckpt.Entry{{Name: "x", DType: tensor.Float32, Shape: []int{3, 4}}, {Name: "y", DType: tensor.BFloat16, Shape: []int{5}}},
		[][]byte{tensor.HostBytes(x), tensor.HostBytes(y16)}, map[string]string{"by": "test"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ckpt.Open(ckpt.OS, name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadAll("y")
	if err != nil || got.DType() != tensor.BFloat16 || got.At(4) != 4 {
		t.Fatalf("y: %v %v", got, err)
	}
	if c.Index.Meta["by"] != "test" || fmt.Sprint(c.Names()) != "[x y]" {
		t.Fatalf("meta %v names %v", c.Index.Meta, c.Names())
	}
}

func FuzzReadHeader(f *testing.F) {
	hdr, _ := ckpt.EncodeHeader([]ckpt.Entry{{Name: "a", DType: tensor.Float32, Shape: []int{2, 2}}}, map[string]string{"k": "v"})
	f.Add(append(hdr, make([]byte, 16)...))
	f.Add([]byte("\x02\x00\x00\x00\x00\x00\x00\x00{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ckpt.ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		var end int64
		for _, e := range h.Entries {
			end = max(end, e.End)
		}
		if h.DataStart+end != int64(len(b)) {
			t.Fatalf("accepted a header whose tensors end at %d in %d bytes", h.DataStart+end, len(b))
		}
	})
}

// TestBlockReads: boxes of several blocks that start off the block grid read
// back exactly; damage in a middle block is found by the reads that touch it,
// and only by them.
func TestBlockReads(t *testing.T) {
	root := t.TempDir()
	rows, cols := 2048, 700 // 2.7 MiB a file box: whole blocks in the middle
	g := global(rows, cols)
	tmp := ckpt.TempDir(root, 1)
	os.MkdirAll(tmp, 0o755)
	idx := &ckpt.Index{Step: 1, Tensors: map[string]*ckpt.TensorInfo{"w": {Shape: []int{rows, cols}, DType: "float32"}}, Files: map[string]*ckpt.FileInfo{}}
	for p := 0; p < 2; p++ {
		name := fmt.Sprintf("rank-%05d.safetensors", p)
		small := fmt.Sprintf("s%d", p) // first in the file: w starts off the block grid
		lo := p * rows / 2
		bx := box(g, []int{lo, 0}, []int{rows / 2, cols})
		info, err := ckpt.WriteFile(ckpt.OS, filepath.Join(tmp, name),
			[]ckpt.Entry{{Name: small, DType: tensor.Float32, Shape: []int{3}}, {Name: "w", DType: tensor.Float32, Shape: bx.Shape()}},
			[][]byte{tensor.HostBytes(global(3)), tensor.HostBytes(bx)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		idx.Files[name] = info
		idx.Tensors["w"].Boxes = append(idx.Tensors["w"].Boxes, ckpt.Box{File: name, Offset: []int{lo, 0}, Shape: bx.Shape()})
		idx.Tensors[small] = &ckpt.TensorInfo{Shape: []int{3}, DType: "float32", Boxes: []ckpt.Box{{File: name, Offset: []int{0}, Shape: []int{3}}}}
	}
	if err := ckpt.Commit(ckpt.OS, root, idx, 0); err != nil {
		t.Fatal(err)
	}
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int{{0, rows}, {500, 1000}, {1023, 2}, {1500, 548}} {
		got := tensor.New(tensor.Float32, r[1], cols)
		if err := c.Read("w", []int{r[0], 0}, []int{r[1], cols}, tensor.HostBytes(got)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tensor.HostBytes(got), tensor.HostBytes(box(g, []int{r[0], 0}, []int{r[1], cols}))) {
			t.Fatalf("rows %v: wrong values", r)
		}
	}
	// Damage block 1 of rank 1's file (rows of w near its middle).
	name := filepath.Join(ckpt.StepDir(root, 1), "rank-00001.safetensors")
	hdrLen := int64(8)
	b, _ := os.ReadFile(name)
	for i := 0; i < 8; i++ {
		hdrLen += int64(b[i]) << (8 * i)
	}
	b[hdrLen+ckpt.BlockSize+100] ^= 1
	os.WriteFile(name, b, 0o644)
	c, _ = ckpt.Open(ckpt.OS, root)
	// Block 1 holds bytes [1 MiB, 2 MiB) of the data: w's rows from about
	// 1024 + 374 to 1024 + 749.
	if err := c.Read("w", []int{1024, 0}, []int{1024, cols}, make([]byte, 1024*cols*4)); !errors.Is(err, ckpt.ErrCorrupt) || !strings.Contains(err.Error(), "block 1") {
		t.Fatalf("damaged block read: %v", err)
	}
	if err := c.Read("w", []int{1024, 0}, []int{300, cols}, make([]byte, 300*cols*4)); err != nil {
		t.Fatalf("a read that does not touch the damaged block: %v", err)
	}
}

// TestConvert: ckpt convert's file opens as a checkpoint holding every
// tensor with the dtype, shape and bytes saved (the Go side of
// TestConvertReadByPython, which needs numpy): a float32 matrix saved in
// four column boxes and a vector; bfloat16, float64 and float32 tensors of
// one to three dims saved in row boxes.
func TestConvert(t *testing.T) {
	root1, root2 := t.TempDir(), t.TempDir()
	w, b := write(t, root1, 3, 30, 50, 4)
	for _, tc := range []struct {
		root string
		want map[string]*tensor.Tensor
	}{{root1, map[string]*tensor.Tensor{"w": w, "b": b}}, {root2, writeMixed(t, root2)}} {
		c, err := ckpt.Open(ckpt.OS, tc.root)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "model.safetensors")
		if _, err := ckpt.Convert(ckpt.OS, c, dst, map[string]string{"step": "3"}); err != nil {
			t.Fatal(err)
		}
		got, err := ckpt.Open(ckpt.OS, dst)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Names()) != len(tc.want) || got.Index.Meta["step"] != "3" {
			t.Fatalf("converted: tensors %v, metadata %v", got.Names(), got.Index.Meta)
		}
		for name, x := range tc.want {
			if err := got.Expect(name, x.Shape(), x.DType()); err != nil {
				t.Fatal(err)
			}
			y, err := got.ReadAll(name)
			if err != nil || !bytes.Equal(tensor.HostBytes(y), tensor.HostBytes(x)) {
				t.Fatalf("%s: wrong bytes (%v)", name, err)
			}
		}
	}
}
