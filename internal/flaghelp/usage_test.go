package flaghelp

import (
	"bytes"
	"flag"
	"io"
	"testing"
	"time"
)

func testFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("mesh", "", "device `MESH`, e.g. dp=2,tp=2")
	fs.Int("tokens", 512, "tokens per step")
	fs.Bool("quick", false, "uneven sizes only")
	fs.Bool("sync", true, "fsync")
	fs.Duration("grace", 10*time.Second, "SIGTERM to SIGKILL")
	fs.Float64("lr", 0.05, "learning rate")
	fs.String("o", "trace.json", "output `FILE`; - for stdout")
	fs.String("kernels", "", "provider (default $MESHRUN_KERNELS, else the device's own)")
	return fs
}

func TestFlags(t *testing.T) {
	var b bytes.Buffer
	Flags(&b, testFlags())
	want := `  --grace DURATION  SIGTERM to SIGKILL (default 10s)
  --kernels STRING  provider (default $MESHRUN_KERNELS, else the device's own)
  --lr NUMBER       learning rate (default 0.05)
  --mesh MESH       device MESH, e.g. dp=2,tp=2
  -o FILE           output FILE; - for stdout (default trace.json)
  --quick           uneven sizes only
  --sync            fsync (default true)
  --tokens INT      tokens per step (default 512)
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	Flags(&b, flag.NewFlagSet("none", flag.ContinueOnError))
	if b.String() != "  (none)\n" {
		t.Errorf("no flags: %q", b.String())
	}
}

func TestError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokns", "5"}, "unknown flag --tokns; did you mean --tokens?"},
		{[]string{"-mseh", "4"}, "unknown flag --mseh; did you mean --mesh?"},
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"-x"}, "unknown flag -x"},
		{[]string{"--tokens", "many"}, `invalid value "many" for flag --tokens: parse error`},
		{[]string{"--quick=maybe"}, `invalid boolean value "maybe" for --quick: parse error`},
		{[]string{"--mesh"}, "flag needs an argument: --mesh"},
		{[]string{"-o"}, "flag needs an argument: -o"},
	} {
		fs := testFlags()
		err := fs.Parse(tc.args)
		if err == nil {
			t.Fatalf("%v parsed", tc.args)
		}
		if got := Error(fs, err).Error(); got != tc.want {
			t.Errorf("%v: got %q, want %q (from %q)", tc.args, got, tc.want, err)
		}
	}
}

// TestHelpAndCommandError: a command's -h is its usage then its flags, and a
// bad flag one line pointing at the command's -h.
func TestHelpAndCommandError(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("tokens", 512, "tokens per step")
	if got, want := Help("usage: t [flags]\n", fs), "usage: t [flags]\n\nflags:\n  --tokens INT  tokens per step (default 512)\n"; got != want {
		t.Errorf("Help: got %q, want %q", got, want)
	}
	err := CommandError("launcher t", fs, fs.Parse([]string{"--tokns", "5"}))
	if want := "unknown flag --tokns; did you mean --tokens? (launcher t -h lists the flags)"; err == nil || err.Error() != want {
		t.Errorf("CommandError: got %v, want %q", err, want)
	}
}
