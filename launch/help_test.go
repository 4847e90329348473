package launch

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/exitcode"
	"github.com/meshrun/meshrun/logview"
)

// TestHelp: -h and --help on the launcher and on every subcommand print the
// usage and every flag with its default on stdout and exit 0; the text is
// pinned by testdata/help/*.txt (go test ./launch -run TestHelp -update
// rewrites them; run.txt is options.go's own usage). planview's TestHelp pins
// plan, logview's logs, logs why and trace.
func TestHelp(t *testing.T) {
	for _, tc := range []struct{ file, cmd string }{
		{"launcher.txt", ""},
		{"run.txt", "run"},
		{"ckpt.txt", "ckpt"},
		{"ckpt-inspect.txt", "ckpt inspect"},
		{"ckpt-convert.txt", "ckpt convert"},
		{"stacks.txt", "stacks"},
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
}

// TestFlagErrors: a bad flag of a subcommand exits 2 with one line naming it
// (and the nearest flag for a typo) and pointing at -h.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ckpt", "inspect", "dir", "--to", "x"}, "launcher ckpt inspect: unknown flag --to (launcher ckpt inspect -h lists the flags)\n"},
		{[]string{"ckpt", "convert", "dir", "--too", "x"}, "launcher ckpt convert: unknown flag --too; did you mean --to? (launcher ckpt convert -h lists the flags)\n"},
		{[]string{"ckpt", "convert", "dir"}, "launcher ckpt convert: --to FILE is required\n"},
		{[]string{"ckpt", "convert", "--to", "x"}, "launcher ckpt convert: PATH is required (launcher ckpt convert -h)\n"},
		{[]string{"stacks", "--wiat", "1s"}, "launcher stacks: unknown flag --wiat; did you mean --wait? (launcher stacks -h lists the flags)\n"},
		{[]string{"stacks", "a", "b"}, "launcher stacks: one job at most, got [\"a\" \"b\"]\n"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, &out, &errb)
		if code != ExitUsage || out.Len() != 0 || errb.String() != tc.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
}

// TestExitCodesShared: every launcher command exits with the same code for
// bad flags and when interrupted, whichever package runs it (package
// internal/exitcode; logview keeps its own ExitUsage).
func TestExitCodesShared(t *testing.T) {
	if ExitUsage != exitcode.Usage || logview.ExitUsage != exitcode.Usage || ExitInterrupted != exitcode.Interrupted {
		t.Errorf("exit codes: launch usage %d, interrupted %d; logview usage %d; want %d and %d",
			ExitUsage, ExitInterrupted, logview.ExitUsage, exitcode.Usage, exitcode.Interrupted)
	}
}
