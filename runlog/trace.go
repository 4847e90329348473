package runlog

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
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

// tracer appends span events to trace.json.
type tracer struct {
	mu    sync.Mutex
	f     *os.File
	w     *bufio.Writer
	rank  int
	lanes []bool // lanes[i]: tid i+1 has an open span
	n     int
	buf   []byte
}

func openTracer(path string, rank, node int) (*tracer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	t := &tracer{f: f, w: bufio.NewWriterSize(f, 64<<10), rank: rank}
	t.w.WriteString("[\n")
	name := "rank " + strconv.Itoa(rank) + " (node " + strconv.Itoa(node) + ")"
	t.w.WriteString(`{"name":"process_name","ph":"M","pid":` + strconv.Itoa(rank) + `,"tid":0,"args":{"name":` + strconv.Quote(name) + "}},\n")
	t.w.WriteString(`{"name":"process_sort_index","ph":"M","pid":` + strconv.Itoa(rank) + `,"tid":0,"args":{"sort_index":` + strconv.Itoa(rank) + "}},\n")
	return t, t.w.Flush()
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
	t.w.Write(b)
	t.n++
	if t.n%flushEvery == 0 {
		t.w.Flush()
	}
}

func (t *tracer) flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return nil
	}
	return t.w.Flush()
}

// close ends the array with a last metadata event (no trailing comma).
func (t *tracer) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return nil
	}
	t.w.WriteString(`{"name":"thread_name","ph":"M","pid":` + strconv.Itoa(t.rank) + `,"tid":0,"args":{"name":"rank"}}` + "\n]\n")
	err := t.w.Flush()
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	t.f = nil
	return err
}

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

// FlushTrace writes the spans held in memory to trace.json.
func (r *Rank) FlushTrace() error {
	if r == nil || r.tr == nil {
		return nil
	}
	return r.tr.flush()
}

func stackLen(buf []byte) int { return runtime.Stack(buf, false) }
