// Package deploy holds the files that run meshrun beyond one machine:
// container images, Kubernetes manifests and Slurm batch scripts. Its tests
// read them and check the fields a run depends on; k8s_test.go decodes the
// manifests strictly into the Kubernetes API types.
package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSlurm checks every slurm/*.sbatch: one launcher per node through srun.
// The CPU script asks for CPUs, one rank each, and no GPU; only the CUDA
// script asks for GPUs, as many per node as it starts ranks.
func TestSlurm(t *testing.T) {
	files, err := filepath.Glob("slurm/*.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			s := string(data)
			for _, want := range []string{"#SBATCH --nodes=", "--ntasks-per-node=1", "srun", "--node-rank \"$SLURM_NODEID\"", "--nnodes \"$SLURM_NNODES\"", "MESHRUN_NATS", "MESHRUN_NATS_CREDS", "MESHRUN_JOB_ID"} {
				if !strings.Contains(s, want) {
					t.Errorf("sbatch script lacks %q", want)
				}
			}
			var sbatch []string
			for _, l := range strings.Split(s, "\n") {
				if strings.HasPrefix(l, "#SBATCH ") {
					sbatch = append(sbatch, l)
				}
			}
			directives := strings.Join(sbatch, "\n")
			switch {
			case strings.Contains(s, "--device cuda"):
				seen["cuda"] = true
				gres := regexp.MustCompile(`(?m)^#SBATCH --gres=gpu:(\d+)$`).FindStringSubmatch(s)
				ranks := regexp.MustCompile(`--nproc-per-node (\d+)`).FindStringSubmatch(s)
				if gres == nil || ranks == nil || gres[1] != ranks[1] {
					t.Errorf("want #SBATCH --gres=gpu:N and --nproc-per-node N alike, got %v and %v", gres, ranks)
				}
			case strings.Contains(s, "--device cpu") || strings.Contains(s, "--device sim"):
				seen["cpu"] = true
				if strings.Contains(strings.ToLower(directives), "gpu") || strings.Contains(directives, "--gres") {
					t.Errorf("the CPU script asks for GPUs:\n%s", directives)
				}
				if !regexp.MustCompile(`(?m)^#SBATCH --cpus-per-task=\d+$`).MatchString(s) ||
					!strings.Contains(s, `--nproc-per-node "$SLURM_CPUS_PER_TASK"`) {
					t.Errorf("want #SBATCH --cpus-per-task=N and one rank per CPU (--nproc-per-node \"$SLURM_CPUS_PER_TASK\")")
				}
			default:
				t.Errorf("no --device cpu, sim or cuda")
			}
		})
	}
	if !seen["cpu"] || !seen["cuda"] {
		t.Errorf("want a CPU script and a CUDA script among %v, got %v", files, seen)
	}
}

func TestDockerfiles(t *testing.T) {
	for _, f := range []string{"Dockerfile", "Dockerfile.cuda"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(data)
		if strings.Count(s, "\nFROM ") < 2 || !strings.Contains(s, "./cmd/launcher ./cmd/worker") || !strings.Contains(s, "ENTRYPOINT") {
			t.Errorf("%s: want a multi-stage build of launcher and worker", f)
		}
		if f == "Dockerfile.cuda" && (!strings.Contains(s, "-tags cuda") || !strings.Contains(s, "nvidia/cuda:")) {
			t.Errorf("%s: want -tags cuda on an official CUDA image", f)
		}
		if f == "Dockerfile.cuda" && !regexp.MustCompile(`(?m)^ARG CUDA_VERSION=11\.`).MatchString(s) {
			t.Errorf("%s: want CUDA 11 (ARG CUDA_VERSION=11.x): gorgonia.org/cu v0.9.6 does not compile against CUDA 12 headers", f)
		}
		if f == "Dockerfile" && (strings.Contains(s, "-tags") || strings.Contains(s, "nvidia")) {
			t.Errorf("%s: the CPU image is a plain build, no CUDA", f)
		}
	}
	if _, err := os.Stat(filepath.Join("..", "go.sum")); err != nil {
		t.Errorf("the images copy go.sum: %v", err)
	}
}
