package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/runlog"
)

// writeJSON writes v, indented, to path atomically: a temporary file
// renamed over it, so that a reader sees the old file or the new one, never
// a part (a full disk leaves no empty summary.json). When the disk is full it
// frees the job folder's reserve (reserveSpace) and tries once more.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(redactJSON(b), '\n')
	err = writeAtomic(path, b)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		if os.Remove(filepath.Join(filepath.Dir(path), reserveFile)) == nil {
			err = writeAtomic(path, b)
		}
	}
	return err
}

func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The folder's mode: 0600, or 0640 shared (perm.go).
		err = os.Chmod(f.Name(), runlog.FileMode(filepath.Dir(path)))
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// reserveFile holds space in a job folder for the launcher's last words:
// the summaries are written even when the ranks filled the disk.
const reserveFile = ".reserve"

// reserveSize is what reserveFile holds.
const reserveSize = 1 << 20

// reserveSpace writes the reserve into dir (best effort).
func reserveSpace(dir string) {
	if f, err := createFile(filepath.Join(dir, reserveFile)); err == nil {
		f.Write(make([]byte, reserveSize))
		f.Close()
	}
}

// events appends lifecycle events to events.jsonl, one JSON object a line with
// a millisecond Unix timestamp.
type events struct {
	mu sync.Mutex
	f  *os.File
}

func openEvents(dir string) (*events, error) {
	f, err := runlog.OpenFile(filepath.Join(dir, EventsFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND)
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
	b = redactJSON(b)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.f.Write(append(b, '\n'))
}

func (e *events) close() error { return e.f.Close() }
