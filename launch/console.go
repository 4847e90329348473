package launch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// rankLine is one line of a rank's output, stamped when the launcher read it.
type rankLine struct {
	t          time.Time
	node, rank int
	text       string
}

// console writes the ranks' lines, stamped and prefixed "node:rank| ", onto one
// writer; identical lines from several ranks within collapseWindow are written
// once as "ranks[1-7]: msg". Lines of different ranks never interleave mid-line.
type console struct {
	mu      sync.Mutex
	w       io.Writer
	window  time.Duration // 0: no collapsing
	show    func(rank int) bool
	pending []*logview.LineGroup
	timer   *time.Timer
	closed  bool
}

func newConsole(w io.Writer, window time.Duration, show func(int) bool) *console {
	if show == nil {
		show = func(int) bool { return true }
	}
	return &console{w: w, window: window, show: show}
}

// add shows a rank's line (after the window, when collapsing).
func (c *console) add(l rankLine) {
	if !c.show(l.rank) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.window <= 0 || c.closed {
		c.w.Write(logview.FormatGroup(&logview.LineGroup{First: l.t, Text: l.text, Node: l.node, Ranks: []int{l.rank}}))
		return
	}
	for _, g := range c.pending {
		if g.Text == l.text && l.t.Sub(g.First) < c.window && !logview.ContainsInt(g.Ranks, l.rank) {
			g.Ranks = append(g.Ranks, l.rank)
			return
		}
	}
	c.pending = append(c.pending, &logview.LineGroup{First: l.t, Text: l.text, Node: l.node, Ranks: []int{l.rank}})
	if c.timer == nil {
		c.timer = time.AfterFunc(c.window, c.flushDue)
	}
}

// notice writes a launcher line at once, stamped, after the ranks' lines
// already held.
func (c *console) notice(t time.Time, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked(time.Time{})
	c.w.Write([]byte(t.Format(consoleStamp) + " " + text + "\n"))
}

func (c *console) flushDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	c.flushLocked(time.Now().Add(-c.window))
	if len(c.pending) > 0 {
		c.timer = time.AfterFunc(c.pending[0].First.Add(c.window).Sub(time.Now()), c.flushDue)
	}
}

// flushLocked writes, in arrival order, the groups that began before limit
// (every group when limit is zero).
func (c *console) flushLocked(limit time.Time) {
	n := 0
	for _, g := range c.pending {
		if !limit.IsZero() && g.First.After(limit) {
			break
		}
		c.w.Write(logview.FormatGroup(g))
		n++
	}
	c.pending = c.pending[n:]
}

// close writes every held line; later lines are written at once.
func (c *console) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.flushLocked(time.Time{})
	c.closed = true
}

// rankWriter splits what a rank writes into lines, stamps each when read,
// appends it to the rank's log file ("<time> <line>") and hands it to the
// console. On stdout, marker lines from runlog go to onMarker instead of the
// console.
type rankWriter struct {
	file       *os.File
	con        *console
	node, rank int
	onMarker   func(kind string, body []byte)
	buf        []byte
	out        []byte
	// dropped counts the lines the log file refused (a full disk); the
	// console says so once, and summary.json counts them.
	dropped atomic.Int64
	// crash, on stderr, keeps a Go runtime's crash report (crash.go).
	crash *logview.CrashWatch
}

func (p *rankWriter) Write(b []byte) (int, error) {
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

func (p *rankWriter) line(t time.Time, l []byte) {
	p.out = t.AppendFormat(p.out[:0], fileStamp)
	p.out = append(append(append(p.out, ' '), l...), '\n')
	if _, err := p.file.Write(p.out); err != nil && p.dropped.Add(1) == 1 {
		p.con.notice(t, fmt.Sprintf("launcher: rank %d's %s: %v: dropping its lines from the file (counted in summary.json)",
			p.rank, filepath.Base(p.file.Name()), errors.Unwrap(err)))
	}
	if p.crash != nil {
		p.crash.Line(l)
	}
	if p.onMarker != nil && bytes.HasPrefix(l, []byte(runlog.Marker)) {
		kind, body, _ := bytes.Cut(l[len(runlog.Marker):], []byte{' '})
		p.onMarker(string(kind), body)
		return
	}
	p.con.add(rankLine{t: t, node: p.node, rank: p.rank, text: string(l)})
}

// Close flushes a last partial line.
func (p *rankWriter) Close() error {
	if len(p.buf) > 0 {
		p.line(time.Now(), p.buf)
		p.buf = nil
	}
	return nil
}

// progressBoard turns the ranks' progress reports into one console line per
// step reached by every reporting rank, at most one a second (and the last).
type progressBoard struct {
	mu      sync.Mutex
	con     *console
	latest  map[int]runlog.Progress
	shown   int
	shownAt time.Time
	expect  int // ranks that will report; the first line waits for them all
	began   time.Time
}

func newProgressBoard(con *console, ranks int) *progressBoard {
	return &progressBoard{con: con, latest: map[int]runlog.Progress{}, shown: -1, expect: ranks, began: time.Now()}
}

func (b *progressBoard) report(rank int, body []byte) {
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
	b.con.notice(now, fmt.Sprintf("progress: step %d%s  loss %.6g  step %.1f ms  (ranks %s; slowest rank %d)",
		minStep, total, loss, q.StepMS, FormatRanks(ranks), slowest))
}
