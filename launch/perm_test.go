package launch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/runlog"
)

// envAsOther runs this test binary as a helper, started by the tests below
// under another uid (the package's TestMain never runs then):
//
//	read PATH...   tries to read each path (a folder is listed), one line
//	               each: "PATH<TAB>ok" or "PATH<TAB>" and the error's errno
//	run ARGS...    the launcher's Main with ARGS; its exit code is ours
const envAsOther = "MESHRUN_TEST_AS_OTHER"

func init() {
	switch os.Getenv(envAsOther) {
	case "":
		return
	case "read":
		for _, p := range os.Args[1:] {
			fmt.Printf("%s\t%s\n", p, tryRead(p))
		}
		os.Exit(0)
	case "run":
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	fmt.Fprintf(os.Stderr, "%s=%q: want read or run\n", envAsOther, os.Getenv(envAsOther))
	os.Exit(2)
}

// tryRead opens path and reads a byte of it (lists it when a folder).
func tryRead(path string) string {
	f, err := os.Open(path)
	if err == nil {
		if st, serr := f.Stat(); serr == nil && st.IsDir() {
			_, err = f.ReadDir(1)
		} else {
			_, err = f.Read(make([]byte, 1))
		}
		f.Close()
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return err.Error()
}

// otherUser is a copy of this test binary that another uid can run.
type otherUser struct {
	bin string
}

// asOtherUser skips without root: only root starts a process as another uid
// (CI runs as root, so these tests run there).
func asOtherUser(t *testing.T) otherUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a reader as uid 65534 (nobody)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := openTempDir(t, 0o755)
	bin := filepath.Join(dir, "as-other")
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err == nil {
		_, err = io.Copy(dst, src)
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Chmod(bin, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return otherUser{bin: bin}
}

// openTempDir is a fresh folder of this mode, its parents reachable by every
// user (t.TempDir's are 0700: they would hide the job folder's own modes).
func openTempDir(t *testing.T, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp(reachableTemp(t), "meshrun-perm-")
	if err == nil {
		err = os.Chmod(dir, mode)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// reachableTemp is the temporary folder ($TMPDIR, else /tmp) when every
// user may pass through it and the folders above it, else /tmp.
func reachableTemp(t *testing.T) string {
	t.Helper()
	for _, base := range []string{os.TempDir(), "/tmp"} {
		ok := true
		for d := base; ok; d = filepath.Dir(d) {
			st, err := os.Stat(d)
			ok = err == nil && st.IsDir() && st.Mode().Perm()&0o001 != 0
			if d == filepath.Dir(d) {
				break
			}
		}
		if ok {
			return base
		}
	}
	t.Fatalf("neither %s nor /tmp may be passed through by other users: no folder to test another user's access in", os.TempDir())
	return ""
}

// command is the helper as uid 65534 with group gid and these supplementary
// groups.
func (o otherUser) command(mode string, gid uint32, groups []uint32, args ...string) *exec.Cmd {
	cmd := exec.Command(o.bin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{envAsOther + "=" + mode, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: gid, Groups: groups}}
	return cmd
}

// read tries every path as uid 65534 and returns what each gave.
func (o otherUser) read(t *testing.T, gid uint32, groups []uint32, paths []string) map[string]string {
	t.Helper()
	cmd := o.command("read", gid, groups, paths...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reader as uid 65534: %v\n%s", err, errb.String())
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if p, res, ok := strings.Cut(sc.Text(), "\t"); ok {
			got[p] = res
		}
	}
	if len(got) != len(paths) {
		t.Fatalf("the reader answered for %d paths of %d:\n%s", len(got), len(paths), out)
	}
	return got
}

// jobPaths are the job folder and everything in it, read as root.
func jobPaths(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p != dir {
			return nil // removed meanwhile (a trace rotated, a temporary file renamed)
		}
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// checkModes holds every folder of the job to dirMode and every file to
// fileMode (the NATS credentials to 0600), of the group gid when gid >= 0.
// Files a rank program made itself are held to them only where the job
// folder's default ACL can be set (acl): elsewhere they keep the rank's
// umask, behind the folders.
func checkModes(t *testing.T, root string, dirMode, fileMode os.FileMode, gid int, acl bool, own func(string) bool) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p != root {
			return nil
		}
		if err != nil {
			return err
		}
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		n++
		want := fileMode
		if st.IsDir() {
			want = dirMode
		} else if filepath.Base(p) == CredsFile {
			want = 0o600
		}
		got := st.Mode() & (fs.ModePerm | fs.ModeSetgid)
		if !acl && own != nil && own(p) {
			return nil
		}
		if got != want&(fs.ModePerm|fs.ModeSetgid) {
			t.Errorf("%s: mode %04o, want %04o", rel(root, p), uint32(got.Perm())|setgidBit(got), uint32(want.Perm())|setgidBit(want))
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && gid >= 0 && int(sys.Gid) != gid {
			t.Errorf("%s: group %d, want %d", rel(root, p), sys.Gid, gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("%s holds %d entries: the job wrote nothing?", root, n)
	}
}

func setgidBit(m os.FileMode) uint32 {
	if m&fs.ModeSetgid != 0 {
		return 0o2000
	}
	return 0
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return r
	}
	return p
}

// aclWorks reports whether a default ACL can be set on a folder of dir's
// file system (the ranks' own files then get the job's modes too).
func aclWorks(t *testing.T, dir string) bool {
	probe, err := os.MkdirTemp(dir, ".acl-probe-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(probe)
	if err := setDefaultACL(probe, 0o700); err != nil {
		t.Logf("no default ACL on %s (%v): files a rank program makes itself keep its umask, behind 0700 folders", dir, err)
		return false
	}
	return true
}

// withUmask runs f under umask m (the ranks inherit it).
func withUmask(m int, f func()) {
	old := syscall.Umask(m)
	defer syscall.Umask(old)
	f()
}

// torchStyleScript is a rank program run as torchrun runs one (with
// --no-python): it writes into its folder and the job's with umask 000, as a
// careless program would, and rank 1 fails through torch's error file.
const torchStyleScript = `#!/bin/sh
umask 000
echo "rank $RANK" > "$MESHRUN_RANK_DIR/own.txt"
mkdir -p "$MESHRUN_RANK_DIR/../ckpt-$RANK/sub"
echo weights > "$MESHRUN_RANK_DIR/../ckpt-$RANK/sub/weights.bin"
if [ "$RANK" = 1 ]; then
  printf '{"message": {"message": "RuntimeError: boom", "extraInfo": {}}}' > "$TORCHELASTIC_ERROR_FILE"
  exit 1
fi
`

// TestJobFilesPrivate: under umask 022 and 077, every folder a job writes
// is 0700 and every file 0600: the launcher's (job.json, summary.json,
// events.jsonl, each rank's stdout.log and stderr.log, an attempt's folder),
// runlog's in the ranks (log.jsonl, trace.json, error.json, stacks-*.txt),
// checkpoints saved into the job folder, and what a torchrun-style program
// writes there with umask 000 (through the job folder's default ACL). The
// --log-dir the launcher makes is 0700 too.
func TestJobFilesPrivate(t *testing.T) {
	script := filepath.Join(t.TempDir(), "train.sh")
	if err := os.WriteFile(script, []byte(torchStyleScript), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, umask := range []int{0o022, 0o077} {
		t.Run(fmt.Sprintf("umask%03o", umask), func(t *testing.T) {
			logDir := filepath.Join(t.TempDir(), "runs") // made by the launcher
			acl := aclWorks(t, filepath.Dir(logDir))
			failing := []string{"--", ranktest(), "-steps", "1000", "-fail-rank", "1", "-at", "3"}
			if umask == 0o022 {
				// A hang: every rank dumps its stacks, twice.
				failing = []string{"--hang-after", "1s", "--", ranktest(), "-steps", "1000", "-block-rank", "1", "-at", "3"}
			}
			jobs := []struct {
				id   string
				args []string
				code func(int) bool
			}{
				{"mlp", []string{"-n", "2", "mlp", "--steps", "3", "--hidden", "32", "--tokens", "16", "--save", filepath.Join(logDir, "mlp", "ckpt")},
					func(c int) bool { return c == 0 }},
				{"failing", append([]string{"-n", "2", "--max-restarts", "1", "--grace", "1s"}, failing...),
					func(c int) bool { return c != 0 }},
				{"torch", []string{"--nproc_per_node=2", "--standalone", "--no-python", script},
					func(c int) bool { return c == 1 }},
			}
			withUmask(umask, func() {
				for _, j := range jobs {
					var out, errb bytes.Buffer
					args := append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", j.id}, j.args...)
					if c := Main(context.Background(), args, &out, &errb); !j.code(c) {
						t.Fatalf("%s: exit %d\n%s%s", j.id, c, out.String(), errb.String())
					}
				}
			})
			// What the jobs were to write.
			for _, f := range []string{
				"mlp/job.json", "mlp/summary.json", "mlp/events.jsonl", "mlp/rank-00001/stdout.log", "mlp/rank-00001/stderr.log",
				"mlp/rank-00000/log.jsonl", "mlp/rank-00000/trace.json", "mlp/ckpt",
				"failing/attempt-1/job.json", "failing/attempt-1/summary.json", "failing/attempt-1/rank-00001/log.jsonl",
				"torch/rank-00001/" + TorchErrorFile, "torch/rank-00000/own.txt", "torch/ckpt-0/sub/weights.bin",
			} {
				if _, err := os.Stat(filepath.Join(logDir, f)); err != nil {
					t.Errorf("the job did not write %s: %v", f, err)
				}
			}
			if m, _ := filepath.Glob(filepath.Join(logDir, "failing", "attempt-1", "*", runlog.ErrorFile)); len(m) == 0 {
				t.Errorf("the failing job's ranks wrote no %s", runlog.ErrorFile)
			}
			if stacks, _ := filepath.Glob(filepath.Join(logDir, "failing", "*", "stacks-*.txt")); umask == 0o022 && len(stacks) == 0 {
				t.Errorf("the hung job's ranks dumped no stacks")
			}
			if st, err := os.Stat(logDir); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("the --log-dir the launcher made: %v %v, want 0700", st.Mode(), err)
			}
			for _, j := range jobs {
				checkModes(t, filepath.Join(logDir, j.id), 0o700, 0o600, -1, acl, func(p string) bool {
					return j.id == "torch" && (strings.Contains(p, "ckpt-") || strings.HasSuffix(p, "own.txt") || strings.HasSuffix(p, TorchErrorFile))
				})
			}
		})
	}
}

// runningJob starts ranktest ranks that run until the job is interrupted and
// waits until they write their logs; stop interrupts it and returns the exit.
func runningJob(t *testing.T, logDir, id string, flags ...string) (dir string, rec JobRecord, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan int, 1)
	var out, errb bytes.Buffer
	go func() {
		args := append([]string{"run", "--log-dir", logDir, "--job-id", id, "--grace", "2s", "-n", "2"}, flags...)
		res <- Main(ctx, append(args, "--", ranktest(), "-steps", "0"), &out, &errb)
	}()
	dir = filepath.Join(logDir, id)
	code, stopped := -1, false
	stop = func() int {
		cancel()
		if !stopped {
			select {
			case code = <-res:
			case <-time.After(testtime.Scale(30 * time.Second)):
				t.Fatal("the launcher did not end")
			}
			stopped = true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	rec = waitJobRecord(t, dir)
	waitFor(t, 20*time.Second, "the ranks' progress", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, RankDir(1), "stdout.log"))
		return bytes.Count(b, []byte("@meshrun:progress")) >= 2
	})
	// A stacks file, written by the rank while the job runs.
	syscall.Kill(rec.Ranks[0].PID, syscall.SIGUSR1)
	waitFor(t, 10*time.Second, "rank 0's stacks", func() bool {
		m, _ := filepath.Glob(filepath.Join(dir, RankDir(0), "stacks-*.txt"))
		return len(m) > 0
	})
	for _, f := range []string{CredsFile, reserveFile, EventsFile, filepath.Join(RankDir(1), "log.jsonl"), filepath.Join(RankDir(1), "trace.json")} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the running job has no %s: %v", f, err)
		}
	}
	return dir, rec, stop
}

// TestJobFilesUnreadableByOthers: another user (uid 65534) can read nothing
// of a running job's folder, its NATS credentials and the ranks' runlog
// files included, nor of the finished job's: every open fails with EACCES.
// The --log-dir the job ran in was there before, 0755, and stays so.
func TestJobFilesUnreadableByOthers(t *testing.T) {
	other := asOtherUser(t)
	logDir := openTempDir(t, 0o755)
	dir, _, stop := runningJob(t, logDir, "private")
	check := func(when string) {
		paths := jobPaths(t, dir)
		t.Logf("%s: uid 65534 tries %d paths", when, len(paths))
		for p, res := range other.read(t, 65534, nil, paths) {
			if res != syscall.EACCES.Error() {
				t.Errorf("%s: uid 65534 reading %s: %s, want %s", when, rel(logDir, p), res, syscall.EACCES.Error())
			}
		}
		checkModes(t, dir, 0o700, 0o600, -1, true, nil)
	}
	check("while the job runs")
	if c := stop(); c != ExitInterrupted {
		t.Errorf("exit %d, want %d", c, ExitInterrupted)
	}
	if _, err := os.Stat(filepath.Join(dir, SummaryFile)); err != nil {
		t.Fatal(err)
	}
	check("after the job")
	if st, _ := os.Stat(logDir); st.Mode().Perm() != 0o755 {
		t.Errorf("the existing --log-dir was changed to %v", st.Mode())
	}
}

// shareGID is the group TestShareLogs gives a job to: root may name any.
const shareGID = 4242

// TestShareLogs: with --share-logs GROUP, a member of GROUP reads every file
// of the job (but its NATS credentials) and lists every folder, while it
// runs and after; a user outside it reads nothing. Folders are 2750 and files
// 0640, of GROUP, under umask 077. A user not in the group is refused before
// anything starts, as is a group that does not exist.
func TestShareLogs(t *testing.T) {
	other := asOtherUser(t)
	logDir := openTempDir(t, 0o755)
	var dir string
	var stop func() int
	withUmask(0o077, func() {
		dir, _, stop = runningJob(t, logDir, "shared", "--share-logs", strconv.Itoa(shareGID))
	})
	check := func(when string) {
		paths := jobPaths(t, dir)
		t.Logf("%s: uid 65534 in group %d and outside it try %d paths", when, shareGID, len(paths))
		member := other.read(t, shareGID, []uint32{shareGID}, paths)
		outsider := other.read(t, 65534, nil, paths)
		for _, p := range paths {
			want := "ok"
			if filepath.Base(p) == CredsFile {
				want = syscall.EACCES.Error()
			}
			if member[p] != want {
				t.Errorf("%s: a member of group %d reading %s: %s, want %s", when, shareGID, rel(logDir, p), member[p], want)
			}
			if outsider[p] != syscall.EACCES.Error() {
				t.Errorf("%s: uid 65534 outside the group reading %s: %s, want %s", when, rel(logDir, p), outsider[p], syscall.EACCES.Error())
			}
		}
		checkModes(t, dir, 0o750|fs.ModeSetgid, 0o640, shareGID, true, nil)
	}
	check("while the job runs")
	if c := stop(); c != ExitInterrupted {
		t.Errorf("exit %d, want %d", c, ExitInterrupted)
	}
	check("after the job")

	// Refused before anything starts: a group the user is not in (uid 65534
	// naming root's group), and a group that does not exist.
	open := openTempDir(t, 0o777)
	cmd := other.command("run", 65534, nil, "run", "--share-logs", "0", "--log-dir", filepath.Join(open, "runs"), "-n", "1", "--", "true")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitUsage || !strings.Contains(errb.String(), "--share-logs 0: you are not in group") {
		t.Errorf("uid 65534 with --share-logs 0: %v, stderr %q; want exit 2 naming the group", err, errb.String())
	}
	code, jobDir, _, stderr := launch(t, "--share-logs", "meshrun-no-such-group", "-n", "1", "--", "true")
	if code != ExitUsage || !strings.Contains(stderr, "--share-logs meshrun-no-such-group: no such group") {
		t.Errorf("--share-logs of no group: exit %d, stderr %q", code, stderr)
	}
	for _, d := range []string{filepath.Join(open, "runs"), jobDir} {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused job made %s: %v", d, err)
		}
	}
}

// TestNoSecretsInJobFiles: no file of a job holds its secrets: the NATS
// users and passwords (the --nats-creds file's, and the embedded server's
// per-job ones), the launcher's secret variables, secret flags and a URL's
// password on the command line. The command line keeps its shape, each
// secret as [redacted]; the credentials file's path is kept.
func TestNoSecretsInJobFiles(t *testing.T) {
	secrets := map[string]string{
		"nats user":     "natsuser-7d1c9e",
		"nats password": "natspw-Zq81LmX4vT",
		"token var":     "tokvar-83hd72",
		"secret var":    "secvar-1ff0a9",
		"password var":  "passvar-c0ffee",
		"--password":    "argpw-55a1b2",
		"--api-token=":  "argtok-9e8d7c",
		"API_TOKEN=":    "envtok-31337x",
		"URL password":  "urlpw-424242",
	}
	t.Setenv("MESHRUN_NATS_TOKEN", secrets["token var"])
	t.Setenv("MESHRUN_JOB_SECRET", secrets["secret var"])
	t.Setenv("MESHRUN_DB_PASSWORD", secrets["password var"])
	program := []string{"--", "sh", "-c", "true", "sh",
		"--password", secrets["--password"], "--api-token=" + secrets["--api-token="], "API_TOKEN=" + secrets["API_TOKEN="],
		"nats://urluser:" + secrets["URL password"] + "@example.com:4222", "--tokens", "512"}

	// An external server, as a multi-node job reaches it.
	id := "secrets-external"
	c := creds.Credentials{User: secrets["nats user"], Password: secrets["nats password"]}
	srv, err := natsrv.Start(natsrv.Options{JobCreds: map[string]creds.Credentials{id: c}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	credsFile := writeCreds(t, c)
	logDir := t.TempDir()
	var out, errb bytes.Buffer
	args := append([]string{"run", "--log-dir", logDir, "--job-id", id, "-n", "2", "--nats", srv.URL(), "--nats-creds", credsFile}, program...)
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	dir := filepath.Join(logDir, id)
	rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile))
	argv := strings.Join(rec.Argv, " ")
	for _, want := range []string{"--password [redacted] --api-token=[redacted] API_TOKEN=[redacted] nats://[redacted]@example.com:4222 --tokens 512",
		"--nats-creds " + credsFile} {
		if !strings.Contains(argv, want) {
			t.Errorf("job.json argv lacks %q: %q", want, argv)
		}
	}
	if cmd := strings.Join(rec.Command, " "); !strings.HasSuffix(cmd, "--password [redacted] --api-token=[redacted] API_TOKEN=[redacted] nats://[redacted]@example.com:4222 --tokens 512") {
		t.Errorf("job.json command: %q", cmd)
	}
	if rec.Env["MESHRUN_NATS_CREDS"] != credsFile {
		t.Errorf("job.json env MESHRUN_NATS_CREDS = %q, want the file's path %s", rec.Env["MESHRUN_NATS_CREDS"], credsFile)
	}
	noSecrets(t, dir, secrets)

	// The embedded server: a rank copies the job's credentials out, to know
	// them; they must be in no file of the job once it ended.
	copyTo := filepath.Join(t.TempDir(), "creds.copy")
	id = "secrets-embedded"
	out.Reset()
	errb.Reset()
	args = []string{"run", "--log-dir", logDir, "--job-id", id, "-n", "2", "--", "sh", "-c", `[ "$RANK" != 0 ] || cp "$MESHRUN_NATS_CREDS" "$0"`, copyTo}
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	b, err := os.ReadFile(copyTo)
	if err != nil {
		t.Fatal(err)
	}
	jc, err := creds.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(logDir, id)
	if _, err := os.Stat(filepath.Join(dir, CredsFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the job's credentials file outlived it: %v", err)
	}
	noSecrets(t, dir, map[string]string{"embedded user": jc.User, "embedded password": jc.Password})
}

// noSecrets fails for each file under dir holding one of secrets.
func noSecrets(t *testing.T, dir string, secrets map[string]string) {
	t.Helper()
	files := 0
	for _, p := range jobPaths(t, dir) {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a folder
		}
		files++
		for what, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds the %s %q", rel(dir, p), what, s)
			}
		}
	}
	if files < 5 {
		t.Fatalf("%s holds %d files", dir, files)
	}
}
