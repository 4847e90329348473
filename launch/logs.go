package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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
	Device    string            `json:"device"`
	Kernels   string            `json:"kernels,omitempty"`
	DType     string            `json:"dtype,omitempty"`
	ShareGPUs bool              `json:"share_gpus,omitempty"`
	Ranks     []RankRecord      `json:"ranks"`
	Versions  map[string]string `json:"versions"`
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
	// Evidence is how the launcher decided (blame.go): "first failure",
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

// writeJSON writes v, indented, to path atomically: a temporary file
// renamed over it, so that a reader sees the old file or the new one, never
// a part (a full disk leaves no empty summary.json). When the disk is full it
// frees the job folder's reserve (reserveSpace) and tries once more.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(redactJSON(b), '\n')
	err = writeAtomic(path, b)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		if os.Remove(filepath.Join(filepath.Dir(path), reserveFile)) == nil {
			err = writeAtomic(path, b)
		}
	}
	return err
}

func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The folder's mode: 0600, or 0640 shared (perm.go).
		err = os.Chmod(f.Name(), runlog.FileMode(filepath.Dir(path)))
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// reserveFile holds space in a job folder for the launcher's last words:
// the summaries are written even when the ranks filled the disk.
const reserveFile = ".reserve"

// reserveSize is what reserveFile holds.
const reserveSize = 1 << 20

// reserveSpace writes the reserve into dir (best effort).
func reserveSpace(dir string) {
	if f, err := createFile(filepath.Join(dir, reserveFile)); err == nil {
		f.Write(make([]byte, reserveSize))
		f.Close()
	}
}

// events appends lifecycle events to events.jsonl, one JSON object a line with
// a millisecond Unix timestamp.
type events struct {
	mu sync.Mutex
	f  *os.File
}

func openEvents(dir string) (*events, error) {
	f, err := runlog.OpenFile(filepath.Join(dir, EventsFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND)
	if err != nil {
		return nil, err
	}
	return &events{f: f}, nil
}

// emit writes one event; kv are alternating keys and values.
func (e *events) emit(name string, kv ...any) {
	m := make(map[string]any, 2+len(kv)/2)
	m["ts_ms"] = time.Now().UnixMilli()
	m["event"] = name
	for i := 0; i+1 < len(kv); i += 2 {
		m[fmt.Sprint(kv[i])] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	b = redactJSON(b)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.f.Write(append(b, '\n'))
}

func (e *events) close() error { return e.f.Close() }

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
