package runlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestFileModes: every file a rank writes (log.jsonl, trace.json and its
// older half, error.json, stacks) takes its folder's mode, whatever the
// umask: 0600 in a 0700 folder, 0640 in a 0750 one (the launcher's
// --share-logs) even under umask 077, never a bit for others even in a 0755
// folder; a folder runlog makes itself is 0700.
func TestFileModes(t *testing.T) {
	for _, tc := range []struct {
		umask   int
		dirMode os.FileMode // 0: runlog makes the folder
		want    os.FileMode
	}{
		{0o022, 0o700, 0o600},
		{0o077, 0o700, 0o600},
		{0o077, 0o750, 0o640},
		{0o000, 0o755, 0o640},
		{0o022, 0, 0o600},
	} {
		t.Run(fmt.Sprintf("umask%03o-dir%03o", tc.umask, tc.dirMode), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "rank-00003")
			if tc.dirMode != 0 {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(dir, tc.dirMode); err != nil {
					t.Fatal(err)
				}
			}
			old := syscall.Umask(tc.umask)
			env := map[string]string{EnvRankDir: dir, EnvTraceMax: "4K", "RANK": "3"}
			r, err := Open(Options{Getenv: func(k string) string { return env[k] }, NoSignal: true})
			if err != nil {
				syscall.Umask(old)
				t.Fatal(err)
			}
			r.Log.Info("hello")
			for i := 0; i < 200; i++ { // past 2K: trace.json becomes trace.1.json
				r.Span("step", "test").End()
				r.FlushTrace()
			}
			r.Fail(errors.New("boom"))
			_, serr := r.DumpStacks("test")
			cerr := r.Close()
			syscall.Umask(old)
			if serr != nil || cerr != nil {
				t.Fatal(serr, cerr)
			}
			if st, err := os.Stat(dir); err != nil || tc.dirMode == 0 && st.Mode().Perm() != 0o700 {
				t.Errorf("the rank's folder: %v %v", st.Mode(), err)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, e := range ents {
				info, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				seen[e.Name()] = true
				if info.Mode().Perm() != tc.want {
					t.Errorf("%s: mode %04o, want %04o", e.Name(), info.Mode().Perm(), tc.want)
				}
			}
			for _, f := range []string{LogFile, TraceFile, OldTraceFile, ErrorFile} {
				if !seen[f] {
					t.Errorf("no %s among %v", f, ents)
				}
			}
			if len(ents) != 5 {
				t.Errorf("files %v, want 5 (a stacks file among them)", ents)
			}
		})
	}
}
