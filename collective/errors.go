package collective

import (
	"errors"
	"fmt"
	"strings"

	"github.com/meshrun/meshrun/protocol"
)

// Sentinel errors. Every error a collective returns wraps one of them; test with
// errors.Is, and use errors.As with *Error for the culprit rank and descriptors.
// A sentinel's message starts with "collective: " and a call site wraps it
// first, adding no prefix of its own: fmt.Errorf("%w: ...", ErrInvalid).
var (
	// ErrAborted: the job was aborted (an abort notice on protocol.AbortSubject,
	// e.g. from the launcher) or the communicator closed.
	ErrAborted = errors.New("collective: aborted")
	// ErrPeerLost: a peer exited, was killed, closed its connection or stopped
	// sending heartbeats. Error.Rank names it.
	ErrPeerLost = errors.New("collective: peer lost")
	// ErrMismatch: ranks called different collectives (op, dtype, counts, group
	// or sequence number). Error.Want and Error.Got hold both descriptors.
	ErrMismatch = errors.New("collective: mismatched collective")
	// ErrTimeout: a wait passed its deadline. Error.Rank names the rank that was
	// missing, when the heartbeats tell.
	ErrTimeout = errors.New("collective: timeout")
	// ErrControlLost: the connection to the NATS server dropped; the collective
	// in flight failed and the world is unusable. Nothing is retried.
	ErrControlLost = errors.New("collective: control plane lost")
	// ErrRendezvous: the job's roster did not complete (missing or duplicate ranks).
	ErrRendezvous = errors.New("collective: rendezvous failed")
	// ErrCorrupt: a message failed to decode (bad magic, version, checksum, length).
	ErrCorrupt = errors.New("collective: corrupt message")
	// ErrAuth: a data connection failed authentication, or the NATS server
	// refused the rank's credentials (Error.Detail names their file and the
	// server's answer).
	ErrAuth = errors.New("collective: authentication failed")
	// ErrPermission: the NATS server refused this rank a subject of its job
	// (a "Permissions Violation": credentials of another job, or a
	// MESHRUN_JOB_ID that is not theirs). Error.Detail names the subject and
	// the credentials. Join fails with it at once, a joined World as soon as
	// the server says so.
	ErrPermission = errors.New("collective: NATS permission denied")
	// ErrLibrary: a device collective library (NCCL) failed: an error it
	// returned, or its communicator's asynchronous error. The communicator was
	// aborted.
	ErrLibrary = errors.New("collective: device collective library failed")
	// ErrNoLibrary: a device collective library could not be loaded; under
	// auto, device buffers then take the staged backend.
	ErrNoLibrary = errors.New("collective: device collective library unavailable")
	// ErrSharedDevice: members of a group are on one physical device and
	// MESHRUN_COLLECTIVES=nccl asked for NCCL, which refuses two ranks of a
	// communicator on one device. Error.Detail names the ranks and the
	// device; nothing moved. Under auto such a group takes staged.
	ErrSharedDevice = errors.New("collective: ranks share a device")
	// ErrInvalid: bad arguments (lengths, counts, ranks, options). It is not
	// placement.ErrInvalid (a layout that cannot hold) nor launch.ErrInvalid
	// (options a launcher cannot run): it fails a call on a live world.
	ErrInvalid = errors.New("collective: invalid argument")
	// ErrClosed: the communicator or world was closed, or failed earlier.
	ErrClosed = errors.New("collective: closed")
)

// Error is the typed error of a failed collective.
type Error struct {
	Kind     error  // one of the sentinels
	Rank     int    // culprit rank (world rank), -1 if unknown
	Reporter int    // the rank that detected the failure, -1 if unknown
	Group    string // the group, e.g. "[0 1 2 3]"
	Seq      uint64 // sequence number of the collective within the group
	Op       string // the collective that failed
	Want     string // descriptor the reporter (and the group's majority) called (mismatch)
	Got      string // descriptor the culprit called (mismatch)
	Detail   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Rank >= 0 {
		fmt.Fprintf(&b, ": rank %d", e.Rank)
	}
	if e.Op != "" {
		fmt.Fprintf(&b, " in %s seq %d", e.Op, e.Seq)
	}
	if e.Group != "" {
		fmt.Fprintf(&b, " of group %s", e.Group)
	}
	if e.Reporter >= 0 {
		fmt.Fprintf(&b, " (seen by rank %d)", e.Reporter)
	}
	if e.Want != "" || e.Got != "" {
		fmt.Fprintf(&b, ": expected %s", e.Want)
		if e.Reporter >= 0 {
			fmt.Fprintf(&b, " (rank %d)", e.Reporter)
		}
		fmt.Fprintf(&b, ", got %s", e.Got)
		if e.Rank >= 0 {
			fmt.Fprintf(&b, " (rank %d)", e.Rank)
		}
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Kind }

// CulpritRank is the rank e blames, -1 if unknown: *Error is a protocol.Blamer,
// so protocol.Culprit reads it without importing this package.
func (e *Error) CulpritRank() int { return e.Rank }

var _ protocol.Blamer = (*Error)(nil)

// Culprit returns the rank an error names, or -1 (protocol.Culprit).
func Culprit(err error) int { return protocol.Culprit(err) }

func newErr(kind error, culprit int, detail string) *Error {
	return &Error{Kind: kind, Rank: culprit, Reporter: -1, Detail: detail}
}
