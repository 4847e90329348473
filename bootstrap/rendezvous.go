package bootstrap

// Coordination over NATS.
//
// Subjects of job J (all under "meshrun.J.", the only subjects the job's NATS
// user may use; package protocol names each one and defines the messages):
//
//	meshrun.J.rdv            rendezvous: every rank publishes its Announce; rank 0
//	                         collects them
//	meshrun.J.rdv.open       rank 0 is listening: a rank that announced earlier
//	                         announces again (later, every second: those ranks
//	                         still missing, as a bitmap)
//	meshrun.J.rdv.roster     the Roster (or the error), once, in chunks, from rank 0
//	meshrun.J.ctl.hb.<rank>  heartbeats: State as JSON, every HeartbeatInterval; the
//	                         last one has closed=true (and the failure, if any);
//	                         read by the launcher and by one rank (see natsControl)
//	meshrun.J.ctl.state.<rank> the rank's State on request
//	meshrun.J.ctl.fail       failure notices: Notice as JSON, from the rank that
//	                         detected a failure; every rank fails at once
//	meshrun.J.ctl.abort      abort: Notice as JSON (protocol.AbortNotice), e.g. from
//	                         the launcher; every rank's pending call fails with ErrAborted
//	meshrun.J.data.<dst>.<src>, meshrun.J.credit.<src>.<dst>, meshrun.J.dping.<rank>
//	                         the nats data path (transport "nats"), its window and
//	                         its readiness check
//
// The notices and the watched heartbeats are read through one channel so that
// a rank's notice and its later heartbeats arrive in the order it sent them.
//
// Why core pub/sub and not JetStream KV: the rendezvous is a one-shot
// barrier that needs a single authority to decide "complete", "missing ranks" and
// "duplicate rank" consistently; rank 0 collecting the announces gives exactly
// that, with no state on the server, no stream to create, clean up or secure per
// job, and it works on any NATS deployment (JetStream is off by default and
// often disabled on shared clusters). KV's persistence is a liability here: a
// stale roster from a previous attempt of the same job must never be read.
// Liveness and failures are transient facts, which core pub/sub carries at
// lowest latency; at-most-once delivery is acceptable because every consumer
// treats silence as failure (heartbeat timeout) and a disconnect fails the
// World rather than being retried.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// rendezvous runs the job's rendezvous over nc in O(N) messages, with no
// round trip per rank: every rank subscribes to the roster and publishes its
// Announce once on RendezvousSubject; rank 0 collects them and publishes the
// Roster once on RosterSubject (in chunks within the server's max_payload),
// which the server fans out to every rank. A rank that announced before rank 0
// was listening announces again when rank 0 says it is (RendezvousOpenSubject,
// published once rank 0's subscription is in place, then every second naming
// the ranks still missing: in a NATS cluster a rank's announce and the first
// "open" can both be dropped, each reaching a server before the interest of
// the other side has). Rank 0 answers with the error instead (missing ranks,
// duplicate rank) when the roster cannot complete before ctx ends.
func rendezvous(ctx context.Context, nc *nats.Conn, job string, me collective.Announce) (*collective.Roster, error) {
	if me.Rank == 0 {
		return coordinate(ctx, nc, job, me)
	}
	subj := protocol.RendezvousSubject(job)
	body, _ := json.Marshal(me)
	ch := make(chan *nats.Msg, 64)
	fail := func(rank int, detail string) (*collective.Roster, error) {
		return nil, &collective.Error{Kind: collective.ErrRendezvous, Rank: rank, Reporter: me.Rank, Detail: detail}
	}
	for _, sj := range []string{protocol.RosterSubject(job), protocol.RendezvousOpenSubject(job)} {
		sub, err := nc.ChanSubscribe(sj, ch)
		if err != nil {
			return fail(-1, err.Error())
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Publish(subj, body); err != nil {
		return fail(-1, err.Error())
	}
	if err := nc.Flush(); err != nil {
		return fail(-1, err.Error())
	}
	var parts rosterParts
	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				// Is anyone listening on the rendezvous subject? (rank 0 is)
				_, err := nc.Request(subj, body, 200*time.Millisecond)
				if errors.Is(err, nats.ErrNoResponders) {
					return fail(0, "rank 0 (the rendezvous coordinator) never joined")
				}
			}
			return fail(-1, "no roster from rank 0 before the deadline: "+ctx.Err().Error())
		case m := <-ch:
			if m.Subject == protocol.RendezvousOpenSubject(job) {
				if openNames(m.Data, me.Rank, me.Size) {
					nc.Publish(subj, body)
				}
				continue
			}
			data, ok := parts.add(m.Data)
			if !ok {
				continue
			}
			r, err := DecodeRoster(data)
			if err != nil {
				return fail(0, "bad roster: "+err.Error())
			}
			if r.Error != "" {
				return fail(-1, r.Error)
			}
			if len(r.Ranks) != me.Size || r.Ranks[me.Rank].Nonce != me.Nonce {
				return fail(-1, "roster does not hold this rank")
			}
			return &r, nil
		}
	}
}

// A roster travels in chunks, each "<id> <index> <count>\n" then its bytes;
// id is rank 0's nonce, so chunks of different coordinators never mix.
const rosterHeaderMax = 64

func rosterChunks(id string, data []byte, maxPayload int) [][]byte {
	size := max(maxPayload-rosterHeaderMax, 1024)
	n := max((len(data)+size-1)/size, 1)
	out := make([][]byte, 0, n)
	for k := 0; k < n; k++ {
		part := data[min(k*size, len(data)):min((k+1)*size, len(data))]
		out = append(out, append([]byte(fmt.Sprintf("%s %d %d\n", id, k, n)), part...))
	}
	return out
}

// rosterParts reassembles a roster from its chunks.
type rosterParts struct {
	id    string
	parts [][]byte
	got   int
}

// add takes one chunk; it returns the whole roster once every chunk of one
// coordinator has arrived.
func (p *rosterParts) add(msg []byte) ([]byte, bool) {
	cut := bytes.IndexByte(msg[:min(len(msg), rosterHeaderMax)], '\n')
	if cut < 0 {
		return nil, false
	}
	body := msg[cut+1:]
	var id string
	var k, n int
	if _, err := fmt.Sscanf(string(msg[:cut]), "%s %d %d", &id, &k, &n); err != nil || n < 1 || n > 1<<16 || k < 0 || k >= n {
		return nil, false
	}
	if n == 1 {
		return body, true
	}
	if id != p.id || len(p.parts) != n {
		p.id, p.parts, p.got = id, make([][]byte, n), 0
	}
	if p.parts[k] == nil {
		p.parts[k] = body
		p.got++
	}
	if p.got < n {
		return nil, false
	}
	return bytes.Join(p.parts, nil), true
}

// openNames reports whether an "open" of rank 0 asks rank to announce
// again: the first (empty) asks every rank, a later one is a bitmap of the
// ranks missing (bit r%8 of byte r/8).
func openNames(data []byte, rank, size int) bool {
	if len(data) != (size+7)/8 {
		return true
	}
	return data[rank/8]&(1<<(rank%8)) != 0
}

// reopenEvery is how often rank 0 names the ranks it still misses.
const reopenEvery = time.Second

func coordinate(ctx context.Context, nc *nats.Conn, job string, me collective.Announce) (*collective.Roster, error) {
	ch := make(chan *nats.Msg, 4*me.Size+16)
	sub, err := nc.ChanSubscribe(protocol.RendezvousSubject(job), ch)
	if err == nil {
		err = nc.Flush()
	}
	if err == nil {
		err = nc.Publish(protocol.RendezvousOpenSubject(job), nil)
	}
	if err != nil {
		return nil, &collective.Error{Kind: collective.ErrRendezvous, Rank: -1, Reporter: 0, Detail: err.Error()}
	}
	defer sub.Unsubscribe()
	got := map[int]collective.Announce{0: me}
	var problem string
	answer := func(r collective.Roster) {
		data := encodeRoster(r)
		for _, c := range rosterChunks(me.Nonce, data, int(nc.MaxPayload())) {
			nc.Publish(protocol.RosterSubject(job), c)
		}
		nc.Flush()
	}
	reopen := time.NewTicker(reopenEvery)
	defer reopen.Stop()
	for len(got) < me.Size && problem == "" {
		select {
		case <-reopen.C:
			missing := make([]byte, (me.Size+7)/8)
			for r := 0; r < me.Size; r++ {
				if _, ok := got[r]; !ok {
					missing[r/8] |= 1 << (r % 8)
				}
			}
			nc.Publish(protocol.RendezvousOpenSubject(job), missing)
		case m := <-ch:
			var a collective.Announce
			if err := json.Unmarshal(m.Data, &a); err != nil || a.Rank < 0 || a.Rank >= me.Size || a.Size != me.Size {
				problem = fmt.Sprintf("bad announce %q (world size %d)", m.Data, me.Size)
				break
			}
			if old, ok := got[a.Rank]; ok && old.Nonce != a.Nonce {
				problem = fmt.Sprintf("duplicate rank %d: pid %d on %s and pid %d on %s", a.Rank, old.PID, old.Host, a.PID, a.Host)
				break
			}
			got[a.Rank] = a
		case <-ctx.Done():
			var missing []int
			for r := 0; r < me.Size; r++ {
				if _, ok := got[r]; !ok {
					missing = append(missing, r)
				}
			}
			problem = fmt.Sprintf("missing ranks %v (%d of %d joined)", missing, len(got), me.Size)
			answer(collective.Roster{Error: problem})
			return nil, &collective.Error{Kind: collective.ErrRendezvous, Rank: missing[0], Reporter: 0, Detail: problem}
		}
	}
	if problem != "" {
		answer(collective.Roster{Error: problem})
		return nil, &collective.Error{Kind: collective.ErrRendezvous, Rank: -1, Reporter: 0, Detail: problem}
	}
	r := collective.Roster{Ranks: make([]collective.Announce, me.Size), Secret: make([]byte, 32)}
	rand.Read(r.Secret)
	for k, a := range got {
		r.Ranks[k] = a
	}
	answer(r)
	return &r, nil
}
