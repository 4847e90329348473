package launch

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/tensor"
)

// writeCkpt writes a checkpoint of step 4: "w" [4 6] split in two files.
func writeCkpt(t *testing.T, root string) {
	t.Helper()
	tmp := ckpt.TempDir(root, 4)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	idx := &ckpt.Index{Step: 4, Mesh: "tp=2", Tensors: map[string]*ckpt.TensorInfo{"w": {Shape: []int{4, 6}, DType: "float32", Placements: "[S(0)]"}}, Files: map[string]*ckpt.FileInfo{}}
	for r := 0; r < 2; r++ {
		h := tensor.New(tensor.Float32, 2, 6)
		for i := range h.Float32() {
			h.Float32()[i] = float32(12*r + i)
		}
		name := []string{"rank-00000.safetensors", "rank-00001.safetensors"}[r]
		info, err := ckpt.WriteFile(ckpt.OS, filepath.Join(tmp, name), []ckpt.Entry{{Name: "w", DType: tensor.Float32, Shape: []int{2, 6}}}, [][]byte{tensor.HostBytes(h)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		idx.Files[name] = info
		idx.Tensors["w"].Boxes = append(idx.Tensors["w"].Boxes, ckpt.Box{File: name, Offset: []int{2 * r, 0}, Shape: []int{2, 6}})
	}
	if err := ckpt.Commit(ckpt.OS, root, idx, 0); err != nil {
		t.Fatal(err)
	}
}

func TestCkptInspectConvert(t *testing.T) {
	root := t.TempDir()
	writeCkpt(t, root)
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"ckpt", "inspect", root}, &out, &errb); code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"step 4", `mesh "tp=2"`, "w ", "[4 6]", "[S(0)]", "rank-00001.safetensors: [2 0]+[2 6]", "verified"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect lacks %q:\n%s", want, out.String())
		}
	}
	file := filepath.Join(t.TempDir(), "w.safetensors")
	out.Reset()
	if code := Main(context.Background(), []string{"ckpt", "convert", root, "--to", file}, &out, &errb); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errb.String())
	}
	c, err := ckpt.Open(ckpt.OS, file)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.ReadAll("w")
	if err != nil || w.At(23) != 23 || c.Index.Step != 4 {
		t.Fatalf("converted: %v step %d", err, c.Index.Step)
	}
	// Damage is refused with exit 2, naming the file.
	name := filepath.Join(ckpt.StepDir(root, 4), "rank-00000.safetensors")
	b, _ := os.ReadFile(name)
	b[len(b)-1] ^= 1
	os.WriteFile(name, b, 0o644)
	errb.Reset()
	if code := Main(context.Background(), []string{"ckpt", "inspect", root}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "rank-00000.safetensors: tensor \"w\": block 0") {
		t.Fatalf("damaged: exit %d: %s", code, errb.String())
	}
	if code := Main(context.Background(), []string{"ckpt", "convert", root}, &out, &errb); code != ExitUsage {
		t.Fatalf("convert without --to: exit %d", code)
	}
}
