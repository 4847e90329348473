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

func TestJob(t *testing.T) {
	ds := docs(t, "k8s/job.yaml")
	job := byKind(t, ds, "Job")
	spec := get(t, job, "spec").(map[string]any)
	if spec["completionMode"] != "Indexed" || spec["completions"] != spec["parallelism"] {
		t.Fatalf("want an Indexed Job with completions = parallelism: %v", spec)
	}
	c := get(t, spec, "template", "spec", "containers", 0)
	args := strings.Join(toStrings(get(t, c, "args")), " ")
	for _, want := range []string{"run", "--nnodes=2", "--node-rank=$(JOB_COMPLETION_INDEX)", "--nats=tls://", "--nats-creds=", "--job-id=", "--log-dir=/runs", "--device=cuda"} {
		if !strings.Contains(args, want) {
			t.Errorf("launcher args lack %q: %s", want, args)
		}
	}
	if !strings.Contains(args, "--nnodes="+itoa(spec["completions"])) {
		t.Errorf("--nnodes differs from completions %v", spec["completions"])
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
	if get(t, c, "resources", "limits", "nvidia.com/gpu") == nil {
		t.Error("no GPUs requested")
	}
	vols := map[string]map[string]any{}
	for _, v := range get(t, spec, "template", "spec", "volumes").([]any) {
		m := v.(map[string]any)
		vols[m["name"].(string)] = m
	}
	if get(t, vols["creds"], "secret", "secretName") == "" || vols["runs"]["persistentVolumeClaim"] == nil {
		t.Errorf("credentials from a Secret and logs to a volume: %v", vols)
	}
}

func TestSlurm(t *testing.T) {
	data, err := os.ReadFile("slurm/meshrun.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for _, want := range []string{"#SBATCH --nodes=", "--ntasks-per-node=1", "srun", "--node-rank \"$SLURM_NODEID\"", "--nnodes \"$SLURM_NNODES\"", "MESHRUN_NATS", "MESHRUN_NATS_CREDS", "MESHRUN_JOB_ID"} {
		if !strings.Contains(s, want) {
			t.Errorf("sbatch script lacks %q", want)
		}
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

func itoa(v any) string {
	n, _ := v.(int)
	return strconv.Itoa(n)
}
