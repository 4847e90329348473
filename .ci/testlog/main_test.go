package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// events builds a go test -json stream: each ev is action, package (under
// m/), test, output.
func events(evs ...[4]string) string {
	var b strings.Builder
	for _, e := range evs {
		pkg := ""
		if e[1] != "" {
			pkg = "m/" + e[1]
		}
		line, _ := json.Marshal(event{Action: e[0], Package: pkg, Test: e[2], Output: e[3]})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

var stream = events(
	[4]string{"start", "a", "", ""},
	[4]string{"run", "a", "TestOK", ""},
	[4]string{"output", "a", "TestOK", "=== RUN   TestOK\n"},
	[4]string{"output", "a", "TestOK", "    a_test.go:3: quiet when it passes\n"},
	[4]string{"output", "a", "TestOK", "--- PASS: TestOK (0.00s)\n"},
	[4]string{"pass", "a", "TestOK", ""},
	[4]string{"run", "a", "TestSkip", ""},
	[4]string{"output", "a", "TestSkip", "=== RUN   TestSkip\n"},
	[4]string{"output", "a", "TestSkip", "    a_test.go:9: no torch here\n"},
	[4]string{"output", "a", "TestSkip", "--- SKIP: TestSkip (0.00s)\n"},
	[4]string{"skip", "a", "TestSkip", ""},
	[4]string{"run", "a", "TestBad", ""},
	[4]string{"run", "a", "TestBad/sub", ""},
	[4]string{"output", "a", "TestBad/sub", "    a_test.go:20: wrong answer\n"},
	[4]string{"output", "a", "TestBad", "--- FAIL: TestBad (0.00s)\n"},
	[4]string{"fail", "a", "TestBad", ""},
	[4]string{"output", "a", "TestBad/sub", "    --- FAIL: TestBad/sub (0.00s)\n"},
	[4]string{"fail", "a", "TestBad/sub", ""},
	[4]string{"output", "a", "", "FAIL\n"},
	[4]string{"output", "a", "", "FAIL\tm/a\t0.01s\n"},
	[4]string{"fail", "a", "", ""},
	[4]string{"run", "b", "TestSub", ""},
	[4]string{"run", "b", "TestSub/one", ""},
	[4]string{"output", "b", "TestSub/one", "    b_test.go:5: needs root\n"},
	[4]string{"skip", "b", "TestSub/one", ""},
	[4]string{"pass", "b", "TestSub", ""},
	[4]string{"run", "b", "TestHang", ""},
	[4]string{"output", "b", "TestHang", "    b_test.go:9: still waiting\n"},
	[4]string{"output", "b", "", "panic: test timed out after 10m0s\n"},
	[4]string{"output", "b", "", "FAIL\tm/b\t600.0s\n"},
	[4]string{"fail", "b", "", ""},
	[4]string{"output", "c", "", "PASS\n"},
	[4]string{"output", "c", "", "ok  \tm/c\t0.02s\n"},
	[4]string{"pass", "c", "", ""},
)

// TestRender: the package lines and the failed (or unfinished) tests'
// output, as go test prints them; the events copied as they came.
func TestRender(t *testing.T) {
	in := stream + "go: a line that is not an event\n"
	var out, raw bytes.Buffer
	if err := render(strings.NewReader(in), &out, &raw); err != nil {
		t.Fatal(err)
	}
	want := "--- FAIL: TestBad (0.00s)\n" +
		"    a_test.go:20: wrong answer\n    --- FAIL: TestBad/sub (0.00s)\n" +
		"FAIL\nFAIL\tm/a\t0.01s\n" +
		"panic: test timed out after 10m0s\n" +
		"FAIL\tm/b\t600.0s\n" +
		"    b_test.go:9: still waiting\n" +
		"ok  \tm/c\t0.02s\n" +
		"go: a line that is not an event\n" +
		"FAIL\n"
	if out.String() != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", out.String(), want)
	}
	if raw.String() != in {
		t.Errorf("the events were not copied as they came")
	}
}

// TestReport: a listed skip is allowed (for its run, or any), an unlisted
// one fails the report, a listed test no run started is named as not run.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "unit.json"), []byte(stream), 0o644)
	os.WriteFile(filepath.Join(dir, "race.json"), []byte(events([4]string{"run", "a", "TestSkip", ""}, [4]string{"skip", "a", "TestSkip", ""})), 0o644)
	list := filepath.Join(dir, "skips")
	write := func(s string) { os.WriteFile(list, []byte(s), 0o644) }
	write(`# comment
unit  a    TestSkip  needs torch: check X installs it
*     b    TestSub   needs root
*     gpu  TestGPU   needs a GPU (build tag cuda)
`)
	var out bytes.Buffer
	ok, err := reportDir(&out, list, "m", dir)
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("\n%s", got)
	if ok {
		t.Error("the race run's skip of a TestSkip, allowed in unit only, passed")
	}
	for _, want := range []string{
		"== skipped tests (runs: race, unit; 4 tests ran)",
		"  unit             a TestSkip: needs torch: check X installs it\n                     (a_test.go:9: no torch here)",
		"  unit             b TestSub/one: needs root\n",
		"not run here (listed in " + list + "; no run built or started them):\n  *                gpu TestGPU: needs a GPU (build tag cuda)\n",
		"skipped, NOT allowed (each must run here, or be listed in " + list + " with its reason):\n  race             a TestSkip: (no message)\n",
		"skipped tests: 2 allowed, 1 not allowed; 1 listed tests not run\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	write("*  a  TestSkip  needs torch\n*  b  TestSub  needs root\n")
	out.Reset()
	if ok, err := reportDir(&out, list, "m", dir); err != nil || !ok {
		t.Errorf("every skip listed: ok %v, err %v\n%s", ok, err, out.String())
	}
	write("*  a  TestSkip\n")
	if _, err := reportDir(&out, list, "m", dir); err == nil || !strings.Contains(err.Error(), ":1: want RUN PACKAGE TEST REASON") {
		t.Errorf("a line without a reason: %v", err)
	}
}
