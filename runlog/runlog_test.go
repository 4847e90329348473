package runlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// blame is an error naming a culprit rank, as collective's errors do
// (protocol.Blamer); runlog's tests, like runlog, do without collective.
type blame struct{ rank int }

func (b *blame) Error() string    { return fmt.Sprintf("collective: peer lost: rank %d", b.rank) }
func (b *blame) CulpritRank() int { return b.rank }

func open(t *testing.T, dir string, stdout, stderr *bytes.Buffer) *Rank {
	t.Helper()
	env := map[string]string{EnvRankDir: dir, "MESHRUN_JOB_ID": "j1", "RANK": "3", EnvNode: "1"}
	o := Options{Getenv: func(k string) string { return env[k] }}
	if stdout != nil {
		o.Stdout = stdout
	}
	if stderr != nil {
		o.Stderr = stderr
	}
	r, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLogLinesCarryIdentity(t *testing.T) {
	dir := t.TempDir()
	var errb bytes.Buffer
	r := open(t, dir, nil, &errb)
	for i := 0; i < 500; i++ { // zap's production sampler would drop most of these
		r.Log.Info("same line")
	}
	r.Log.Warn("careful")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["job"] != "j1" || m["rank"] != 3.0 || m["node"] != 1.0 || m["pid"] != float64(os.Getpid()) || m["ts_ms"] == nil {
			t.Fatalf("line lacks identity: %s", sc.Text())
		}
		n++
	}
	if n != 501 {
		t.Errorf("%d lines, want 501 (no sampling)", n)
	}
	if got := errb.String(); got != "WARN careful\n" {
		t.Errorf("console copy %q, want only the warning", got)
	}
}

// traceFile is the JSON array format (with or without the closing bracket).
func readTrace(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ev []map[string]any
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatalf("trace is not a JSON array: %v\n%s", err, b)
	}
	return ev
}

func TestSpansConcurrent(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, nil, nil)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				sp := r.Span("allreduce", "collective", Arg{"seq", fmt.Sprint(i)})
				time.Sleep(10 * time.Microsecond)
				sp.End()
			}
		}()
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	ev := readTrace(t, filepath.Join(dir, TraceFile))
	spans := 0
	type open struct{ b, e float64 }
	byTid := map[float64][]open{}
	for _, e := range ev {
		if e["pid"] != 3.0 {
			t.Fatalf("event of pid %v, want the rank (3)", e["pid"])
		}
		if e["ph"] == "X" {
			spans++
			ts, dur := e["ts"].(float64), e["dur"].(float64)
			byTid[e["tid"].(float64)] = append(byTid[e["tid"].(float64)], open{ts, ts + dur})
		}
	}
	if spans != 800 {
		t.Errorf("%d spans, want 800", spans)
	}
	if len(byTid) > 8 {
		t.Errorf("%d lanes for 8 goroutines", len(byTid))
	}
}

func TestNoRankDir(t *testing.T) {
	var out bytes.Buffer
	r, err := Open(Options{Getenv: func(string) string { return "" }, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	r.Span("x", "y").End()
	r.Progress(1, 2, 0.5, time.Millisecond)
	r.Fail(errors.New("boom"))
	if _, err := r.DumpStacks("test"); err == nil {
		t.Error("DumpStacks without a folder succeeded")
	}
	r.Close()
	if out.Len() != 0 {
		t.Errorf("markers written outside a launcher: %q", out.String())
	}
	var nilRank *Rank
	nilRank.Span("x", "y").End()
	nilRank.Progress(1, 1, 0, 0)
	nilRank.Close()
}

func TestProgressAndError(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	r := open(t, dir, &out, nil)
	r.Progress(7, 100, 0.25, 1500*time.Microsecond)
	err := fmt.Errorf("step 7: %w", &blame{rank: 5})
	r.Fail(err)
	r.Fail(errors.New("second failure is not recorded"))
	r.Close()
	var sawHello, sawProgress bool
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		switch {
		case strings.HasPrefix(l, Marker+"hello "):
			sawHello = true
		case strings.HasPrefix(l, Marker+"progress "):
			var p Progress
			if err := json.Unmarshal([]byte(strings.TrimPrefix(l, Marker+"progress ")), &p); err != nil {
				t.Fatal(err)
			}
			if p != (Progress{Step: 7, Total: 100, Loss: 0.25, StepMS: 1.5, Rank: 3}) {
				t.Errorf("progress %+v", p)
			}
			sawProgress = true
		}
	}
	if !sawHello || !sawProgress {
		t.Errorf("markers: %q", out.String())
	}
	b, rerr := os.ReadFile(filepath.Join(dir, ErrorFile))
	if rerr != nil {
		t.Fatal(rerr)
	}
	var rec ErrorRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Culprit == nil || *rec.Culprit != 5 || rec.Rank != 3 || rec.Node != 1 || rec.TimeMS == 0 || !strings.Contains(rec.Error, "step 7") {
		t.Errorf("error.json: %s", b)
	}
}

func TestStacksOnSIGUSR1(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, nil, nil)
	defer r.Close()
	syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, StacksPrefix+"*.txt"))
		if len(m) == 1 {
			b, _ := os.ReadFile(m[0])
			if bytes.Contains(b, []byte("goroutine ")) && bytes.Contains(b, []byte("TestStacksOnSIGUSR1")) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stack dump: %v", m)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func BenchmarkSpan(b *testing.B) {
	env := map[string]string{EnvRankDir: b.TempDir(), "RANK": "0"}
	r, err := Open(Options{Getenv: func(k string) string { return env[k] }, NoSignal: true})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Span("allreduce", "collective").End()
		}
	})
}

// TestTraceBounded: with MESHRUN_TRACE_MAX the trace keeps the newest spans
// within the bound, in trace.1.json and trace.json, both valid JSON, and
// counts the spans it dropped.
func TestTraceBounded(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{EnvRankDir: dir, "RANK": "0", EnvTraceMax: "64K"}
	r, err := Open(Options{Getenv: func(k string) string { return env[k] }, NoSignal: true})
	if err != nil {
		t.Fatal(err)
	}
	const spans = 20000
	for i := 0; i < spans; i++ {
		r.Span("allreduce", "collective", Arg{"seq", strconv.Itoa(i)}).End()
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	var kept int
	var size int64
	dropped := -1.0
	for _, name := range []string{OldTraceFile, TraceFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		size += int64(len(b))
		var evs []map[string]any
		if err := json.Unmarshal(b, &evs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, e := range evs {
			if e["ph"] == "X" {
				kept++
			}
			if a, ok := e["args"].(map[string]any); ok && e["name"] == "thread_name" && name == TraceFile {
				dropped, _ = a["dropped_spans"].(float64)
			}
		}
	}
	t.Logf("%d spans: %d kept in %d bytes, %v dropped", spans, kept, size, dropped)
	if size > 64<<10+4<<10 || kept+int(dropped) != spans || kept == 0 {
		t.Errorf("kept %d, dropped %v of %d, %d bytes for a 64 KiB bound", kept, dropped, spans, size)
	}
	b, _ := os.ReadFile(filepath.Join(dir, LogFile))
	if !bytes.Contains(b, []byte(`"msg":"trace spans dropped"`)) {
		t.Errorf("log.jsonl does not say spans were dropped:\n%s", b)
	}
}

// TestLogsOnFullDisk: writes that fail (/dev/full: no space left on
// device) never fail the rank and never flood the console: the trace stops,
// log entries are dropped and counted, each says so once (and the count
// of dropped spans at the end).
func TestLogsOnFullDisk(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	defer full.Close()
	dir := t.TempDir()
	var console bytes.Buffer
	env := map[string]string{EnvRankDir: dir, "RANK": "0"}
	r, err := Open(Options{Getenv: func(k string) string { return env[k] }, NoSignal: true, Stderr: &console})
	if err != nil {
		t.Fatal(err)
	}
	// The disk fills up: both files now write to /dev/full.
	r.logFile.mu.Lock()
	r.logFile.f = full
	r.logFile.mu.Unlock()
	r.tr.mu.Lock()
	r.tr.f, r.tr.w = full, bufio.NewWriterSize(full, 64<<10)
	r.tr.mu.Unlock()
	for i := 0; i < 5000; i++ {
		r.Log.Info("step", zap.Int("i", i))
		r.Span("step", "train").End()
	}
	r.Close()
	if n := strings.Count(console.String(), "\n"); n > 3 || !strings.Contains(console.String(), "log.jsonl: write /dev/full: no space left on device: dropping entries") ||
		!strings.Contains(console.String(), "trace.json: write /dev/full: no space left on device: dropping trace spans") {
		t.Errorf("console (%d lines):\n%s", n, console.String())
	}
	if got := r.logFile.Dropped(); got < 5000 {
		t.Errorf("dropped %d log entries, want >= 5000", got)
	}
}

// TestRecord: spans recorded after the fact land on their own rows
// (thread 1000 + lane) with the times given, beside an open span's row.
func TestRecord(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, nil, nil)
	sp := r.Span("step", "train")
	t0 := time.Now()
	r.Record("F0", "pipeline", 0, t0, t0.Add(3*time.Millisecond), Arg{"stage", "1"})
	r.Record("send F0", "pipeline", 1, t0.Add(3*time.Millisecond), t0.Add(4*time.Millisecond))
	r.Record("refused", "pipeline", -1, t0, t0)
	sp.End()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string][3]float64{}
	for _, e := range readTrace(t, filepath.Join(dir, TraceFile)) {
		if e["ph"] == "X" {
			got[e["name"].(string)] = [3]float64{e["tid"].(float64), e["ts"].(float64), e["dur"].(float64)}
		}
	}
	base := float64(t0.UnixMicro())
	if f := got["F0"]; f[0] != 1000 || f[1] != base || f[2] != 3000 {
		t.Errorf("F0: tid, ts, dur %v, want 1000, %v, 3000", f, base)
	}
	if f := got["send F0"]; f[0] != 1001 || f[1] != base+3000 || f[2] != 1000 {
		t.Errorf("send F0: tid, ts, dur %v, want 1001, %v, 1000", f, base+3000)
	}
	if _, ok := got["refused"]; ok || got["step"][0] >= 1000 {
		t.Errorf("a negative lane recorded, or the open span on a Record row: %v", got)
	}
}

// TestSteps: each Step appends a line to steps.jsonl, whose times add up;
// parts that overlapped beyond the step are scaled into it, and nothing is
// written without a folder.
func TestSteps(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, nil, nil)
	r.Step(NewStepRecord(1, 2.5, 10*time.Millisecond, 6*time.Millisecond, 3*time.Millisecond, 1024))
	r.Step(NewStepRecord(2, 2.4, 10*time.Millisecond, 9*time.Millisecond, 3*time.Millisecond, 0)) // 12 ms of spans in 10
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, StepsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), b)
	}
	for i, l := range lines {
		var s StepRecord
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatal(err)
		}
		sum := s.KernelMS + s.CollectiveMS + s.OtherMS
		if s.Step != i+1 || math.Abs(sum-s.StepMS) > 1e-9 || s.OtherMS < 0 || s.StepMS != 10 {
			t.Errorf("line %d: %+v (parts sum to %g)", i, s, sum)
		}
	}
	var nothing *Rank
	nothing.Step(StepRecord{}) // a nil Rank writes nothing
}
