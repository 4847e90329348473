package ptx

import (
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// ptxasSpills are the kernels allowed to spill registers, and why: a
// dk-dv block keeps a row of dK and of dV (2 × 64 floats) per thread, and
// ptxas (CUDA 11.8, sm_90) gives it 255 registers and about 190 bytes of
// spill stores. Any other kernel's spill fails TestPTXAssembles.
var ptxasSpills = map[string]bool{"attn_flash_dkv_f32": true, "attn_flash_dkv_bf16": true}

// TestPTXAssembles: NVIDIA's own assembler (ptxas, from Debian's CUDA 11.8
// toolkit; MESHRUN_PTXAS names it, .ci/checks.d/cuda.sh fetches it) takes
// the embedded PTX for sm_80 (the target it is written for) and sm_90 (the
// H100 and H200, which the driver compiles it for at load), so a GPU
// machine will load every kernel of it, not fail the whole module on one
// (static shared memory over 48 KiB is one of ptxas's errors), and no
// kernel spills but those ptxasSpills names. Registers need no check: a
// thread has at most 255, and no launch has a block of over 256 threads
// (ptx.BlockThreads, LayerNormThreads, FlashQ, FlashRows), 65,536 in all.
func TestPTXAssembles(t *testing.T) {
	ptxas := os.Getenv("MESHRUN_PTXAS")
	if ptxas == "" {
		ptxas = filepath.Join("..", "..", "..", ".cache", "cuda", "toolkit", "usr", "bin", "ptxas")
	}
	if _, err := os.Stat(ptxas); err != nil {
		t.Skipf("no ptxas (%v): .ci/checks.d/cuda.sh fetches it", err)
	}
	for _, threads := range []int{BlockThreads, LayerNormThreads, FlashQ, FlashRows} {
		if threads > 256 {
			t.Fatalf("a block of %d threads: 255 registers a thread would be over a block's 65,536", threads)
		}
	}
	entry := regexp.MustCompile(`Compiling entry function '(\w+)' for '(sm_\d+)'`)
	spill := regexp.MustCompile(`(\d+) bytes spill stores, (\d+) bytes spill loads`)
	used := regexp.MustCompile(`Used (\d+) registers(?:, (\d+) bytes smem)?`)
	for _, arch := range []string{"sm_80", "sm_90"} {
		out, err := exec.Command(ptxas, "-arch="+arch, "-v", "kernels.ptx", "-o", filepath.Join(t.TempDir(), "k.cubin")).CombinedOutput()
		if err != nil {
			t.Fatalf("ptxas -arch=%s: %v\n%s", arch, err, out)
		}
		entries, usages, kernel := 0, 0, ""
		for _, line := range strings.Split(string(out), "\n") {
			if m := entry.FindStringSubmatch(line); m != nil {
				kernel, entries = m[1], entries+1
				continue
			}
			if m := spill.FindStringSubmatch(line); m != nil && (m[1] != "0" || m[2] != "0") {
				if !ptxasSpills[kernel] {
					t.Errorf("%s %s: %s", arch, kernel, strings.TrimSpace(line))
				}
				t.Logf("%s %s: %s", arch, kernel, strings.TrimSpace(line))
			}
			if m := used.FindStringSubmatch(line); m != nil {
				usages++
				t.Logf("%s %s: %s registers, %s bytes of shared memory", arch, kernel, m[1], cmp.Or(m[2], "0"))
			}
		}
		if want := strings.Count(PTX, ".visible .entry "); entries != want || usages != want {
			t.Errorf("%s: ptxas compiled %d kernels and reported the resources of %d, the PTX has %d", arch, entries, usages, want)
		}
	}
}
