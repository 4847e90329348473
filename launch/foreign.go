package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/logview"
)

// A program the launcher runs that is not one of meshrun's workers (a
// PyTorch script, anything after --) sends no heartbeats: the launcher
// judges its progress from the outside. A rank makes progress when it
// writes a line (stdout or stderr; a program may print one on purpose, e.g.
// "@meshrun:progress", which the console does not show), or when its
// processes (the rank's process group) use CPU time: at least busyShare of
// one core over a check. When no rank of the job has made progress for
// --hang-after, the job hangs: the launcher asks every rank for its stacks
// (SIGUSR1 to the ranks that said they dump them: Python through the site
// hook, meshrun's workers through runlog; /proc for the others), groups the
// ranks by stack, names the odd one out as the root cause and tears the job
// down.

// DefaultProgramHangAfter is how long no rank of a program may make progress
// before the launcher calls its job hung, when --hang-after is not given:
// longer than the collectives' 30 s, since a program may wait without
// output and nearly without CPU for good reasons (a download, a slow
// filesystem), as long as NCCL's own default timeout.
const DefaultProgramHangAfter = 10 * time.Minute

// busyShare is the share of one core a rank's processes must use over a
// check to count as progress without output: waiting in a collective or on
// a socket costs less, a computing rank far more.
const busyShare = 0.05

// activity is what the launcher knows of a foreign rank's progress.
type activity struct {
	line     atomic.Int64 // unix ns of its last output line
	cpu      float64      // its process group's CPU seconds at the last check
	checked  time.Time    // the last check
	lastBusy time.Time    // the last check that found it busy (or its start)
}

// idleCheckEvery is how often the launcher reads a foreign job's CPU times.
const idleCheckEvery = time.Second

// onIdleCheck is the hang check of a foreign program's job: it updates each
// rank's activity and, when no rank made progress for --hang-after, dumps
// the stacks and tears the job down naming the odd rank out.
func (a *attempt) onIdleCheck(now time.Time) {
	if a.tearing || a.idleDone || now.Sub(a.idleAt) < idleCheckEvery {
		return
	}
	a.idleAt = now
	idleSince := time.Time{}
	running := 0
	for _, p := range a.procs {
		if p.done || p.pid <= 0 {
			continue
		}
		running++
		act := &p.act
		cpu := probe.GroupCPU(p.pid)
		busy := false
		if !act.checked.IsZero() && cpu-act.cpu >= busyShare*now.Sub(act.checked).Seconds() {
			busy = true
		}
		if act.lastBusy.IsZero() {
			act.lastBusy = p.start // it was busy starting
		}
		if l := act.line.Load(); l > 0 && time.Unix(0, l).After(act.lastBusy) {
			act.lastBusy = time.Unix(0, l)
		}
		if busy {
			act.lastBusy = now
		}
		act.cpu, act.checked = cpu, now
		if idleSince.IsZero() || act.lastBusy.After(idleSince) {
			idleSince = act.lastBusy
		}
	}
	after := DefaultProgramHangAfter
	if a.j.HangAfterSet {
		after = a.j.HangAfter
	}
	if running == 0 || now.Sub(idleSince) < after {
		return
	}
	a.idleDone = true
	idle := now.Sub(idleSince)
	a.say("hang: no rank made progress (output, or %.0f%% of a core) for %.1f s: asking every rank for its stacks", busyShare*100, idle.Seconds())
	stacks := probe.Collect(rankTargets(a.procs), probe.StacksWait)
	groups, odd := logview.GroupStacks(stacks)
	path := a.writeStacks(now, stacks, groups, odd)
	var parts []string
	for _, g := range groups {
		parts = append(parts, g.Describe())
	}
	why := fmt.Sprintf("made no progress for %.1f s, as no other rank did, and no rank's stack stands out: %s", idle.Seconds(), strings.Join(parts, "; "))
	r := a.procs[0].spec.Rank
	if odd >= 0 {
		g := groups[odd]
		r = g.Ranks[0]
		where := "is in " + g.Place()
		if g.Kind == logview.StacksProc || g.Place() == "" {
			where = "is " + g.Proc
		}
		why = fmt.Sprintf("%s, while %s; no rank made progress for %.1f s", where, othersOf(groups, odd), idle.Seconds())
	}
	if path != "" {
		why += "; stacks in " + path
	}
	a.hangs = append(a.hangs, HangReport{TimeMS: now.UnixMilli(), Missing: []int{r}, WaitingMS: idle.Milliseconds(),
		Groups: describeAll(groups), Stacks: path})
	a.ev.emit("hang", "attempt", a.n, "idle_ms", idle.Milliseconds(), "groups", describeAll(groups), "odd", odd, "stacks", path)
	rc := RootCause{Rank: r, Node: a.j.nodeOf(r), ExitCode: ExitHang, TimeMS: now.UnixMilli(), Hung: true, Error: why}
	if odd >= 0 {
		rc.Evidence = logview.EvidenceStacks
	}
	if odd >= 0 {
		rc.Stack = strings.Split(strings.TrimRight(groups[odd].Text(), "\n"), "\n")
		rc.Where = groups[odd].Place()
	}
	a.failed(rc)
	a.hangWhy = fmt.Sprintf("rank %d hung: %s", r, why)
	a.teardown(OutcomeHang, a.hangWhy)
}

// othersOf describes every group but odd.
func othersOf(groups []logview.Group, odd int) string {
	var out []string
	for i, g := range groups {
		if i != odd {
			out = append(out, g.Describe())
		}
	}
	return strings.Join(out, "; ")
}

func describeAll(groups []logview.Group) []string {
	out := make([]string, len(groups))
	for i, g := range groups {
		out[i] = g.Describe()
	}
	return out
}

func rankTargets(procs []*proc) []probe.Target {
	var out []probe.Target
	for _, p := range procs {
		if p.done || p.pid <= 0 {
			continue
		}
		rt, _ := p.runtime.Load().(string)
		if rt == "" && p.stacks.Load() {
			rt = "go"
		}
		pid := p.pid
		if h := int(p.helloPID.Load()); h > 0 && h != p.pid {
			// A Python the rank's program started (a shell script's):
			// signalled itself, only while it is the rank's.
			if !probe.IsRankProcess(h, p.dir) {
				rt = ""
			} else {
				pid = h
			}
		}
		out = append(out, probe.Target{Rank: p.spec.Rank, PID: pid, Dir: p.dir, Runtime: rt})
	}
	return out
}

// writeStacks writes every rank's stacks, grouped, into the attempt's folder
// (stacks-<ms>.txt) and returns its path ("" when it could not).
func (a *attempt) writeStacks(now time.Time, stacks []logview.RankStacks, groups []logview.Group, odd int) string {
	path := filepath.Join(a.dir, fmt.Sprintf("stacks-%d.txt", now.UnixMilli()))
	if err := os.WriteFile(path, []byte(probe.Format(stacks, groups, odd)), 0o600); err != nil {
		a.ev.emit("error", "error", "stacks: "+err.Error())
		return ""
	}
	return path
}

// describeHang reads the stacks the ranks wrote for a hang found in the
// heartbeats (onHangCheck asked for them at askedAt), groups them, writes
// them into the attempt's folder and adds to the root cause where the hung
// rank was: its innermost frame of meshrun's code and its folded stack.
func (a *attempt) describeHang(askedAt time.Time) {
	if a.root == nil || !a.root.Hung {
		return
	}
	var stacks []logview.RankStacks
	for _, p := range a.procs {
		if p.pid <= 0 || p.done {
			continue
		}
		rs := logview.RankStacks{Rank: p.spec.Rank, Kind: "proc", Proc: probe.ProcInfo(p.pid)}
		if f := probe.NewestGoDumpSince(p.dir, askedAt); f != "" {
			if b, err := os.ReadFile(f); err == nil {
				rs = logview.RankStacks{Rank: p.spec.Rank, Kind: "go", Threads: logview.ParseGoDump(string(b)), File: f}
			}
		}
		stacks = append(stacks, rs)
	}
	if len(stacks) == 0 {
		return
	}
	now := time.Now()
	groups, odd := logview.GroupStacks(stacks)
	path := a.writeStacks(now, stacks, groups, odd)
	for _, g := range groups {
		if !slices.Contains(g.Ranks, a.root.Rank) {
			continue
		}
		if g.Where != nil {
			a.root.Where = g.Place()
			a.root.Error += "; it was in " + a.root.Where
			a.hangWhy += "; it was in " + a.root.Where
		}
		a.root.Stack = strings.Split(strings.TrimRight(g.Text(), "\n"), "\n")
	}
	if path != "" {
		a.root.Error += "; stacks in " + path
		if n := len(a.hangs); n > 0 {
			a.hangs[n-1].Groups, a.hangs[n-1].Stacks = describeAll(groups), path
		}
	}
}

// blameFirstException makes the rank of this node that raised the first
// uncaught exception the root cause of a failed attempt: a rank whose
// collective then failed (the peer closed its connection) may exit first,
// before the one that raised has finished exiting.
func (a *attempt) blameFirstException() {
	if a.outcome != OutcomeRankFailed || a.root == nil || a.root.Node != a.j.NodeRank {
		return
	}
	var first *proc
	var at int64
	for _, p := range a.procs {
		if !p.done || p.out.ExitCode == 0 {
			continue
		}
		if t := probe.ExceptionTime(p.dir); t > 0 && (first == nil || t < at) {
			first, at = p, t
		}
	}
	if first == nil || first.spec.Rank == a.root.Rank {
		return
	}
	if rt := probe.ExceptionTime(a.byRank[a.root.Rank].dir); rt > 0 && rt <= at {
		return
	}
	prev := a.root.Rank
	rc := a.causeOf(first)
	rc.ReportedBy, rc.Evidence = &prev, logview.EvidenceException
	a.root = &rc
	a.victims = slices.DeleteFunc(a.victims, func(r int) bool { return r == first.spec.Rank })
	if !slices.Contains(a.victims, prev) {
		a.victims = append(a.victims, prev)
		slices.Sort(a.victims)
	}
}
