package logview

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// A Go program that crashes does not die by a signal: its runtime writes a
// crash report on stderr and exits 2 itself, for an unrecovered panic, a
// fatal error (concurrent map writes, all goroutines asleep, a fault the
// runtime cannot turn into a panic) and a signal it cannot handle (SIGSEGV in
// C code called through cgo, a SIGSEGV or SIGBUS sent by kill). Exit 2 is
// also what the launcher says for a job refused before anything started, so
// the launcher reads each rank's stderr for such a report as it streams
// (CrashWatch) and, for a rank that exited 2 after one, reports the crash:
// its kind, its line, the crashing goroutine's first frames, and an exit code
// of its own (CrashReport.ExitCode).

// ExitCrash is the launcher's exit code when the root cause is a rank whose
// Go runtime crashed with a panic or a fatal error that no signal caused; a
// crash a signal caused (a nil dereference, a fault, SIGSEGV in cgo, kill
// -SEGV) exits 128+signal, as a process the signal killed.
const ExitCrash = 126

// Crash kinds (RootCause.Crash, RankOutcome.Crash) besides a signal's name.
const (
	CrashPanic = "panic"
	CrashFatal = "fatal error"
)

// crashFrames is how many of the crashing goroutine's frames a report keeps.
const crashFrames = 8

// CrashReport is a Go runtime's crash report, read from a rank's stderr.
type CrashReport struct {
	// Kind: "panic", "fatal error", or the name of the signal the runtime
	// died of ("SIGSEGV": its report begins "SIGSEGV: segmentation
	// violation", then "PC=...").
	Kind string
	// Signal is the signal behind the crash, when one is: the kind's, or
	// the one a panic or fatal error names ("[signal SIGSEGV: ...]").
	Signal string
	// Line is the panic or fatal line, with what the runtime printed with it
	// ("[signal ...]", "unexpected fault address ...", nested panics).
	Line string
	// Stack is the crashing goroutine's header ("goroutine 7 [running]:")
	// and its first frames, each "function(args)" and "\tfile:line +0x..".
	Stack []string
}

// ExitCode is the code the launcher reports for a rank that crashed so:
// 128+signal when a signal caused the crash, else ExitCrash.
func (c *CrashReport) ExitCode() int {
	if s, ok := signalNumber(c.Signal); ok {
		return 128 + int(s)
	}
	return ExitCrash
}

// signalNumber is the signal named name ("SIGSEGV").
func signalNumber(name string) (syscall.Signal, bool) {
	for s, n := range SignalNames {
		if n == name {
			return s, true
		}
	}
	return 0, false
}

var (
	// signalHeader is the first line of a report of a signal the runtime
	// died of: "SIGSEGV: segmentation violation"; "PC=" follows.
	signalHeader = regexp.MustCompile(`^(SIG[A-Z0-9]+): [a-z]`)
	// signalLine is the signal line of a panic or fatal error.
	signalLine = regexp.MustCompile(`^\[signal (SIG[A-Z0-9]+)`)
	// goroutineHeader begins a goroutine's stack: "goroutine 1 [running]:",
	// "goroutine 1 gp=0x.. m=0 mp=0x.. [running]:".
	goroutineHeader = regexp.MustCompile(`^goroutine \d+ .*\]:$`)
	// pcLine follows a signal header: "PC=0x47dfe1 m=0 sigcode=0 ...".
	pcLine = regexp.MustCompile(`^PC=0x[0-9a-f]+ m=(\d+) sigcode=(-?\d+)`)
	// framePointers are the fp=, sp=, pc= a traceback of the runtime's
	// adds to each frame's file line.
	framePointers = regexp.MustCompile(` fp=0x[0-9a-f]+ sp=0x[0-9a-f]+ pc=0x[0-9a-f]+$`)
)

// crashHeaderKind is the kind of crash report whose first line l may be
// ("" if none). A signal header counts once the next line is its "PC=".
func crashHeaderKind(l string) string {
	switch {
	case strings.HasPrefix(l, "panic: "):
		return CrashPanic
	case strings.HasPrefix(l, "fatal error: "):
		return CrashFatal
	}
	if m := signalHeader.FindStringSubmatch(l); m != nil {
		return m[1]
	}
	return ""
}

// Bounds of what CrashWatch keeps of a report: its start (the crashing
// goroutine is the first listed, or, for a signal, near the start).
const (
	crashMaxLines = 4000
	crashMaxBytes = 512 << 10
	crashContext  = 4 // lines kept before the header
)

// CrashWatch keeps the last crash report seen in a rank's stderr lines: a
// Go runtime writes one just before it exits, so the last header wins over
// any "panic: " a program printed earlier.
type CrashWatch struct {
	mu     sync.Mutex
	before []string // the "runtime: " and "unexpected fault address" lines just seen
	cur    []string // from the last header on
	ctx    []string // what came before cur's header
	size   int
	// held is the report a signal-like header replaced until its "PC="
	// line confirms it ("SIGTERM: shutting down" is not a report).
	held, heldCtx []string
	pending       bool
}

// Line reads one line of the rank's stderr.
func (w *CrashWatch) Line(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending {
		w.pending = false
		if !bytes.HasPrefix(b, []byte("PC=")) {
			w.cur, w.ctx, w.held, w.heldCtx = w.held, w.heldCtx, nil, nil
			w.size = 0
			for _, s := range w.cur {
				w.size += len(s)
			}
		} else {
			w.held, w.heldCtx = nil, nil
		}
	}
	if len(b) > 0 && (b[0] == 'p' || b[0] == 'f' || b[0] == 'S') {
		l := string(b)
		if k := crashHeaderKind(l); k != "" {
			if k != CrashPanic && k != CrashFatal {
				w.held, w.heldCtx, w.pending = w.cur, w.ctx, true
			}
			w.ctx = append([]string(nil), w.before...)
			w.cur, w.size = []string{l}, len(l)
			w.before = w.before[:0]
			return
		}
	}
	if w.cur != nil && len(w.cur) < crashMaxLines && w.size+len(b) <= crashMaxBytes {
		w.cur = append(w.cur, string(b))
		w.size += len(b)
	}
	// The lines a fatal error's report may begin with, before its header.
	if bytes.HasPrefix(b, []byte("unexpected fault address ")) || bytes.HasPrefix(b, []byte("runtime: ")) {
		if len(w.before) == crashContext {
			w.before = append(w.before[:0], w.before[1:]...)
		}
		w.before = append(w.before, string(b))
	} else {
		w.before = w.before[:0]
	}
}

// report is the last crash report seen, nil if none.
func (w *CrashWatch) Report() *CrashReport {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cur, ctx := w.cur, w.ctx
	if w.pending { // a signal header as the very last line: no report
		cur, ctx = w.held, w.heldCtx
	}
	return parseCrash(cur, ctx)
}

// parseCrash reads a crash report: lines from its header on, and the lines
// before the header (a fatal error's "unexpected fault address ...").
func parseCrash(lines, before []string) *CrashReport {
	if len(lines) == 0 {
		return nil
	}
	c := &CrashReport{Kind: crashHeaderKind(lines[0])}
	if c.Kind == "" {
		return nil
	}
	line := lines[0]
	if c.Kind == CrashPanic {
		// A panic that runlog.Recover (or any deferred recover) recorded and
		// raised again is the same panic.
		line = strings.TrimSuffix(line, " [recovered, repanicked]")
	}
	var notes []string
	if c.Kind == CrashFatal {
		for _, b := range before {
			if strings.HasPrefix(b, "unexpected fault address ") || strings.HasPrefix(b, "runtime: goroutine stack exceeds") ||
				strings.HasPrefix(b, "runtime: out of memory") {
				notes = append(notes, b)
			}
		}
	}
	m := -1 // the m the signal arrived on ("PC=... m=0")
	i := 1
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != "" && !goroutineHeader.MatchString(lines[i]); i++ {
		l := strings.TrimSpace(lines[i])
		if s := signalLine.FindStringSubmatch(l); s != nil {
			c.Signal = s[1]
			line += " " + l
			continue
		}
		if p := pcLine.FindStringSubmatch(l); p != nil && c.Kind != CrashPanic && c.Kind != CrashFatal {
			m, _ = strconv.Atoi(p[1])
			// SI_USER, SI_TKILL: a process sent it (kill), no fault did.
			if p[2] == "0" || p[2] == "-6" {
				notes = append(notes, "sent by kill, not a fault: sigcode="+p[2])
			}
			continue
		}
		if i < 8 && len(line) < 1000 {
			notes = append(notes, l)
		}
	}
	if c.Kind != CrashPanic && c.Kind != CrashFatal {
		c.Signal = c.Kind
	}
	if len(notes) > 0 {
		line += " (" + strings.Join(notes, "; ") + ")"
	}
	c.Line = line

	// The goroutines listed: the crashing one is the first, or for a signal
	// the one on the m the signal arrived on, else the one running.
	var blocks [][]string
	for ; i < len(lines); i++ {
		if !goroutineHeader.MatchString(lines[i]) {
			continue
		}
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) != "" {
			j++
		}
		blocks = append(blocks, lines[i:j])
		i = j
	}
	var pick []string
	if len(blocks) > 0 {
		pick = blocks[0]
	}
	if c.Kind != CrashPanic && c.Kind != CrashFatal {
		// The goroutine on the thread the signal arrived on; when that is
		// the thread's own scheduler stack (goroutine 0: the thread was
		// idle, the signal came from outside), a goroutine running, else
		// the main goroutine: where the program was.
		on, idle, running, main := -1, -1, -1, -1
		for k, b := range blocks {
			if strings.HasPrefix(b[0], "goroutine 1 ") {
				main = k
			}
			if m >= 0 && strings.Contains(b[0], " m="+strconv.Itoa(m)+" ") {
				if strings.HasPrefix(b[0], "goroutine 0 ") {
					idle = k
				} else if on < 0 {
					on = k
				}
			}
			if running < 0 && strings.Contains(b[0], "[running") {
				running = k
			}
		}
		switch {
		case on >= 0:
			pick = blocks[on]
		case running >= 0:
			pick = blocks[running]
		case main >= 0:
			pick = blocks[main]
		case idle >= 0:
			pick = blocks[idle]
		}
	}
	if pick != nil {
		c.Stack = append(c.Stack, pick[0])
		frames := 0
		for _, l := range pick[1:] {
			if !strings.HasPrefix(l, "\t") {
				if frames == crashFrames {
					c.Stack = append(c.Stack, "...")
					break
				}
				frames++
			}
			c.Stack = append(c.Stack, framePointers.ReplaceAllString(l, ""))
		}
	}
	return c
}
