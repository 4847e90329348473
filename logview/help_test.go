package logview

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/goldenfile"
)

// command runs `launcher logs` or `launcher trace` (args[0]) as cmd/launcher
// does.
func command(args []string, stdout, stderr *bytes.Buffer) int {
	if args[0] == "trace" {
		return TraceMain(args[1:], stdout, stderr)
	}
	return LogsMain(context.Background(), args[1:], stdout, stderr)
}

// TestHelp: -h and --help on logs, logs why and trace print the usage and
// every flag with its default on stdout and exit 0; the text is pinned by
// testdata/help/*.txt (go test ./logview -run TestHelp -update rewrites
// them).
func TestHelp(t *testing.T) {
	for _, tc := range []struct{ file, cmd string }{
		{"logs.txt", "logs"},
		{"logs-why.txt", "logs why"},
		{"trace.txt", "trace"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var texts []string
			for _, h := range []string{"-h", "--help"} {
				var out, errb bytes.Buffer
				code := command(append(strings.Fields(tc.cmd), h), &out, &errb)
				if code != 0 || errb.Len() != 0 || out.Len() == 0 {
					t.Fatalf("launcher %s %s: exit %d, stderr %q, stdout %q", tc.cmd, h, code, errb.String(), out.String())
				}
				texts = append(texts, out.String())
			}
			if texts[0] != texts[1] {
				t.Errorf("--help differs from -h:\n%s", texts[1])
			}
			goldenfile.Check(t, filepath.Join("testdata", "help", tc.file), texts[0])
		})
	}
}

// TestFlagErrors: a bad flag of logs, logs why or trace exits 2 with one line
// naming it (and the nearest flag for a typo) and pointing at -h.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"logs", "--tial", "3"}, "launcher logs: unknown flag --tial; did you mean --tail? (launcher logs -h lists the flags)\n"},
		{[]string{"logs", "why", "--log-dri", "x"}, "launcher logs why: unknown flag --log-dri; did you mean --log-dir? (launcher logs why -h lists the flags)\n"},
		{[]string{"trace", "-o"}, "launcher trace: flag needs an argument: -o (launcher trace -h lists the flags)\n"},
	} {
		var out, errb bytes.Buffer
		code := command(tc.args, &out, &errb)
		if code != ExitUsage || out.Len() != 0 || errb.String() != tc.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
}
