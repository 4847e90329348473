package planview

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/placement"
)

// TestPlanAbsurdSizes: `launcher plan` refuses meshes, shapes and searches
// beyond its bounds at once, with exit 2 and one line naming them, never an
// overflow (a negative count), a panic, or minutes of work.
func TestPlanAbsurdSizes(t *testing.T) {
	for _, tc := range []struct {
		name, args, want string
	}{
		{"a trillion devices", "--mesh 1000000x1000000 --op linear --x 8x16:[R,R] --w 32x16:[R,R]",
			`--mesh: placement: too large: size 1000000 is more than 65536 in mesh "1000000x1000000"`},
		{"16M devices", "--mesh 4096x4096 --op linear --x 8x16:[R,R] --w 32x16:[R,R]",
			"--mesh: placement: too large: mesh 4096x4096 holds more than 65536 devices, the most a mesh may hold"},
		{"tokens x hidden", "--block mlp --mesh tp=2 --tokens 3000000000 --hidden 1000000000 --ffn 1000000000",
			"placement: too large: layout mlp: x [tokens 3000000000, hidden 1000000000] would hold more than 281474976710656 elements"},
		{"tokens x ffn", "--block mlp --mesh tp=2 --tokens 4000000000 --hidden 1 --ffn 4000000000",
			"layout mlp: h [tokens 4000000000, ffn 4000000000]"},
		{"every size", "--block mlp --mesh tp=2 --tokens 4000000000 --hidden 4000000000 --ffn 4000000000", "too large"},
		{"a shape", "--mesh 2 --x 16777216x16777216x2:[S(0)] --w 32x2:[R]", "shape 16777216x16777216x2 holds more than"},
		{"a shape's dim", "--mesh 2 --x 99999999999999999999x2:[S(0)] --w 32x2:[R]", "is more than 281474976710656"},
		{"mesh dims", "--mesh 1x1x1x1x1x1x1x1x1 --x 8:[R,R,R,R,R,R,R,R,R] --op gelu", "has 9 dims, more than the 8"},
		{"a 6-D search", "--mesh 2x2x2x2x2x2 --x 1024x4096:[R,R,S(1),S(1),S(1,chunk),R] --w 1024x4096:[S(0),S(1),S(0),S(0),S(0),S(0,chunk)]", "planning budget exceeded"},
		{"a 6-D block", "--block mlp --mesh 2x2x2x2x2x2 --tokens 512 --hidden 1024 --ffn 4096", "planning budget exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			start := time.Now()
			code := Main(context.Background(), strings.Fields(tc.args), &out, &errb)
			d := time.Since(start)
			if code != ExitUsage || out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("plan %s: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, out.String(), errb.String(), tc.want)
			}
			if d > testtime.Scale(5*time.Second) {
				t.Errorf("plan %s took %v", tc.args, d)
			}
		})
	}
}

// TestPlanLargeMeshes: what the planner refused for its budget before it
// searched strategies by bounds plans now: a 6-D mesh, the MLP block on one,
// a 2-D mesh of 65,536 ranks.
func TestPlanLargeMeshes(t *testing.T) {
	for _, args := range []string{
		"--mesh 2x2x2x2x2x2 --x 8x16:[R,R,R,R,R,R] --w 32x16:[R,R,R,R,R,S(0)]",
		"--block mlp --mesh 2x2x2x2x2x2",
		"--block mlp --mesh 2x2x2x2x2x2 --tokens 512 --hidden 1024",
		"--mesh 256x256 --x 8x16:[R,S(0)] --w 32x16:[R,S(0)]",
	} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), strings.Fields(args), &out, &errb); code != 0 || !strings.Contains(out.String(), "modelled") {
			t.Errorf("plan %s: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// TestPlanBlockMemory: `launcher plan --block mlp` ends with the memory a
// rank needs, the estimate the mlp workload checks before it starts.
func TestPlanBlockMemory(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), strings.Fields("--block mlp --mesh tp=2 --tokens 20000 --hidden 20000 --ffn 80000"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := "memory per rank: about 49.9 GiB (params 6.0 GiB, gradients 6.0 GiB, activations 23.1 GiB, scratch 14.9 GiB)\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Fatalf("output ends %q, want %q", out.String()[max(0, out.Len()-200):], want)
	}
}

// TestPlanInterrupted: a plan stops as soon as its context is done, and
// RunPlan's context is done on SIGINT (launcher plan exits at once).
func TestPlanInterrupted(t *testing.T) {
	o, err := ParsePlanFlags(strings.Fields("--mesh 2x2x2x2x2x2 --x 1024x4096:[R,R,S(1),S(1),S(1,chunk),R] --w 1024x4096:[S(0),S(1),S(0),S(0),S(0),S(0,chunk)]"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = RunPlanContext(ctx, &bytes.Buffer{}, o)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("canceled plan: %v", err)
	}
	if d := time.Since(start); d > testtime.Scale(time.Second) {
		t.Fatalf("a plan canceled after 100 ms returned after %v", d)
	}

	// Keep SIGINT from ending the test binary, then send it until RunPlan,
	// which installs its own handler, returns.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- RunPlan(&bytes.Buffer{}, o) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil || errors.Is(err, placement.ErrBudget) || !strings.Contains(err.Error(), "interrupted") {
				t.Fatalf("SIGINT: %v", err)
			}
			return
		case <-tick.C:
			if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
		case <-time.After(testtime.Scale(10 * time.Second)):
			t.Fatal("RunPlan did not return")
		}
	}
}
