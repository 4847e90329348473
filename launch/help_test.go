package launch

import (
	"bytes"
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelp: -h and --help on the launcher and on every subcommand print the
// usage and every flag with its default on stdout and exit 0; the text is
// pinned by testdata/help/*.txt (go test ./launch -run TestHelp -update
// rewrites them; run.txt is options.go's own usage). logview's TestHelp pins
// logs, logs why and trace.
func TestHelp(t *testing.T) {
	for _, tc := range []struct{ file, cmd string }{
		{"launcher.txt", ""},
		{"plan.txt", "plan"},
		{"run.txt", "run"},
		{"ckpt.txt", "ckpt"},
		{"ckpt-inspect.txt", "ckpt inspect"},
		{"ckpt-convert.txt", "ckpt convert"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var texts []string
			for _, h := range []string{"-h", "--help"} {
				var out, errb bytes.Buffer
				code := Main(context.Background(), append(strings.Fields(tc.cmd), h), &out, &errb)
				if code != 0 || errb.Len() != 0 || out.Len() == 0 {
					t.Fatalf("launcher %s %s: exit %d, stderr %q, stdout %q", tc.cmd, h, code, errb.String(), out.String())
				}
				texts = append(texts, out.String())
			}
			if texts[0] != texts[1] {
				t.Errorf("--help differs from -h:\n%s", texts[1])
			}
			golden(t, filepath.Join("testdata", "help", tc.file), texts[0])
		})
	}
	// The plan help lists every flag plan has.
	fs, _ := planFlags(&PlanOptions{})
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(planHelp(), "-"+f.Name+" ") {
			t.Errorf("plan help lacks --%s", f.Name)
		}
	})
}

// TestFlagErrors: a bad flag of a subcommand exits 2 with one line naming it
// (and the nearest flag for a typo) and pointing at -h.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--mesh", "4", "--tokns", "5"}, "launcher plan: unknown flag --tokns; did you mean --tokens? (launcher plan -h lists the flags)\n"},
		{[]string{"plan", "--tokens", "x"}, `launcher plan: invalid value "x" for flag --tokens: parse error (launcher plan -h lists the flags)` + "\n"},
		{[]string{"ckpt", "inspect", "dir", "--to", "x"}, "launcher ckpt inspect: unknown flag --to (launcher ckpt inspect -h lists the flags)\n"},
		{[]string{"ckpt", "convert", "dir"}, "launcher ckpt convert: --to FILE is required\n"},
		{[]string{"ckpt", "convert", "--to", "x"}, "launcher ckpt convert: PATH is required (launcher ckpt convert -h)\n"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, &out, &errb)
		if code != ExitUsage || out.Len() != 0 || errb.String() != tc.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
}
