package logview

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/runlog"
)

// Files of a job folder, runs/<job-id>/.
const (
	JobFile     = "job.json"
	EventsFile  = "events.jsonl"
	SummaryFile = "summary.json"
	CredsFile   = "nats.creds"
)

// RankDir is the folder of one rank inside the job folder: rank-00003.
func RankDir(rank int) string { return fmt.Sprintf("rank-%05d", rank) }

// JobRecord is job.json: what was run, where, and with which versions.
type JobRecord struct {
	JobID    string            `json:"job_id"`
	Argv     []string          `json:"argv"`
	Command  []string          `json:"command"`
	Started  time.Time         `json:"started"`
	NNodes   int               `json:"nnodes"`
	World    int               `json:"world_size"`
	NodeRank int               `json:"node_rank"`
	NATSURL  string            `json:"nats_url"`
	Env      map[string]string `json:"env"` // variables set for every rank (rank-specific ones in Ranks)
	// Device is the ranks' resolved device (cpu, sim or cuda); Kernels the
	// --kernels choice, empty for the device's own; ShareGPUs is --share-gpus.
	Device    string `json:"device"`
	Kernels   string `json:"kernels,omitempty"`
	DType     string `json:"dtype,omitempty"`
	ShareGPUs bool   `json:"share_gpus,omitempty"`
	// CPUsPerRank is --cpus-per-rank: each rank's cgroup cap in cores.
	CPUsPerRank float64           `json:"cpus_per_rank,omitempty"`
	Ranks       []RankRecord      `json:"ranks"`
	Versions    map[string]string `json:"versions"`
}

// RankRecord is one rank in job.json.
type RankRecord struct {
	Rank       int `json:"rank"`
	LocalRank  int `json:"local_rank"`
	Node       int `json:"node"`
	PID        int `json:"pid"`
	GOMAXPROCS int `json:"gomaxprocs"`
	// GPU is the rank's CUDA_VISIBLE_DEVICES, cuda ranks only.
	GPU string `json:"gpu,omitempty"`
}

// Summary is summary.json: how every rank ended and why the job ended. Its
// attempt fields are the last attempt's; Attempts lists every attempt (more
// than one with --max-restarts).
type Summary struct {
	JobID  string `json:"job_id"`
	Node   int    `json:"node"`
	NNodes int    `json:"nnodes"`
	// WorldSize is the number of ranks of the whole job, every node's.
	WorldSize int `json:"world_size"`
	AttemptSummary
	// DurationMS is the whole job's, every attempt's.
	DurationMS int64            `json:"duration_ms"`
	Attempts   []AttemptSummary `json:"attempts"`
}

// AttemptSummary is how one attempt of the job ended. An attempt's own folder
// (the job folder for attempt 0, attempt-N/ after) holds it as summary.json
// too.
type AttemptSummary struct {
	// Attempt counts from 0 (TORCHELASTIC_RESTART_COUNT); Dir is its folder,
	// relative to the job's ("." for attempt 0).
	Attempt  int    `json:"attempt"`
	Dir      string `json:"dir"`
	ExitCode int    `json:"exit_code"`
	// Reason: "ok", "rank_failed", "hang", "timeout", "interrupted", "fatal"
	// (a problem of the job as a whole, in Error).
	Reason Outcome `json:"reason"`
	// Error is what ended a "fatal" attempt.
	Error string `json:"error,omitempty"`
	// RootCauseRank is the rank whose failure ended the job; nil when none did.
	RootCauseRank *int `json:"root_cause_rank"`
	// RootCause tells how the root-cause rank failed; with several nodes it may
	// be another node's rank (the first failure across nodes).
	RootCause *RootCause `json:"root_cause,omitempty"`
	// Victims are this node's ranks the launcher tore down because of the root
	// cause, the timeout or an interrupt, and ranks that failed only because
	// of the root cause (a collective that timed out waiting for it).
	Victims []int `json:"victims"`
	// Notice is the first collective failure a rank announced (it names the
	// culprit rank the collective layer blamed).
	Notice *NoticeReport `json:"collective_failure,omitempty"`
	// Hangs are the collectives --hang-after found stuck.
	Hangs      []HangReport  `json:"hangs,omitempty"`
	DurationMS int64         `json:"duration_ms"`
	Ranks      []RankOutcome `json:"ranks"`
}

// RootCause is the first rank to fail.
type RootCause struct {
	Rank     int    `json:"rank"`
	Node     int    `json:"node"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// TimeMS is when its failure was seen, in Unix milliseconds.
	TimeMS int64 `json:"time_ms"`
	// Error is its error.json (runlog) or why it did not start.
	Error string `json:"error,omitempty"`
	// Culprit is the rank its error names (e.g. the peer a collective lost).
	Culprit *int `json:"culprit_rank,omitempty"`
	// Hung: the rank did not fail; it never entered a collective its peers
	// waited in (Error says which), and was torn down. ReportedBy is the rank
	// whose collective timed out waiting for it, when one did.
	Hung       bool `json:"hung,omitempty"`
	ReportedBy *int `json:"reported_by,omitempty"`
	// Evidence is how the launcher decided (launch's blame.go): "first failure",
	// "blamed by the failed ranks' errors (ranks 0,2)", ...; ReportedBy is
	// then the rank that failed first.
	Evidence string `json:"evidence,omitempty"`
	// Crash is the kind of Go runtime crash the rank's stderr reported
	// (crash.go): "panic", "fatal error", or a signal's name ("SIGSEGV");
	// Error is then its panic or fatal line, Signal the signal that caused
	// it (if one did), ExitCode the launcher's code for it (ExitCrash, or
	// 128+signal), and Stack the crashing goroutine's first frames.
	Crash string   `json:"crash,omitempty"`
	Stack []string `json:"stack,omitempty"`
	// Exception is a Python rank's uncaught exception ("ValueError: bad
	// batch 7") and Where the user's innermost frame it was raised in
	// ("load_batch (train.py:57)"); for a hung rank, Where is its stack's
	// innermost frame of the user's and Stack its folded stack.
	Exception string `json:"exception,omitempty"`
	Where     string `json:"where,omitempty"`
}

// NoticeReport is a collective failure as the ranks announced it.
type NoticeReport struct {
	TimeMS   int64  `json:"time_ms"`
	Code     string `json:"code"`
	Culprit  int    `json:"culprit_rank"`
	Reporter int    `json:"reporter_rank"`
	Op       string `json:"op,omitempty"`
	Seq      uint64 `json:"seq,omitempty"`
	Group    string `json:"group,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// HangReport is a collective that waited longer than --hang-after.
type HangReport struct {
	TimeMS  int64  `json:"time_ms"`
	Op      string `json:"op"`
	Seq     uint64 `json:"seq"`
	Group   string `json:"group"`
	Waiting []int  `json:"waiting"`
	Missing []int  `json:"missing"`
	// WaitingMS is how long the first rank has waited.
	WaitingMS int64 `json:"waiting_ms"`
	// States are the missing local ranks' process states ("T (stopped)").
	States map[string]string `json:"process_states,omitempty"`
	// Groups are the ranks grouped by stack, each described ("rank 1 in
	// load_batch (train.py:57)"), when the launcher dumped them; Stacks is
	// the file holding them all.
	Groups []string `json:"groups,omitempty"`
	Stacks string   `json:"stacks,omitempty"`
}

// RankOutcome is how one rank ended.
type RankOutcome struct {
	Rank       int    `json:"rank"`
	Node       int    `json:"node"`
	PID        int    `json:"pid"`
	ExitCode   int    `json:"exit_code"` // 128+signal when signalled
	Signal     string `json:"signal,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	EndMS      int64  `json:"end_ms,omitempty"` // Unix milliseconds
	Error      string `json:"error,omitempty"`
	// Crash is the kind of Go runtime crash its stderr reported ("panic",
	// "fatal error", "SIGSEGV"), Error then its line; ExitCode stays the
	// process's own (2, the runtime's).
	Crash string `json:"crash,omitempty"`
	// LogLinesDropped: lines its stdout.log and stderr.log could not take
	// (a full disk); they were shown on the console only.
	LogLinesDropped int64 `json:"log_lines_dropped,omitempty"`
}

// AttemptDir is the folder, in the job's, of attempt n > 0.
func AttemptDir(n int) string { return "attempt-" + strconv.Itoa(n) }

// Attempts lists a job's attempts by the folders they left: 0 (the job
// folder) and every attempt-N in it, in order. It needs no summary: a running
// job's attempts are listed too.
func Attempts(jobDir string) []int {
	out := []int{0}
	ents, _ := os.ReadDir(jobDir)
	for _, e := range ents {
		if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "attempt-")); e.IsDir() && err == nil && n > 0 && AttemptDir(n) == e.Name() {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// AttemptFolder is the folder of a job's attempt n (from 0; -1 the last one
// started) and n.
func AttemptFolder(jobDir string, n int) (string, int, error) {
	all := Attempts(jobDir)
	if n < 0 {
		n = all[len(all)-1]
	}
	if !slices.Contains(all, n) {
		if len(all) == 1 {
			return "", n, fmt.Errorf("%s ran one attempt (0): no attempt %d", jobDir, n)
		}
		return "", n, fmt.Errorf("%s ran attempts 0 to %d: no attempt %d", jobDir, all[len(all)-1], n)
	}
	if n == 0 {
		return jobDir, 0, nil
	}
	return filepath.Join(jobDir, AttemptDir(n)), n, nil
}

// Evidence values of RootCause: how the launcher decided the root cause
// (launch's blame.go).
const (
	EvidenceFirst   = "first failure"
	EvidenceHang    = "missing from a collective its peers waited in (heartbeats)"
	EvidenceTimeout = "a peer's collective timed out waiting for it"
	EvidenceBlamed  = "blamed by the failed ranks' errors"
	EvidenceEarly   = "exited before joining the job its peers were joining"
	// EvidenceException: a Python rank's uncaught exception came before
	// every other failed rank's (their exception records' times).
	EvidenceException = "raised the first uncaught exception"
	// EvidenceStacks: no rank of a program made progress, and this one's
	// stack differs from every other's (launch's foreign.go).
	EvidenceStacks = "the odd one out of the ranks' stacks, when no rank made progress"
)

// How says how the root-cause rank ended: "hung", a crash (crashHow), or
// as exitHow says.
func (rc *RootCause) How() string {
	switch {
	case rc.Hung:
		return "hung"
	case rc.Crash != "":
		return crashHow(rc.Crash, rc.Signal, rc.ExitCode)
	case rc.Exception != "" && rc.Where != "":
		return fmt.Sprintf("raised %s in %s, then %s", rc.Exception, rc.Where, exitHow(rc.ExitCode, rc.Signal))
	case rc.Exception != "":
		return fmt.Sprintf("raised %s, then %s", rc.Exception, exitHow(rc.ExitCode, rc.Signal))
	}
	return exitHow(rc.ExitCode, rc.Signal)
}

// crashHow says how a rank whose Go runtime crashed ended: "crashed: Go
// panic (exit 126)", "crashed: Go panic (SIGSEGV; exit 139)", "crashed: Go
// fatal error (exit 126)", "crashed: SIGSEGV in the Go runtime (exit 139)".
func crashHow(kind, sig string, code int) string {
	switch {
	case kind != CrashPanic && kind != CrashFatal:
		return fmt.Sprintf("crashed: %s in the Go runtime (exit %d)", kind, code)
	case sig != "":
		return fmt.Sprintf("crashed: Go %s (%s; exit %d)", kind, sig, code)
	}
	return fmt.Sprintf("crashed: Go %s (exit %d)", kind, code)
}

// exitHow says how a rank ended: "exited with code 3", "was killed by
// SIGKILL (exit 137)", "exited with code 143 (after SIGTERM)".
func exitHow(code int, sig string) string {
	if sig != "" {
		return fmt.Sprintf("was killed by %s (exit %d)", sig, code)
	}
	if n, ok := SignalNames[syscall.Signal(code-128)]; ok && code > 128 {
		return fmt.Sprintf("exited with code %d (after %s)", code, n)
	}
	return fmt.Sprintf("exited with code %d", code)
}

// SignalNames are the signals a rank's end or crash may name.
var SignalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS",
	syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2", syscall.SIGTRAP: "SIGTRAP",
	syscall.SIGSYS: "SIGSYS", syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ",
}

// ReadErrorFile reads a rank's error.json.
func ReadErrorFile(dir string) (runlog.ErrorRecord, bool) {
	var rec runlog.ErrorRecord
	b, err := os.ReadFile(filepath.Join(dir, runlog.ErrorFile))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return rec, false
	}
	return rec, true
}
