// Package deploy holds the files that run meshrun beyond one machine:
// container images, Kubernetes manifests and a Slurm batch script. Its test
// decodes them and checks the fields a run depends on.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// docs decodes every YAML document of a file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
	return out
}

// get walks a decoded document: get(d, "spec", "template", "spec").
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a map at %q", path, k)
			}
			v, ok = m[k]
			if !ok {
				t.Fatalf("%v: no field %q", path, k)
			}
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				t.Fatalf("%v: no item %d", path, k)
			}
			v = s[k]
		}
	}
	return v
}

func byKind(t *testing.T, ds []map[string]any, kind string) map[string]any {
	t.Helper()
	for _, d := range ds {
		if d["kind"] == kind {
			for _, f := range []string{"apiVersion", "metadata"} {
				get(t, d, f)
			}
			return d
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}

func TestNATSCluster(t *testing.T) {
	ds := docs(t, "k8s/nats.yaml")
	ss := byKind(t, ds, "StatefulSet")
	if get(t, ss, "spec", "replicas") != 3 {
		t.Fatalf("replicas %v", get(t, ss, "spec", "replicas"))
	}
	conf := get(t, byKind(t, ds, "ConfigMap"), "data", "nats.conf").(string)
	for _, want := range []string{"routes", "jetstream", "tls", "cluster", "include ./auth/auth.conf",
		"nats-0.nats-cluster", "nats-1.nats-cluster", "nats-2.nats-cluster"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nats.conf lacks %q", want)
		}
	}
	if strings.Contains(conf, "no_auth_user") || strings.Contains(conf, "authorization: {}") {
		t.Error("nats.conf must not admit clients without credentials")
	}
}

// TestJobs checks every k8s/job-*.yaml: an Indexed Job of launchers, one per
// node. The CPU image asks for CPUs (one rank each) and no GPU; only the CUDA
// image asks for GPUs, one per rank, and runs --device=cuda.
func TestJobs(t *testing.T) {
	files, err := filepath.Glob("k8s/job-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			job := byKind(t, docs(t, f), "Job")
			spec := get(t, job, "spec").(map[string]any)
			if spec["completionMode"] != "Indexed" || spec["completions"] != spec["parallelism"] {
				t.Fatalf("want an Indexed Job with completions = parallelism: %v", spec)
			}
			c := get(t, spec, "template", "spec", "containers", 0)
			argv := toStrings(get(t, c, "args"))
			args := strings.Join(argv, " ")
			for _, want := range []string{"run", "--node-rank=$(JOB_COMPLETION_INDEX)", "--nats=tls://", "--nats-creds=", "--job-id=", "--log-dir=/runs"} {
				if !strings.Contains(args, want) {
					t.Errorf("launcher args lack %q: %s", want, args)
				}
			}
			if flagValue(argv, "--nnodes") != itoa(spec["completions"]) {
				t.Errorf("--nnodes %q differs from completions %v", flagValue(argv, "--nnodes"), spec["completions"])
			}
			env := map[string]any{}
			for _, e := range get(t, c, "env").([]any) {
				m := e.(map[string]any)
				env[m["name"].(string)] = m
			}
			idx := get(t, env["JOB_COMPLETION_INDEX"], "valueFrom", "fieldRef", "fieldPath")
			if idx != "metadata.annotations['batch.kubernetes.io/job-completion-index']" {
				t.Errorf("node rank from %v", idx)
			}
			vols := map[string]map[string]any{}
			for _, v := range get(t, spec, "template", "spec", "volumes").([]any) {
				m := v.(map[string]any)
				vols[m["name"].(string)] = m
			}
			if get(t, vols["creds"], "secret", "secretName") == "" || vols["runs"]["persistentVolumeClaim"] == nil {
				t.Errorf("credentials from a Secret and logs to a volume: %v", vols)
			}

			ranks, err := strconv.Atoi(flagValue(argv, "--nproc-per-node"))
			if err != nil || ranks < 1 {
				t.Fatalf("--nproc-per-node %q: want the number of ranks per pod, to match the resources asked for", flagValue(argv, "--nproc-per-node"))
			}
			res := get(t, c, "resources").(map[string]any)
			image := get(t, c, "image").(string)
			device := flagValue(argv, "--device")
			switch {
			case strings.HasSuffix(image, ":cuda"):
				seen["cuda"] = true
				if device != "cuda" {
					t.Errorf("the CUDA image runs --device=%q, want cuda", device)
				}
				if gpus := get(t, res, "limits", "nvidia.com/gpu"); gpus != ranks {
					t.Errorf("nvidia.com/gpu limit %v, want one GPU per rank: %d (--nproc-per-node)", gpus, ranks)
				}
			case strings.HasSuffix(image, ":cpu"):
				seen["cpu"] = true
				if device != "cpu" && device != "sim" {
					t.Errorf("the CPU image runs --device=%q, want cpu or sim", device)
				}
				for _, kind := range []string{"requests", "limits"} {
					m, _ := res[kind].(map[string]any)
					for name := range m {
						if strings.Contains(strings.ToLower(name), "gpu") {
							t.Errorf("the CPU image asks for a GPU: resources.%s.%s", kind, name)
						}
					}
				}
				if cpus := cpuCount(t, get(t, res, "requests", "cpu")); cpus != ranks {
					t.Errorf("cpu request %d, want one CPU per rank: %d (--nproc-per-node)", cpus, ranks)
				}
			default:
				t.Errorf("image %q: want meshrun:cpu or meshrun:cuda", image)
			}
		})
	}
	if !seen["cpu"] || !seen["cuda"] {
		t.Errorf("want a CPU job and a CUDA job among %v, got %v", files, seen)
	}
}

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

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// flagValue is the value of --name=VALUE in args, "" when absent.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// cpuCount reads a whole-CPU quantity: 8, "8" or "8000m".
func cpuCount(t *testing.T, v any) int {
	t.Helper()
	switch q := v.(type) {
	case int:
		return q
	case string:
		if m, ok := strings.CutSuffix(q, "m"); ok {
			if n, err := strconv.Atoi(m); err == nil && n%1000 == 0 {
				return n / 1000
			}
		} else if n, err := strconv.Atoi(q); err == nil {
			return n
		}
	}
	t.Fatalf("cpu quantity %v: want whole CPUs", v)
	return 0
}

func itoa(v any) string {
	n, _ := v.(int)
	return strconv.Itoa(n)
}
