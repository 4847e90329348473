package logview

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func readStacks(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "stacks", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// where is a frame's "func file:line" with the file's base name.
func where(f Frame) string {
	return f.Func + " " + baseName(f.File) + ":" + strconv.Itoa(f.Line)
}

func wheres(frames []Frame) []string {
	var s []string
	for _, f := range frames {
		w := where(f)
		if f.Library {
			w += " (lib)"
		}
		s = append(s, w)
	}
	return s
}

// Two dumps appended to one file (python3 with faulthandler.register on
// SIGUSR1, signaled in warmup, then in load_batch): the last is read; the
// main thread is the last listed.
func TestParsePythonDump(t *testing.T) {
	text := readStacks(t, "python-two-dumps.txt")
	if !strings.Contains(text, "in warmup") {
		t.Fatal("testdata: the first dump should be in warmup")
	}
	th := ParsePythonDump(text)
	if len(th) != 2 {
		t.Fatalf("%d threads, want 2: %+v", len(th), th)
	}
	if th[0].Main || !th[1].Main || th[1].State != "current" || th[0].State != "" {
		t.Errorf("threads %+v: want the last listed main and current", th)
	}
	want := []string{"load_batch train.py:14", "main train.py:25", "<module> train.py:28"}
	if got := wheres(th[1].Frames); !reflect.DeepEqual(got, want) {
		t.Errorf("main thread %v, want %v", got, want)
	}
	want = []string{"wait threading.py:320 (lib)", "get queue.py:171 (lib)", "prefetch train.py:10",
		"run threading.py:975 (lib)", "_bootstrap_inner threading.py:1038 (lib)", "_bootstrap threading.py:995 (lib)"}
	if got := wheres(th[0].Frames); !reflect.DeepEqual(got, want) {
		t.Errorf("prefetch thread %v, want %v", got, want)
	}
	if th[0].Name != "0x00007f464ce816c0" {
		t.Errorf("name %q", th[0].Name)
	}
}

// The signal landed on a thread that is not the main one: "Current thread"
// is listed first, the main thread still last.
func TestParsePythonDumpSignalOnThread(t *testing.T) {
	th := ParsePythonDump(readStacks(t, "python-signal-on-thread.txt"))
	if len(th) != 2 || th[0].State != "current" || th[0].Main || !th[1].Main {
		t.Fatalf("threads %+v", th)
	}
	if got := where(th[1].Frames[0]); got != "all_reduce_wait other.py:12" {
		t.Errorf("main thread at %s", got)
	}
	if ParsePythonDump("no dump here\n") != nil {
		t.Error("threads from no dump")
	}
}

func TestParseGoDump(t *testing.T) {
	th := ParseGoDump(readStacks(t, "go-runlog.txt"))
	if len(th) != 3 {
		t.Fatalf("%d goroutines, want 3", len(th))
	}
	var main *Thread
	for i := range th {
		if th[i].Main {
			if main != nil {
				t.Fatal("two main goroutines")
			}
			main = &th[i]
		}
	}
	if main == nil || main.Name != "1" || main.State != "sync.WaitGroup.Wait" {
		t.Fatalf("main goroutine %+v", main)
	}
	want := []string{"sync.runtime_SemacquireWaitGroup sema.go:114 (lib)", "sync.(*WaitGroup).Wait waitgroup.go:206 (lib)",
		"main.waitForPeers main.go:17", "main.main main.go:33"}
	if got := wheres(main.Frames); !reflect.DeepEqual(got, want) {
		t.Errorf("goroutine 1 %v, want %v", got, want)
	}
	// "created by" is not a frame of the goroutine.
	if got := wheres(th[0].Frames); !reflect.DeepEqual(got, []string{"main.main.func1 main.go:28"}) || th[0].State != "running" {
		t.Errorf("goroutine %s [%s] %v", th[0].Name, th[0].State, got)
	}
}

func TestGoLibrary(t *testing.T) {
	for fn, lib := range map[string]bool{
		"runtime.gopark":           true,
		"internal/poll.(*FD).Read": true,
		"net/http.(*conn).serve":   true,
		"main.main":                false,
		"github.com/meshrun/meshrun/collective.(*W).Wait": false,
		"example.com/x/y.F": false,
	} {
		if got := goLibrary(fn, "/src/x.go"); got != lib {
			t.Errorf("goLibrary(%s) = %v", fn, got)
		}
	}
	if !goLibrary("github.com/nats-io/nats%2ego.(*Conn).Flush", "/root/go/pkg/mod/github.com/nats-io/nats.go@v1.37.0/nats.go") {
		t.Error("a module from the module cache is the user's")
	}
}

func TestParsePythonTracebackChained(t *testing.T) {
	e := ParsePythonTraceback(strings.Split(readStacks(t, "traceback-chained.txt"), "\n"))
	if e == nil || e.Type != "KeyError" || e.Message != "'lr'" {
		t.Fatalf("%+v", e)
	}
	if got := wheres(e.Frames); !reflect.DeepEqual(got, []string{"main chained.py:20", "<module> chained.py:23"}) {
		t.Errorf("frames %v", got)
	}
	if e.User == nil || where(*e.User) != "main chained.py:20" {
		t.Errorf("user frame %+v", e.User)
	}
}

// A torch-like failure: warnings and an earlier traceback before it, a
// multi-line message, the NCCL watchdog's lines after it.
func TestParsePythonTracebackTorch(t *testing.T) {
	lines := strings.Split(readStacks(t, "traceback-torch.txt"), "\n")
	e := ParsePythonTraceback(lines)
	if e == nil || e.Type != "torch.distributed.DistBackendError" ||
		e.Message != "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5" {
		t.Fatalf("%+v", e)
	}
	want := []string{"all_reduce distributed_c10d.py:2501 (lib)", "wrapper c10d_logger.py:83 (lib)",
		"train_step train.py:41", "main train.py:80", "<module> train.py:88"}
	if got := wheres(e.Frames); !reflect.DeepEqual(got, want) {
		t.Errorf("frames %v, want %v", got, want)
	}
	if e.User == nil || where(*e.User) != "train_step train.py:41" {
		t.Errorf("user frame %+v", e.User)
	}
	// The earlier traceback alone: an exception with no message.
	var upTo []string
	for _, l := range lines {
		upTo = append(upTo, l)
		if l == "queue.Empty" {
			break
		}
	}
	if e := ParsePythonTraceback(upTo); e == nil || e.Type != "queue.Empty" || e.Message != "" || e.User != nil || len(e.Frames) != 1 {
		t.Errorf("queue.Empty: %+v", e)
	}
	if e := ParsePythonTraceback(upTo[:4]); e != nil {
		t.Errorf("a traceback cut off before its exception: %+v", e)
	}
	if e := ParsePythonTraceback(lines[:2]); e != nil {
		t.Errorf("no traceback: %+v", e)
	}
}

func TestParsePythonTracebackRankPrefix(t *testing.T) {
	e := ParsePythonTraceback(strings.Split(readStacks(t, "traceback-rank-prefix.txt"), "\n"))
	if e == nil || e.Type != "ValueError" || e.Message != "bad batch 7" || e.User == nil || where(*e.User) != "load_batch train.py:57" {
		t.Fatalf("%+v", e)
	}
}

// exception.json as the launcher's site hook wrote it for a script raising
// ValueError("bad batch 7") in load_batch.
func TestReadPythonException(t *testing.T) {
	e := ReadPythonException(filepath.Join("testdata", "stacks", "exception.json"))
	if e == nil || e.Type != "ValueError" || e.Message != "bad batch 7" {
		t.Fatalf("%+v", e)
	}
	if got := wheres(e.Frames); !reflect.DeepEqual(got, []string{"load_batch exc.py:3", "<module> exc.py:5"}) {
		t.Errorf("frames %v", got)
	}
	if e.User == nil || where(*e.User) != "load_batch exc.py:3" {
		t.Errorf("user frame %+v", e.User)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "exception.json")
	os.WriteFile(bad, []byte(`{"type":`), 0o600)
	if ReadPythonException(bad) != nil || ReadPythonException(filepath.Join(dir, "none.json")) != nil {
		t.Error("an exception from an invalid or missing file")
	}
}

const siteTorch = "/opt/venv/lib/python3.11/site-packages/torch/"

// pyRank is a Python rank whose main thread (listed last, after another
// thread) has frames, innermost first.
func pyRank(rank int, frames ...Frame) RankStacks {
	other := Thread{Name: "0x2", Frames: []Frame{{Func: "wait", File: "/usr/lib/python3.11/threading.py", Line: 320, Library: true}}}
	return RankStacks{Rank: rank, Kind: StacksPython, Threads: []Thread{other, {Name: "0x1", Main: true, Frames: frames}}}
}

func torchAllReduce(libLine int) []Frame {
	return []Frame{
		{Func: "all_reduce", File: siteTorch + "distributed/distributed_c10d.py", Line: libLine, Library: true},
		{Func: "wrapper", File: siteTorch + "distributed/c10d_logger.py", Line: 83, Library: true},
		{Func: "sync_grads", File: "/home/ana/proj/train.py", Line: 41},
		{Func: "_call_impl", File: siteTorch + "nn/modules/module.py", Line: 1520, Library: true},
		{Func: "forward", File: siteTorch + "nn/parallel/distributed.py", Line: 1589, Library: true},
		{Func: "_bootstrap", File: "/usr/lib/python3.11/threading.py", Line: 995, Library: true},
		{Func: "main", File: "/home/ana/proj/train.py", Line: 80},
		{Func: "<module>", File: "/home/ana/proj/train.py", Line: 88},
	}
}

func loadBatch() []Frame {
	return []Frame{
		{Func: "load_batch", File: "/home/ana/proj/train.py", Line: 57},
		{Func: "main", File: "/home/ana/proj/train.py", Line: 78},
		{Func: "<module>", File: "/home/ana/proj/train.py", Line: 88},
	}
}

func TestGroupStacksOddOne(t *testing.T) {
	// Library frames differ (rank 2 at another line in torch): the same group.
	rs := []RankStacks{pyRank(3, torchAllReduce(2501)...), pyRank(1, loadBatch()...), pyRank(0, torchAllReduce(2501)...), pyRank(2, torchAllReduce(2490)...)}
	groups, odd := GroupStacks(rs)
	if len(groups) != 2 || odd != 1 {
		t.Fatalf("%d groups, odd %d", len(groups), odd)
	}
	if got := groups[odd].Describe(); got != "rank 1 in load_batch (train.py:57)" {
		t.Errorf("odd one: %q", got)
	}
	if got := groups[0].Describe(); got != "ranks 0,2-3 in all_reduce (train.py:41)" {
		t.Errorf("the others: %q", got)
	}
	if !reflect.DeepEqual(groups[0].Ranks, []int{0, 2, 3}) || groups[0].Kind != StacksPython || groups[0].Where.Line != 41 {
		t.Errorf("group %+v", groups[0])
	}
	want := "  … 2 library frames (torch/distributed)\n" +
		"  train.py:41 in sync_grads\n" +
		"  … 3 library frames (torch/nn, threading)\n" +
		"  train.py:80 in main\n" +
		"  train.py:88 in <module>\n"
	if got := groups[0].Text(); got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}
	want = "  train.py:57 in load_batch\n  train.py:78 in main\n  train.py:88 in <module>\n"
	if got := groups[1].Text(); got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}
}

func TestGroupStacksTies(t *testing.T) {
	for name, rs := range map[string][]RankStacks{
		"one group": {pyRank(0, loadBatch()...), pyRank(1, loadBatch()...)},
		"two of two": {pyRank(0, loadBatch()...), pyRank(1, torchAllReduce(1)...),
			pyRank(2, loadBatch()...), pyRank(3, torchAllReduce(1)...)},
		"one and one":     {pyRank(0, loadBatch()...), pyRank(1, torchAllReduce(1)...)},
		"two single ones": {pyRank(0, loadBatch()...), pyRank(1, loadBatch()...), pyRank(2, torchAllReduce(1)...), pyRank(3, torchAllReduce(1)[:1]...)},
		"none":            nil,
	} {
		if groups, odd := GroupStacks(rs); odd != -1 {
			t.Errorf("%s: odd %d of %d groups", name, odd, len(groups))
		}
	}
	groups, _ := GroupStacks([]RankStacks{pyRank(0, loadBatch()...), pyRank(1, torchAllReduce(1)...)})
	if groups[0].Ranks[0] != 0 || groups[1].Ranks[0] != 1 {
		t.Errorf("groups of one size not in rank order: %+v", groups)
	}
}

// A rank that wrote no dump (stopped, or not Python or Go) is grouped by
// what /proc says.
func TestGroupStacksProc(t *testing.T) {
	rs := []RankStacks{pyRank(0, torchAllReduce(1)...), pyRank(1, torchAllReduce(1)...), pyRank(2, torchAllReduce(1)...),
		{Rank: 4, Kind: StacksProc, Proc: "T (stopped), wchan do_signal_stop"}}
	groups, odd := GroupStacks(rs)
	if odd != 1 || len(groups) != 2 {
		t.Fatalf("groups %+v, odd %d", groups, odd)
	}
	if got := groups[odd].Describe(); got != "rank 4: T (stopped), wchan do_signal_stop" {
		t.Errorf("%q", got)
	}
	if groups[odd].Text() != "" {
		t.Errorf("text %q for a rank with no dump", groups[odd].Text())
	}
	if got := (Group{Ranks: []int{5}, Kind: StacksProc}).Describe(); got != "rank 5: no stacks" {
		t.Errorf("%q", got)
	}
}

// Main threads without a user frame group by their innermost library
// functions.
func TestGroupStacksLibraryOnly(t *testing.T) {
	lib := func(fns ...string) []Frame {
		var f []Frame
		for i, fn := range fns {
			f = append(f, Frame{Func: fn, File: siteTorch + "x.py", Line: 10 + i, Library: true})
		}
		return f
	}
	rs := []RankStacks{pyRank(0, lib("wait", "barrier")...), pyRank(1, lib("wait", "barrier")...), pyRank(2, lib("recv", "barrier")...)}
	groups, odd := GroupStacks(rs)
	if len(groups) != 2 || odd != 1 || !reflect.DeepEqual(groups[1].Ranks, []int{2}) || groups[1].Where != nil {
		t.Fatalf("groups %+v, odd %d", groups, odd)
	}
	if got := groups[1].Describe(); got != "rank 2 in recv (x.py:10)" {
		t.Errorf("%q", got)
	}
}

func TestGroupStacksGo(t *testing.T) {
	th := ParseGoDump(readStacks(t, "go-runlog.txt"))
	other := ParseGoDump(strings.Replace(readStacks(t, "go-runlog.txt"), "main.go:17", "main.go:19", 1))
	rs := []RankStacks{{Rank: 0, Kind: StacksGo, Threads: th}, {Rank: 1, Kind: StacksGo, Threads: th}, {Rank: 2, Kind: StacksGo, Threads: other}}
	groups, odd := GroupStacks(rs)
	if odd != 1 {
		t.Fatalf("groups %+v, odd %d", groups, odd)
	}
	if got := groups[1].Describe(); got != "rank 2 in main.waitForPeers (main.go:19)" {
		t.Errorf("%q", got)
	}
	want := "  … 2 library frames (sync)\n  main.go:17 in main.waitForPeers\n  main.go:33 in main.main\n"
	if got := groups[0].Text(); got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}
}
