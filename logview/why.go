package logview

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/meshrun/meshrun/runlog"
)

// whyLines is how many of the root-cause rank's last lines `logs why` shows.
const whyLines = 10

// Why writes why a job ended: the root-cause rank, its error and last lines,
// what the collectives reported, hangs, and the victims apart; for a job
// that restarted, of its last attempt, after a line per attempt.
func Why(jobDir string, w io.Writer) error { return WhyAttempt(jobDir, -1, w) }

// WhyAttempt is Why for one attempt (from 0; -1 the last).
func WhyAttempt(jobDir string, attempt int, w io.Writer) error {
	var job Summary
	b, err := os.ReadFile(filepath.Join(jobDir, SummaryFile))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s has no %s: the job is still running or its launcher was killed; see %s", jobDir, SummaryFile, EventsFile)
	}
	if err == nil {
		err = json.Unmarshal(b, &job)
	}
	if err != nil {
		return fmt.Errorf("%s: %v", SummaryFile, err)
	}
	sum := job.AttemptSummary
	if len(job.Attempts) > 0 {
		if attempt >= len(job.Attempts) {
			return fmt.Errorf("job %s ran %d attempts (0 to %d): no attempt %d", job.JobID, len(job.Attempts), len(job.Attempts)-1, attempt)
		}
		if attempt >= 0 {
			sum = job.Attempts[attempt]
		}
	} else if attempt > 0 {
		return fmt.Errorf("job %s ran one attempt: no attempt %d", job.JobID, attempt)
	}
	fmt.Fprintf(w, "job %s: %s, exit %d, %d ranks on node %d of %d, %.2f s\n",
		job.JobID, job.Reason, job.ExitCode, len(sum.Ranks), job.Node, max(job.NNodes, 1), float64(job.DurationMS)/1000)
	if len(job.Attempts) > 1 {
		for _, a := range job.Attempts {
			what := a.Reason.String()
			if a.RootCauseRank != nil {
				what += fmt.Sprintf(", root cause rank %d", *a.RootCauseRank)
			}
			fmt.Fprintf(w, "  attempt %d: %s, exit %d, %.2f s, logs in %s\n", a.Attempt, what, a.ExitCode, float64(a.DurationMS)/1000,
				filepath.Join(jobDir, a.Dir))
		}
		fmt.Fprintf(w, "attempt %d:\n", sum.Attempt)
	}
	jobDir = filepath.Join(jobDir, sum.Dir)
	rc := sum.RootCause
	switch {
	case rc != nil:
		whyRootCause(w, jobDir, job.Node, rc)
	case sum.Reason == OutcomeOK:
		fmt.Fprintln(w, "\nevery rank exited 0")
	case sum.Reason == OutcomeFatal:
		fmt.Fprintf(w, "\nno rank failed first: %s\n", sum.Error)
	default:
		fmt.Fprintf(w, "\nno rank failed first: the job ended by %s\n", sum.Reason)
	}
	if n := sum.Notice; n != nil {
		where := ""
		if n.Op != "" {
			where = fmt.Sprintf(" in %s seq %d on group %s", n.Op, n.Seq, n.Group)
		}
		fmt.Fprintf(w, "\ncollective failure: rank %d reported %s%s, blaming rank %d: %s\n",
			n.Reporter, n.Code, where, n.Culprit, n.Detail)
	}
	for _, h := range sum.Hangs {
		if h.Op == "" {
			// A program's job: no rank made progress (launch's foreign.go).
			fmt.Fprintf(w, "\nhang: no rank made progress for %.1f s; by stack:\n", float64(h.WaitingMS)/1000)
			for _, g := range h.Groups {
				fmt.Fprintf(w, "  %s\n", g)
			}
			if h.Stacks != "" {
				fmt.Fprintf(w, "  every rank's stacks: %s\n", h.Stacks)
			}
			continue
		}
		fmt.Fprintf(w, "\nhang: %s seq %d on group %s: ranks %s waited %.1f s for ranks %s",
			h.Op, h.Seq, h.Group, FormatRanks(h.Waiting), float64(h.WaitingMS)/1000, FormatRanks(h.Missing))
		if len(h.Groups) > 0 {
			fmt.Fprintf(w, "; by stack: %s", strings.Join(h.Groups, "; "))
		}
		var keys []string
		for k := range h.States {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "; rank %s was %s", k, h.States[k])
		}
		fmt.Fprintln(w)
	}
	if dumps, _ := filepath.Glob(filepath.Join(jobDir, "rank-*", FlightRecorderPrefix+"*")); len(dumps) > 0 {
		fmt.Fprintf(w, "\nNCCL flight recorder dumps (PyTorch's format):\n")
		for _, d := range dumps {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
	if len(sum.Victims) > 0 {
		whyVictims(w, jobDir, sum)
	}
	return nil
}

// FlightRecorderPrefix starts the names of PyTorch's flight recorder dumps
// in a rank's folder (the launcher points TORCH_NCCL_DEBUG_INFO_TEMP_FILE
// there; PyTorch appends the rank).
const FlightRecorderPrefix = "nccl_trace_rank_"

// whyRootCause writes the root cause of an attempt whose ranks' folders are
// in jobDir, seen from node: how and when it ended, its error, the frames of
// a crash, the evidence, and its last lines (when its logs are on this
// node).
func whyRootCause(w io.Writer, jobDir string, node int, rc *RootCause) {
	fmt.Fprintf(w, "\nroot cause: rank %d on node %d %s at %s (first failure, ms clock)\n",
		rc.Rank, rc.Node, rc.How(), time.UnixMilli(rc.TimeMS).Format("2006-01-02 15:04:05.000"))
	if rc.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", rc.Error)
	}
	if len(rc.Stack) > 0 && rc.Crash == "" {
		// A hung rank's stack, as the launcher grouped it.
		fmt.Fprintln(w, "  its stack (the user's frames; library frames folded):")
		for _, l := range rc.Stack {
			fmt.Fprintf(w, "    %s\n", strings.TrimLeft(l, " "))
		}
	} else if len(rc.Stack) > 0 {
		// The crashing goroutine, where a Go runtime's report has it,
		// before the other goroutines and the registers; for a signal
		// no goroutine of the program faulted on (kill -SEGV landing on
		// an idle thread), the one the report names.
		label := "crashed in"
		if (rc.Crash != CrashPanic && rc.Crash != CrashFatal) && !strings.Contains(rc.Stack[0], "[running") {
			label = "when it crashed:"
		}
		fmt.Fprintf(w, "  %s %s\n", label, rc.Stack[0])
		for _, l := range rc.Stack[1:] {
			fmt.Fprintf(w, "    %s\n", strings.ReplaceAll(l, "\t", "    "))
		}
	}
	switch {
	case rc.ReportedBy != nil && rc.Evidence == EvidenceTimeout:
		fmt.Fprintf(w, "  found by rank %d, whose collective timed out waiting for it\n", *rc.ReportedBy)
	case rc.ReportedBy != nil:
		fmt.Fprintf(w, "  evidence: %s; rank %d failed first\n", rc.Evidence, *rc.ReportedBy)
	case rc.Evidence != "":
		fmt.Fprintf(w, "  evidence: %s\n", rc.Evidence)
	}
	if rc.Culprit != nil && *rc.Culprit != rc.Rank {
		fmt.Fprintf(w, "  its error blames rank %d\n", *rc.Culprit)
	}
	if rc.Node != node {
		fmt.Fprintf(w, "  (its logs are on node %d)\n", rc.Node)
	} else {
		es, err := ReadLogs(jobDir, map[int]bool{rc.Rank: true})
		what := ""
		if rc.Crash != "" {
			// The lines before its crash report: the report (every
			// goroutine, then the registers) is above.
			es, what = beforeCrash(es, rc.Crash), " before its crash report"
		}
		if err == nil && len(es) > 0 {
			if len(es) > whyLines {
				es = es[len(es)-whyLines:]
			}
			fmt.Fprintf(w, "  last lines of rank %d%s:\n", rc.Rank, what)
			for _, e := range es {
				fmt.Fprintf(w, "    %s %s\n", time.UnixMilli(e.TimeMS).Format(ConsoleStamp), e.Text())
			}
		}
	}
}

// whyVictims writes the ranks the root cause took down, each with how it
// ended and its last word: its crash, error.json, or last line of stderr.
func whyVictims(w io.Writer, jobDir string, sum AttemptSummary) {
	fmt.Fprintf(w, "\nvictims (torn down, not the cause): ranks %s\n", FormatRanks(sum.Victims))
	out := map[int]RankOutcome{}
	for _, r := range sum.Ranks {
		out[r.Rank] = r
	}
	for _, v := range sum.Victims {
		o := out[v]
		how := fmt.Sprintf("exit %d", o.ExitCode)
		if o.Signal != "" {
			how = o.Signal
		}
		line := ""
		if o.Crash != "" {
			how, line = "crashed: Go "+o.Crash, o.Error
			if o.Crash != CrashPanic && o.Crash != CrashFatal {
				how = "crashed: " + o.Crash + " in the Go runtime"
			}
		} else if rec, ok := ReadErrorFile(filepath.Join(jobDir, RankDir(v))); ok {
			line = rec.Error
		} else {
			line = lastLine(filepath.Join(jobDir, RankDir(v), "stderr.log"))
		}
		if line != "" {
			fmt.Fprintf(w, "  rank %d: %s: %s\n", v, how, line)
		} else {
			fmt.Fprintf(w, "  rank %d: %s\n", v, how)
		}
	}
}

// beforeCrash is es up to the start of the last crash report of kind in the
// rank's stderr (all of es if it has none).
func beforeCrash(es []Entry, kind string) []Entry {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Stream == "stderr" && crashHeaderKind(es[i].Msg) == kind {
			return es[:i]
		}
	}
	return es
}

// lastLine is a log file's last line without its stamp.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.TrimSpace(l) != "" {
			last = l
		}
	}
	if stamp, rest, ok := strings.Cut(last, " "); ok {
		if _, err := time.Parse(FileStamp, stamp); err == nil {
			return rest
		}
	}
	return last
}

// whyMain is `launcher logs why`.
func whyMain(args []string, stdout, stderr io.Writer) int {
	const cmd = "launcher logs why"
	fs := flag.NewFlagSet("why", flag.ContinueOnError)
	dir, attempt, code, ok := jobArgs(cmd, whyUsage, fs, "attempt `K` of a job that restarted, from 0 (default: the last)", args, stdout, stderr)
	if !ok {
		return code
	}
	if err := WhyAttempt(dir, attempt, stdout); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 1
	}
	return 0
}

const traceUsage = `usage: launcher trace [JOB|latest] [-o FILE] [--attempt K] [--log-dir DIR]
  every rank's trace.json merged into one Chrome trace (Perfetto, chrome://tracing),
  one process per rank; JOB is a job id or a folder under --log-dir (default: the latest)
`

const whyUsage = `usage: launcher logs why [JOB|latest] [--attempt K] [--log-dir DIR]
  why the job ended: the root-cause rank, its error (a Go crash's panic or fatal line and
  the crashing goroutine's frames) and last lines, what the collectives reported, hangs,
  the victims apart (and, for a job that restarted, its attempts); JOB is a job id or a
  folder under --log-dir (default: the latest)
`

// MergeTraces merges the ranks' trace.json files of a job into one Chrome
// trace (JSON object format), one process per rank, and returns how many
// ranks it found.
func MergeTraces(jobDir string, w io.Writer) (int, error) {
	dirs, err := rankDirs(jobDir)
	if err != nil {
		return 0, err
	}
	ranks := make([]int, 0, len(dirs))
	for r := range dirs {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	var events []json.RawMessage
	found := 0
	for _, r := range ranks {
		// A bounded trace keeps its older half in trace.1.json.
		var evs []json.RawMessage
		for _, name := range []string{runlog.OldTraceFile, runlog.TraceFile} {
			b, err := os.ReadFile(filepath.Join(dirs[r], name))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return 0, err
			}
			part, err := parseTrace(b)
			if err != nil {
				return 0, fmt.Errorf("rank %d %s: %v", r, name, err)
			}
			evs = append(evs, part...)
		}
		if evs == nil {
			continue
		}
		found++
		named := false
		for _, e := range evs {
			// One process per rank, whatever the rank's writer used as pid.
			var m map[string]any
			if json.Unmarshal(e, &m) != nil {
				continue
			}
			m["pid"] = r
			if m["name"] == "process_name" && m["ph"] == "M" {
				named = true
			}
			nb, _ := json.Marshal(m)
			events = append(events, nb)
		}
		if !named {
			nb, _ := json.Marshal(map[string]any{"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": map[string]any{"name": fmt.Sprintf("rank %d", r)}})
			events = append(events, nb)
		}
	}
	if events == nil {
		events = []json.RawMessage{}
	}
	out := struct {
		TraceEvents     []json.RawMessage `json:"traceEvents"`
		DisplayTimeUnit string            `json:"displayTimeUnit"`
		OtherData       map[string]string `json:"otherData"`
	}{events, "ms", map[string]string{"job": filepath.Base(jobDir)}}
	b, err := json.Marshal(out)
	if err != nil {
		return 0, err
	}
	_, err = w.Write(append(b, '\n'))
	return found, err
}

// parseTrace reads the JSON array format, also when the array was cut short
// (a rank killed before it closed its trace), or the object format.
func parseTrace(b []byte) ([]json.RawMessage, error) {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var obj struct {
			TraceEvents []json.RawMessage `json:"traceEvents"`
		}
		err := json.Unmarshal(b, &obj)
		return obj.TraceEvents, err
	}
	if !bytes.HasSuffix(b, []byte("]")) {
		b = append(bytes.TrimSuffix(b, []byte(",")), ']')
	}
	var evs []json.RawMessage
	if err := json.Unmarshal(b, &evs); err != nil {
		// A last event cut mid-way: drop it.
		if i := bytes.LastIndex(b, []byte("},\n")); i > 0 {
			b = append(b[:i+1], ']')
			err = json.Unmarshal(b, &evs)
		}
		return evs, err
	}
	return evs, nil
}

// TraceMain is `launcher trace`, given the arguments after "trace"; it
// returns the exit code.
func TraceMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	out := fs.String("o", "trace.json", "write the merged trace to `FILE`; - for stdout")
	dir, attempt, code, ok := jobArgs("launcher trace", traceUsage, fs, "the ranks of attempt `K` of a job that restarted, from 0 (default: the last)", args, stdout, stderr)
	if !ok {
		return code
	}
	dir, _, err := AttemptFolder(dir, attempt)
	if err != nil {
		fmt.Fprintf(stderr, "launcher trace: %v\n", err)
		return 1
	}
	var buf bytes.Buffer
	n, err := MergeTraces(dir, &buf)
	if err == nil && n == 0 {
		err = fmt.Errorf("no rank of %s wrote a trace (ranks write trace.json through package runlog)", dir)
	}
	if err == nil {
		if *out == "-" {
			_, err = stdout.Write(buf.Bytes())
		} else {
			err = os.WriteFile(*out, buf.Bytes(), 0o644)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "launcher trace: %v\n", err)
		return 1
	}
	if *out != "-" {
		fmt.Fprintf(stderr, "launcher trace: %d ranks of %s -> %s (open in ui.perfetto.dev or chrome://tracing)\n", n, filepath.Base(dir), *out)
	}
	return 0
}
