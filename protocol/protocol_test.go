package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/deps"
)

// The subjects are the wire contract between ranks, launchers and the NATS
// permissions of a job: spelled out here once.
func TestSubjects(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{JobSubjects("j1"), "meshrun.j1.>"},
		{RendezvousSubject("j1"), "meshrun.j1.rdv"},
		{HeartbeatSubject("j1", 3), "meshrun.j1.ctl.hb.3"},
		{HeartbeatSubjects("j1"), "meshrun.j1.ctl.hb.*"},
		{FailSubject("j1"), "meshrun.j1.ctl.fail"},
		{AbortSubject("j1"), "meshrun.j1.ctl.abort"},
		{NoticeSubjects("j1"), "meshrun.j1.ctl.*"},
		{ControlSubjects("j1"), "meshrun.j1.ctl.>"},
		{LauncherSubject("j1"), "meshrun.j1.launcher"},
		{MasterSubject("j1"), "meshrun.j1.launcher.master"},
		{AttemptSubject("j1"), "meshrun.j1.launcher.attempt"},
		{PresenceSubject("j1"), "meshrun.j1.launcher.hello"},
		{JoiningSubject("j1", 7), "meshrun.j1.join.7"},
		{JoiningSubjects("j1"), "meshrun.j1.join.*"},
		{DataSubject("j1", 2, 0), "meshrun.j1.data.2.0"},
		{CreditSubject("j1", 0, 2), "meshrun.j1.credit.0.2"},
		{CreditSubjects("j1", 0), "meshrun.j1.credit.0.*"},
		{DataPingSubject("j1", 4), "meshrun.j1.dping.4"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for _, tc := range []struct {
		subj string
		dst  int
		ok   bool
	}{
		{CreditSubject("j1", 0, 2), 2, true},
		{CreditSubject("j1", 1, 2), 0, false},
		{CreditSubject("j2", 0, 2), 0, false},
		{"meshrun.j1.credit.0.x", 0, false},
		{DataSubject("j1", 0, 2), 0, false},
	} {
		if dst, ok := ParseCreditSubject("j1", 0, tc.subj); ok != tc.ok || ok && dst != tc.dst {
			t.Errorf("ParseCreditSubject(%q) = %d, %v", tc.subj, dst, ok)
		}
	}
}

func TestParse(t *testing.T) {
	fail, _ := json.Marshal(Notice{Code: CodeMismatch, Rank: 1, Reporter: 0, Op: "all_reduce", Seq: 4, Decided: true})
	if n, ok := ParseNotice("j1", FailSubject("j1"), fail); !ok || n.Abort || n.Code != CodeMismatch || n.Rank != 1 || !n.Decided {
		t.Errorf("fail notice: %+v %v", n, ok)
	}
	// Anything on the abort subject is an abort.
	if n, ok := ParseNotice("j1", AbortSubject("j1"), []byte(`{"code":"timeout","rank":2,"detail":"why"}`)); !ok || !n.Abort || n.Code != CodeAborted || n.Detail != "why" {
		t.Errorf("abort notice: %+v %v", n, ok)
	}
	abort, _ := json.Marshal(AbortNotice("rank 3 exited"))
	if n, ok := ParseNotice("j1", AbortSubject("j1"), abort); !ok || n != AbortNotice("rank 3 exited") || n.Rank != -1 || n.Reporter != -1 {
		t.Errorf("AbortNotice round trip: %+v %v", n, ok)
	}
	for _, subj := range []string{FailSubject("j2"), HeartbeatSubject("j1", 0), LauncherSubject("j1")} {
		if _, ok := ParseNotice("j1", subj, fail); ok {
			t.Errorf("ParseNotice accepted %s", subj)
		}
	}
	if _, ok := ParseNotice("j1", FailSubject("j1"), []byte("{")); ok {
		t.Error("ParseNotice accepted bad JSON")
	}
	hb, _ := json.Marshal(State{Rank: 2, Seq: 7, Op: "barrier", Active: true})
	if s, ok := ParseHeartbeat("j1", HeartbeatSubject("j1", 2), hb); !ok || s.Rank != 2 || s.Seq != 7 || !s.Active {
		t.Errorf("heartbeat: %+v %v", s, ok)
	}
	for _, subj := range []string{FailSubject("j1"), HeartbeatSubject("j2", 2)} {
		if _, ok := ParseHeartbeat("j1", subj, hb); ok {
			t.Errorf("ParseHeartbeat accepted %s", subj)
		}
	}
	if _, ok := ParseHeartbeat("j1", HeartbeatSubject("j1", 2), []byte("[]")); ok {
		t.Error("ParseHeartbeat accepted bad JSON")
	}
}

type blamer struct{ rank int }

func (b blamer) Error() string    { return fmt.Sprintf("blames %d", b.rank) }
func (b blamer) CulpritRank() int { return b.rank }

func TestCulprit(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, -1},
		{errors.New("plain"), -1},
		{blamer{3}, 3},
		{fmt.Errorf("step 7: %w", blamer{5}), 5},
		{fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", blamer{-1})), -1},
		{errors.Join(errors.New("first"), blamer{2}), 2},
	} {
		if got := Culprit(tc.err); got != tc.want {
			t.Errorf("Culprit(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestHangs(t *testing.T) {
	now := time.Now()
	old := now.Add(-time.Second)
	g := "[0 1 2]"
	ranks := []int{0, 1, 2}
	latest := map[int]State{
		// Ranks 0 and 1 wait in seq 4 of g; rank 2 never entered it.
		0: {Rank: 0, Group: g, Ranks: ranks, Seq: 4, Op: "all_reduce", Active: true, Since: old, Seqs: map[string]uint64{g: 4}},
		1: {Rank: 1, Group: g, Ranks: ranks, Seq: 4, Op: "all_reduce", Active: true, Since: old.Add(-time.Millisecond), Seqs: map[string]uint64{g: 4}},
		2: {Rank: 2, Group: g, Ranks: ranks, Seq: 3, Op: "all_reduce", Since: old, Seqs: map[string]uint64{g: 3}},
		// Rank 3 has just entered a collective: not a hang yet.
		3: {Rank: 3, Group: "[3 4]", Ranks: []int{3, 4}, Seq: 1, Op: "barrier", Active: true, Since: now},
	}
	hs := Hangs(latest, now, 500*time.Millisecond)
	if len(hs) != 1 {
		t.Fatalf("hangs %v", hs)
	}
	h := hs[0]
	if h.Group != g || h.Seq != 4 || h.Op != "all_reduce" || !h.Since.Equal(old.Add(-time.Millisecond)) ||
		fmt.Sprint(h.Waiting) != "[0 1]" || fmt.Sprint(h.Missing) != "[2]" {
		t.Errorf("hang %v", h)
	}
	// A rank with no heartbeat at all is missing too.
	delete(latest, 2)
	if hs := Hangs(latest, now, 500*time.Millisecond); len(hs) != 1 || fmt.Sprint(hs[0].Missing) != "[2]" {
		t.Errorf("without rank 2's heartbeat: %v", hs)
	}
	if hs := Hangs(latest, now, 2*time.Second); len(hs) != 0 {
		t.Errorf("below the threshold: %v", hs)
	}
}

// protocol is read by the launcher and by runlog, which must not link the
// collective layer: it depends on the standard library alone.
func TestStandardLibraryOnly(t *testing.T) {
	for _, d := range deps.Of(t, deps.Module+"/protocol") {
		if !d.Standard && d.ImportPath != deps.Module+"/protocol" {
			t.Errorf("protocol depends on %s", d.ImportPath)
		}
	}
}

func TestParseJoiningSubject(t *testing.T) {
	if r, ok := ParseJoiningSubject("j1", JoiningSubject("j1", 12)); !ok || r != 12 {
		t.Errorf("got %d %v", r, ok)
	}
	for _, s := range []string{"meshrun.j2.join.1", "meshrun.j1.join.x", "meshrun.j1.join.-1", "meshrun.j1.rdv"} {
		if _, ok := ParseJoiningSubject("j1", s); ok {
			t.Errorf("%s parsed", s)
		}
	}
}
