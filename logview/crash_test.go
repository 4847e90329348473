package logview

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCrashReports reads Go 1.26's crash reports (testdata/crash: a small
// program's stderr, and a cgo one's): the kind, the signal behind it, the
// line, the crashing goroutine's first frames and the exit code the
// launcher gives it, fed line by line after other output, as a rank's stderr
// streams.
func TestCrashReports(t *testing.T) {
	cases := []struct {
		file, kind, signal, line, goroutine, frame string
		code                                       int
	}{
		{"panic.txt", "panic", "", "panic: boom", "goroutine 1 [running]:", "main.main()", ExitCrash},
		{"repanic.txt", "panic", "", "panic: boom2", "goroutine 1 [running]:", "main.main.func4()", ExitCrash},
		{"nil.txt", "panic", "SIGSEGV", "panic: runtime error: invalid memory address or nil pointer dereference [signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x489fbc]",
			"goroutine 1 [running]:", "main.main()", 139},
		{"fault.txt", "fatal error", "SIGSEGV", "fatal error: fault [signal SIGSEGV: segmentation violation code=0x1 addr=0x10000000000 pc=0x48a072] (unexpected fault address 0x10000000000)",
			"goroutine 1 gp=0x24c06637e1e0 m=0 mp=0x5592c0 [running]:", "runtime.throw({0x4ab0f0?, 0x7f442dd80a00?})", 139},
		{"map.txt", "fatal error", "", "fatal error: concurrent map writes", "goroutine 20 [running]:", "internal/runtime/maps.fatal({0x4adf6a?, 0x0?})", ExitCrash},
		{"deadlock.txt", "fatal error", "", "fatal error: all goroutines are asleep - deadlock!", "goroutine 1 [chan receive]:", "main.main()", ExitCrash},
		// kill -SEGV from outside, landing on an idle thread (goroutine
		// 0's): no goroutine of the program runs; the main one says where
		// it was.
		{"sigsegv-async.txt", "SIGSEGV", "SIGSEGV", "SIGSEGV: segmentation violation (sent by kill, not a fault: sigcode=0)",
			"goroutine 1 gp=0x3211f6fc01e0 m=nil [sleep]:", "runtime.gopark(0x6a05f57a074?, 0x47aa32?, 0x20?, 0xcf?, 0x450d7f?)", 139},
		{"cgo.txt", "SIGSEGV", "SIGSEGV", "SIGSEGV: segmentation violation (signal arrived during cgo execution)",
			"goroutine 1 gp=0x3b4ebf461e0 m=0 mp=0x532240 [syscall]:", "runtime.cgocall(0x47e520, 0x3b4ebf7c738)", 139},
	}
	for _, tc := range cases {
		t.Run(strings.TrimSuffix(tc.file, ".txt"), func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "crash", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var w CrashWatch
			for _, l := range []string{"starting", "panic: a line the program printed, long before", "SIGTERM: handled, no report", "more output"} {
				w.Line([]byte(l))
			}
			for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
				w.Line([]byte(l))
			}
			c := w.Report()
			if c == nil {
				t.Fatal("no report")
			}
			if c.Kind != tc.kind || c.Signal != tc.signal || c.Line != tc.line || c.ExitCode() != tc.code {
				t.Errorf("kind %q signal %q code %d line %q\nwant %q %q %d %q", c.Kind, c.Signal, c.ExitCode(), c.Line, tc.kind, tc.signal, tc.code, tc.line)
			}
			if len(c.Stack) < 3 || c.Stack[0] != tc.goroutine || c.Stack[1] != tc.frame || !strings.HasPrefix(c.Stack[2], "\t") {
				t.Errorf("stack %q, want %q then %q", c.Stack, tc.goroutine, tc.frame)
			}
			for _, l := range c.Stack {
				if strings.Contains(l, " fp=0x") {
					t.Errorf("frame pointers kept: %q", l)
				}
			}
			if n := len(c.Stack); n > 2*crashFrames+2 {
				t.Errorf("%d lines of stack, want the first %d frames", n, crashFrames)
			}
		})
	}
}

// TestCrashWatchNoReport: output with no crash report, a signal-like line
// with no "PC=" after it, and a report cut short by a later line that is not
// one, give none.
func TestCrashWatchNoReport(t *testing.T) {
	for _, lines := range [][]string{
		{"step 1", "step 2", "done"},
		{"SIGTERM: shutting down", "bye"},
		{"SIGTERM: shutting down"},
		{},
	} {
		var w CrashWatch
		for _, l := range lines {
			w.Line([]byte(l))
		}
		if c := w.Report(); c != nil {
			t.Errorf("%q: report %+v", lines, c)
		}
	}
	// A signal-like line after a report keeps the report.
	var w CrashWatch
	for _, l := range []string{"panic: boom", "", "goroutine 1 [running]:", "main.main()", "\t/x.go:1 +0x1", "SIGTERM: not a report"} {
		w.Line([]byte(l))
	}
	if c := w.Report(); c == nil || c.Line != "panic: boom" || c.Stack[0] != "goroutine 1 [running]:" {
		t.Errorf("report %+v", c)
	}
}
