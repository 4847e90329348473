// Package report is `launcher report`: one self-contained HTML page about a
// job, made from its folder (the launcher's job.json, summary.json and
// events, the ranks' steps.jsonl, stdout and traces): what ran and how it
// ended, the loss and the step time per step of every attempt, each rank's
// step split into kernels, collectives and the rest, the bytes and the
// collectives per step, and one step's timeline across the ranks. It reads a
// running job's folder as it is, and a failed job's; what is missing, it
// says. docs/report.md has the page and the files it reads.
package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// Job is what a job's folder holds, as the page shows it.
type Job struct {
	Dir     string
	Record  *logview.JobRecord // nil: no job.json
	Summary *logview.Summary   // nil: still running, or killed before it wrote one
	// Attempts are the attempts' steps, in order (one without restarts).
	Attempts []Attempt
	// Report is the workload's JSON report (rank 0's last JSON line), nil
	// when there is none yet.
	Report map[string]any
	// Timeline is one step of the last attempt across its ranks, from the
	// traces; nil without traces.
	Timeline *Timeline
	// Saves are the steps a checkpoint was saved at, every attempt's.
	Saves []int
	// Notes say what is missing or cut short.
	Notes []string
}

// Attempt is one attempt's ranks' steps.
type Attempt struct {
	N     int
	Ranks map[int][]runlog.StepRecord
}

// ErrNotJob is Read's error for a folder that is not a job's.
var ErrNotJob = errors.New("report: not a job folder")

// Read reads the job folder dir.
func Read(dir string) (*Job, error) {
	j := &Job{Dir: dir}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotJob, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%w: %s is a file", ErrNotJob, dir)
	}
	var rec logview.JobRecord
	switch err := readJSON(filepath.Join(dir, logview.JobFile), &rec); {
	case err == nil:
		j.Record = &rec
	case errors.Is(err, os.ErrNotExist):
		if _, e := os.Stat(filepath.Join(dir, logview.EventsFile)); e != nil {
			return nil, fmt.Errorf("%w: %s has neither %s nor %s", ErrNotJob, dir, logview.JobFile, logview.EventsFile)
		}
		j.note("%s is missing: the job's command and ranks are unknown", logview.JobFile)
	default:
		j.note("%s does not read: %v", logview.JobFile, err)
	}
	var sum logview.Summary
	switch err := readJSON(filepath.Join(dir, logview.SummaryFile), &sum); {
	case err == nil:
		j.Summary = &sum
	case errors.Is(err, os.ErrNotExist):
		j.note("no %s yet: the job is running, or its launcher was killed", logview.SummaryFile)
	default:
		j.note("%s does not read: %v", logview.SummaryFile, err)
	}
	for _, n := range logview.Attempts(dir) {
		ad, _, err := logview.AttemptFolder(dir, n)
		if err != nil {
			continue
		}
		a := Attempt{N: n, Ranks: map[int][]runlog.StepRecord{}}
		ents, _ := os.ReadDir(ad)
		for _, e := range ents {
			r, ok := rankOf(e.Name())
			if !ok || !e.IsDir() {
				continue
			}
			steps, err := j.readSteps(filepath.Join(ad, e.Name(), runlog.StepsFile), filepath.Join(relAttempt(n), e.Name(), runlog.StepsFile))
			if err != nil {
				continue
			}
			a.Ranks[r] = steps
		}
		j.Attempts = append(j.Attempts, a)
	}
	if len(j.steps(0)) == 0 {
		j.note("no steps recorded (%s): the workload records none, or has not finished a step", runlog.StepsFile)
	}
	for _, a := range j.Attempts {
		ad, _, _ := logview.AttemptFolder(dir, a.N)
		j.Saves = append(j.Saves, saves(filepath.Join(ad, logview.RankDir(0), "stdout.log"))...)
	}
	last := j.Attempts[len(j.Attempts)-1]
	ad, _, _ := logview.AttemptFolder(dir, last.N)
	j.Report = lastReport(filepath.Join(ad, logview.RankDir(0), "stdout.log"))
	if tl, err := readTimeline(ad, last); err == nil {
		j.Timeline = tl
	} else if !errors.Is(err, os.ErrNotExist) {
		j.note("no timeline: %v", err)
	}
	return j, nil
}

func (j *Job) note(format string, args ...any) {
	j.Notes = append(j.Notes, fmt.Sprintf(format, args...))
}

// steps are rank r's steps over every attempt, in order.
func (j *Job) steps(r int) []runlog.StepRecord {
	var out []runlog.StepRecord
	for _, a := range j.Attempts {
		out = append(out, a.Ranks[r]...)
	}
	return out
}

// ranks are the ranks that recorded steps, in order.
func (j *Job) ranks() []int {
	var rs []int
	for _, a := range j.Attempts {
		for r := range a.Ranks {
			if !slices.Contains(rs, r) {
				rs = append(rs, r)
			}
		}
	}
	slices.Sort(rs)
	return rs
}

func relAttempt(n int) string {
	if n == 0 {
		return "."
	}
	return logview.AttemptDir(n)
}

// rankOf is the rank of a folder rank-NNNNN.
func rankOf(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "rank-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && logview.RankDir(n) == name
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// readSteps reads a steps.jsonl: a line cut short at the end (a rank still
// writing, or killed) is dropped with a note, as is a line that does not
// read.
func (j *Job) readSteps(path, name string) ([]runlog.StepRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []runlog.StepRecord
	lines := bytes.Split(b, []byte("\n"))
	for i, l := range lines {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var s runlog.StepRecord
		if err := json.Unmarshal(l, &s); err != nil {
			if i == len(lines)-1 {
				j.note("%s: its last record is cut short (the rank was writing it, or died)", name)
			} else {
				j.note("%s: line %d does not read (%v); left out", name, i+1, err)
			}
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// lastReport is the workload's report: the last line of a rank's
// stdout.log that holds a JSON object (the launcher stamps each line with
// its time).
func lastReport(path string) map[string]any {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var last map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		l := sc.Text()
		i := strings.IndexByte(l, '{')
		if i < 0 || !strings.HasSuffix(strings.TrimSpace(l), "}") {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(l[i:]), &m) == nil {
			last = m
		}
	}
	return last
}

// saves are the steps of the checkpoints a rank's stdout.log says it saved
// ("saved step N to DIR ...", the training workloads' line).
func saves(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int
	for _, l := range strings.Split(string(b), "\n") {
		_, rest, ok := strings.Cut(l, "saved step ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Timeline is one step of an attempt across its ranks: each rank's spans
// (kernels, collectives, pipeline actions) within the step, in
// milliseconds from the step's start.
type Timeline struct {
	Step   int
	StepMS float64
	Ranks  []int
	Spans  map[int][]Span
}

// Span is one traced span.
type Span struct {
	Name, Cat  string
	Start, Dur float64 // ms from the step's start
}

// readTimeline takes the step a's rank 0 ended last and each rank's spans
// within it from their trace.json.
func readTimeline(dir string, a Attempt) (*Timeline, error) {
	steps := a.Ranks[0]
	if len(steps) == 0 {
		return nil, os.ErrNotExist
	}
	last := steps[len(steps)-1]
	end := float64(last.TimeMS) * 1000 // µs
	begin := end - last.StepMS*1000
	tl := &Timeline{Step: last.Step, StepMS: last.StepMS, Spans: map[int][]Span{}}
	for r := range a.Ranks {
		f, err := os.Open(filepath.Join(dir, logview.RankDir(r), runlog.TraceFile))
		if err != nil {
			continue
		}
		spans, err := spansIn(f, begin-5000, end+5000, begin) // a rank's step may start and end a little apart
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("rank %d's trace.json: %v", r, err)
		}
		tl.Ranks = append(tl.Ranks, r)
		tl.Spans[r] = spans
	}
	if len(tl.Ranks) == 0 {
		return nil, os.ErrNotExist
	}
	slices.Sort(tl.Ranks)
	return tl, nil
}

// spansIn reads a Chrome trace (a JSON array of events, possibly cut short
// at the end) and keeps the complete events inside [from, to] µs, in ms from
// zero µs.
func spansIn(r io.Reader, from, to, zero float64) ([]Span, error) {
	d := json.NewDecoder(bufio.NewReaderSize(r, 1<<16))
	if tok, err := d.Token(); err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("not a JSON array of events")
	}
	var out []Span
	for d.More() {
		var e struct {
			Name string  `json:"name"`
			Cat  string  `json:"cat"`
			Ph   string  `json:"ph"`
			Ts   float64 `json:"ts"`
			Dur  float64 `json:"dur"`
		}
		if err := d.Decode(&e); err != nil {
			break // cut short: what read so far stands
		}
		if e.Ph == "X" && e.Ts >= from && e.Ts+e.Dur <= to {
			out = append(out, Span{Name: e.Name, Cat: e.Cat, Start: (e.Ts - zero) / 1000, Dur: e.Dur / 1000})
		}
	}
	return out, nil
}
