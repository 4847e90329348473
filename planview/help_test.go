package planview

import (
	"bytes"
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelp: -h and --help on plan print the usage and every flag with its
// default on stdout and exit 0; the text is pinned by testdata/help/plan.txt
// (go test ./planview -run TestHelp -update rewrites it). launch's TestHelp
// pins the launcher's own usage, which lists plan.
func TestHelp(t *testing.T) {
	var texts []string
	for _, h := range []string{"-h", "--help"} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), []string{h}, &out, &errb)
		if code != 0 || errb.Len() != 0 || out.Len() == 0 {
			t.Fatalf("launcher plan %s: exit %d, stderr %q, stdout %q", h, code, errb.String(), out.String())
		}
		texts = append(texts, out.String())
	}
	if texts[0] != texts[1] {
		t.Errorf("--help differs from -h:\n%s", texts[1])
	}
	golden(t, filepath.Join("testdata", "help", "plan.txt"), texts[0])
	// The plan help lists every flag plan has.
	fs, _ := planFlags(&PlanOptions{})
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(planHelp(), "-"+f.Name+" ") {
			t.Errorf("plan help lacks --%s", f.Name)
		}
	})
}

// TestFlagErrors: a bad flag of plan exits 2 with one line naming it (and the
// nearest flag for a typo) and pointing at -h.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mesh", "4", "--tokns", "5"}, "launcher plan: unknown flag --tokns; did you mean --tokens? (launcher plan -h lists the flags)\n"},
		{[]string{"--tokens", "x"}, `launcher plan: invalid value "x" for flag --tokens: parse error (launcher plan -h lists the flags)` + "\n"},
		{[]string{"extra"}, "launcher plan: unexpected argument \"extra\" (launcher plan -h lists the flags)\n"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, &out, &errb)
		if code != ExitUsage || out.Len() != 0 || errb.String() != tc.want {
			t.Errorf("plan %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
}
