package ckpt_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/tensor"
)

// python returns an interpreter with numpy: $MESHRUN_PYTHON, else
// /usr/bin/python3, else python3. It skips the test when none has numpy,
// unless MESHRUN_REQUIRE_PYTHON is set (CI sets it, after installing numpy).
func python(t *testing.T) string {
	for _, p := range []string{os.Getenv("MESHRUN_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if err := exec.Command(p, "-c", "import numpy").Run(); err == nil {
			return p
		}
	}
	if os.Getenv("MESHRUN_REQUIRE_PYTHON") != "" {
		t.Fatal("no python3 with numpy, and MESHRUN_REQUIRE_PYTHON is set")
	}
	t.Skip("no python3 with numpy")
	return ""
}

// TestConvertReadByPython: a checkpoint converted to one safetensors file reads
// in an independent reader (json and numpy, no meshrun code) with the values
// meshrun wrote.
func TestConvertReadByPython(t *testing.T) {
	py := python(t)
	root := t.TempDir()
	w, b := write(t, root, 3, 30, 50, 4)
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "model.safetensors")
	if _, err := ckpt.Convert(ckpt.OS, c, dst, map[string]string{"step": "3"}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "testdata/read_safetensors.py", dst).Output()
	if err != nil {
		t.Fatalf("%s: %v", py, err)
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
	for name, want := range map[string]*tensor.Tensor{"w": w, "b": b} {
		g, ok := got.Tensors[name]
		if !ok || g.DType != "F32" || len(g.Values) != want.Len() {
			t.Fatalf("%s: read %+v", name, g)
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
