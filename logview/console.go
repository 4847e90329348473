package logview

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/runlog"
)

// CollapseWindow is how long the console holds a line to see whether other
// ranks print the same one, which it then shows once as "ranks[1-7]: msg".
const CollapseWindow = 150 * time.Millisecond

// Time layouts: the console shows the time of day, the rank logs the full time.
const (
	ConsoleStamp = "15:04:05.000"
	FileStamp    = "2006-01-02T15:04:05.000Z07:00"
)

// lineGroup is a line printed by one or more ranks within the window.
type lineGroup struct {
	first time.Time
	text  string
	node  int
	ranks []int
}

// formatGroup is a group as the console and `launcher logs` show it: the
// time of its first line, "node:rank| " or "ranks[1-7]: ", and its text.
func formatGroup(g *lineGroup) []byte {
	var b []byte
	b = g.first.AppendFormat(b, ConsoleStamp)
	b = append(b, ' ')
	if len(g.ranks) == 1 {
		b = fmt.Appendf(b, "%d:%d| ", g.node, g.ranks[0])
	} else {
		b = append(b, "ranks["...)
		b = append(b, FormatRanks(g.ranks)...)
		b = append(b, "]: "...)
	}
	b = append(b, g.text...)
	return append(b, '\n')
}

// containsInt reports whether s holds v.
func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// FormatRanks renders ranks compactly: [0 1 2 3 5 7 8] -> "0-3,5,7-8".
func FormatRanks(ranks []int) string {
	r := append([]int(nil), ranks...)
	sort.Ints(r)
	var b strings.Builder
	for i := 0; i < len(r); {
		j := i
		for j+1 < len(r) && r[j+1] == r[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(r[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(r[j]))
		}
		i = j + 1
	}
	return b.String()
}

// maxRankSet bounds how many ranks a rank set may name in all: a set is a
// map, and "0-1048576,1048577-2097153,..." would otherwise cost memory
// without end.
const maxRankSet = 1 << 17

// ParseRanks reads "0,4-7" into a set of ranks.
func ParseRanks(s string) (map[int]bool, error) {
	set := map[int]bool{}
	total := 0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("ranks %q: %q is not a rank or a range like 4-7", s, part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a {
				return nil, fmt.Errorf("ranks %q: %q is not a range like 4-7", s, part)
			}
		}
		if total += b - a + 1; b-a > maxRankSet || total > maxRankSet {
			return nil, fmt.Errorf("ranks %q: more than %d ranks", s, maxRankSet)
		}
		for r := a; r <= b; r++ {
			set[r] = true
		}
	}
	return set, nil
}

// RankLine is one line of a rank's output, stamped when the launcher read it.
type RankLine struct {
	T          time.Time
	Node, Rank int
	Text       string
}

// Console writes the ranks' lines, stamped and prefixed "node:rank| ", onto one
// writer; identical lines from several ranks within CollapseWindow are written
// once as "ranks[1-7]: msg". Lines of different ranks never interleave mid-line.
type Console struct {
	mu      sync.Mutex
	w       io.Writer
	window  time.Duration // 0: no collapsing
	show    func(rank int) bool
	pending []*lineGroup
	timer   *time.Timer
	closed  bool
}

func NewConsole(w io.Writer, window time.Duration, show func(int) bool) *Console {
	if show == nil {
		show = func(int) bool { return true }
	}
	return &Console{w: w, window: window, show: show}
}

// Add shows a rank's line (after the window, when collapsing).
func (c *Console) Add(l RankLine) {
	if !c.show(l.Rank) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.window <= 0 || c.closed {
		c.w.Write(formatGroup(&lineGroup{first: l.T, text: l.Text, node: l.Node, ranks: []int{l.Rank}}))
		return
	}
	for _, g := range c.pending {
		if g.text == l.Text && l.T.Sub(g.first) < c.window && !containsInt(g.ranks, l.Rank) {
			g.ranks = append(g.ranks, l.Rank)
			return
		}
	}
	c.pending = append(c.pending, &lineGroup{first: l.T, text: l.Text, node: l.Node, ranks: []int{l.Rank}})
	if c.timer == nil {
		c.timer = time.AfterFunc(c.window, c.flushDue)
	}
}

// Notice writes a launcher line at once, stamped, after the ranks' lines
// already held.
func (c *Console) Notice(t time.Time, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked(time.Time{})
	c.w.Write([]byte(t.Format(ConsoleStamp) + " " + text + "\n"))
}

func (c *Console) flushDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	c.flushLocked(time.Now().Add(-c.window))
	if len(c.pending) > 0 {
		c.timer = time.AfterFunc(c.pending[0].first.Add(c.window).Sub(time.Now()), c.flushDue)
	}
}

// flushLocked writes, in arrival order, the groups that began before limit
// (every group when limit is zero).
func (c *Console) flushLocked(limit time.Time) {
	n := 0
	for _, g := range c.pending {
		if !limit.IsZero() && g.first.After(limit) {
			break
		}
		c.w.Write(formatGroup(g))
		n++
	}
	c.pending = c.pending[n:]
}

// Close writes every held line; later lines are written at once.
func (c *Console) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.flushLocked(time.Time{})
	c.closed = true
}

// RankWriter splits what a rank writes into lines, stamps each when read,
// appends it to the rank's log file ("<time> <line>") and hands it to the
// console. On stdout, marker lines from runlog go to onMarker instead of the
// console.
type RankWriter struct {
	File       *os.File
	Con        *Console
	Node, Rank int
	OnMarker   func(kind string, body []byte)
	// OnLine, if set, hears the time of every line, markers included (the
	// launcher's sign of a foreign program's progress).
	OnLine func(t time.Time)
	// Crash, on stderr, keeps a Go runtime's crash report (crash.go).
	Crash *CrashWatch
	buf   []byte
	out   []byte
	// dropped counts the lines the log file refused (a full disk); the
	// console says so once, and summary.json counts them.
	dropped atomic.Int64
}

// Dropped is how many lines the log file refused.
func (p *RankWriter) Dropped() int64 { return p.dropped.Load() }

func (p *RankWriter) Write(b []byte) (int, error) {
	now := time.Now()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.line(now, bytes.TrimSuffix(p.buf[:i], []byte{'\r'}))
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) == 0 {
		p.buf = nil // release the grown array between bursts
	}
	return len(b), nil
}

func (p *RankWriter) line(t time.Time, l []byte) {
	p.out = t.AppendFormat(p.out[:0], FileStamp)
	p.out = append(append(append(p.out, ' '), l...), '\n')
	if _, err := p.File.Write(p.out); err != nil && p.dropped.Add(1) == 1 {
		p.Con.Notice(t, fmt.Sprintf("launcher: rank %d's %s: %v: dropping its lines from the file (counted in summary.json)",
			p.Rank, filepath.Base(p.File.Name()), errors.Unwrap(err)))
	}
	if p.Crash != nil {
		p.Crash.Line(l)
	}
	if p.OnLine != nil {
		p.OnLine(t)
	}
	if p.OnMarker != nil && bytes.HasPrefix(l, []byte(runlog.Marker)) {
		kind, body, _ := bytes.Cut(l[len(runlog.Marker):], []byte{' '})
		p.OnMarker(string(kind), body)
		return
	}
	p.Con.Add(RankLine{T: t, Node: p.Node, Rank: p.Rank, Text: string(l)})
}

// Close flushes a last partial line.
func (p *RankWriter) Close() error {
	if len(p.buf) > 0 {
		p.line(time.Now(), p.buf)
		p.buf = nil
	}
	return nil
}

// ProgressBoard turns the ranks' progress reports into one Console line per
// step reached by every reporting rank, at most one a second (and the last).
type ProgressBoard struct {
	mu      sync.Mutex
	con     *Console
	latest  map[int]runlog.Progress
	shown   int
	shownAt time.Time
	expect  int // ranks that will report; the first line waits for them all
	began   time.Time
}

func NewProgressBoard(con *Console, ranks int) *ProgressBoard {
	return &ProgressBoard{con: con, latest: map[int]runlog.Progress{}, shown: -1, expect: ranks, began: time.Now()}
}

// Report reads a rank's progress report (a runlog marker line's body).
func (b *ProgressBoard) Report(rank int, body []byte) {
	var p runlog.Progress
	if json.Unmarshal(body, &p) != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.latest[rank] = p
	slowest, minStep := -1, 0
	var ranks []int
	for r, q := range b.latest {
		ranks = append(ranks, r)
		if slowest < 0 || q.Step < minStep || q.Step == minStep && r < slowest {
			slowest, minStep = r, q.Step
		}
	}
	now := time.Now()
	final := p.Total > 0 && minStep >= p.Total
	if b.shown < 0 && len(b.latest) < b.expect && now.Sub(b.began) < 5*time.Second {
		return // not every rank has reported yet
	}
	if minStep <= b.shown || (!final && b.shown >= 0 && now.Sub(b.shownAt) < time.Second) {
		return
	}
	b.shown, b.shownAt = minStep, now
	q := b.latest[slowest]
	loss := q.Loss
	if r0, ok := b.latest[0]; ok && r0.Step == minStep {
		loss = r0.Loss
	}
	total := ""
	if q.Total > 0 {
		total = "/" + strconv.Itoa(q.Total)
	}
	b.con.Notice(now, fmt.Sprintf("progress: step %d%s  loss %.6g  step %.1f ms  (ranks %s; slowest rank %d)",
		minStep, total, loss, q.StepMS, FormatRanks(ranks), slowest))
}
