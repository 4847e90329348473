package transport_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/transport"
	"golang.org/x/sys/unix"
)

// A hostile local user against the shm transport: a squatter watches
// /dev/shm (inotify, and a readdir sweep whenever it is idle) and, for every
// meshrun-* name it sees, creates first every name it can derive from it:
// the name itself (should the job look it up again once it is unlinked),
// its other tries (NAME.0 to NAME.3) and, where the name has short numeric
// fields (as meshrun-TOKEN-SRC-DST[.TRY], the rings named by a per-rank
// token), the names with the last of them set to 0-7 (a rank's rings to
// each peer) and then with the last two (every ring), each with its tries.
// Its files are empty, mode 0644, owned by uid 65534 where it can make
// them so.

// squatterUID is the user the squatter process runs as ('nobody').
const squatterUID = 65534

// squatNames lists the names a squatter claims on seeing name, the most
// promising first: that rank's next rings.
func squatNames(name string) []string {
	base, _, _ := strings.Cut(name, ".")
	names := []string{name}
	withTries := func(b string) {
		names = append(names, b)
		for try := 0; try < 4; try++ {
			names = append(names, b+"."+strconv.Itoa(try))
		}
	}
	withTries(base)
	fields := strings.Split(base, "-")
	var nums []int // the short numeric fields
	for i := 1; i < len(fields); i++ {
		if _, err := strconv.Atoi(fields[i]); err == nil && len(fields[i]) <= 3 {
			nums = append(nums, i)
		}
	}
	set := func(vals ...int) string {
		f := slices.Clone(fields)
		for k, v := range vals {
			f[nums[len(nums)-len(vals)+k]] = strconv.Itoa(v)
		}
		return strings.Join(f, "-")
	}
	if len(nums) >= 1 {
		for v := 0; v < 8; v++ {
			withTries(set(v))
		}
	}
	if len(nums) >= 2 {
		for u := 0; u < 8; u++ {
			for v := 0; v < 8; v++ {
				withTries(set(u, v))
			}
		}
	}
	return names
}

// squatter is the watcher's state: the names it has seen and those it made.
type squatter struct {
	chown   bool              // make its files uid 65534's (it runs as root)
	claimed func(path string) // told of each file it made
	seen    map[string]bool   // names already handled, its own included
	nseen   atomic.Int64      // names of others seen
	nmade   atomic.Int64      // files made
}

func newSquatter(chown bool, claimed func(string)) *squatter {
	return &squatter{chown: chown, claimed: claimed, seen: map[string]bool{}}
}

// see handles a name found in /dev/shm.
func (s *squatter) see(name string) {
	if !strings.HasPrefix(name, "meshrun-") || s.seen[name] {
		return
	}
	s.seen[name] = true
	s.nseen.Add(1)
	for _, n := range squatNames(name) {
		if s.seen[n] && n != name {
			continue
		}
		s.seen[n] = true
		path := filepath.Join("/dev/shm", n)
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			continue
		}
		if s.chown {
			unix.Fchown(fd, squatterUID, squatterUID)
		}
		unix.Fchmod(fd, 0o644) // past the umask
		unix.Close(fd)
		s.nmade.Add(1)
		s.claimed(path)
	}
}

// sweep reads the directory whole (what inotify may have dropped).
func (s *squatter) sweep() {
	d, err := os.Open("/dev/shm")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		s.see(n)
	}
}

// run watches /dev/shm until stop is closed; ready is called once it watches.
func (s *squatter) run(stop <-chan struct{}, ready func()) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, "/dev/shm", unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		return fmt.Errorf("inotify on /dev/shm: %w", err)
	}
	s.sweep()
	ready()
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if k, _ := unix.Poll(fds, 20); k == 0 {
				s.sweep()
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("reading inotify: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				s.sweep()
				continue
			}
			if i := strings.IndexByte(string(nameBytes), 0); i >= 0 {
				nameBytes = nameBytes[:i]
			}
			s.see(string(nameBytes))
		}
	}
}

// squatterMain is the squatter process (the test binary, re-executed as
// uid 65534 with MESHRUN_TEST_SQUATTER=1): it prints "ready", then the path
// of every file it makes, until its stdin closes.
func squatterMain() int {
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	s := newSquatter(false, func(path string) {
		mu.Lock()
		fmt.Fprintln(out, path)
		out.Flush()
		mu.Unlock()
	})
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	err := s.run(stop, func() {
		mu.Lock()
		fmt.Fprintln(out, "ready")
		out.Flush()
		mu.Unlock()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "squatter:", err)
		return 1
	}
	return 0
}

// squatterFiles collects what the squatters made, removed when the test ends.
type squatterFiles struct {
	mu    sync.Mutex
	paths map[string]bool
}

func (f *squatterFiles) add(path string) {
	f.mu.Lock()
	f.paths[path] = true
	f.mu.Unlock()
}

func (f *squatterFiles) has(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paths[path]
}

func (f *squatterFiles) removeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p := range f.paths {
		os.Remove(p)
	}
}

// startSquatterProcess runs the squatter as uid 65534 (the test runs as
// root): a copy of the test binary in a directory that user can read.
func startSquatterProcess(t *testing.T, files *squatterFiles) (made *atomic.Int64) {
	t.Helper()
	dir, err := os.MkdirTemp("", "meshrun-squatter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "squatter")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err == nil {
		_, err = io.Copy(dst, src)
		if e := dst.Close(); err == nil {
			err = e
		}
	}
	src.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = []string{"MESHRUN_TEST_SQUATTER=1", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: squatterUID, Gid: squatterUID}}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	made = new(atomic.Int64)
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); l == "ready" {
				close(ready)
			} else {
				files.add(l)
				made.Add(1)
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		cmd.Wait()
	})
	select {
	case <-ready:
	case <-done:
		t.Fatal("the squatter process exited before it watched /dev/shm")
	case <-time.After(20 * time.Second):
		t.Fatal("the squatter process never watched /dev/shm")
	}
	return made
}

// TestShmSquatter: jobs on shared memory set up and run while squatters
// watch /dev/shm and claim, as fast as they can, every name they can derive
// from what they see: a goroutine of the test and, where the test runs as
// root (CI), a process of uid 65534. Ten jobs of four ranks (five asking for
// shm, five for the default transport) must all join over shm and all-reduce
// right, leaving nothing of theirs in /dev/shm and every squatter's file in
// place; the squatters must have seen the jobs' names and made files, or the
// test proves nothing.
func TestShmSquatter(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	files := &squatterFiles{paths: map[string]bool{}}
	t.Cleanup(files.removeAll) // after the squatters stop (cleanups run last first)
	g := newSquatter(os.Geteuid() == 0, files.add)
	stop := make(chan struct{})
	ready := make(chan struct{})
	gdone := make(chan error, 1)
	go func() { gdone <- g.run(stop, func() { close(ready) }) }()
	t.Cleanup(func() {
		close(stop)
		if err := <-gdone; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-ready:
	case err := <-gdone:
		t.Fatal(err)
	}
	pmade := new(atomic.Int64)
	if os.Geteuid() == 0 {
		pmade = startSquatterProcess(t, files)
	} else {
		t.Log("not root: no squatter of another uid (CI runs as root and has one); the goroutine's files are mode 0644")
	}

	const runs, n = 10, 4
	jobs := make([]string, runs)
	for i := range jobs {
		jobs[i] = bootstraptest.NewJob()
	}
	s := bootstraptest.StartServer(t, jobs...)
	passed := 0
	for i, job := range jobs {
		kind := "shm"
		if i%2 == 1 {
			kind = "auto"
		}
		rdv := bootstraptest.WatchRendezvous(t, s)
		seen0, made0 := g.nseen.Load(), g.nmade.Load()+pmade.Load()
		cfgs := make([]bootstrap.Config, n)
		for r := range cfgs {
			cfgs[r] = bootstraptest.Config(s, job, r, n, kind, collective.Options{})
			cfgs[r].RendezvousTimeout = 5 * time.Second
		}
		start := time.Now()
		ws, errs := bootstraptest.JoinAll(cfgs)
		err := errors.Join(errs...)
		if err == nil {
			for _, w := range ws {
				if w.Transport().Name() != "shm" {
					err = fmt.Errorf("rank %d joined over %s, want shm", w.Rank(), w.Transport().Name())
				}
			}
		}
		if err == nil {
			err = bootstraptest.AllReduceOnce(ws)
		}
		for _, w := range ws {
			if w != nil {
				w.Close()
			}
		}
		took := time.Since(start)
		if err != nil {
			t.Errorf("job %d (%s) failed after %v: %v", i, kind, took.Round(time.Millisecond), err)
		} else {
			passed++
		}
		// The squatter sees the names of the rings (created, mapped and
		// unlinked within the setup) a moment after they appear.
		deadline := time.Now().Add(2 * time.Second)
		for g.nseen.Load() == seen0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		// (Wait a moment for the squatters' files, they follow the names.)
		for g.nmade.Load()+pmade.Load() == made0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if g.nseen.Load() == seen0 || g.nmade.Load()+pmade.Load() == made0 {
			t.Errorf("job %d: the squatter goroutine saw %d of the job's names and the squatters made %d files: they tried nothing", i, g.nseen.Load()-seen0, g.nmade.Load()+pmade.Load()-made0)
		}
		roster := rdv.RosterSeen(t)
		for _, p := range transport.ShmRingPaths(roster) {
			if _, err := os.Lstat(p); err == nil && !files.has(p) {
				t.Errorf("job %d left %s in /dev/shm", i, p)
			}
			// Nothing of the job in a name: its id, a rank's token.
			if strings.Contains(p, job) {
				t.Errorf("job %d: the name %s holds the job id", i, p)
			}
			for r, a := range roster.Ranks {
				if strings.Contains(p, a.Shm) {
					t.Errorf("job %d: the name %s holds rank %d's token", i, p, r)
				}
			}
		}
	}
	t.Logf("%d of %d jobs passed; the squatter goroutine saw %d names and made %d files", passed, runs, g.nseen.Load(), g.nmade.Load())
	if os.Geteuid() == 0 {
		t.Logf("the squatter of uid %d made %d files", squatterUID, pmade.Load())
		if pmade.Load() == 0 {
			t.Errorf("the squatter of uid %d made no file: it tried nothing", squatterUID)
		}
	}
	// A rank removes no file it did not create.
	files.mu.Lock()
	var gone []string
	for p := range files.paths {
		if _, err := os.Lstat(p); err != nil {
			gone = append(gone, p)
		}
	}
	files.mu.Unlock()
	if len(gone) > 0 {
		t.Errorf("%d squatter's files were removed by the jobs, e.g. %s", len(gone), gone[0])
	}
}
