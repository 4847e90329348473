package transport_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/transport"
	"golang.org/x/sys/unix"
)

// TestShmFull: where the shared memory is full (any local user can fill
// /dev/shm), shm setup fails with an error naming it, blaming no rank,
// rather than killing the ranks with a SIGBUS as they bring the rings in.
// The rings go to a tmpfs of 2 MiB, smaller than one ring (4 MiB).
func TestShmFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=1777"); err != nil {
		t.Fatalf("mounting a tmpfs of 2 MiB: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	defer transport.SetShmDir(dir)()
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	cfgs := make([]bootstrap.Config, 2)
	for r := range cfgs {
		cfgs[r] = bootstraptest.Config(s, job, r, 2, "shm", collective.Options{})
		cfgs[r].RendezvousTimeout = 3e9
	}
	ws, errs := bootstraptest.JoinAll(cfgs)
	for _, w := range ws {
		if w != nil {
			w.Close()
		}
	}
	var full bool
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		if err == nil {
			t.Errorf("rank %d joined with its rings in a full tmpfs", r)
			continue
		}
		if strings.Contains(err.Error(), "no space left on device") {
			full = true
			if c := collective.Culprit(err); c >= 0 || errors.Is(err, collective.ErrPeerLost) {
				t.Errorf("rank %d blames rank %d for a full /dev/shm: %v", r, c, err)
			}
		}
	}
	if !full {
		t.Error("no rank said the shared memory was full")
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("%d files left in the tmpfs, e.g. %s", len(left), left[0].Name())
	}
}
