package runlog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
)

// A rank's logs must never take the rank down, nor flood its console: when
// a write fails (a full disk), lossyFile drops the entry, counts it, and
// says so once on the console; it tries again with the next entry, so the
// log resumes when space is freed, and Close appends how many it dropped.
type lossyFile struct {
	mu      sync.Mutex
	f       *os.File
	name    string    // for the console note
	note    io.Writer // the console; nil: none
	dropped int64     // lines
	said    bool
}

func (l *lossyFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(p); err != nil {
		l.dropped += int64(max(bytes.Count(p, []byte{'\n'}), 1))
		if !l.said && l.note != nil {
			fmt.Fprintf(l.note, "WARN runlog: %s: %v: dropping entries until it can be written (counted)\n", l.name, err)
			l.said = true
		}
		return len(p), nil
	}
	return len(p), nil
}

func (l *lossyFile) Sync() error { return nil }

// Dropped is how many lines were dropped.
func (l *lossyFile) Dropped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// close appends the count of dropped entries (best effort) and closes.
func (l *lossyFile) close(last func(dropped int64) []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped > 0 && last != nil {
		l.f.Write(last(l.dropped))
	}
	return l.f.Close()
}
