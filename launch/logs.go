package launch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files of a job folder, runs/<job-id>/.
const (
	JobFile     = "job.json"
	EventsFile  = "events.jsonl"
	SummaryFile = "summary.json"
	CredsFile   = "nats.creds"
)

// RankDir is the folder of one rank inside the job folder: rank-00003.
func RankDir(rank int) string { return fmt.Sprintf("rank-%05d", rank) }

// JobRecord is job.json: what was run, where, and with which versions.
type JobRecord struct {
	JobID    string            `json:"job_id"`
	Argv     []string          `json:"argv"`
	Command  []string          `json:"command"`
	Started  time.Time         `json:"started"`
	NNodes   int               `json:"nnodes"`
	World    int               `json:"world_size"`
	NATSURL  string            `json:"nats_url"`
	Env      map[string]string `json:"env"` // variables set for every rank (rank-specific ones in Ranks)
	Ranks    []RankRecord      `json:"ranks"`
	Versions map[string]string `json:"versions"`
}

// RankRecord is one rank in job.json.
type RankRecord struct {
	Rank       int `json:"rank"`
	LocalRank  int `json:"local_rank"`
	Node       int `json:"node"`
	PID        int `json:"pid"`
	GOMAXPROCS int `json:"gomaxprocs"`
}

// Summary is summary.json: how every rank ended and why the job ended.
type Summary struct {
	JobID    string `json:"job_id"`
	ExitCode int    `json:"exit_code"`
	// Reason: "ok", "rank_failed", "timeout", "interrupted".
	Reason string `json:"reason"`
	// RootCause is the rank whose failure ended the job; nil when none did.
	RootCause *int `json:"root_cause_rank"`
	// Victims are the ranks the launcher tore down because of the root cause,
	// the timeout or an interrupt.
	Victims    []int         `json:"victims"`
	DurationMS int64         `json:"duration_ms"`
	Ranks      []RankOutcome `json:"ranks"`
}

// RankOutcome is how one rank ended.
type RankOutcome struct {
	Rank       int    `json:"rank"`
	PID        int    `json:"pid"`
	ExitCode   int    `json:"exit_code"` // 128+signal when signalled
	Signal     string `json:"signal,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	Error      string `json:"error,omitempty"`
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// events appends lifecycle events to events.jsonl, one JSON object a line with
// a millisecond Unix timestamp.
type events struct {
	mu sync.Mutex
	f  *os.File
}

func openEvents(dir string) (*events, error) {
	f, err := os.OpenFile(filepath.Join(dir, EventsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &events{f: f}, nil
}

// emit writes one event; kv are alternating keys and values.
func (e *events) emit(name string, kv ...any) {
	m := make(map[string]any, 2+len(kv)/2)
	m["ts_ms"] = time.Now().UnixMilli()
	m["event"] = name
	for i := 0; i+1 < len(kv); i += 2 {
		m[fmt.Sprint(kv[i])] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.f.Write(append(b, '\n'))
}

func (e *events) close() error { return e.f.Close() }

// console serializes the prefixed lines of every rank onto one writer, so
// lines of different ranks never interleave mid-line.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *console) writeLine(prefix, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := make([]byte, 0, len(prefix)+len(line)+1)
	buf = append(append(append(buf, prefix...), line...), '\n')
	c.w.Write(buf)
}

// prefixer splits what a rank writes into lines and sends each, prefixed
// "node:rank| ", to the console. A last line without a newline is sent by Close.
type prefixer struct {
	c      *console
	prefix []byte
	buf    []byte
}

func newPrefixer(c *console, node, rank int) *prefixer {
	return &prefixer{c: c, prefix: fmt.Appendf(nil, "%d:%d| ", node, rank)}
}

func (p *prefixer) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.c.writeLine(p.prefix, bytes.TrimSuffix(p.buf[:i], []byte{'\r'}))
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) == 0 {
		p.buf = nil // release the grown array between bursts
	}
	return len(b), nil
}

// Close flushes a last partial line.
func (p *prefixer) Close() error {
	if len(p.buf) > 0 {
		p.c.writeLine(p.prefix, p.buf)
		p.buf = nil
	}
	return nil
}
