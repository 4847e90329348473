package launch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
)

// No process outlives its job. Each rank runs in its own process group, and
// the kernel kills the rank itself when the launcher dies (parent-death
// signal); but what a rank started (`sh -c 'sleep 300; ...'`, a daemon that
// left the group with setsid) would be re-parented to init. So:
//
//   - every rank, and whatever it starts, carries EnvLauncherTag, this
//     launcher's random tag, in its environment;
//   - at the end of each attempt the launcher kills every process carrying
//     its tag (killTagged), whatever group or session it moved to;
//   - a guard process, started before the ranks, holds a pipe from the
//     launcher: when the launcher dies by any signal, SIGKILL included, the
//     pipe closes and the guard kills the ranks' process groups and every
//     tagged process, and removes the job's NATS credentials. It ignores
//     SIGINT, SIGTERM and SIGHUP and sits in its own process group, so a
//     Ctrl-C in the terminal does not take it first. When the launcher ends
//     normally it says "done" and the guard exits.
//
// Secrets: the credentials of the embedded NATS server are removed when the
// job ends (the guard removes them when the launcher is killed), and at the
// start of a job the launcher removes those of earlier jobs in --log-dir
// whose launcher is gone (cleanStaleCreds).

// EnvLauncherTag names the variable that marks the processes of one
// launcher's ranks.
const EnvLauncherTag = "MESHRUN_LAUNCHER_TAG"

// guardScript is the guard: "$1" the tag, "$2" the credentials file ("" for
// none); the launcher writes a process group per line, "done" at the end.
// A group is signalled as `kill -s KILL -- -PGID`: dash, Debian's /bin/sh,
// takes `kill -KILL -- -PGID` for a bad number and kills nothing.
const guardScript = `trap '' INT TERM HUP
tag=$1 creds=$2
shift 2
while read -r pg; do
	[ "$pg" = done ] && exit 0
	set -- "$@" "$pg"
done
for pg; do kill -s KILL -- "-$pg" 2>/dev/null; done
for f in /proc/[0-9]*/environ; do
	if tr '\0' '\n' < "$f" 2>/dev/null | grep -qx "` + EnvLauncherTag + `=$tag"; then
		p=${f#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null
	fi
done
[ -n "$creds" ] && rm -f "$creds"
exit 0
`

// guard is the launcher's end of its guard process.
type guard struct {
	cmd *exec.Cmd
	w   io.WriteCloser
}

// startGuard starts the guard for tag and creds; nil when /bin/sh cannot
// run (the launcher then goes on unguarded and says so).
func startGuard(tag, creds string) (*guard, error) {
	cmd := exec.Command("/bin/sh", "-c", guardScript, "meshrun-guard", tag, creds)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("guard process: %w", err)
	}
	return &guard{cmd: cmd, w: w}, nil
}

// watch tells the guard of a rank's process group.
func (g *guard) watch(pgid int) {
	if g != nil {
		fmt.Fprintf(g.w, "%d\n", pgid)
	}
}

// done ends the guard without it killing anything.
func (g *guard) done() {
	if g == nil {
		return
	}
	io.WriteString(g.w, "done\n")
	g.w.Close()
	g.cmd.Wait()
}

// killTagged SIGKILLs every process whose environment carries tag (the
// launcher's ranks and all they started, whatever group or session), but
// this process; it returns how many it signalled.
func killTagged(tag string) int {
	want := []byte(EnvLauncherTag + "=" + tag + "\x00")
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !(bytes.HasPrefix(b, want) || bytes.Contains(b, append([]byte{0}, want...))) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// cleanStaleCreds removes the NATS credentials left in the job folders of
// logDir by launchers that are gone (killed before they could): their
// server is gone with them, but a secret is a secret. A folder whose
// launcher still runs, or whose events do not say which launcher it was
// and is under a minute old, is left alone. It returns the files removed.
func cleanStaleCreds(logDir string) []string {
	var removed []string
	m, _ := filepath.Glob(filepath.Join(logDir, "*", CredsFile))
	for _, creds := range m {
		dir := filepath.Dir(creds)
		pid, _ := jobStart(filepath.Join(dir, EventsFile))
		if pid > 0 && processAlive(pid) {
			continue
		}
		if st, err := os.Stat(creds); pid <= 0 && (err != nil || time.Since(st.ModTime()) < time.Minute) {
			continue
		}
		if os.Remove(creds) == nil {
			removed = append(removed, creds)
		}
	}
	return removed
}

// jobStart reads the job_start event, the first line of an events.jsonl:
// the launcher's pid (0 unknown) and its node (-1 unknown).
func jobStart(events string) (pid, node int) {
	f, err := os.Open(events)
	if err != nil {
		return 0, -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		return 0, -1
	}
	var ev struct {
		Event string `json:"event"`
		PID   int    `json:"launcher_pid"`
		Node  *int   `json:"node"`
	}
	if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "job_start" {
		return 0, -1
	}
	node = -1
	if ev.Node != nil {
		node = *ev.Node
	}
	return ev.PID, node
}

// processAlive reports whether pid is a live process (not a zombie).
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st := probe.ProcessState(pid)
	return st == "" || st[0] != 'Z'
}
