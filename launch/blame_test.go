package launch

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshrun/meshrun/runlog"
)

// TestBlameByVotes: whatever order the exits came in, the rank the failed
// ranks' errors blame is the root cause: a SIGTERMed rank that recorded its
// own failure before the teardown began exited 143 (not hung), however late
// its exit was seen, and so did one whose error, blaming no one, came before
// the teardown; one still running and silent when the teardown began is
// hung, whatever it recorded after (the abort's error, blaming no one, or
// its peers' verdict, blaming itself, once resumed).
func TestBlameByVotes(t *testing.T) {
	tear := time.UnixMilli(1_000_000)
	for _, tc := range []struct {
		name     string
		selfAtMS int64 // when rank 1 recorded its own failure
		culprit  int   // the rank its error blames; -1: none
		hung     bool
		endMS    int64 // when its exit 143 came (0: just after the teardown's SIGTERM)
	}{
		{"failing before the teardown", tear.UnixMilli() - 5, 1, false, 0},
		{"blaming itself after the teardown began", tear.UnixMilli() + 50, 1, true, 0},
		{"only after the teardown's SIGTERM", tear.Add(abortSettle).UnixMilli() + 50, 1, true, 0},
		{"an error blaming no one before the teardown", tear.UnixMilli() - 5, -1, false, 0},
		{"an error blaming no one after the teardown began", tear.UnixMilli() + 5, -1, true, 0},
		// A SIGTERM from outside: the worker exits 143 on it, and its
		// peers, which saw its connections close, failed first.
		{"exiting 143 before the teardown's SIGTERM", tear.UnixMilli() + 50, 1, false, tear.UnixMilli() + 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rec := func(rank, culprit int, at int64) {
				r := runlog.ErrorRecord{Error: "collective failed", Rank: rank, TimeMS: at}
				if culprit >= 0 {
					r.Culprit = &culprit
				}
				b, _ := json.Marshal(r)
				os.MkdirAll(filepath.Join(dir, RankDir(rank)), 0o755)
				os.WriteFile(filepath.Join(dir, RankDir(rank), runlog.ErrorFile), b, 0o644)
			}
			rec(0, 1, tear.UnixMilli()-20)
			rec(2, 1, tear.UnixMilli()-10)
			rec(1, tc.culprit, tc.selfAtMS)
			j := &job{world: 3, ranks: []rankSpec{{Rank: 0}, {Rank: 1}, {Rank: 2}}}
			a := &attempt{j: j, dir: dir, tearAt: tear, outcome: OutcomeRankFailed, byRank: map[int]*proc{}, remoteFails: map[int]RootCause{},
				stoppedStates: map[int]string{}, pl: &plane{joining: map[int]time.Time{}, seen: map[int]time.Time{1: tear}}}
			// The teardown's SIGTERM went out abortSettle after it began;
			// rank 1 exited 143 on it (ranks 0 and 2 failed on their own).
			a.termAt = tear.Add(abortSettle)
			for r, code := range []int{1, 143, 1} {
				p := &proc{spec: j.ranks[r], done: true}
				p.out = RankOutcome{Rank: r, ExitCode: code, EndMS: tear.UnixMilli() + int64(r)*100}
				if r == 1 {
					p.out.EndMS = a.termAt.UnixMilli() + 30
					if tc.endMS != 0 {
						p.out.EndMS = tc.endMS
					}
				}
				a.procs = append(a.procs, p)
				a.byRank[r] = p
			}
			// Rank 0 exited first and started the teardown; ranks 1 and 2
			// were still running then.
			a.root = &RootCause{Rank: 0, ExitCode: 1, TimeMS: tear.UnixMilli()}
			a.victims = []int{1, 2}
			a.blameByVotes()
			rc := a.root
			if rc.Rank != 1 || rc.Hung != tc.hung || rc.ReportedBy == nil || *rc.ReportedBy != 0 || slices.Contains(a.victims, 1) || !slices.Contains(a.victims, 0) {
				t.Fatalf("root %+v, victims %v", rc, a.victims)
			}
			if !tc.hung && (rc.ExitCode != 143 || a.outcome != OutcomeRankFailed) {
				t.Errorf("exit %d, outcome %s", rc.ExitCode, a.outcome)
			}
			if tc.hung && (rc.ExitCode != ExitHang || a.outcome != OutcomeHang) {
				t.Errorf("exit %d, outcome %s", rc.ExitCode, a.outcome)
			}
		})
	}
}
