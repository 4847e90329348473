// Package runlog is the worker side of the launcher's per-rank logs: a zap JSON
// logger writing rank-NNNNN/log.jsonl, a Chrome trace of spans in trace.json,
// error.json when the rank fails, progress reports the launcher shows on its
// console, and goroutine stacks dumped to the rank's folder on SIGUSR1.
//
// A worker opens it once from the environment the launcher sets:
//
//	MESHRUN_RANK_DIR   the rank's folder (runs/<job>/rank-00003); unset: nothing is
//	                   written to disk and every call is a cheap no-op
//	MESHRUN_JOB_ID, RANK, MESHRUN_NODE (or NODE_RANK)   stamped on every log line
//
// Its files are private whatever the umask: 0600, or 0640 in a folder its
// group may read (launcher run --share-logs; FileMode).
//
// Programs that do not use runlog launch as well: the launcher needs none of it.
package runlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/meshrun/meshrun/protocol"
)

// Files a rank writes into its folder.
const (
	LogFile   = "log.jsonl"
	TraceFile = "trace.json"
	ErrorFile = "error.json"
	// StacksPrefix starts the name of a goroutine dump: stacks-<unix ms>.txt.
	StacksPrefix = "stacks-"
)

// Marker starts a line a rank writes on stdout for the launcher (progress,
// hello); the launcher shows such lines its own way, not as output.
const Marker = "@meshrun:"

// Env names the launcher sets for runlog.
const (
	EnvRankDir = "MESHRUN_RANK_DIR"
	EnvNode    = "MESHRUN_NODE"
)

// Options configure Open. Every field may be left zero.
type Options struct {
	// Getenv reads the environment; default os.Getenv.
	Getenv func(string) string
	// Stdout receives the marker lines the launcher reads (progress, hello);
	// nil sends none.
	Stdout io.Writer
	// Stderr receives a console copy of log entries at ConsoleLevel and above
	// (without time, pid or job: the launcher stamps and prefixes lines); nil
	// sends none.
	Stderr io.Writer
	// ConsoleLevel is the lowest level copied to Stderr; default warn.
	ConsoleLevel zapcore.Level
	// NoSignal leaves SIGUSR1 alone (no stack dumps on signal).
	NoSignal bool
}

// Rank is one rank's logs. Its methods are safe for concurrent use; the nil
// *Rank is valid and does nothing (Log is then a no-op logger).
type Rank struct {
	// Log writes log.jsonl: job, rank, node and pid on every line, no sampling.
	Log *zap.Logger

	dir        string
	job        string
	rank, node int
	stdout     io.Writer
	outMu      sync.Mutex
	logFile    *lossyFile
	tr         *tracer
	sigC       chan os.Signal
	quit       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
	failOnce   sync.Once
	// steps is steps.jsonl, opened at the first Step.
	stepsMu   sync.Mutex
	steps     *lossyFile
	stepsSaid bool
}

// Open opens the rank's logs from the environment. Without MESHRUN_RANK_DIR it
// returns a Rank that writes nothing to disk (its logger still copies warnings
// to Stderr), so a program runs the same outside the launcher.
func Open(o Options) (*Rank, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if o.ConsoleLevel == 0 && o.Stderr != nil {
		o.ConsoleLevel = zapcore.WarnLevel
	}
	r := &Rank{
		dir:    getenv(EnvRankDir),
		job:    getenv("MESHRUN_JOB_ID"),
		rank:   envInt(getenv, "RANK", -1),
		node:   envInt(getenv, EnvNode, envInt(getenv, "NODE_RANK", 0)),
		stdout: o.Stdout,
		quit:   make(chan struct{}),
	}
	var cores []zapcore.Core
	if o.Stderr != nil {
		enc := zapcore.NewConsoleEncoder(zapcore.EncoderConfig{
			LevelKey: "level", MessageKey: "msg", EncodeLevel: zapcore.CapitalLevelEncoder,
			ConsoleSeparator: " ",
		})
		cores = append(cores, zapcore.NewCore(enc, zapcore.AddSync(o.Stderr), o.ConsoleLevel))
	}
	if r.dir != "" {
		// The launcher made the folder (0700, or 0750 shared); one runlog
		// makes itself is private.
		if err := os.MkdirAll(r.dir, 0o700); err != nil {
			return nil, fmt.Errorf("runlog: %w", err)
		}
		traceMax := int64(DefaultTraceMax)
		if v := getenv(EnvTraceMax); v != "" {
			n, err := parseSize(v)
			if err != nil {
				return nil, fmt.Errorf("runlog: %s: %w", EnvTraceMax, err)
			}
			traceMax = n
		}
		f, err := OpenFile(filepath.Join(r.dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND)
		if err != nil {
			return nil, fmt.Errorf("runlog: %w", err)
		}
		r.logFile = &lossyFile{f: f, name: LogFile, note: o.Stderr}
		enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{
			TimeKey: "ts_ms", LevelKey: "level", MessageKey: "msg", CallerKey: "caller",
			StacktraceKey: "stack", NameKey: "logger",
			EncodeTime: zapcore.EpochMillisTimeEncoder, EncodeLevel: zapcore.LowercaseLevelEncoder,
			EncodeDuration: zapcore.MillisDurationEncoder, EncodeCaller: zapcore.ShortCallerEncoder,
			LineEnding: "\n",
		})
		fields := []zapcore.Field{zap.String("job", r.job), zap.Int("rank", r.rank), zap.Int("node", r.node), zap.Int("pid", os.Getpid())}
		cores = append(cores, zapcore.NewCore(enc, r.logFile, zapcore.DebugLevel).With(fields))
		tr, err := openTracer(filepath.Join(r.dir, TraceFile), r.rank, r.node, traceMax, o.Stderr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("runlog: %w", err)
		}
		r.tr = tr
	}
	switch len(cores) {
	case 0:
		r.Log = zap.NewNop()
	case 1:
		r.Log = zap.New(cores[0])
	default:
		r.Log = zap.New(zapcore.NewTee(cores...))
	}
	if r.dir != "" {
		if !o.NoSignal {
			r.sigC = make(chan os.Signal, 1)
			signal.Notify(r.sigC, syscall.SIGUSR1)
		}
		r.wg.Add(1)
		go r.loop()
	}
	r.marker("hello", map[string]any{"pid": os.Getpid(), "stacks_on_sigusr1": r.sigC != nil, "rank": r.rank})
	return r, nil
}

func envInt(getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil {
		return n
	}
	return def
}

// Dir is the rank's folder, "" when the rank writes nothing to disk.
func (r *Rank) Dir() string {
	if r == nil {
		return ""
	}
	return r.dir
}

// marker writes one "@meshrun:kind {json}" line to stdout for the launcher.
func (r *Rank) marker(kind string, v any) {
	if r == nil || r.stdout == nil || r.dir == "" {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	line := make([]byte, 0, len(Marker)+len(kind)+len(b)+2)
	line = append(append(append(append(line, Marker...), kind...), ' '), b...)
	line = append(line, '\n')
	r.outMu.Lock()
	r.stdout.Write(line)
	r.outMu.Unlock()
}

// Progress is one step report, as the launcher reads it.
type Progress struct {
	Step   int     `json:"step"`
	Total  int     `json:"total,omitempty"`
	Loss   float64 `json:"loss"`
	StepMS float64 `json:"step_ms"`
	Rank   int     `json:"rank"`
}

// Progress reports step k of total (0 if unknown), the loss and the step's
// time: the launcher shows it as a progress line; log.jsonl gets it too.
func (r *Rank) Progress(step, total int, loss float64, stepTime time.Duration) {
	if r == nil {
		return
	}
	p := Progress{Step: step, Total: total, Loss: loss, StepMS: float64(stepTime.Microseconds()) / 1000, Rank: r.rank}
	r.marker("progress", p)
	r.Log.Info("progress", zap.Int("step", step), zap.Int("total", total), zap.Float64("loss", loss), zap.Float64("step_ms", p.StepMS))
}

// ErrorRecord is error.json.
type ErrorRecord struct {
	Error string `json:"error"`
	// Culprit is the rank the error names (protocol.Culprit), when it names one.
	Culprit *int `json:"culprit_rank,omitempty"`
	// Culprits are all the ranks the error names, when it names several
	// (protocol.Culprits: a checkpoint save that failed on ranks 0, 2 and 3);
	// Culprit is then the first of them.
	Culprits []int  `json:"culprit_ranks,omitempty"`
	Rank     int    `json:"rank"`
	Node     int    `json:"node"`
	PID      int    `json:"pid"`
	TimeMS   int64  `json:"time_ms"`
	Stack    string `json:"stack,omitempty"`
}

// Fail records the error that ends the rank: error.json (first call wins) and
// an error line in log.jsonl. It does not exit.
func (r *Rank) Fail(err error) {
	if r == nil || err == nil {
		return
	}
	r.fail(err, "")
}

func (r *Rank) fail(err error, stack string) {
	r.failOnce.Do(func() {
		rec := ErrorRecord{Error: err.Error(), Rank: r.rank, Node: r.node, PID: os.Getpid(), TimeMS: time.Now().UnixMilli(), Stack: stack}
		fields := []zap.Field{zap.Error(err)}
		if c := protocol.Culprit(err); c >= 0 {
			rec.Culprit = &c
			fields = append(fields, zap.Int("culprit_rank", c))
		}
		if cs := protocol.Culprits(err); len(cs) > 0 {
			rec.Culprits = cs
			fields = append(fields, zap.Ints("culprit_ranks", cs))
		}
		r.Log.Error("rank failed", fields...)
		if r.dir == "" {
			return
		}
		b, _ := json.MarshalIndent(rec, "", "  ")
		writeFile(filepath.Join(r.dir, ErrorFile), append(b, '\n'))
	})
}

// Recover records a panic in error.json (with its stack) and panics again; use
// it as `defer r.Recover()` at the top of main's work.
func (r *Rank) Recover() {
	v := recover()
	if v == nil {
		return
	}
	if r != nil {
		buf := make([]byte, 64<<10)
		buf = buf[:stackLen(buf)]
		r.fail(fmt.Errorf("panic: %v", v), string(buf))
		r.Close()
	}
	panic(v)
}

// DumpStacks writes every goroutine's stack to the rank's folder
// (stacks-<unix ms>.txt) and returns the file's path.
func (r *Rank) DumpStacks(reason string) (string, error) {
	if r == nil || r.dir == "" {
		return "", errors.New("runlog: no rank folder")
	}
	now := time.Now()
	path := filepath.Join(r.dir, fmt.Sprintf("%s%d.txt", StacksPrefix, now.UnixMilli()))
	f, err := OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(f, "# rank %d node %d pid %d at %s: %s\n", r.rank, r.node, os.Getpid(), now.UTC().Format(time.RFC3339Nano), reason)
	err = pprof.Lookup("goroutine").WriteTo(f, 2)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	r.Log.Warn("goroutine stacks dumped", zap.String("path", path), zap.String("reason", reason))
	return path, err
}

// loop dumps stacks on SIGUSR1 and writes the trace out every second, so a
// rank killed by SIGKILL loses at most a second of spans.
func (r *Rank) loop() {
	defer r.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-r.sigC:
			r.DumpStacks("SIGUSR1")
		case <-t.C:
			r.FlushTrace()
		}
	}
}

// Close flushes the logger and the trace; SIGUSR1 is ignored from then on.
func (r *Rank) Close() error {
	if r == nil {
		return nil
	}
	var err error
	r.closeOnce.Do(func() {
		if r.sigC != nil {
			// The launcher may still send SIGUSR1 (it heard "stacks on SIGUSR1"
			// at Open): from now on it does nothing rather than kill the process.
			signal.Ignore(syscall.SIGUSR1)
		}
		close(r.quit)
		r.wg.Wait()
		if r.tr != nil {
			var dropped int64
			dropped, err = r.tr.close()
			if dropped > 0 {
				r.Log.Warn("trace spans dropped", zap.Int64("dropped_spans", dropped), zap.Int64("trace_max", r.tr.max))
			}
		}
		r.Log.Sync()
		r.stepsMu.Lock()
		if r.steps != nil {
			r.steps.close(nil)
		}
		r.stepsMu.Unlock()
		if r.logFile != nil {
			cerr := r.logFile.close(func(n int64) []byte {
				return []byte(fmt.Sprintf(`{"ts_ms":%d,"level":"warn","msg":"log entries dropped","dropped":%d,"job":%q,"rank":%d,"node":%d,"pid":%d}`+"\n",
					time.Now().UnixMilli(), n, r.job, r.rank, r.node, os.Getpid()))
			})
			if err == nil {
				err = cerr
			}
		}
	})
	return err
}
