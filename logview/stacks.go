package logview

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Stacks a hung job's ranks wrote on SIGUSR1, read and grouped: a Python
// rank's faulthandler dump (stacks-python.txt, the launcher's site hook), a
// Go rank's goroutine dump (stacks-<unix ms>.txt, runlog), or, for a rank
// that wrote none, what /proc says of its process. Ranks whose main threads
// stand at the same place in the user's code form a group; the one group
// smaller than all others is the odd one out, usually the rank the others
// wait for.

// Frame is one stack frame. Library marks frames of the language's own
// library or third-party packages (folded when shown).
type Frame struct {
	Func, File string
	Line       int
	Library    bool
}

// Thread is one thread's (Python) or goroutine's (Go) stack, innermost first.
type Thread struct {
	// Name: the thread's id as faulthandler prints it ("0x00007f..."), or
	// the goroutine's number.
	Name string
	Main bool
	// State: "current" for the thread that wrote a Python dump; a
	// goroutine's wait reason ("chan receive", "sync.WaitGroup.Wait").
	State  string
	Frames []Frame
}

// RankStacks is one rank's stacks: Kind "python", "go" or "proc" (no dump:
// what /proc says, in Proc, e.g. "S (sleeping), wchan do_epoll_wait, syscall 232").
type RankStacks struct {
	Rank    int
	Kind    string
	Threads []Thread
	Proc    string
	File    string
}

// Kinds of RankStacks.
const (
	StacksPython = "python"
	StacksGo     = "go"
	StacksProc   = "proc"
)

var (
	// pyThreadHeader begins a thread in a faulthandler dump: "Thread
	// 0x00007f.. (most recent call first):", "Current thread 0x..", with a
	// name in brackets in newer Pythons; "Stack (most recent call first):"
	// when only the current thread was dumped.
	pyThreadHeader = regexp.MustCompile(`^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):$|^Stack \(most recent call first\):$`)
	// pyDumpFrame is a frame of a faulthandler dump.
	pyDumpFrame = regexp.MustCompile(`^\s+File "(.*)", line (\d+) in (.*)$`)
	// pyTraceFrame is a frame of a traceback ("in func" absent for a
	// SyntaxError's).
	pyTraceFrame = regexp.MustCompile(`^\s+File "(.*)", line (\d+)(?:, in (.*))?$`)
	// pyStdlib is a path into a Python installation's library
	// (/usr/lib/python3.11/, ~/.pyenv/versions/3.11.7/lib/python3.11/).
	pyStdlib = regexp.MustCompile(`/lib(?:64)?/python3(?:\.\d+)?/`)
	// rankPrefix is what torch puts before a rank's lines ("[rank1]: ").
	rankPrefix = regexp.MustCompile(`^\[rank\d+\]: ?`)
	// goroutineLine is a goroutine's header in a dump: "goroutine 1
	// [chan receive, 2 minutes]:"; a crash's adds "gp=.. m=.." before the
	// state.
	goroutineLine = regexp.MustCompile(`^goroutine (\d+)(?: [^\[]*)? \[([^\]]*)\]:$`)
	// goFileLine is a Go frame's file line: "\t/src/x.go:12 +0x1d".
	goFileLine = regexp.MustCompile(`^\t(.*):(\d+)(?: .*)?$`)
	// pyExceptionLine is "pkg.Type: message" or "Type".
	pyExceptionLine = regexp.MustCompile(`^([A-Za-z_][\w.]*)(?:: ?(.*))?$`)
)

// pythonLibrary reports whether a Python frame's file is the standard
// library's or a package's, not the user's.
func pythonLibrary(file string) bool {
	if strings.HasPrefix(file, "<") {
		// Code given as a string (python -c, exec) is the user's.
		return file != "<string>" && file != "<stdin>"
	}
	f := strings.ReplaceAll(file, `\`, "/")
	return strings.Contains(f, "/site-packages/") || strings.Contains(f, "/dist-packages/") ||
		strings.HasPrefix(f, "/usr/lib/python3") || strings.HasPrefix(f, "/usr/local/lib/python3") ||
		pyStdlib.MatchString(f)
}

// ParsePythonDump reads faulthandler's dump of all threads (the format of
// faulthandler.register(all_threads=True)); when text holds several dumps
// (the site hook appends each), the last one. faulthandler lists threads most
// recently started first, so the main thread (the oldest) is the last
// listed; "Current thread" is the one the signal landed on, not always the
// main one.
func ParsePythonDump(text string) []Thread {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	// A dump's threads are separated by blank lines, and a dump ends
	// without one: a header right after a frame begins the next dump.
	start := -1
	for i, l := range lines {
		if pyThreadHeader.MatchString(l) && (start < 0 || strings.TrimSpace(lines[i-1]) != "") {
			start = i
		}
	}
	if start < 0 {
		return nil
	}
	var threads []Thread
	var cur *Thread
	for _, l := range lines[start:] {
		if m := pyThreadHeader.FindStringSubmatch(l); m != nil {
			t := Thread{Name: m[2]}
			if m[3] != "" {
				t.Name = m[3]
			}
			if m[1] == "Current thread" || m[1] == "" {
				t.State = "current"
			}
			threads = append(threads, t)
			cur = &threads[len(threads)-1]
			continue
		}
		if cur == nil {
			continue
		}
		if m := pyDumpFrame.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[2])
			cur.Frames = append(cur.Frames, Frame{Func: m[3], File: m[1], Line: n, Library: pythonLibrary(m[1])})
		}
	}
	if len(threads) > 0 {
		threads[len(threads)-1].Main = true
	}
	return threads
}

// goLibrary reports whether a Go function (its full name, package path
// first) is the standard library's or a module's from the module cache:
// the standard library's paths have no dot in their first element.
// meshrun's own packages and package main are the user's.
func goLibrary(fn, file string) bool {
	if strings.HasPrefix(fn, "github.com/meshrun/meshrun/") {
		return false
	}
	if strings.Contains(file, "/pkg/mod/") || strings.Contains(file, "/vendor/") {
		return true
	}
	pkg := goPackage(fn)
	first, _, _ := strings.Cut(pkg, "/")
	return pkg != "main" && !strings.Contains(first, ".")
}

// goPackage is the package path of a Go function's full name
// ("github.com/x/y.(*T).M" -> "github.com/x/y").
func goPackage(fn string) string {
	dir, base := "", fn
	if i := strings.LastIndex(fn, "/"); i >= 0 {
		dir, base = fn[:i+1], fn[i+1:]
	}
	if i := strings.Index(base, "."); i >= 0 {
		base = base[:i]
	}
	return dir + base
}

// ParseGoDump reads a dump of all goroutines: runtime.Stack(buf, true), a
// crash's traceback, or runlog's stacks-<ms>.txt (a "# rank ..." line, then
// the goroutines). When text holds several dumps, each after a "# " line,
// the last one. Goroutine 1 is main.
func ParseGoDump(text string) []Thread {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "# ") {
			lines = lines[i+1:]
			break
		}
	}
	var threads []Thread
	var cur *Thread
	var fn string // a function line waiting for its file line
	for _, l := range lines {
		if m := goroutineLine.FindStringSubmatch(l); m != nil {
			threads = append(threads, Thread{Name: m[1], Main: m[1] == "1", State: m[2]})
			cur, fn = &threads[len(threads)-1], ""
			continue
		}
		if cur == nil {
			continue
		}
		switch {
		case strings.TrimSpace(l) == "":
			cur, fn = nil, ""
		case strings.HasPrefix(l, "\t"):
			m := goFileLine.FindStringSubmatch(l)
			if m == nil || fn == "" {
				continue
			}
			n, _ := strconv.Atoi(m[2])
			cur.Frames = append(cur.Frames, Frame{Func: fn, File: m[1], Line: n, Library: goLibrary(fn, m[1])})
			fn = ""
		case strings.HasPrefix(l, "created by "), strings.HasPrefix(l, "..."):
			// The goroutine's creator is not on its stack.
			fn = ""
		default:
			fn = l
			if strings.HasSuffix(l, ")") {
				if i := strings.LastIndex(l, "("); i > 0 {
					fn = l[:i]
				}
			}
		}
	}
	return threads
}

// PyException is a Python rank's uncaught exception.
type PyException struct {
	// Type is the exception's class, qualified by its module unless a
	// builtin ("ValueError", "torch.distributed.DistBackendError").
	Type string
	// Message is its message's first line ("" when none).
	Message string
	// Frames are the traceback's frames, innermost first (as Thread's).
	Frames []Frame
	// User is the innermost frame of the user's code, nil when none.
	User *Frame
}

// ParsePythonTraceback reads the last traceback in a rank's stderr lines:
// the exception the program died of (with chained exceptions, "During
// handling ..." or "The above exception ...", the last one printed); nil when
// there is none. A "[rankN]: " prefix on every line (torch's) is dropped.
func ParsePythonTraceback(lines []string) *PyException {
	start := -1
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.TrimRight(rankPrefix.ReplaceAllString(lines[i], ""), " \r") == "Traceback (most recent call last):" {
			start = i
			break
		}
	}
	if start < 0 {
		return nil
	}
	e := &PyException{}
	var outer []Frame // outermost first, as printed
	for _, raw := range lines[start+1:] {
		l := strings.TrimRight(rankPrefix.ReplaceAllString(raw, ""), "\r")
		if m := pyTraceFrame.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[2])
			outer = append(outer, Frame{Func: m[3], File: m[1], Line: n, Library: pythonLibrary(m[1])})
			continue
		}
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			continue // a frame's source line, carets, "[Previous line repeated ...]"
		}
		m := pyExceptionLine.FindStringSubmatch(l)
		if m == nil {
			// A message that does not start with a name ("Error: ..." is
			// the common case): the line as it is.
			e.Type = l
		} else {
			e.Type, e.Message = m[1], strings.TrimSpace(m[2])
		}
		break
	}
	if e.Type == "" {
		return nil // cut off before the exception's line
	}
	for i := len(outer) - 1; i >= 0; i-- {
		e.Frames = append(e.Frames, outer[i])
	}
	e.User = innermostUser(e.Frames)
	return e
}

// innermostUser is the first of frames (innermost first) that is not a
// library's, nil when none.
func innermostUser(frames []Frame) *Frame {
	for i := range frames {
		if !frames[i].Library {
			f := frames[i]
			return &f
		}
	}
	return nil
}

// pyExceptionFile is exception.json as the site hook writes it.
type pyExceptionFile struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Frames  []struct {
		File string `json:"file"`
		Line int    `json:"line"`
		Func string `json:"func"`
	} `json:"frames"` // outermost first
	UserFrame *struct {
		File string `json:"file"`
		Line int    `json:"line"`
		Func string `json:"func"`
	} `json:"user_frame"`
}

// ReadPythonException reads exception.json, the uncaught exception the
// launcher's site hook recorded for a Python rank; nil when absent or
// invalid. Its message is cut to the first line.
func ReadPythonException(path string) *PyException {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var f pyExceptionFile
	if json.Unmarshal(b, &f) != nil || f.Type == "" {
		return nil
	}
	e := &PyException{Type: f.Type, Message: firstLineOf(f.Message)}
	for i := len(f.Frames) - 1; i >= 0; i-- {
		fr := f.Frames[i]
		e.Frames = append(e.Frames, Frame{Func: fr.Func, File: fr.File, Line: fr.Line, Library: pythonLibrary(fr.File)})
	}
	if u := f.UserFrame; u != nil {
		e.User = &Frame{Func: u.Func, File: u.File, Line: u.Line}
	} else {
		e.User = innermostUser(e.Frames)
	}
	return e
}

func firstLineOf(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(s)
}

// Group is ranks whose main thread's stack is the same (compared on the
// user's frames: function, file and line; library frames ignored).
type Group struct {
	Ranks []int
	// Where is the innermost user frame, nil when none.
	Where *Frame
	// Frames are the main thread's frames (of the group's lowest rank),
	// innermost first.
	Frames []Frame
	Kind   string
	Proc   string
}

// mainThread is the rank's main thread: the one marked Main, else the one a
// dump lists it as (a Python dump's last, a Go dump's first); nil when none.
func (rs RankStacks) mainThread() *Thread {
	for i := range rs.Threads {
		if rs.Threads[i].Main {
			return &rs.Threads[i]
		}
	}
	if len(rs.Threads) == 0 {
		return nil
	}
	if rs.Kind == StacksPython {
		return &rs.Threads[len(rs.Threads)-1]
	}
	return &rs.Threads[0]
}

// libraryKeyFrames is how many of a thread's innermost library frames
// stand for it when it has no user frame.
const libraryKeyFrames = 3

// groupKey is what ranks of one group share.
func (rs RankStacks) groupKey() string {
	if rs.Kind == StacksProc {
		return "proc\x00" + rs.Proc
	}
	t := rs.mainThread()
	if t == nil {
		return rs.Kind + "\x00none"
	}
	var b strings.Builder
	b.WriteString(rs.Kind + "\x00user")
	user := false
	for _, f := range t.Frames {
		if !f.Library {
			user = true
			fmt.Fprintf(&b, "\x00%s\x00%s\x00%d", f.Func, f.File, f.Line)
		}
	}
	if user {
		return b.String()
	}
	b.Reset()
	b.WriteString(rs.Kind + "\x00library")
	for i, f := range t.Frames {
		if i == libraryKeyFrames {
			break
		}
		b.WriteString("\x00" + f.Func)
	}
	return b.String()
}

// GroupStacks groups ranks and returns the groups, largest first, and the
// index of the odd one out: the one group strictly smaller than every other
// group (so with 2+ groups); -1 when there is none (one group, or a tie).
// Groups of one size come in the order of their lowest rank.
func GroupStacks(rs []RankStacks) (groups []Group, odd int) {
	sorted := append([]RankStacks(nil), rs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Rank < sorted[j].Rank })
	index := map[string]int{}
	for _, r := range sorted {
		k := r.groupKey()
		if i, ok := index[k]; ok {
			groups[i].Ranks = append(groups[i].Ranks, r.Rank)
			continue
		}
		g := Group{Ranks: []int{r.Rank}, Kind: r.Kind, Proc: r.Proc}
		if t := r.mainThread(); t != nil {
			g.Frames = t.Frames
			g.Where = innermostUser(t.Frames)
		}
		index[k] = len(groups)
		groups = append(groups, g)
	}
	sort.SliceStable(groups, func(i, j int) bool {
		if len(groups[i].Ranks) != len(groups[j].Ranks) {
			return len(groups[i].Ranks) > len(groups[j].Ranks)
		}
		return groups[i].Ranks[0] < groups[j].Ranks[0]
	})
	n := len(groups)
	if n >= 2 && len(groups[n-1].Ranks) < len(groups[n-2].Ranks) {
		return groups, n - 1
	}
	return groups, -1
}

// ranksLabel is "rank 1" or "ranks 0,2-3" (FormatRanks).
func ranksLabel(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	return "ranks " + FormatRanks(ranks)
}

// shortFunc is a function's name without its package's folder
// ("github.com/x/y.(*T).M" -> "y.(*T).M"; a Python name as it is).
func shortFunc(fn string) string {
	if i := strings.LastIndex(fn, "/"); i >= 0 && !strings.HasSuffix(fn, "/") {
		return fn[i+1:]
	}
	return fn
}

// baseName is a file's base name ("/p/train.py" -> "train.py"; "<string>").
func baseName(file string) string {
	return path.Base(strings.ReplaceAll(file, `\`, "/"))
}

// frameWhere is "func (file.py:12)".
func frameWhere(f Frame) string {
	return fmt.Sprintf("%s (%s:%d)", shortFunc(f.Func), baseName(f.File), f.Line)
}

// Describe is one line for the group: "rank 1 in load_batch (train.py:57)",
// "ranks 0,2-3 in all_reduce (train.py:41)"; with no user frame, the
// innermost frame; a rank with no dump, what /proc says: "rank 4: S
// (sleeping), wchan do_epoll_wait".
func (g Group) Describe() string {
	who := ranksLabel(g.Ranks)
	switch {
	case g.Kind == StacksProc && g.Proc != "":
		return who + ": " + g.Proc
	case g.Kind == StacksProc:
		return who + ": no stacks"
	case g.Place() != "":
		return who + " in " + g.Place()
	}
	return who + ": no stack"
}

// Place is where the group's main thread is, as a user reads it: the
// function it is in and the line of the user's code it was called from.
// For Python the function is the innermost frame's, a library's included
// ("all_reduce (train.py:41)": the script's line 41 called all_reduce and
// waits in it); for Go the innermost frame of the user's code (the
// runtime's and the standard library's frames are how it waits). With no
// user frame, the innermost frame; "" with no frame.
func (g Group) Place() string {
	switch {
	case len(g.Frames) == 0:
		return ""
	case g.Where == nil:
		return frameWhere(g.Frames[0])
	case g.Kind == StacksPython:
		w := *g.Where
		w.Func = g.Frames[0].Func
		return frameWhere(w)
	}
	return frameWhere(*g.Where)
}

// libraryPackages is how many package names a folded run of library
// frames lists.
const libraryPackages = 3

// Text is the group's stack folded for a summary, innermost first: user
// frames in full ("  train.py:57 in load_batch"), each run of library frames
// one line ("  … 6 library frames (torch/distributed, torch/nn)"). "" for a
// rank with no dump.
func (g Group) Text() string {
	var b strings.Builder
	for i := 0; i < len(g.Frames); {
		f := g.Frames[i]
		if !f.Library {
			fmt.Fprintf(&b, "  %s:%d in %s\n", baseName(f.File), f.Line, shortFunc(f.Func))
			i++
			continue
		}
		j := i
		var pkgs []string
		seen := map[string]bool{}
		for ; j < len(g.Frames) && g.Frames[j].Library; j++ {
			p := framePackage(g.Kind, g.Frames[j])
			if p != "" && !seen[p] {
				seen[p] = true
				pkgs = append(pkgs, p)
			}
		}
		noun := "frames"
		if j-i == 1 {
			noun = "frame"
		}
		if len(pkgs) > libraryPackages {
			pkgs = append(pkgs[:libraryPackages], "...")
		}
		fmt.Fprintf(&b, "  … %d library %s (%s)\n", j-i, noun, strings.Join(pkgs, ", "))
		i = j
	}
	return b.String()
}

// framePackage names a library frame's package: a Go function's package
// path; a Python file's folders within site-packages or the standard
// library, at most two ("torch/distributed"), or its module for a file at
// the top ("threading").
func framePackage(kind string, f Frame) string {
	if kind == StacksGo {
		return goPackage(f.Func)
	}
	file := strings.ReplaceAll(f.File, `\`, "/")
	if strings.HasPrefix(file, "<") {
		return strings.Trim(strings.TrimPrefix(strings.TrimPrefix(file, "<"), "frozen "), "<>")
	}
	rel := ""
	for _, marker := range []string{"/site-packages/", "/dist-packages/"} {
		if i := strings.LastIndex(file, marker); i >= 0 {
			rel = file[i+len(marker):]
			break
		}
	}
	if rel == "" {
		if loc := pyStdlib.FindStringIndex(file); loc != nil {
			rel = file[loc[1]:]
		} else {
			rel = path.Base(file)
		}
	}
	dirs := strings.Split(rel, "/")
	if len(dirs) == 1 {
		return strings.TrimSuffix(dirs[0], ".py")
	}
	dirs = dirs[:len(dirs)-1]
	if len(dirs) > 2 {
		dirs = dirs[:2]
	}
	return strings.Join(dirs, "/")
}
