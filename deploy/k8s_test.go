package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/meshrun/meshrun/internal/deps"
)

// scheme knows the kinds deploy/k8s holds. A document of any other kind does
// not decode: a new kind means registering its API group here.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strictDecoder decodes YAML or JSON into the Go type registered for the
// document's apiVersion and kind, failing on unknown, misspelled (also by
// case only) and duplicate fields, as the API server's strict field
// validation (kubectl apply --validate=strict, the default) does.
var strictDecoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// decode splits a multi-document YAML stream at its "---" lines and decodes
// every document strictly by its kind. Documents that hold only comments are
// skipped.
func decode(data []byte) ([]runtime.Object, error) {
	r := yamlutil.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if blank(doc) {
			continue
		}
		obj, _, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", n, kindOf(doc), err)
		}
		objs = append(objs, obj)
	}
}

func blank(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// kindOf names a document's apiVersion and kind for messages, read leniently.
func kindOf(doc []byte) string {
	var tm metav1.TypeMeta
	if j, err := yamlutil.ToJSON(doc); err != nil || json.Unmarshal(j, &tm) != nil || tm.Kind == "" {
		return "no kind"
	}
	return tm.APIVersion + " " + tm.Kind
}

func load(t *testing.T, path string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

// all returns the objects of one Go type, in file order.
func all[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	got := all[T](objs)
	if len(got) != 1 {
		var zero T
		t.Fatalf("want one %T, found %d", zero, len(got))
	}
	return got[0]
}

func manifests(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s: %v", pattern, err)
	}
	return files
}

// TestManifestsDecodeStrictly decodes every document of every k8s/*.yaml into
// the official Kubernetes Go types, strictly, and checks what the API server
// would refuse before looking further: names, the namespace, and one object
// defined alike wherever it appears (kubectl apply of one file must not undo
// another).
func TestManifestsDecodeStrictly(t *testing.T) {
	type key struct{ kind, ns, name string }
	seen := map[key]runtime.Object{}
	where := map[key]string{}
	for _, f := range manifests(t, "k8s/*.yaml") {
		objs := load(t, f)
		if len(objs) == 0 {
			t.Errorf("%s: no objects", f)
		}
		for _, o := range objs {
			m, err := metaOf(o)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			kind := o.GetObjectKind().GroupVersionKind().Kind
			if m.GetNamespace() != "meshrun" {
				t.Errorf("%s: %s %s in namespace %q, want meshrun", f, kind, m.GetName(), m.GetNamespace())
			}
			valid := validation.IsDNS1123Subdomain
			if kind == "Service" {
				valid = validation.IsDNS1035Label
			}
			for _, msg := range valid(m.GetName()) {
				t.Errorf("%s: %s name %q: %s", f, kind, m.GetName(), msg)
			}
			k := key{kind, m.GetNamespace(), m.GetName()}
			if prev, ok := seen[k]; ok && !equality.Semantic.DeepEqual(prev, o) {
				t.Errorf("%s %s/%s differs between %s and %s", kind, m.GetNamespace(), m.GetName(), where[k], f)
			}
			seen[k], where[k] = o, f
		}
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	if m, ok := o.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("%T has no object metadata", o)
}

// TestStrictDecodingRejects shows that decode refuses what the API server
// refuses: each case edits a copy of k8s/job-cpu.yaml.
func TestStrictDecodingRejects(t *testing.T) {
	orig, err := os.ReadFile("k8s/job-cpu.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decode(orig); err != nil {
		t.Fatalf("the unedited copy: %v", err)
	}
	for _, tc := range []struct {
		name, old, new string
		want           []string // in the error
	}{
		{"misspelled field", "  completionMode: Indexed", "  completionMod: Indexed",
			[]string{"document 3 (batch/v1 Job)", `unknown field "spec.completionMod"`}},
		{"misspelled nested field", "            defaultMode: 0440", "            defaultMod: 0440",
			[]string{`unknown field "spec.template.spec.volumes[0].secret.defaultMod"`}},
		{"field in the wrong case", "      restartPolicy: Never", "      restartpolicy: Never",
			[]string{`unknown field "spec.template.spec.restartpolicy"`}},
		{"pod field on the Job", "  backoffLimit: 0\n", "  backoffLimit: 0\n  restartPolicy: Never\n",
			[]string{`unknown field "spec.restartPolicy"`}},
		{"duplicate field", "  parallelism: 2\n", "  parallelism: 2\n  parallelism: 3\n",
			[]string{`"parallelism"`, "already set"}},
		{"wrong type", "  completions: 2", "  completions: two",
			[]string{"document 3", "completions"}},
		{"unknown kind", "kind: Job\n", "kind: Jobs\n",
			[]string{`no kind "Jobs" is registered`}},
		{"misspelled kind of the Service", "kind: Service\n", "kind: service\n",
			[]string{"document 1", `"service"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tc.old)) {
				t.Fatalf("k8s/job-cpu.yaml no longer holds %q: update this case", tc.old)
			}
			edited := bytes.Replace(orig, []byte(tc.old), []byte(tc.new), 1)
			_, err := decode(edited)
			if err == nil {
				t.Fatalf("accepted %q in place of %q", tc.new, tc.old)
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestNATSCluster checks k8s/nats.yaml: a 3-server StatefulSet whose
// selector, governing Service, volumes and configuration agree.
func TestNATSCluster(t *testing.T) {
	objs := load(t, "k8s/nats.yaml")
	ss := one[*appsv1.StatefulSet](t, objs)
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 3 {
		t.Fatalf("replicas %v, want 3", ss.Spec.Replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(ss.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ss.Spec.Template.Labels)) {
		t.Errorf("selector %v must select the template's labels %v (%v)", ss.Spec.Selector, ss.Spec.Template.Labels, err)
	}
	services := map[string]*corev1.Service{}
	for _, s := range all[*corev1.Service](objs) {
		services[s.Name] = s
		if !labelsMatch(s.Spec.Selector, ss.Spec.Template.Labels) {
			t.Errorf("Service %s selects %v, not the servers (%v)", s.Name, s.Spec.Selector, ss.Spec.Template.Labels)
		}
	}
	if gov := services[ss.Spec.ServiceName]; gov == nil || gov.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("serviceName %q: want a headless Service of that name (the routes' DNS names)", ss.Spec.ServiceName)
	}
	if c := services["nats"]; c == nil || !hasPort(c, 4222) {
		t.Error("want Service nats with the client port 4222 (--nats=tls://nats.meshrun.svc:4222)")
	}
	checkPodSpec(t, &ss.Spec.Template.Spec, ss.Spec.VolumeClaimTemplates)

	cm := one[*corev1.ConfigMap](t, objs)
	conf := cm.Data["nats.conf"]
	for _, want := range []string{"routes", "jetstream", "tls", "cluster", "include ./auth/auth.conf",
		"nats-0.nats-cluster", "nats-1.nats-cluster", "nats-2.nats-cluster"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nats.conf lacks %q", want)
		}
	}
	if strings.Contains(conf, "no_auth_user") || strings.Contains(conf, "authorization: {}") {
		t.Error("nats.conf must not admit clients without credentials")
	}
	if vol := volume(&ss.Spec.Template.Spec, "config"); vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Errorf("volume config: want ConfigMap %s", cm.Name)
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func hasPort(s *corev1.Service, port int32) bool {
	for _, p := range s.Spec.Ports {
		if p.Port == port {
			return true
		}
	}
	return false
}

// checkPodSpec checks what the API server validates in any pod: container
// names, every volume mount naming a volume, environment variable names,
// downward API paths, port names.
func checkPodSpec(t *testing.T, spec *corev1.PodSpec, claims []corev1.PersistentVolumeClaim) {
	t.Helper()
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		vols[v.Name] = true
	}
	for _, c := range claims {
		vols[c.Name] = true
	}
	names := map[string]bool{}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if names[c.Name] {
			t.Errorf("container name %q used twice", c.Name)
		}
		names[c.Name] = true
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			t.Errorf("container name %q: %s", c.Name, msg)
		}
		if c.Image == "" {
			t.Errorf("container %s: no image", c.Name)
		}
		paths := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				t.Errorf("container %s mounts %q, which no volume defines", c.Name, m.Name)
			}
			if paths[m.MountPath] {
				t.Errorf("container %s mounts two volumes at %s", c.Name, m.MountPath)
			}
			paths[m.MountPath] = true
		}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				t.Errorf("container %s: env %q: %s", c.Name, e.Name, msg)
			}
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && !downwardEnvPath(e.ValueFrom.FieldRef.FieldPath) {
				t.Errorf("container %s: env %s from %q, which the downward API does not give environment variables", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		for _, p := range c.Ports {
			for _, msg := range validation.IsValidPortName(p.Name) {
				t.Errorf("container %s: port name %q: %s", c.Name, p.Name, msg)
			}
		}
	}
}

// downwardEnvPath reports whether the downward API fills an environment
// variable from path (the fieldRef paths the API server accepts for env).
func downwardEnvPath(path string) bool {
	switch path {
	case "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
		"status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs":
		return true
	}
	return regexp.MustCompile(`^metadata\.(labels|annotations)\['[^']+'\]$`).MatchString(path)
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// completionIndexAnnotation is where the Job controller puts an Indexed Job
// pod's index (also a label, and JOB_COMPLETION_INDEX in every container).
const completionIndexAnnotation = "batch.kubernetes.io/job-completion-index"

// TestJobs checks every k8s/job-*.yaml: an Indexed Job of launchers, one per
// node, whose completion index is the launcher's --node-rank and whose
// completions, parallelism and --nnodes agree. The CPU image asks for CPUs
// (one rank each, Guaranteed QoS) and no GPU; only the CUDA image asks for
// GPUs, one per rank, and runs --device=cuda.
func TestJobs(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range manifests(t, "k8s/job-*.yaml") {
		t.Run(f, func(t *testing.T) {
			objs := load(t, f)
			job := one[*batchv1.Job](t, objs)
			spec := &job.Spec.Template.Spec
			checkPodSpec(t, spec, nil)
			if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion {
				t.Errorf("completionMode %v, want Indexed (the index is the node rank)", job.Spec.CompletionMode)
			}
			if spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %q, want Never: a launcher that failed must not rejoin a job the others have ended", spec.RestartPolicy)
			}
			c := container(spec, "launcher")
			if c == nil {
				t.Fatal("no container named launcher")
			}
			argv := c.Args
			if len(argv) == 0 || argv[0] != "run" {
				t.Fatalf("launcher args %q: want launcher run ...", argv)
			}
			for _, want := range []string{"--nats=tls://", "--nats-creds=", "--nats-ca=", "--job-id=", "--log-dir=/runs/node-$(JOB_COMPLETION_INDEX)"} {
				if !slices.ContainsFunc(argv, func(a string) bool { return strings.HasPrefix(a, want) }) {
					t.Errorf("launcher args lack %s...: %q", want, argv)
				}
			}

			// One pod per node: completions = parallelism = --nnodes.
			nodes, err := strconv.Atoi(flagValue(argv, "--nnodes"))
			if err != nil || job.Spec.Completions == nil || job.Spec.Parallelism == nil ||
				int(*job.Spec.Completions) != nodes || int(*job.Spec.Parallelism) != nodes {
				t.Errorf("completions %v, parallelism %v and --nnodes %q must be one number", ptrStr(job.Spec.Completions), ptrStr(job.Spec.Parallelism), flagValue(argv, "--nnodes"))
			}

			// --node-rank=$(VAR), VAR the completion index.
			m := regexp.MustCompile(`^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$`).FindStringSubmatch(flagValue(argv, "--node-rank"))
			if m == nil {
				t.Fatalf("--node-rank=%q: want $(VAR), VAR holding the completion index", flagValue(argv, "--node-rank"))
			}
			if src := envSource(c, m[1]); src != "index" {
				t.Errorf("--node-rank=$(%s): %s", m[1], src)
			}
			if id := flagValue(argv, "--job-id"); strings.HasPrefix(id, "$(") {
				if v := envSource(c, strings.Trim(id, "$()")); v != "value" {
					t.Errorf("--job-id=%s: %s, want a fixed value (the NATS user's permissions name it)", id, v)
				}
			}

			// Peers reach each pod by its stable name: the pod's subdomain is a
			// headless Service of this file that selects the job's pods.
			if !headlessServiceFor(all[*corev1.Service](objs), spec.Subdomain, job.Name) {
				t.Errorf("subdomain %q: want a headless Service of that name selecting job-name=%s", spec.Subdomain, job.Name)
			}
			if v := volume(spec, "runs"); v == nil || v.PersistentVolumeClaim == nil {
				t.Error("logs (--log-dir=/runs) on a PersistentVolumeClaim, volume runs")
			} else if !slices.ContainsFunc(all[*corev1.PersistentVolumeClaim](objs), func(p *corev1.PersistentVolumeClaim) bool {
				return p.Name == v.PersistentVolumeClaim.ClaimName
			}) {
				t.Errorf("claim %s is not in %s", v.PersistentVolumeClaim.ClaimName, f)
			}

			ranks, err := strconv.Atoi(flagValue(argv, "--nproc-per-node"))
			if err != nil || ranks < 1 {
				t.Fatalf("--nproc-per-node %q: want the number of ranks per pod, to match the resources asked for", flagValue(argv, "--nproc-per-node"))
			}
			gpu := corev1.ResourceName("nvidia.com/gpu")
			device := flagValue(argv, "--device")
			switch {
			case strings.HasSuffix(c.Image, ":cuda"):
				seen["cuda"] = true
				if device != "cuda" {
					t.Errorf("the CUDA image runs --device=%q, want cuda", device)
				}
				if q, ok := c.Resources.Limits[gpu]; !ok || q.Value() != int64(ranks) {
					t.Errorf("nvidia.com/gpu limit %v, want one GPU per rank: %d (--nproc-per-node)", q.String(), ranks)
				}
				for _, o := range slices.Concat(spec.InitContainers, spec.Containers) {
					if o.Name != c.Name && hasGPU(o.Resources) {
						t.Errorf("container %s asks for a GPU: only the launcher's ranks use them", o.Name)
					}
				}
			case strings.HasSuffix(c.Image, ":cpu"):
				seen["cpu"] = true
				if device != "cpu" && device != "sim" {
					t.Errorf("the CPU image runs --device=%q, want cpu or sim", device)
				}
				for _, o := range slices.Concat(spec.InitContainers, spec.Containers) {
					if hasGPU(o.Resources) {
						t.Errorf("container %s of the CPU job asks for a GPU: %v", o.Name, o.Resources)
					}
				}
				cpu := c.Resources.Requests[corev1.ResourceCPU]
				if cpu.MilliValue()%1000 != 0 || cpu.Value() != int64(ranks) {
					t.Errorf("cpu request %s, want one whole CPU per rank: %d (--nproc-per-node)", cpu.String(), ranks)
				}
				// Guaranteed QoS (so the static CPU manager can pin the
				// launcher's CPUs) needs requests = limits for CPU and memory
				// in every container, init containers included.
				for _, o := range slices.Concat(spec.InitContainers, spec.Containers) {
					for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
						req, lim := o.Resources.Requests[r], o.Resources.Limits[r]
						if lim.IsZero() || req.Cmp(lim) != 0 {
							t.Errorf("container %s: %s request %s, limit %s: want them equal (Guaranteed QoS)", o.Name, r, req.String(), lim.String())
						}
					}
				}
			default:
				t.Errorf("image %q: want meshrun:cpu or meshrun:cuda", c.Image)
			}
		})
	}
	if !seen["cpu"] || !seen["cuda"] {
		t.Errorf("want a CPU job and a CUDA job among k8s/job-*.yaml, got %v", seen)
	}
}

func hasGPU(r corev1.ResourceRequirements) bool {
	for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
		for name := range l {
			if strings.Contains(strings.ToLower(string(name)), "gpu") {
				return true
			}
		}
	}
	return false
}

func ptrStr(p *int32) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(int(*p))
}

// envSource says where container c's variable name comes from: "index" (the
// Job's completion index), "value" (a literal), or what is wrong.
func envSource(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			p := e.ValueFrom.FieldRef.FieldPath
			if p == "metadata.annotations['"+completionIndexAnnotation+"']" || p == "metadata.labels['"+completionIndexAnnotation+"']" {
				return "index"
			}
			return "from " + p + ", not the completion index"
		case e.ValueFrom == nil && e.Value != "":
			return "value"
		default:
			return "neither a literal nor the completion index"
		}
	}
	if name == "JOB_COMPLETION_INDEX" {
		return "index" // the Job controller sets it in every container of an Indexed Job
	}
	return "not in the container's env: $(" + name + ") would stay as it is"
}

func headlessServiceFor(services []*corev1.Service, name, job string) bool {
	for _, s := range services {
		if s.Name != name || s.Spec.ClusterIP != corev1.ClusterIPNone {
			continue
		}
		// The Job controller labels its pods job-name and
		// batch.kubernetes.io/job-name with the Job's name.
		pod := map[string]string{"job-name": job, "batch.kubernetes.io/job-name": job}
		return labelsMatch(s.Spec.Selector, pod)
	}
	return false
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

// TestBinariesLinkNoKubernetes keeps the Kubernetes packages this test
// decodes with out of every binary and library of the module: only deploy's
// test imports them.
func TestBinariesLinkNoKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("go list -deps of the whole module")
	}
	deps.Forbid(t, []string{deps.Module + "/..."}, "k8s.io", "sigs.k8s.io")
}
