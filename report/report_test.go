package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// fakeJob writes a job folder: ranks ranks, attempts of perAttempt steps
// each (a restart between them), each rank's steps.jsonl, rank 0's report
// line and each rank's trace of the last step; spike, if > 0, is a step whose
// time is 100× the others'.
func fakeJob(t testing.TB, ranks, attempts, perAttempt, spike int) string {
	t.Helper()
	dir := t.TempDir()
	write := func(path string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, logview.JobFile), logview.JobRecord{JobID: "fake", Argv: []string{"launcher", "run", "-n", fmt.Sprint(ranks), "mlp"}, World: ranks, NNodes: 1, Device: "cpu"})
	sum := logview.Summary{JobID: "fake", WorldSize: ranks}
	t0 := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC).UnixMilli()
	step := 0
	for a := range attempts {
		ad := dir
		if a > 0 {
			ad = filepath.Join(dir, logview.AttemptDir(a))
		}
		for r := range ranks {
			var b bytes.Buffer
			for k := range perAttempt {
				s := step + k + 1
				ms := 10.0 + float64(r)
				if s == spike {
					ms *= 100
				}
				rec := runlog.StepRecord{Step: s, Loss: 2 / math.Sqrt(float64(s)), StepMS: ms, KernelMS: 0.6 * ms, CollectiveMS: 0.3 * ms, OtherMS: 0.1 * ms,
					CommBytes: 4096, CollectiveBytes: map[string]int64{"all_reduce": 4096}, TimeMS: t0 + int64(s)*20}
				line, _ := json.Marshal(rec)
				b.Write(append(line, '\n'))
			}
			rd := filepath.Join(ad, logview.RankDir(r))
			if err := os.MkdirAll(rd, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(rd, runlog.StepsFile), b.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			if r == 0 && a < attempts-1 {
				out := fmt.Sprintf("2026-11-27T03:00:01.000Z saved step %d to /ckpt in 1.0 ms\n", step+perAttempt)
				if err := os.WriteFile(filepath.Join(rd, "stdout.log"), []byte(out), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if a == attempts-1 {
				end := float64(t0+int64(step+perAttempt)*20) * 1000
				trace := fmt.Sprintf(`[{"name":"gemm","cat":"kernel","ph":"X","ts":%.0f,"dur":4000,"pid":%d,"tid":1},`+
					`{"name":"y","cat":"collective","ph":"X","ts":%.0f,"dur":2000,"pid":%d,"tid":1}`, end-9000, r, end-4000, r)
				if r == 0 {
					trace += "]" // the others' traces cut short, as a running rank's
				}
				if err := os.WriteFile(filepath.Join(rd, runlog.TraceFile), []byte(trace), 0o600); err != nil {
					t.Fatal(err)
				}
				if r == 0 {
					out := `2026-11-27T03:00:01.000Z step 1/20 loss 2.0` + "\n" +
						`2026-11-27T03:00:02.000Z {"mesh":"tp=2","tokens":512,"collectives_per_step":{"all_reduce dx":1},"heldout_loss":0.5}` + "\n"
					if err := os.WriteFile(filepath.Join(rd, "stdout.log"), []byte(out), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		reason := logview.OutcomeOK
		if a < attempts-1 {
			reason = logview.OutcomeRankFailed
		}
		sum.Attempts = append(sum.Attempts, logview.AttemptSummary{Attempt: a, Reason: reason})
		step += perAttempt
	}
	sum.AttemptSummary = sum.Attempts[len(sum.Attempts)-1]
	write(filepath.Join(dir, logview.SummaryFile), sum)
	return dir
}

// pageOf reads the job folder dir and returns its page and what was read.
func pageOf(t *testing.T, dir string) (string, *Job) {
	t.Helper()
	j, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Write(&b, j); err != nil {
		t.Fatal(err)
	}
	return b.String(), j
}

// svgs are the page's inline SVG documents, each parsed as XML.
func svgs(t *testing.T, page string) []string {
	t.Helper()
	all := regexp.MustCompile(`(?s)<svg .*?</svg>`).FindAllString(page, -1)
	for i, s := range all {
		d := xml.NewDecoder(strings.NewReader(s))
		for {
			_, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("svg %d does not parse: %v\n%s", i, err, s[:min(len(s), 300)])
			}
		}
	}
	return all
}

// TestReportPage: a job of 2 ranks restarted once makes a page with its
// command, outcome and attempts, the loss of both attempts with the restart
// marked, a checkpoint marked, each rank's step time and split, the bytes and collectives, and
// one step across the ranks; every SVG parses; no script.
func TestReportPage(t *testing.T) {
	page, _ := pageOf(t, fakeJob(t, 2, 2, 10, 0))
	ss := svgs(t, page)
	if len(ss) != 5 {
		t.Fatalf("%d SVGs, want 5 (loss, step time, split, bytes, timeline)", len(ss))
	}
	for _, want := range []string{"launcher run -n 2 mlp", `<span class="ok">ok</span>`, "0: rank_failed; 1: ok", "attempt 0", "attempt 1", "restart", ">ckpt<",
		"held-out (end)", "rank 1", "all_reduce dx", "<td>all_reduce</td><td>4096</td>", "10.00 ms = kernels 6.00 + collectives 3.00 + other 1.00", "step 20 of the last attempt", "tokens/s"} {
		if !strings.Contains(page, want) {
			t.Errorf("no %q in the page", want)
		}
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "http://") && !strings.Contains(page, "http://www.w3.org/2000/svg") {
		t.Errorf("the page has a script or a link outside itself")
	}
	// The loss: one curve per attempt, each its 10 points.
	if n := strings.Count(ss[0], "<polyline"); n < 2 {
		t.Errorf("the loss plot has %d curves", n)
	}
	// The timeline: each rank's kernel and collective.
	if n := strings.Count(ss[4], "<title>"); n != 4 {
		t.Errorf("the timeline has %d spans, want 4", n)
	}
}

// TestReportLarge: 4 ranks × 10,000 steps make a page in under 2 s and 2
// MB, the curves decimated but their extremes kept (a step 100× slower
// than the others still reaches the top of its plot).
func TestReportLarge(t *testing.T) {
	dir := fakeJob(t, 4, 1, 10000, 5000)
	start := time.Now()
	page, _ := pageOf(t, dir)
	took := time.Since(start)
	if took > 2*time.Second || len(page) > 2<<20 {
		t.Errorf("the page took %v and is %d bytes; want under 2 s and 2 MB", took, len(page))
	}
	ss := svgs(t, page)
	// The step-time plot's y axis reaches the spike (1000 ms on rank 0, and
	// 1300 on rank 3): a point at its top edge (y = 20).
	if !strings.Contains(ss[1], ",20.0") {
		t.Errorf("the spike was dropped from the step-time plot")
	}
	t.Logf("4 ranks × 10000 steps: %v, %d bytes", took, len(page))
}

// TestReportBadInput: a file, a folder that is no job's, a missing job:
// a clear error; a steps.jsonl cut short or with a bad line: the page says
// so and shows the rest.
func TestReportBadInput(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, []byte("x"), 0o600)
	for _, p := range []string{f, t.TempDir(), filepath.Join(t.TempDir(), "none")} {
		if _, err := Read(p); !errors.Is(err, ErrNotJob) {
			t.Errorf("Read(%s): %v, want ErrNotJob", p, err)
		}
	}
	dir := fakeJob(t, 2, 1, 5, 0)
	steps := filepath.Join(dir, logview.RankDir(1), runlog.StepsFile)
	b, _ := os.ReadFile(steps)
	lines := strings.SplitAfter(string(b), "\n")
	cut := lines[0] + "not json\n" + strings.Join(lines[1:4], "") + lines[4][:len(lines[4])/2]
	os.WriteFile(steps, []byte(cut), 0o600)
	os.Remove(filepath.Join(dir, logview.SummaryFile))
	page, j := pageOf(t, dir)
	for _, want := range []string{"rank-00001/steps.jsonl: line 2 does not read", "rank-00001/steps.jsonl: its last record is cut short", "no summary.json yet", "running, or its launcher was killed"} {
		if !strings.Contains(page, want) {
			t.Errorf("no %q in the page", want)
		}
	}
	if got := len(j.steps(1)); got != 4 {
		t.Errorf("rank 1: %d steps read, want the 4 whole ones", got)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"--log-dir", t.TempDir(), "nosuchjob"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), `launcher report: no job "nosuchjob"`) {
		t.Errorf("a missing job: exit %d, %q", code, errb.String())
	}
	if code := Main([]string{dir, "other"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "one job at a time") {
		t.Errorf("two jobs: exit %d, %q", code, errb.String())
	}
	for _, args := range [][]string{{"-o", filepath.Join(dir, "r.html"), dir}, {dir, "-o", filepath.Join(dir, "r.html")}} {
		out.Reset()
		if code := Main(args, &out, &errb); code != 0 || strings.TrimSpace(out.String()) != filepath.Join(dir, "r.html") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
}

// TestReportFailedJob: a failed job's page gives its reason and root
// cause.
func TestReportFailedJob(t *testing.T) {
	dir := fakeJob(t, 2, 1, 5, 0)
	rc := 1
	sum := logview.Summary{JobID: "fake", WorldSize: 2, AttemptSummary: logview.AttemptSummary{ExitCode: 137, Reason: logview.OutcomeRankFailed,
		RootCauseRank: &rc, RootCause: &logview.RootCause{Rank: 1, Signal: "SIGKILL", ExitCode: 137}}}
	b, _ := json.Marshal(sum)
	os.WriteFile(filepath.Join(dir, logview.SummaryFile), b, 0o600)
	page, _ := pageOf(t, dir)
	for _, want := range []string{`<span class="bad">rank_failed</span> (exit 137)`, "root cause", "rank 1 (node 0): killed by SIGKILL"} {
		if !strings.Contains(page, want) {
			t.Errorf("no %q in the failed job's page", want)
		}
	}
}

// TestReportPipeline: a pipelined GPT's report gives each stage's layers,
// bubble measured, at its costs and its own part, peak (and its bytes) and costs; a report without
// "pipeline" has no such section.
func TestReportPipeline(t *testing.T) {
	dir := fakeJob(t, 2, 1, 10, 0)
	out := `2026-11-27T03:00:02.000Z {"mesh":"pp=2","pipeline":{"pp":2,"schedule":"zb2","micro_batches":8,"stage_layers":[4,4],` +
		`"bubble_model":0.1111,"bubble":[0.1,0.039],"peak_activations":[3,3],"scratch_bytes":[3145728,3670016],"workspace_bytes":[1048576,524288],"cost_ms":[{"F":15.2,"B":16.7,"W":13.9},{"F":16.6,"B":17.9,"W":14}],` +
		`"send_ms":[0.04,0.05],"bubble_at_cost":[0.085,0.047],"bubble_replayed":[0.092,0.041],"overhead":[0.0012,0.0031]}}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, logview.RankDir(0), "stdout.log"), []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	page, _ := pageOf(t, dir)
	for _, want := range []string{"<h2>Pipeline stages</h2>", "schedule zb2, 8 micro-batches", "(p−1)/(m+p−1): 11.1%",
		"<tr><td>0</td><td>4</td><td>10.0%</td><td>8.5%</td><td>9.2%</td><td>0.12%</td><td>3</td><td>3.0</td><td>1.0</td><td>15.20, 16.70, 13.90</td><td>0.040</td></tr>",
		"<tr><td>1</td><td>4</td><td>3.9%</td><td>4.7%</td><td>4.1%</td><td>0.31%</td><td>3</td><td>3.5</td><td>0.5</td><td>16.60, 17.90, 14.00</td><td>0.050</td></tr>"} {
		if !strings.Contains(page, want) {
			t.Errorf("no %q in the page", want)
		}
	}
	// Interleaved: the chunks and its own model.
	out = strings.Replace(out, `"schedule":"zb2",`, `"schedule":"interleaved","chunks":2,`, 1)
	if err := os.WriteFile(filepath.Join(dir, logview.RankDir(0), "stdout.log"), []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if page, _ := pageOf(t, dir); !strings.Contains(page, "schedule interleaved over 2 chunks a stage (each stage&#39;s layers the sum of its chunks&#39;), 8 micro-batches per step; its bubble at equal stages, (p−1)/(v·m+p−1): 11.1%") {
		t.Errorf("interleaved: no chunks or model in the page's pipeline section")
	}
	if page, _ := pageOf(t, fakeJob(t, 2, 1, 10, 0)); strings.Contains(page, "Pipeline stages") {
		t.Errorf("a job without a pipeline has a pipeline section")
	}
}
