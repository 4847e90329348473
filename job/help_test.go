package job

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// TestHelp: `worker -h` and `worker WORKLOAD -h` (and --help) print the usage
// and every flag with its default on stdout and exit 0; the text is pinned by
// testdata/help/*.txt (go test ./job -run TestHelp -update rewrites them).
func TestHelp(t *testing.T) {
	names := []string{"worker"}
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			var args []string
			if name != "worker" {
				args = []string{name}
			}
			code, out, errs := run(t, append(args, "-h")...)
			if code != 0 || errs != "" {
				t.Fatalf("-h: exit %d, stderr %q", code, errs)
			}
			if code2, out2, _ := run(t, append(args, "--help")...); code2 != 0 || out2 != out {
				t.Errorf("--help: exit %d, output differs from -h:\n%s", code2, out2)
			}
			if name != "worker" {
				fs := newFlags(name)
				workloads[name].new().flags(fs)
				fs.VisitAll(func(f *flag.Flag) {
					if !strings.Contains(out, "-"+f.Name+" ") {
						t.Errorf("help lacks --%s", f.Name)
					}
				})
			}
			path := filepath.Join("testdata", "help", name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./job -run TestHelp -update writes it)", err)
			}
			if out != string(want) {
				t.Errorf("help differs from %s (-update rewrites it after review)\n--- got\n%s\n--- want\n%s", path, out, want)
			}
		})
	}
}

// TestFlagErrors: an unknown flag or a bad value exits 2 with one line naming
// the flag (and the nearest one for a typo) and pointing at -h.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mlp", "--tokns", "5"}, "worker mlp: unknown flag --tokns; did you mean --tokens? (worker mlp -h lists the flags)\n"},
		{[]string{"mlp", "--steps", "many"}, `worker mlp: invalid value "many" for flag --steps: parse error (worker mlp -h lists the flags)` + "\n"},
		{[]string{"linear", "--mesh"}, "worker linear: flag needs an argument: --mesh (worker linear -h lists the flags)\n"},
		{[]string{"verify", "--quick=maybe"}, `worker verify: invalid boolean value "maybe" for --quick: parse error (worker verify -h lists the flags)` + "\n"},
		{[]string{"hello", "--bogus"}, "worker hello: unknown flag --bogus (worker hello -h lists the flags)\n"},
		{[]string{"mlp", "tokens", "5"}, `worker mlp: unexpected argument "tokens" (flags are --name VALUE)` + "\n"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != ExitUsage || out != "" || errs != tc.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
}
