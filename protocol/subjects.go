// Package protocol is meshrun's control plane as seen from outside a rank: the
// NATS subjects of a job, the heartbeat State and failure Notice the ranks
// publish on them, the notice codes, the hang diagnosis read from heartbeats
// (Hangs) and the culprit an error names (Culprit). The launcher and runlog need
// only this package, never collective; collective speaks the same protocol.
//
// It depends on the standard library alone: no NATS client, no server.
//
// Subjects of job J, all under "meshrun.J." (JobSubjects: the only subjects the
// job's NATS user may use). Build every one with the functions below, never by
// hand:
//
//	meshrun.J.rdv                 RendezvousSubject: each rank's announce, to rank 0
//	meshrun.J.rdv.open            RendezvousOpenSubject: rank 0 listens (announce again)
//	meshrun.J.rdv.roster          RosterSubject: the roster, from rank 0 to every rank
//	meshrun.J.ctl.hb.<rank>       HeartbeatSubject: State as JSON, periodically; the last
//	                              one has closed=true (and the failure, if any)
//	meshrun.J.ctl.state.<rank>    StateSubject: a request answered by rank with its
//	                              State as JSON (read on demand, e.g. to blame a timeout)
//	meshrun.J.ctl.fail            FailSubject: Notice as JSON, from the rank that
//	                              detected a failure
//	meshrun.J.ctl.abort           AbortSubject: Notice as JSON (AbortNotice); anything on
//	                              it aborts the whole job
//	meshrun.J.launcher            LauncherSubject: launcher to launcher (several nodes)
//	meshrun.J.launcher.master     MasterSubject: an attempt's MASTER_ADDR/PORT, from node 0
//	meshrun.J.launcher.attempt    AttemptSubject: a node's ranks of an attempt all exited
//	meshrun.J.data.<dst>.<src>    DataSubject: the nats data path (transport "nats")
//	meshrun.J.credit.<src>.<dst>  CreditSubject: its credit window, back to the sender
//	meshrun.J.dping.<rank>        DataPingSubject: answered once a rank's data
//	                              subscriptions are in place
package protocol

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// prefix is "meshrun.<job>.", the root of every subject of job.
func prefix(job string) string { return "meshrun." + job + "." }

// JobSubjects matches every subject of job: "meshrun.<job>.>".
func JobSubjects(job string) string { return prefix(job) + ">" }

// RendezvousSubject carries the rendezvous: "meshrun.<job>.rdv".
func RendezvousSubject(job string) string { return prefix(job) + "rdv" }

// RendezvousOpenSubject carries rank 0's word that it listens on
// RendezvousSubject: "meshrun.<job>.rdv.open".
func RendezvousOpenSubject(job string) string { return prefix(job) + "rdv.open" }

// RosterSubject carries the rendezvous' roster, from rank 0 to every rank:
// "meshrun.<job>.rdv.roster".
func RosterSubject(job string) string { return prefix(job) + "rdv.roster" }

// HeartbeatSubject carries rank's heartbeats: "meshrun.<job>.ctl.hb.<rank>".
func HeartbeatSubject(job string, rank int) string {
	return prefix(job) + "ctl.hb." + strconv.Itoa(rank)
}

// HeartbeatSubjects matches the heartbeats of every rank: "meshrun.<job>.ctl.hb.*".
func HeartbeatSubjects(job string) string { return prefix(job) + "ctl.hb.*" }

// StateSubject is answered by rank with its State as JSON:
// "meshrun.<job>.ctl.state.<rank>". A rank reads the heartbeats of one peer
// only (see package collective); the state of any other is asked for here.
func StateSubject(job string, rank int) string {
	return prefix(job) + "ctl.state." + strconv.Itoa(rank)
}

// ExchangeSubject is where a rank that offers a value under name (Control's
// Offer: an NCCL unique id, a bootstrap address) answers the job's ranks that
// ask for it. name is hashed: any string names one subject token.
func ExchangeSubject(job, name string) string {
	h := fnv.New64a()
	h.Write([]byte(name))
	return prefix(job) + "ctl.x." + strconv.FormatUint(h.Sum64(), 16)
}

// FailSubject carries failure notices: "meshrun.<job>.ctl.fail".
func FailSubject(job string) string { return prefix(job) + "ctl.fail" }

// AbortSubject carries aborts of the whole job: "meshrun.<job>.ctl.abort".
func AbortSubject(job string) string { return prefix(job) + "ctl.abort" }

// NoticeSubjects matches FailSubject and AbortSubject and nothing else (a
// heartbeat subject has one token more): "meshrun.<job>.ctl.*".
func NoticeSubjects(job string) string { return prefix(job) + "ctl.*" }

// ControlSubjects matches the notices and every heartbeat:
// "meshrun.<job>.ctl.>". A rank reads them through this one subscription so
// that a peer's notice and its later heartbeats arrive in the order it sent
// them.
func ControlSubjects(job string) string { return prefix(job) + "ctl.>" }

// LauncherSubject carries messages between the launchers of a job (one per
// node): "meshrun.<job>.launcher".
func LauncherSubject(job string) string { return prefix(job) + "launcher" }

// MasterSubject carries the other launchers' requests for an attempt's
// MASTER_ADDR and MASTER_PORT, which node 0's launcher answers:
// "meshrun.<job>.launcher.master".
func MasterSubject(job string) string { return prefix(job) + "launcher.master" }

// JoiningSubject carries a rank's word that it started joining the job
// (before its rendezvous), for the launcher: "meshrun.<job>.join.<rank>".
func JoiningSubject(job string, rank int) string { return prefix(job) + "join." + strconv.Itoa(rank) }

// JoiningSubjects matches every rank's JoiningSubject.
func JoiningSubjects(job string) string { return prefix(job) + "join.*" }

// ParseJoiningSubject is the rank of a JoiningSubject of job.
func ParseJoiningSubject(job, subject string) (int, bool) {
	r, err := strconv.Atoi(strings.TrimPrefix(subject, prefix(job)+"join."))
	if err != nil || !strings.HasPrefix(subject, prefix(job)+"join.") || r < 0 {
		return 0, false
	}
	return r, true
}

// PresenceSubject carries each launcher's hello as it joins a job (node,
// host, pid), which the job's other launchers answer with theirs: a second
// launcher for a node already running, or one whose --nnodes or
// --nproc-per-node differ, is refused before it starts a rank:
// "meshrun.<job>.launcher.hello".
func PresenceSubject(job string) string { return prefix(job) + "launcher.hello" }

// AttemptSubject carries each launcher's word that its ranks of an attempt
// have all exited, before a restart: "meshrun.<job>.launcher.attempt".
func AttemptSubject(job string) string { return prefix(job) + "launcher.attempt" }

// DataSubject carries the nats transport's messages from rank src to rank dst:
// "meshrun.<job>.data.<dst>.<src>".
func DataSubject(job string, dst, src int) string {
	return prefix(job) + "data." + strconv.Itoa(dst) + "." + strconv.Itoa(src)
}

// CreditSubject carries the credits rank dst returns to rank src, the sender of
// the data it consumed: "meshrun.<job>.credit.<src>.<dst>".
func CreditSubject(job string, src, dst int) string {
	return prefix(job) + "credit." + strconv.Itoa(src) + "." + strconv.Itoa(dst)
}

// CreditSubjects matches every credit returned to rank src:
// "meshrun.<job>.credit.<src>.*".
func CreditSubjects(job string, src int) string {
	return prefix(job) + "credit." + strconv.Itoa(src) + ".*"
}

// ParseCreditSubject returns the rank dst of CreditSubject(job, src, dst); ok
// is false when subject is no such subject.
func ParseCreditSubject(job string, src int, subject string) (dst int, ok bool) {
	rest, found := strings.CutPrefix(subject, prefix(job)+"credit."+strconv.Itoa(src)+".")
	if !found {
		return 0, false
	}
	dst, err := strconv.Atoi(rest)
	return dst, err == nil
}

// DataPingSubject is answered by rank once its data subscriptions are in place:
// "meshrun.<job>.dping.<rank>".
func DataPingSubject(job string, rank int) string {
	return prefix(job) + "dping." + strconv.Itoa(rank)
}
