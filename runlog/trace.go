package runlog

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Trace format: Chrome's JSON array format, one complete ("X") event per span,
// written when the span ends. ts and dur are microseconds; ts counts from the
// Unix epoch so that the launcher can merge the ranks' files on one time axis.
// pid is the rank. The array is left open while the rank runs (Chrome and
// Perfetto accept a trace cut short by a crash); Close ends it.

// flushEvery bounds how many events wait in memory before they are written.
const flushEvery = 256

// DefaultTraceMax bounds a rank's trace files on disk (MESHRUN_TRACE_MAX).
const DefaultTraceMax = 32 << 20

// EnvTraceMax names the variable that bounds a rank's trace on disk: bytes,
// or with a K, M or G suffix (KiB, MiB, GiB); 0 for no bound.
const EnvTraceMax = "MESHRUN_TRACE_MAX"

// OldTraceFile holds the older half of a bounded trace (see tracer).
const OldTraceFile = "trace.1.json"

// tracer appends span events to trace.json. Bounded (max > 0): when
// trace.json reaches max/2 it is closed and becomes trace.1.json (the one
// before that is dropped) and a new trace.json starts, so the trace keeps
// the newest spans within max bytes; dropped spans are counted in the last
// metadata event. A write that fails (a full disk) ends the trace: the rest
// of the spans are dropped and counted, and the console told once.
type tracer struct {
	mu         sync.Mutex
	path       string
	f          *os.File
	w          *bufio.Writer
	rank, node int
	lanes      []bool // lanes[i]: tid i+1 has an open span
	n          int
	buf        []byte
	max        int64 // 0: unbounded
	written    int64 // bytes in trace.json
	events     int64 // spans in trace.json
	older      int64 // spans in trace.1.json
	dropped    int64
	failed     bool
	note       io.Writer // the console, for a failure; nil: none
}

func openTracer(path string, rank, node int, max int64, note io.Writer) (*tracer, error) {
	t := &tracer{path: path, rank: rank, node: node, max: max, note: note}
	return t, t.open()
}

// open starts trace.json with its metadata events.
func (t *tracer) open() error {
	f, err := OpenFile(t.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	t.f, t.w = f, bufio.NewWriterSize(f, 64<<10)
	name := "rank " + strconv.Itoa(t.rank) + " (node " + strconv.Itoa(t.node) + ")"
	head := "[\n" + `{"name":"process_name","ph":"M","pid":` + strconv.Itoa(t.rank) + `,"tid":0,"args":{"name":` + strconv.Quote(name) + "}},\n" +
		`{"name":"process_sort_index","ph":"M","pid":` + strconv.Itoa(t.rank) + `,"tid":0,"args":{"sort_index":` + strconv.Itoa(t.rank) + "}},\n"
	t.w.WriteString(head)
	t.written, t.events = int64(len(head)), 0
	return t.w.Flush()
}

// fail ends the trace after a write error; t.mu held.
func (t *tracer) fail(err error) {
	if t.failed {
		return
	}
	t.failed = true
	if t.note != nil {
		fmt.Fprintf(t.note, "WARN runlog: %s: %v: dropping trace spans from here (counted)\n", filepath.Base(t.path), err)
	}
	t.f.Close()
}

// rotate makes trace.json the older half; t.mu held.
func (t *tracer) rotate() {
	if err := t.finish(); err != nil {
		t.fail(err)
		return
	}
	old := filepath.Join(filepath.Dir(t.path), OldTraceFile)
	if err := os.Rename(t.path, old); err != nil {
		t.fail(err)
		return
	}
	t.dropped += t.older
	t.older = t.events
	if err := t.open(); err != nil {
		t.fail(err)
	}
}

// finish ends the array with a last metadata event (no trailing comma),
// carrying the count of dropped spans, and closes the file; t.mu held.
func (t *tracer) finish() error {
	t.w.WriteString(`{"name":"thread_name","ph":"M","pid":` + strconv.Itoa(t.rank) + `,"tid":0,"args":{"name":"rank","dropped_spans":` +
		strconv.FormatInt(t.dropped, 10) + "}}\n]\n")
	err := t.w.Flush()
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lane picks the lowest free thread lane so overlapping spans (from several
// goroutines) never share a track.
func (t *tracer) lane() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, busy := range t.lanes {
		if !busy {
			t.lanes[i] = true
			return i + 1
		}
	}
	t.lanes = append(t.lanes, true)
	return len(t.lanes)
}

func (t *tracer) end(name, cat string, tid int, begin, end time.Time, args []Arg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tid-1 < len(t.lanes) {
		t.lanes[tid-1] = false
	}
	if t.f == nil {
		return
	}
	if t.failed {
		t.dropped++
		return
	}
	b := t.buf[:0]
	b = append(b, `{"name":`...)
	b = strconv.AppendQuote(b, name)
	b = append(b, `,"cat":`...)
	b = strconv.AppendQuote(b, cat)
	b = append(b, `,"ph":"X","ts":`...)
	b = strconv.AppendInt(b, begin.UnixMicro(), 10)
	b = append(b, `,"dur":`...)
	d := end.Sub(begin).Nanoseconds()
	b = strconv.AppendFloat(b, float64(d)/1000, 'f', 3, 64)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(t.rank), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendInt(b, int64(tid), 10)
	if len(args) > 0 {
		b = append(b, `,"args":{`...)
		for i, a := range args {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, a.Key)
			b = append(b, ':')
			b = strconv.AppendQuote(b, a.Value)
		}
		b = append(b, '}')
	}
	b = append(b, "},\n"...)
	t.buf = b
	if _, err := t.w.Write(b); err != nil {
		t.dropped++
		t.fail(err)
		return
	}
	t.written += int64(len(b))
	t.events++
	t.n++
	if t.n%flushEvery == 0 {
		if err := t.w.Flush(); err != nil {
			t.fail(err)
			return
		}
	}
	if t.max > 0 && t.written >= t.max/2 {
		t.rotate()
	}
}

func (t *tracer) flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil || t.failed {
		return nil
	}
	err := t.w.Flush()
	if err != nil {
		t.fail(err)
	}
	return err
}

// close ends the trace; it returns the spans dropped (bounds, write
// failures).
func (t *tracer) close() (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return t.dropped, nil
	}
	var err error
	if !t.failed {
		err = t.finish()
	}
	t.f = nil
	return t.dropped, err
}

// parseSize reads a byte count: 1048576, 64K, 32M, 2G (powers of 1024), or
// with KiB, MiB, GiB.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q: want bytes, or a number with K, M or G", s)
	}
	return n * mult, nil
}

// ParseSize is parseSize, for the launcher's --trace-max.
func ParseSize(s string) (int64, error) { return parseSize(s) }

// Arg is a string argument shown with a span.
type Arg struct{ Key, Value string }

// Span is an open trace span; End closes it. The zero Span does nothing.
type Span struct {
	t         *tracer
	name, cat string
	tid       int
	begin     time.Time
	args      []Arg
}

// Span opens a span named name in category cat ("collective", "gemm", ...):
//
//	sp := r.Span("allreduce", "collective")
//	... the work ...
//	sp.End()
//
// It costs two clock reads and two short critical sections; on a Rank without
// a folder it costs nothing.
func (r *Rank) Span(name, cat string, args ...Arg) Span {
	if r == nil || r.tr == nil {
		return Span{}
	}
	return Span{t: r.tr, name: name, cat: cat, tid: r.tr.lane(), begin: time.Now(), args: args}
}

// End closes the span and records it.
func (s Span) End() {
	if s.t == nil {
		return
	}
	s.t.end(s.name, s.cat, s.tid, s.begin, time.Now(), s.args)
}

// Record writes a span that has already run, from begin to end, on a row of
// its own, lane (≥ 0; thread 1000 + lane in the viewer, apart from Span's
// rows): a pipeline stage's forwards and backwards on one row, its sends on
// another, once the step has measured them.
func (r *Rank) Record(name, cat string, lane int, begin, end time.Time, args ...Arg) {
	if r == nil || r.tr == nil || lane < 0 {
		return
	}
	r.tr.end(name, cat, recordTID+lane, begin, end, args)
}

// recordTID is the first thread id of Record's rows.
const recordTID = 1000

// FlushTrace writes the spans held in memory to trace.json.
func (r *Rank) FlushTrace() error {
	if r == nil || r.tr == nil {
		return nil
	}
	return r.tr.flush()
}

func stackLen(buf []byte) int { return runtime.Stack(buf, false) }
