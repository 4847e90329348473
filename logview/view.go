package logview

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/internal/flaghelp"
	"github.com/meshrun/meshrun/runlog"
)

const logsUsage = `usage: launcher logs [JOB|latest] [FLAGS]    the ranks' logs merged by time
       launcher logs why [JOB|latest] [--log-dir DIR]   the root cause, its error and last lines, the victims
  JOB is a job id or a folder under --log-dir (default: the latest); flags may come before
  or after it. Stdout and stderr lines count as info unless they start with a level.
`

// Entry is one merged log entry: a line of a rank's stdout or stderr, or an
// entry of its log.jsonl.
type Entry struct {
	TimeMS int64  `json:"ts_ms"`
	Node   int    `json:"node"`
	Rank   int    `json:"rank"`
	Stream string `json:"stream"` // stdout, stderr, log
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	// Fields are a log.jsonl entry's own fields (job, rank, node, pid aside).
	Fields map[string]any `json:"fields,omitempty"`
}

// Text is the entry as one line shows it, without time and rank.
func (e Entry) Text() string {
	if e.Stream != "log" {
		return e.Msg
	}
	s := strings.ToUpper(e.Level) + " " + e.Msg
	if len(e.Fields) > 0 {
		b, _ := json.Marshal(e.Fields)
		s += " " + string(b)
	}
	return s
}

var levels = map[string]int{"debug": 0, "info": 1, "warn": 2, "warning": 2, "error": 3, "dpanic": 4, "panic": 5, "fatal": 6}

// LogsOptions are the flags of `launcher logs`.
type LogsOptions struct {
	LogDir   string
	Job      string
	Ranks    map[int]bool
	Level    string
	Grep     *regexp.Regexp
	Since    time.Duration
	Tail     int
	Follow   bool
	JSON     bool
	Collapse bool
	// Attempt: whose ranks' logs, from 0; -1 the last one started (followed
	// into the next when the job restarts).
	Attempt int
	// Note, when set, hears which attempt is shown of a job that restarted.
	Note io.Writer
}

// ResolveJob finds a job's folder: JOB, or the latest job in logDir for "" and
// "latest".
func ResolveJob(logDir, job string) (string, error) {
	if logDir == "" {
		logDir = "runs"
	}
	if job != "" && job != "latest" {
		d := filepath.Join(logDir, job)
		if _, err := os.Stat(d); err != nil {
			return "", fmt.Errorf("no job %q in %s", job, logDir)
		}
		return d, nil
	}
	ents, err := os.ReadDir(logDir)
	if err != nil {
		return "", fmt.Errorf("no jobs: %v", err)
	}
	var best string
	var bestT time.Time
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		st, err := os.Stat(filepath.Join(logDir, e.Name(), EventsFile))
		if err != nil {
			continue
		}
		if best == "" || st.ModTime().After(bestT) {
			best, bestT = e.Name(), st.ModTime()
		}
	}
	if best == "" {
		return "", fmt.Errorf("no jobs in %s", logDir)
	}
	return filepath.Join(logDir, best), nil
}

// rankDirs lists a job's rank folders by rank.
func rankDirs(jobDir string) (map[int]string, error) {
	m, err := filepath.Glob(filepath.Join(jobDir, "rank-*"))
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, d := range m {
		r, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "rank-"))
		if err == nil {
			out[r] = d
		}
	}
	return out, nil
}

// tailFile reads a growing file from where the last read stopped, whole lines only.
type tailFile struct {
	path   string
	off    int64
	stream string
	rank   int
	node   int
	last   int64 // time of the last stamped line, for unstamped ones
	skipLv bool  // stderr of a rank with log.jsonl: skip runlog's console copies
}

func (t *tailFile) read() ([]Entry, error) {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		return nil, nil
	}
	b = b[:i+1]
	t.off += int64(len(b))
	var out []Entry
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if e, ok := t.parse(l); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

func (t *tailFile) parse(l string) (Entry, bool) {
	e := Entry{Node: t.node, Rank: t.rank, Stream: t.stream, Level: "info"}
	if t.stream == "log" {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			return e, false
		}
		if ts, ok := m["ts_ms"].(float64); ok {
			e.TimeMS = int64(ts)
		}
		e.Level, _ = m["level"].(string)
		e.Msg, _ = m["msg"].(string)
		if n, ok := m["node"].(float64); ok {
			e.Node = int(n)
		}
		for _, k := range []string{"ts_ms", "level", "msg", "job", "rank", "node", "pid"} {
			delete(m, k)
		}
		if len(m) > 0 {
			e.Fields = m
		}
		return e, true
	}
	stamp, text, ok := strings.Cut(l, " ")
	if ts, err := time.Parse(FileStamp, stamp); ok && err == nil {
		t.last = ts.UnixMilli()
	} else {
		text = l
	}
	e.TimeMS, e.Msg = t.last, text
	if strings.HasPrefix(text, runlog.Marker) {
		return e, false
	}
	if lv, _, ok := strings.Cut(text, " "); ok {
		if _, known := levels[strings.ToLower(lv)]; known && lv == strings.ToUpper(lv) {
			if t.skipLv {
				return e, false
			}
			e.Level = strings.ToLower(lv)
		}
	}
	return e, true
}

// openTails lists the files of the selected ranks.
func openTails(jobDir string, ranks map[int]bool) ([]*tailFile, error) {
	dirs, err := rankDirs(jobDir)
	if err != nil {
		return nil, err
	}
	node := 0
	var rec JobRecord
	if b, err := os.ReadFile(filepath.Join(jobDir, JobFile)); err == nil && json.Unmarshal(b, &rec) == nil {
		node = rec.NodeRank
	}
	var out []*tailFile
	for r, d := range dirs {
		if ranks != nil && !ranks[r] {
			continue
		}
		_, err := os.Stat(filepath.Join(d, runlog.LogFile))
		hasLog := err == nil
		out = append(out,
			&tailFile{path: filepath.Join(d, "stdout.log"), stream: "stdout", rank: r, node: node},
			&tailFile{path: filepath.Join(d, "stderr.log"), stream: "stderr", rank: r, node: node, skipLv: hasLog},
			&tailFile{path: filepath.Join(d, runlog.LogFile), stream: "log", rank: r, node: node})
	}
	return out, nil
}

// ReadLogs reads and merges the entries of the selected ranks of a job, by
// time (stable: a rank's own order is kept).
func ReadLogs(jobDir string, ranks map[int]bool) ([]Entry, error) {
	tails, err := openTails(jobDir, ranks)
	if err != nil {
		return nil, err
	}
	return readAll(tails)
}

func readAll(tails []*tailFile) ([]Entry, error) {
	var all []Entry
	for _, t := range tails {
		es, err := t.read()
		if err != nil {
			return nil, err
		}
		all = append(all, es...)
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].TimeMS != all[j].TimeMS {
			return all[i].TimeMS < all[j].TimeMS
		}
		return all[i].Rank < all[j].Rank
	})
	return all, nil
}

func (o LogsOptions) keep(e Entry, now time.Time) bool {
	if o.Level != "" && levels[e.Level] < levels[strings.ToLower(o.Level)] {
		return false
	}
	if o.Since > 0 && e.TimeMS < now.Add(-o.Since).UnixMilli() {
		return false
	}
	if o.Grep != nil && !o.Grep.MatchString(e.Text()) {
		return false
	}
	return true
}

// collapser groups identical entries of different ranks within the window.
type collapser struct {
	w       io.Writer
	pending []*lineGroup
	on      bool
}

func (c *collapser) add(e Entry) {
	t := time.UnixMilli(e.TimeMS)
	if !c.on {
		c.w.Write(formatGroup(&lineGroup{first: t, text: e.Text(), node: e.Node, ranks: []int{e.Rank}}))
		return
	}
	c.flushBefore(t.Add(-CollapseWindow))
	for _, g := range c.pending {
		if g.text == e.Text() && !containsInt(g.ranks, e.Rank) {
			g.ranks = append(g.ranks, e.Rank)
			return
		}
	}
	c.pending = append(c.pending, &lineGroup{first: t, text: e.Text(), node: e.Node, ranks: []int{e.Rank}})
}

// flushBefore writes the groups that began before limit (all for zero).
func (c *collapser) flushBefore(limit time.Time) {
	n := 0
	for _, g := range c.pending {
		if !limit.IsZero() && !g.first.Before(limit) {
			break
		}
		c.w.Write(formatGroup(g))
		n++
	}
	c.pending = c.pending[n:]
}

// Logs writes the job's merged logs.
func (o LogsOptions) Logs(ctx context.Context, w io.Writer) error {
	jobDir, err := ResolveJob(o.LogDir, o.Job)
	if err != nil {
		return err
	}
	dir, shown, err := AttemptFolder(jobDir, o.Attempt)
	if err != nil {
		return err
	}
	if all := Attempts(jobDir); len(all) > 1 && o.Note != nil {
		fmt.Fprintf(o.Note, "launcher logs: job %s ran attempts 0 to %d; showing attempt %d (--attempt K for another)\n",
			filepath.Base(jobDir), all[len(all)-1], shown)
	}
	tails, err := openTails(dir, o.Ranks)
	if err != nil {
		return err
	}
	col := &collapser{w: w, on: o.Collapse && !o.JSON}
	emit := func(es []Entry) {
		now := time.Now()
		var kept []Entry
		for _, e := range es {
			if o.keep(e, now) {
				kept = append(kept, e)
			}
		}
		if o.Tail > 0 && len(kept) > o.Tail {
			kept = kept[len(kept)-o.Tail:]
		}
		for _, e := range kept {
			if o.JSON {
				b, _ := json.Marshal(e)
				w.Write(append(b, '\n'))
				continue
			}
			col.add(e)
		}
	}
	es, err := readAll(tails)
	if err != nil {
		return err
	}
	emit(es)
	if o.Follow {
		o.Tail = 0
		finished := false
		for !finished {
			if _, err := os.Stat(filepath.Join(jobDir, SummaryFile)); err == nil {
				finished = true // one last read
			}
			if o.Attempt < 0 {
				// The job restarted: the rest of this attempt, then the next's.
				if next, n, err := AttemptFolder(jobDir, -1); err == nil && n != shown {
					es, err := readAll(tails)
					if err != nil {
						return err
					}
					emit(es)
					col.flushBefore(time.Time{})
					if !o.JSON {
						fmt.Fprintf(w, "--- attempt %d (%s) ---\n", n, next)
					}
					dir, shown, tails = next, n, nil
				}
			}
			select {
			case <-ctx.Done():
				finished = true
			case <-time.After(250 * time.Millisecond):
			}
			if len(tails) == 0 || !finished {
				if tails, err = refreshTails(dir, o.Ranks, tails); err != nil {
					return err
				}
			}
			es, err := readAll(tails)
			if err != nil {
				return err
			}
			emit(es)
			col.flushBefore(time.Now().Add(-CollapseWindow))
		}
	}
	col.flushBefore(time.Time{})
	return nil
}

// refreshTails adds the files of ranks that appeared since the last look.
func refreshTails(dir string, ranks map[int]bool, have []*tailFile) ([]*tailFile, error) {
	all, err := openTails(dir, ranks)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, t := range have {
		known[t.path] = true
	}
	for _, t := range all {
		if !known[t.path] {
			have = append(have, t)
		}
	}
	return have, nil
}

// LogsMain is `launcher logs` (and `launcher logs why`), given the arguments
// after "logs"; it returns the exit code.
func LogsMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "why" {
		return whyMain(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("logs", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := LogsOptions{}
	fs.StringVar(&o.LogDir, "log-dir", "runs", "`DIR` holding the jobs' folders")
	ranks := fs.String("rank", "", "only these `RANKS`, e.g. 0,4-7")
	fs.StringVar(&o.Level, "level", "", "only entries at `LEVEL` or above: debug, info, warn, error")
	grep := fs.String("grep", "", "only entries whose text matches the regular expression `RE`")
	fs.DurationVar(&o.Since, "since", 0, "only entries of the last `DUR`, e.g. 5m")
	fs.IntVar(&o.Tail, "tail", 0, "only the last `N` entries")
	fs.BoolVar(&o.Follow, "f", false, "follow: keep printing new entries until the job ends")
	fs.BoolVar(&o.JSON, "json", false, "one JSON object per entry")
	fs.BoolVar(&o.Collapse, "collapse", false, "identical entries of several ranks within 150 ms as one: ranks[1-7]: msg")
	fs.IntVar(&o.Attempt, "attempt", -1, "the ranks of attempt `K` of a job that restarted, from 0 (default: the last; -f follows restarts)")
	o.Note = stderr
	job, err := flaghelp.Interspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, flaghelp.Help(logsUsage, fs))
		return 0
	}
	if err != nil {
		err = flaghelp.CommandError("launcher logs", fs, err)
	}
	var p problems
	if err != nil {
		p = append(p, err.Error())
	}
	if len(job) > 1 {
		p = append(p, fmt.Sprintf("one job at most, got %q", job))
	}
	if len(job) == 1 {
		o.Job = job[0]
	}
	if *ranks != "" {
		if o.Ranks, err = ParseRanks(*ranks); err != nil {
			p = append(p, "--rank: "+err.Error())
		}
	}
	if _, ok := levels[strings.ToLower(o.Level)]; o.Level != "" && !ok {
		p = append(p, fmt.Sprintf("--level %q: want debug, info, warn or error", o.Level))
	}
	if *grep != "" {
		if o.Grep, err = regexp.Compile(*grep); err != nil {
			p = append(p, "--grep: "+err.Error())
		}
	}
	if o.Tail < 0 || o.Since < 0 {
		p = append(p, "--tail and --since must not be negative")
	}
	if o.Attempt < -1 {
		p = append(p, fmt.Sprintf("--attempt %d: want 0 or more", o.Attempt))
	}
	if len(p) > 0 {
		fmt.Fprintf(stderr, "launcher logs: %v\n", p)
		return ExitUsage
	}
	if err := o.Logs(ctx, stdout); err != nil {
		fmt.Fprintf(stderr, "launcher logs: %v\n", err)
		return 1
	}
	return 0
}
