package ckpt_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/internal/pythontest"
	"github.com/meshrun/meshrun/tensor"
)

// writeMixed saves one checkpoint of step 1 under root in two files: "h"
// bfloat16 [4, 3, 5] and "d" float64 [2, 7] split by rows between them, "v"
// float32 [9] whole in the second. It returns the global tensors.
func writeMixed(t *testing.T, root string) map[string]*tensor.Tensor {
	t.Helper()
	h, d, v := tensor.New(tensor.BFloat16, 4, 3, 5), tensor.New(tensor.Float64, 2, 7), tensor.New(tensor.Float32, 9)
	for i := range h.BFloat16() {
		h.BFloat16()[i] = tensor.ToBF16(float32(i - 30)) // integers: exact
	}
	for i := range d.Float64() {
		d.Float64()[i] = float64(i) / 3
	}
	for i := range v.Float32() {
		v.Float32()[i] = float32(i) / 7
	}
	all := map[string]*tensor.Tensor{"h": h, "d": d, "v": v}
	tmp := ckpt.TempDir(root, 1)
	if err := ckpt.OS.MkdirAll(tmp); err != nil {
		t.Fatal(err)
	}
	idx := &ckpt.Index{Step: 1, Mesh: "2", Tensors: map[string]*ckpt.TensorInfo{}, Files: map[string]*ckpt.FileInfo{}}
	for _, name := range []string{"h", "d", "v"} {
		x := all[name]
		idx.Tensors[name] = &ckpt.TensorInfo{Shape: x.Shape(), DType: x.DType().String(), Placements: "[S(0)]"}
	}
	idx.Tensors["v"].Placements = "[R]"
	for p := 0; p < 2; p++ {
		file := fmt.Sprintf("rank-%05d.safetensors", p)
		var entries []ckpt.Entry
		var data [][]byte
		for _, name := range []string{"h", "d"} {
			x := all[name]
			rows := x.Dim(0)
			lo, hi := p*rows/2, (p+1)*rows/2
			shape := append([]int{hi - lo}, x.Shape()[1:]...)
			rowBytes := len(tensor.HostBytes(x)) / rows
			entries = append(entries, ckpt.Entry{Name: name, DType: x.DType(), Shape: shape})
			data = append(data, tensor.HostBytes(x)[lo*rowBytes:hi*rowBytes])
			off := make([]int, len(shape))
			off[0] = lo
			idx.Tensors[name].Boxes = append(idx.Tensors[name].Boxes, ckpt.Box{File: file, Offset: off, Shape: shape})
		}
		if p == 1 {
			entries = append(entries, ckpt.Entry{Name: "v", DType: tensor.Float32, Shape: v.Shape()})
			data = append(data, tensor.HostBytes(v))
			idx.Tensors["v"].Boxes = []ckpt.Box{{File: file, Offset: []int{0}, Shape: v.Shape()}}
		}
		info, err := ckpt.WriteFile(ckpt.OS, filepath.Join(tmp, file), entries, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		idx.Files[file] = info
	}
	if err := ckpt.Commit(ckpt.OS, root, idx, 0); err != nil {
		t.Fatal(err)
	}
	return all
}

// safetensorsDType is the safetensors name of each dtype, from the format's
// own list (not from package ckpt).
var safetensorsDType = map[tensor.DType]string{tensor.Float32: "F32", tensor.Float64: "F64", tensor.BFloat16: "BF16"}

// TestConvertReadByPython: a checkpoint converted to one safetensors file reads
// in an independent reader (json and numpy, no meshrun code) with the dtype,
// the shape and the values of every tensor meshrun wrote: a float32 matrix
// saved in four column boxes and a vector; bfloat16, float64 and float32
// tensors of one to three dims saved in row boxes.
func TestConvertReadByPython(t *testing.T) {
	py := pythontest.Python(t, "numpy", "MESHRUN_REQUIRE_PYTHON")
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
		out, err := exec.Command(py, "testdata/read_safetensors.py", dst).Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("%s: %v\n%s", py, err, msg)
		}
		var got struct {
			Tensors map[string]struct {
				DType  string    `json:"dtype"`
				Shape  []int     `json:"shape"`
				Values []float64 `json:"values"`
			} `json:"tensors"`
			Metadata map[string]string `json:"metadata"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(got.Tensors) != len(tc.want) {
			t.Errorf("read %d tensors, wrote %d", len(got.Tensors), len(tc.want))
		}
		for name, want := range tc.want {
			g, ok := got.Tensors[name]
			if !ok {
				t.Fatalf("%s: not in the file", name)
			}
			if g.DType != safetensorsDType[want.DType()] || !slices.Equal(g.Shape, want.Shape()) || len(g.Values) != want.Len() {
				t.Fatalf("%s: read %s %v (%d values), wrote %s %v", name, g.DType, g.Shape, len(g.Values), safetensorsDType[want.DType()], want.Shape())
			}
			for i, v := range g.Values {
				if v != want.At(i) {
					t.Fatalf("%s[%d] = %v, wrote %v", name, i, v, want.At(i))
				}
			}
		}
		if got.Metadata["step"] != "3" {
			t.Fatalf("metadata %v", got.Metadata)
		}
	}
}
