package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// State is what a rank is doing, as its heartbeats report it: the collective in
// flight (or the last one finished) on some group.
type State struct {
	Rank   int       `json:"rank"`
	Group  string    `json:"group,omitempty"` // ranks, e.g. "[0 1 2 3]"
	Ranks  []int     `json:"ranks,omitempty"`
	Seq    uint64    `json:"seq"`
	Op     string    `json:"op,omitempty"`
	Active bool      `json:"active"` // in the collective now
	Since  time.Time `json:"since"`  // when it entered (or left) it
	Time   time.Time `json:"time"`   // when the heartbeat was sent
	// Seqs is the sequence number reached per group (collectives entered).
	Seqs map[string]uint64 `json:"seqs,omitempty"`
	// Closed: the rank closed its World (a clean exit, not a loss).
	Closed bool `json:"closed,omitempty"`
	// Failure is the rank's World failure, if any.
	Failure *Notice `json:"failure,omitempty"`
	// Watch, in the last heartbeat (Closed), lists the ranks whose liveness
	// this rank was watching: its watcher takes them over.
	Watch []int `json:"watch,omitempty"`
}

// Notice tells every rank of a group (or the whole job) that a collective failed.
type Notice struct {
	Abort    bool   `json:"abort,omitempty"` // the whole job is aborted
	Group    string `json:"group,omitempty"`
	Seq      uint64 `json:"seq"`
	Op       string `json:"op,omitempty"`
	Code     string `json:"code"` // one of the Code constants
	Rank     int    `json:"rank"` // culprit, -1 unknown
	Reporter int    `json:"reporter"`
	Want     string `json:"want,omitempty"`
	Got      string `json:"got,omitempty"`
	Detail   string `json:"detail,omitempty"`
	// Decided: Rank is the culprit as the group decided it. A mismatch is first
	// reported as seen by one rank (Decided false: Rank is the sender it got the
	// other descriptor from), then decided by vote (see collective.World) and
	// published once more by the reporting majority rank.
	Decided bool `json:"decided,omitempty"`
}

// Notice codes: what failed. All but CodePeerClosed name one of collective's
// sentinel errors.
const (
	CodeAborted     = "aborted"
	CodePeerLost    = "peer_lost"
	CodeMismatch    = "mismatch"
	CodeTimeout     = "timeout"
	CodeControlLost = "control_lost"
	CodeCorrupt     = "corrupt"
	CodeAuth        = "auth"
	CodeClosed      = "closed"
	// CodeLibrary: a device collective library (NCCL) failed on Rank.
	CodeLibrary = "library"
	// CodePeerClosed: Rank closed its World (a clean exit, not a failure by
	// itself); a rank delivers it to itself on a peer's last heartbeat.
	CodePeerClosed = "peer_closed"
)

// AbortNotice is the notice that aborts a job for reason: every rank's pending
// and future collectives fail with it. Publish it as JSON on AbortSubject.
func AbortNotice(reason string) Notice {
	return Notice{Abort: true, Code: CodeAborted, Rank: -1, Reporter: -1, Detail: reason}
}

// ParseNotice decodes a message received on subject of job. ok is true for a
// valid notice on FailSubject or AbortSubject; anything on AbortSubject is an
// abort (Abort set, Code CodeAborted) whatever it says.
func ParseNotice(job, subject string, data []byte) (n Notice, ok bool) {
	abort := subject == AbortSubject(job)
	if !abort && subject != FailSubject(job) {
		return Notice{}, false
	}
	if json.Unmarshal(data, &n) != nil {
		return Notice{}, false
	}
	if abort {
		n.Abort, n.Code = true, CodeAborted
	}
	return n, true
}

// ParseHeartbeat decodes a message received on subject of job. ok is true for
// a valid State on a HeartbeatSubject; the rank it claims is not checked.
func ParseHeartbeat(job, subject string, data []byte) (s State, ok bool) {
	if !strings.HasPrefix(subject, prefix(job)+"ctl.hb.") {
		return State{}, false
	}
	if json.Unmarshal(data, &s) != nil {
		return State{}, false
	}
	return s, true
}

// Blamer is an error that names the rank it blames (collective's *Error is
// one). CulpritRank is -1 when it names none.
type Blamer interface {
	error
	CulpritRank() int
}

// Culprits returns every rank err blames, when it blames several (a
// checkpoint save that failed on several ranks names them all): the
// CulpritRanks of the first error in its chain that has them, else nil.
func Culprits(err error) []int {
	var m interface{ CulpritRanks() []int }
	if errors.As(err, &m) {
		return m.CulpritRanks()
	}
	return nil
}

// Culprit returns the rank the first Blamer in err's chain names, or -1.
func Culprit(err error) int {
	var b Blamer
	if errors.As(err, &b) {
		return b.CulpritRank()
	}
	return -1
}
