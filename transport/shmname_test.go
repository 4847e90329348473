package transport_test

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/transport"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// plant creates path the way another local user would: owned by uid 65534
// when the test runs as root, else world-readable (mode 0644): either way not
// a file this job's ranks can have made. A same-user file of the right mode
// but the wrong content is planted with foreign=false.
func plant(t *testing.T, path string, foreign bool) {
	t.Helper()
	mode := os.FileMode(0o600)
	if foreign {
		mode = 0o644
	}
	t.Cleanup(func() { os.Remove(path) })
	if err := os.WriteFile(path, []byte("not a ring"), mode); err != nil {
		t.Error(err)
		return
	}
	os.Chmod(path, mode) // past the umask
	if foreign && os.Geteuid() == 0 {
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Error(err)
		}
	}
}

// TestShmRingNames: a local user who knows the job id cannot block a job on
// shared memory, and a ring name that is taken all the same is passed over or
// fails setup at once, naming the file, never blaming a peer.
func TestShmRingNames(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}

	// Files at the names the rings of the job had when they were derived from
	// its id: another user's file, a symbolic link and a file of our own.
	t.Run("old-names", func(t *testing.T) {
		job := bootstraptest.NewJob()
		s := bootstraptest.StartServer(t, job)
		rdv := bootstraptest.WatchRendezvous(t, s)
		h := fnv.New64a()
		h.Write([]byte("job:" + job))
		var planted []string
		for src := 0; src < 3; src++ {
			for dst := 0; dst < 3; dst++ {
				path := fmt.Sprintf("/dev/shm/meshrun-%016x-%d-%d", h.Sum64(), src, dst)
				planted = append(planted, path)
				switch (src + dst) % 3 {
				case 0:
					plant(t, path, true)
				case 1:
					plant(t, path, false)
				case 2:
					if err := os.Symlink("/dev/null", path); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { os.Remove(path) })
				}
			}
		}
		ws := bootstraptest.JoinWorlds(t, s, job, 3, "shm", collective.Options{})
		err := bootstraptest.AllReduceOnce(ws)
		for _, w := range ws {
			w.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		if left := bootstraptest.LeftRings(rdv.RosterSeen(t), nil); len(left) > 0 {
			t.Errorf("left in /dev/shm after the job: %v", left)
		}
		for _, p := range planted {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("the planted %s is gone (%v): a rank removed a file it did not create", p, err)
			}
		}
	})

	// The first name of two rings of rank 1 is taken when it creates them:
	// by another user's file (1->0) and by a file of ours that is no ring
	// (1->2). Rank 1 takes the next name; its peers pass over the files.
	t.Run("taken-name", func(t *testing.T) {
		job := bootstraptest.NewJob()
		s := bootstraptest.StartServer(t, job)
		rdv := bootstraptest.WatchRendezvous(t, s)
		planted := map[string]bool{}
		var mu sync.Mutex
		defer transport.SetShmCreateHook(func(path string, src, dst, try int) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case src == 1 && dst == 0 && try == 0:
				plant(t, path, true)
			case src == 1 && dst == 2 && try == 0:
				plant(t, path, false)
			default:
				return
			}
			planted[path] = true
		})()
		core, logs := observer.New(zap.WarnLevel)
		ws := bootstraptest.JoinWorlds(t, s, job, 3, "shm", collective.Options{Logger: zap.New(core)})
		err := bootstraptest.AllReduceOnce(ws)
		for _, w := range ws {
			w.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(planted) != 2 {
			t.Fatalf("planted %v, want rank 1's first names of its rings to 0 and 2", planted)
		}
		if n := logs.FilterMessageSnippet("shm ring name taken").FilterField(zap.Int("rank", 1)).Len(); n != 2 {
			t.Errorf("rank 1 logged %d taken names, want 2", n)
		}
		if left := bootstraptest.LeftRings(rdv.RosterSeen(t), planted); len(left) > 0 {
			t.Errorf("left in /dev/shm after the job: %v", left)
		}
		for p := range planted {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("the planted %s is gone (%v): a rank removed a file it did not create", p, err)
			}
		}
	})

	// Every name of the ring 1->0 is taken by another user's file. Rank 1
	// cannot create it and rank 0 sees it cannot be made: both fail at once
	// with ErrAuth naming the files and their owner's uid, blaming no rank,
	// not with a peer lost at the deadline.
	t.Run("all-names-taken", func(t *testing.T) {
		job := bootstraptest.NewJob()
		s := bootstraptest.StartServer(t, job)
		rdv := bootstraptest.WatchRendezvous(t, s)
		planted := map[string]bool{}
		var first string
		var mu sync.Mutex
		defer transport.SetShmCreateHook(func(path string, src, dst, try int) {
			mu.Lock()
			defer mu.Unlock()
			if src == 1 && dst == 0 {
				plant(t, path, true)
				planted[path] = true
				if first == "" {
					first = path
				}
			}
		})()
		const timeout = 4 * time.Second
		cfgs := make([]bootstrap.Config, 3)
		for i := range cfgs {
			cfgs[i] = bootstraptest.Config(s, job, i, 3, "shm", collective.Options{})
			cfgs[i].RendezvousTimeout = timeout
		}
		start := time.Now()
		took := make([]time.Duration, 3)
		ws := make([]*collective.World, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range cfgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ws[i], errs[i] = bootstrap.Join(t.Context(), cfgs[i])
				took[i] = time.Since(start)
			}()
		}
		wg.Wait()
		for _, w := range ws {
			if w != nil {
				w.Close()
			}
		}
		if len(planted) != 4 {
			t.Fatalf("planted %d files, want the 4 names of ring 1->0", len(planted))
		}
		// The squatter is named by its uid: 65534 as root, else this user
		// (plant makes the files mode 0644).
		owner := fmt.Sprintf("files of uid %d", os.Geteuid())
		if os.Geteuid() == 0 {
			owner = "files of uid 65534"
		}
		for _, r := range []int{1, 0} {
			err := errs[r]
			if !errors.Is(err, collective.ErrAuth) || errors.Is(err, collective.ErrPeerLost) || !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), owner) {
				t.Errorf("rank %d: %v; want ErrAuth naming %s and %s", r, err, owner, first)
			}
			if collective.Culprit(err) >= 0 {
				t.Errorf("rank %d blames rank %d: %v", r, collective.Culprit(err), err)
			}
			if took[r] > timeout/2 {
				t.Errorf("rank %d failed after %v, with a setup deadline of %v", r, took[r], timeout)
			}
		}
		// Rank 2 waits for rank 1's ring, which never comes, until its deadline.
		if errs[2] == nil {
			t.Error("rank 2 joined a world whose rank 1 failed")
		}
		t.Logf("rank 1: %v (%v)", errs[1], took[1].Round(time.Millisecond))
		t.Logf("rank 0: %v (%v)", errs[0], took[0].Round(time.Millisecond))
		if left := bootstraptest.LeftRings(rdv.RosterSeen(t), planted); len(left) > 0 {
			t.Errorf("left in /dev/shm after the failed setup: %v", left)
		}
	})
}

// TestShmRingsMappedAtSetup: every page of every ring is in place before
// the first collective, so no message pays a page fault in its path (the
// first thousand 4 KiB all-reduces did, 10 to 20 times their later time).
func TestShmRingsMappedAtSetup(t *testing.T) {
	for r, w := range shmWorlds(t, 3, 0) {
		resident, total, err := transport.RingPages(w.Transport())
		if err != nil {
			t.Fatal(err)
		}
		if total == 0 || resident != total {
			t.Errorf("rank %d: %d of %d ring pages mapped after setup", r, resident, total)
		}
	}
}
