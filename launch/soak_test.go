package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestSoak runs consecutive jobs of 2 to 4 ranks (barrier: NATS, the
// rendezvous, shared memory), then 5 at once, and checks that nothing
// accumulates: no process of theirs is left, no /dev/shm file, no open
// descriptor or goroutine of the launcher beyond a small slack.
// MESHRUN_SOAK sets the consecutive jobs (default 20 here; bench/soak/run.sh
// runs 200).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs many jobs")
	}
	n := 20
	if v, err := strconv.Atoi(os.Getenv("MESHRUN_SOAK")); err == nil && v > 0 {
		n = v
	}
	logDir := t.TempDir()
	run := func(i int) error {
		var out, errb bytes.Buffer
		args := []string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", fmt.Sprintf("soak-%d", i), "-n", strconv.Itoa(2 + i%3), "barrier"}
		if code := Main(context.Background(), args, &out, &errb); code != 0 {
			return fmt.Errorf("job %d: exit %d: %s", i, code, errb.String())
		}
		return nil
	}
	// One job first: what the first leaves (the runtime's own threads and
	// pools) is not growth.
	if err := run(0); err != nil {
		t.Fatal(err)
	}
	before := soakCounts()
	start := time.Now()
	for i := 1; i <= n; i++ {
		if err := run(i); err != nil {
			t.Fatal(err)
		}
	}
	consecutive := time.Since(start)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	start = time.Now()
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := run(10000 + i); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	concurrent := time.Since(start)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var after soakCount
	waitFor(t, 10*time.Second, "the jobs' goroutines and descriptors to settle", func() bool {
		after = soakCounts()
		return after.goroutines <= before.goroutines+5 && after.fds <= before.fds+5 && after.shm <= before.shm && after.tagged == 0
	})
	t.Logf("%d consecutive jobs in %v, 5 concurrent in %v; before %+v, after %+v", n, consecutive.Round(time.Millisecond), concurrent.Round(time.Millisecond), before, after)
}

type soakCount struct{ goroutines, fds, shm, tagged int }

// soakCounts counts the launcher's goroutines and open descriptors, the
// meshrun files in /dev/shm, and the processes that carry a launcher's tag.
func soakCounts() soakCount {
	c := soakCount{goroutines: runtime.NumGoroutine()}
	fds, _ := os.ReadDir("/proc/self/fd")
	c.fds = len(fds)
	shm, _ := filepath.Glob("/dev/shm/meshrun-*")
	c.shm = len(shm)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(b, []byte(EnvLauncherTag+"=")) && processAlive(atoi(e.Name())) {
			c.tagged++
		}
	}
	return c
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
