// Command testlog keeps CI's `go test` runs honest about what they skipped.
//
//	go test -json ARGS | testlog render -o DIR/RUN.json
//	testlog report -allowed .ci/skips DIR
//
// render prints the events of `go test -json` as `go test` prints them
// (the package lines, and the output of the tests that failed or never
// finished; passing and skipped tests stay quiet) and appends the events, as
// they came, to a file. report reads every DIR/RUN.json so written (RUN names
// the run: "unit" for test.sh's go test ./..., a check's name for its runs)
// and lists the tests that skipped, each with its own message and the
// reason the list gives; a skip the list does not allow fails the report
// (exit 1). Listed tests that no run even built (the cuda build tag's, which
// need a GPU) are listed as not run, with the list's reason.
//
// The list: one test a line, "RUN PACKAGE TEST REASON": RUN the run the
// skip is allowed in ("*": any), PACKAGE relative to the module (launch,
// collective/nccl), TEST a top-level test (its subtests too) or a subtest;
// '#' starts a comment line.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "render":
		fs := flag.NewFlagSet("render", flag.ExitOnError)
		out := fs.String("o", "", "append the events to this file")
		fs.Parse(os.Args[2:])
		var f *os.File
		if *out != "" {
			if f, err = os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
				break
			}
			defer f.Close()
		}
		var w io.Writer = io.Discard
		if f != nil {
			w = f
		}
		err = render(os.Stdin, os.Stdout, w)
	case "report":
		fs := flag.NewFlagSet("report", flag.ExitOnError)
		allowed := fs.String("allowed", ".ci/skips", "the tests allowed to skip")
		module := fs.String("module", "", "the module path (default: go.mod's)")
		fs.Parse(os.Args[2:])
		if fs.NArg() != 1 {
			usage()
		}
		var ok bool
		ok, err = reportDir(os.Stdout, *allowed, *module, fs.Arg(0))
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go test -json ARGS | testlog render [-o DIR/RUN.json]\n       testlog report [-allowed .ci/skips] [-module PATH] DIR")
	os.Exit(2)
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output
}

// render prints the stream as go test prints it and copies it to raw.
func render(in io.Reader, out, raw io.Writer) error {
	type key struct{ pkg, test string }
	pending := map[key][]string{} // a test's output until it ends
	var order []key               // the tests in the order they started, for a flush
	flush := func(pkg string) {
		for _, k := range order {
			if lines, ok := pending[k]; ok && (pkg == "" || k.pkg == pkg) {
				io.WriteString(out, strings.Join(lines, ""))
				delete(pending, k)
			}
		}
	}
	failed := false
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			if _, werr := io.WriteString(raw, line); werr != nil {
				return werr
			}
			var e event
			if json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
				io.WriteString(out, line) // not an event: as it came
			} else {
				k := key{e.Package, e.Test}
				switch {
				case e.Action == "build-output":
					io.WriteString(out, e.Output)
				case e.Test == "" && e.Action == "output":
					if e.Output != "PASS\n" { // go test prints only the ok line of a package that passed
						io.WriteString(out, e.Output)
					}
				case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
					flush(e.Package) // tests that never ended: a timeout, a panic
					failed = failed || e.Action == "fail"
				case e.Action == "run":
					if _, ok := pending[k]; !ok {
						pending[k] = []string{}
						order = append(order, k)
					}
				case e.Action == "output":
					if !strings.HasPrefix(e.Output, "=== ") {
						pending[k] = append(pending[k], e.Output)
					}
				case e.Action == "fail":
					io.WriteString(out, strings.Join(pending[k], ""))
					delete(pending, k)
				case e.Action == "pass" || e.Action == "skip":
					delete(pending, k)
				}
			}
		}
		if err == io.EOF {
			flush("")
			if failed {
				io.WriteString(out, "FAIL\n") // as go test ends when a package failed
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// entry is a line of the list of tests allowed to skip.
type entry struct {
	run, pkg, test, reason string
	used                   bool
}

func (e *entry) matches(run, pkg, test string) bool {
	return (e.run == "*" || e.run == run) && e.pkg == pkg && (e.test == test || strings.HasPrefix(test, e.test+"/"))
}

func readAllowed(path string) ([]*entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []*entry
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			return nil, fmt.Errorf("%s:%d: want RUN PACKAGE TEST REASON, got %q", path, n+1, line)
		}
		reason := line
		for _, w := range f[:3] {
			reason = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(reason), w))
		}
		list = append(list, &entry{run: f[0], pkg: f[1], test: f[2], reason: reason})
	}
	return list, nil
}

// skip is a test that skipped in a run, with its message.
type skip struct {
	run, pkg, test, msg string
}

// runs is what a folder of runs holds: the skips, and every test any run
// started or ended.
type runs struct {
	skips []skip
	seen  map[[2]string]bool
	ran   int // tests (subtests too) that passed or failed
	names []string
}

func readRuns(dir, module string) (*runs, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no runs (*.json) in %s", dir)
	}
	sort.Strings(files)
	rs := &runs{seen: map[[2]string]bool{}}
	for _, file := range files {
		run := strings.TrimSuffix(filepath.Base(file), ".json")
		rs.names = append(rs.names, run)
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		last := map[[2]string]string{} // a test's last line of output, its skip message
		for _, line := range strings.Split(string(b), "\n") {
			var e event
			if json.Unmarshal([]byte(line), &e) != nil || e.Test == "" {
				continue
			}
			pkg := relPackage(e.Package, module)
			k := [2]string{pkg, e.Test}
			rs.seen[k] = true
			switch e.Action {
			case "output":
				if s := strings.TrimSpace(e.Output); s != "" && !strings.HasPrefix(s, "=== ") && !strings.HasPrefix(s, "--- ") {
					last[k] = s
				}
			case "skip":
				rs.skips = append(rs.skips, skip{run: run, pkg: pkg, test: e.Test, msg: last[k]})
			case "pass", "fail":
				rs.ran++
			}
		}
	}
	return rs, nil
}

func relPackage(pkg, module string) string {
	if pkg == module {
		return "."
	}
	return strings.TrimPrefix(pkg, module+"/")
}

// modulePath reads the module path from go.mod in the working directory.
func modulePath() (string, error) {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return f[1], nil
		}
	}
	return "", errors.New("go.mod names no module")
}

func reportDir(w io.Writer, allowedPath, module, dir string) (bool, error) {
	if module == "" {
		m, err := modulePath()
		if err != nil {
			return false, err
		}
		module = m
	}
	list, err := readAllowed(allowedPath)
	if err != nil {
		return false, err
	}
	rs, err := readRuns(dir, module)
	if err != nil {
		return false, err
	}
	return report(w, allowedPath, list, rs), nil
}

// report prints the skipped tests and the listed tests no run started;
// false when a skip is not allowed.
func report(w io.Writer, allowedPath string, list []*entry, rs *runs) bool {
	var allowed, denied []string
	for _, s := range rs.skips {
		var e *entry
		for _, c := range list {
			if c.matches(s.run, s.pkg, s.test) {
				e = c
				break
			}
		}
		msg := s.msg
		if msg == "" {
			msg = "(no message)"
		}
		if e == nil {
			denied = append(denied, fmt.Sprintf("  %-16s %s %s: %s", s.run, s.pkg, s.test, msg))
			continue
		}
		e.used = true
		allowed = append(allowed, fmt.Sprintf("  %-16s %s %s: %s\n  %-16s   (%s)", s.run, s.pkg, s.test, e.reason, "", msg))
	}
	var notRun []string
	for _, e := range list {
		if !e.used && !rs.seen[[2]string{e.pkg, e.test}] {
			notRun = append(notRun, fmt.Sprintf("  %-16s %s %s: %s", e.run, e.pkg, e.test, e.reason))
		}
	}
	fmt.Fprintf(w, "== skipped tests (runs: %s; %d tests ran)\n", strings.Join(rs.names, ", "), rs.ran)
	if len(allowed) > 0 {
		fmt.Fprintf(w, "skipped, as %s allows:\n%s\n", allowedPath, strings.Join(allowed, "\n"))
	}
	if len(notRun) > 0 {
		fmt.Fprintf(w, "not run here (listed in %s; no run built or started them):\n%s\n", allowedPath, strings.Join(notRun, "\n"))
	}
	if len(denied) > 0 {
		fmt.Fprintf(w, "skipped, NOT allowed (each must run here, or be listed in %s with its reason):\n%s\n", allowedPath, strings.Join(denied, "\n"))
	}
	fmt.Fprintf(w, "skipped tests: %d allowed, %d not allowed; %d listed tests not run\n", len(allowed), len(denied), len(notRun))
	return len(denied) == 0
}
