package collective

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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Announce is what a rank tells the rendezvous about itself.
type Announce struct {
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	Host  string `json:"host"`
	Boot  string `json:"boot,omitempty"` // kernel boot id: same host iff equal
	PID   int    `json:"pid"`
	Nonce string `json:"nonce"`
	Addr  string `json:"addr,omitempty"` // tcp data listener
	// Shm is a random hex token of the shared-memory rings this rank
	// creates: mixed into their names with the job's secret (see shmNames)
	// and written in their header, where a peer checks it before it maps
	// one. Only the job's ranks learn it, from the roster.
	Shm string `json:"shm,omitempty"`
}

// Roster is the rendezvous' answer: every rank's Announce by rank, and the
// job's secret for data connections.
type Roster struct {
	Ranks  []Announce `json:"ranks,omitempty"`
	Secret []byte     `json:"secret,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// SameHost reports whether every rank runs on one machine.
func (r *Roster) SameHost() bool {
	for _, a := range r.Ranks {
		if a.Host != r.Ranks[0].Host || a.Boot != r.Ranks[0].Boot {
			return false
		}
	}
	return true
}

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
func rendezvous(ctx context.Context, nc *nats.Conn, job string, me Announce) (*Roster, error) {
	if me.Rank == 0 {
		return coordinate(ctx, nc, job, me)
	}
	subj := protocol.RendezvousSubject(job)
	body, _ := json.Marshal(me)
	ch := make(chan *nats.Msg, 64)
	fail := func(rank int, detail string) (*Roster, error) {
		return nil, &Error{Kind: ErrRendezvous, Rank: rank, Reporter: me.Rank, Detail: detail}
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
			r, err := decodeRoster(data)
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

func coordinate(ctx context.Context, nc *nats.Conn, job string, me Announce) (*Roster, error) {
	ch := make(chan *nats.Msg, 4*me.Size+16)
	sub, err := nc.ChanSubscribe(protocol.RendezvousSubject(job), ch)
	if err == nil {
		err = nc.Flush()
	}
	if err == nil {
		err = nc.Publish(protocol.RendezvousOpenSubject(job), nil)
	}
	if err != nil {
		return nil, &Error{Kind: ErrRendezvous, Rank: -1, Reporter: 0, Detail: err.Error()}
	}
	defer sub.Unsubscribe()
	got := map[int]Announce{0: me}
	var problem string
	answer := func(r Roster) {
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
			var a Announce
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
			answer(Roster{Error: problem})
			return nil, &Error{Kind: ErrRendezvous, Rank: missing[0], Reporter: 0, Detail: problem}
		}
	}
	if problem != "" {
		answer(Roster{Error: problem})
		return nil, &Error{Kind: ErrRendezvous, Rank: -1, Reporter: 0, Detail: problem}
	}
	r := Roster{Ranks: make([]Announce, me.Size), Secret: make([]byte, 32)}
	rand.Read(r.Secret)
	for k, a := range got {
		r.Ranks[k] = a
	}
	answer(r)
	return &r, nil
}

// natsControl is the Control of a real job.
//
// Liveness in O(N) messages: every rank publishes its heartbeat on its own
// subject as before (the launcher reads them all), but reads the heartbeats of
// one peer only, its predecessor (rank-1 mod N): N deliveries per interval in
// all, not N². The job fails at its first failure, so one live watcher per
// rank is enough: a rank silent for the timeout is declared lost by its
// watcher, which publishes the notice every rank reads. A rank that closes its
// World names in its last heartbeat (State.Watch) the ranks it was watching,
// and its watcher takes them over, after asking each for its state
// (StateSubject): one that no longer answers has closed too, and its
// predecessor is taken over in turn. The state of a rank that is not watched
// (PeerState, to blame a timeout) is asked for on demand. A watcher that
// finds its rank silent first checks its own link (a round trip to the
// server): when that fails too, this rank has lost the control plane
// (ErrControlLost) and blames no one. A watched rank not heard from yet may
// still be reading its roster, whatever else it is sent waiting behind it:
// it is asked for its state first, and it is lost only when nothing answers
// on its state subject any more, or when it has stayed silent past the
// rendezvous timeout as well.
type natsControl struct {
	nc       *nats.Conn
	job      string
	rank     int
	size     int
	interval time.Duration
	timeout  time.Duration
	// joinGrace: how much longer than timeout a watched rank never heard
	// may stay silent while its state subject is there (see loop)
	joinGrace time.Duration
	log       *zap.Logger
	// ch carries the notices and the watched heartbeats, through one channel
	// so that a rank's notice and its later heartbeats arrive in the order it
	// sent them.
	ch chan *nats.Msg

	mu      sync.Mutex
	state   func() State
	notice  func(Notice)
	peers   map[int]State     // of the watched ranks and those seen closed
	seen    map[int]time.Time // when each watched rank was last heard
	heard   map[int]bool      // watched ranks whose heartbeats have come
	watch   map[int]*nats.Subscription
	pending []Notice
	subs    []*nats.Subscription
	quit    chan struct{}
	// done ends with quit: the requests and round trips the watcher and
	// the handoff make end with it, so that Close (which waits for them)
	// never waits for an answer that may not come.
	done    context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	started time.Time
	lost    bool
}

func newNatsControl(nc *nats.Conn, job string, rank, size int, interval, timeout, joinGrace time.Duration, log *zap.Logger) (*natsControl, error) {
	c := &natsControl{nc: nc, job: job, rank: rank, size: size, interval: interval, timeout: timeout, joinGrace: joinGrace, log: log,
		ch: make(chan *nats.Msg, 1024), peers: map[int]State{}, seen: map[int]time.Time{}, heard: map[int]bool{},
		watch: map[int]*nats.Subscription{}, quit: make(chan struct{}), started: time.Now()}
	c.done, c.stop = context.WithCancel(context.Background())
	sub, err := nc.ChanSubscribe(protocol.NoticeSubjects(job), c.ch)
	if err != nil {
		return nil, err
	}
	c.subs = append(c.subs, sub)
	sub, err = nc.Subscribe(protocol.StateSubject(job, rank), c.answerState)
	if err != nil {
		return nil, err
	}
	c.subs = append(c.subs, sub)
	if size > 1 {
		c.mu.Lock()
		err = c.watchLocked((rank + size - 1) % size)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	c.wg.Add(1)
	go c.dispatch()
	return c, nc.Flush()
}

// watchLocked starts reading rank's heartbeats; its silence counts from now.
func (c *natsControl) watchLocked(rank int) error {
	if _, ok := c.watch[rank]; ok || rank == c.rank {
		return nil
	}
	sub, err := c.nc.ChanSubscribe(protocol.HeartbeatSubject(c.job, rank), c.ch)
	if err != nil {
		return err
	}
	c.watch[rank] = sub
	c.seen[rank] = time.Now()
	return nil
}

func (c *natsControl) answerState(m *nats.Msg) {
	c.mu.Lock()
	st := c.state
	c.mu.Unlock()
	s := State{Rank: c.rank, Time: time.Now()}
	if st != nil {
		s = st()
	}
	data, _ := json.Marshal(s)
	m.Respond(data)
}

func (c *natsControl) dispatch() {
	defer c.wg.Done()
	for {
		select {
		case <-c.quit:
			return
		case m := <-c.ch:
			c.handle(m)
		}
	}
}

func (c *natsControl) handle(m *nats.Msg) {
	if n, ok := protocol.ParseNotice(c.job, m.Subject, m.Data); ok {
		c.deliver(n)
		return
	}
	s, ok := protocol.ParseHeartbeat(c.job, m.Subject, m.Data)
	if !ok || s.Rank < 0 || s.Rank >= c.size {
		return
	}
	c.mu.Lock()
	if _, watched := c.watch[s.Rank]; !watched {
		c.mu.Unlock()
		return
	}
	c.peers[s.Rank] = s
	c.seen[s.Rank] = time.Now()
	c.heard[s.Rank] = true
	c.mu.Unlock()
	if s.Closed && s.Rank != c.rank {
		if s.Failure != nil {
			c.deliver(*s.Failure)
		} else {
			c.deliver(Notice{Code: protocol.CodePeerClosed, Rank: s.Rank, Reporter: c.rank})
		}
		c.handoff(s.Rank, s.Watch)
	}
}

// handoff: watched rank closed, having watched ranks: take them over (its
// predecessor when it names none), each after asking it for its state; one
// that does not answer has closed as well, and its predecessor is next.
func (c *natsControl) handoff(closed int, ranks []int) {
	c.mu.Lock()
	if sub, ok := c.watch[closed]; ok {
		sub.Unsubscribe()
		delete(c.watch, closed)
	}
	c.mu.Unlock()
	if len(ranks) == 0 {
		ranks = []int{(closed + c.size - 1) % c.size}
	}
	for steps := 0; len(ranks) > 0 && steps < c.size; steps++ {
		q := ranks[0]
		ranks = ranks[1:]
		if q < 0 || q >= c.size || q == c.rank {
			continue
		}
		c.mu.Lock()
		_, watched := c.watch[q]
		done := watched || c.peers[q].Closed
		if !done {
			c.watchLocked(q)
		}
		c.mu.Unlock()
		if done {
			continue
		}
		msg, err := c.request(protocol.StateSubject(c.job, q), c.askTimeout())
		if c.done.Err() != nil {
			return // closing
		}
		if errors.Is(err, nats.ErrNoResponders) {
			c.mu.Lock()
			p := c.peers[q]
			p.Closed = true
			c.peers[q] = p
			delete(c.seen, q)
			if sub, ok := c.watch[q]; ok {
				sub.Unsubscribe()
				delete(c.watch, q)
			}
			c.mu.Unlock()
			ranks = append(ranks, (q+c.size-1)%c.size)
			continue
		}
		var s State
		if err == nil && json.Unmarshal(msg.Data, &s) == nil {
			c.mu.Lock()
			if !c.peers[q].Closed {
				c.peers[q], c.seen[q] = s, time.Now()
			}
			c.mu.Unlock()
		}
	}
}

// askTimeout bounds a state request: two heartbeat intervals, at most 1 s.
func (c *natsControl) askTimeout() time.Duration {
	return min(2*c.interval, time.Second)
}

// request sends a request on subj and waits for its answer at most d, or
// until Close begins. A Close used to wait for a state request of the
// handoff in flight: when the rank asked was on its way out (its
// subscription still there, its process exiting), the request went
// unanswered, and the last survivor of a torn-down job exited 1.0 s (the
// timeout) after the others.
func (c *natsControl) request(subj string, d time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(c.done, d)
	defer cancel()
	return c.nc.RequestWithContext(ctx, subj, nil)
}

// flush is a round trip to the server, at most d, or until Close begins.
func (c *natsControl) flush(d time.Duration) error {
	ctx, cancel := context.WithTimeout(c.done, d)
	defer cancel()
	return c.nc.FlushWithContext(ctx)
}

func (c *natsControl) deliver(n Notice) {
	c.mu.Lock()
	fn := c.notice
	if fn == nil {
		c.pending = append(c.pending, n)
	}
	c.mu.Unlock()
	if fn != nil {
		fn(n)
	}
}

func (c *natsControl) Publish(n Notice) error {
	data, _ := json.Marshal(n)
	subj := protocol.FailSubject(c.job)
	if n.Abort {
		subj = protocol.AbortSubject(c.job)
	}
	if err := c.nc.Publish(subj, data); err != nil {
		return err
	}
	return c.nc.FlushTimeout(time.Second)
}

// Attach starts the heartbeats and the liveness monitor.
func (c *natsControl) Attach(state func() State, notice func(Notice)) {
	c.mu.Lock()
	c.state, c.notice = state, notice
	pending := c.pending
	c.pending = nil
	c.started = time.Now()
	for r := range c.watch {
		if c.seen[r].Before(c.started) {
			c.seen[r] = c.started
		}
	}
	c.mu.Unlock()
	for _, n := range pending {
		notice(n)
	}
	c.wg.Add(1)
	go c.loop()
}

func (c *natsControl) beat(closing bool) {
	s := c.state()
	s.Closed = closing
	if closing {
		c.mu.Lock()
		for r := range c.watch {
			if !c.peers[r].Closed {
				s.Watch = append(s.Watch, r)
			}
		}
		c.mu.Unlock()
		slices.Sort(s.Watch)
	}
	data, _ := json.Marshal(s)
	c.nc.Publish(protocol.HeartbeatSubject(c.job, c.rank), data)
}

func (c *natsControl) loop() {
	defer c.wg.Done()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	c.beat(false)
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		}
		c.beat(false)
		now := time.Now()
		c.mu.Lock()
		lost, last := -1, time.Time{}
		for r := range c.watch {
			if r == c.rank || c.peers[r].Closed {
				continue
			}
			if seen := c.seen[r]; now.Sub(seen) > c.timeout {
				lost, last = r, seen
				break
			}
		}
		fn := c.notice
		joining := false
		if lost >= 0 {
			if c.lost {
				lost = -1
			}
			c.lost = true
			joining = !c.heard[lost]
		}
		c.mu.Unlock()
		if lost >= 0 && fn != nil {
			at := c.askTimeout()
			// A rank never heard since this one started watching may still
			// be joining: ranks attach as their copies of the roster arrive,
			// which at thousands of ranks spans more than the timeout (the
			// server sends N copies; whatever else a rank is sent waits
			// behind its own). Its state subject is there from before the
			// rendezvous: one that answers is not lost (its silence counts
			// again from now); one with nothing there has gone; one that does
			// not answer may still be reading its roster, up to the
			// rendezvous timeout.
			if joining {
				msg, err := c.request(protocol.StateSubject(c.job, lost), at)
				if c.done.Err() != nil {
					return // closing
				}
				if err == nil || !errors.Is(err, nats.ErrNoResponders) && time.Since(last) < c.timeout+c.joinGrace {
					c.mu.Lock()
					if _, ok := c.watch[lost]; ok && !c.peers[lost].Closed && err == nil {
						var s State
						if json.Unmarshal(msg.Data, &s) == nil && s.Rank == lost {
							c.peers[lost] = s
						}
						c.seen[lost] = time.Now()
					}
					c.lost = false
					c.mu.Unlock()
					continue
				}
			}
			// The silence may be this rank's own link to the server (a hung
			// server, a path that drops everything): one round trip tells,
			// and then the rank it watches is not blamed.
			if err := c.flush(at); err != nil {
				if c.done.Err() != nil {
					return // closing
				}
				fn(Notice{Code: protocol.CodeControlLost, Rank: -1, Reporter: c.rank, Detail: fmt.Sprintf("the NATS server at %s did not answer within %v (%v); rank %d, silent for %v, is not blamed",
					c.nc.ConnectedUrlRedacted(), at, err, lost, now.Sub(last).Round(time.Millisecond))})
				continue
			}
			detail := fmt.Sprintf("no heartbeat for %v (stopped, hung or dead)", time.Since(last).Round(time.Millisecond))
			if joining {
				detail = fmt.Sprintf("no heartbeat in the %v since this rank started watching it, and nothing on its state subject (gone while joining)", time.Since(last).Round(time.Millisecond))
			}
			fn(Notice{Code: protocol.CodePeerLost, Rank: lost, Reporter: c.rank, Detail: detail})
			// Tell the others: only this rank watches it.
			e := noticeErr(Notice{Code: protocol.CodePeerLost, Rank: lost, Reporter: c.rank})
			e.Detail = detail
			c.Publish(noticeOf(e))
		}
	}
}

// PeerState returns the last heartbeat of a watched rank; any other rank is
// asked for its state (at most askTimeout).
func (c *natsControl) PeerState(rank int) (State, time.Time, bool) {
	c.mu.Lock()
	_, watched := c.watch[rank]
	st, at := c.peers[rank], c.seen[rank]
	c.mu.Unlock()
	if watched && !st.Time.IsZero() || rank == c.rank {
		return st, at, !at.IsZero()
	}
	msg, err := c.request(protocol.StateSubject(c.job, rank), c.askTimeout())
	if err != nil {
		return st, at, !at.IsZero() && !st.Time.IsZero()
	}
	var s State
	if json.Unmarshal(msg.Data, &s) != nil {
		return st, at, false
	}
	return s, time.Now(), true
}

// Offer answers requests on name's exchange subject with value (the NATS
// connection's own goroutine replies; nothing is stored on the server).
func (c *natsControl) Offer(name string, value []byte) error {
	value = slices.Clone(value)
	sub, err := c.nc.Subscribe(protocol.ExchangeSubject(c.job, name), func(m *nats.Msg) { m.Respond(value) })
	if err != nil {
		return fmt.Errorf("offering %q: %w", name, err)
	}
	c.mu.Lock()
	c.subs = append(c.subs, sub)
	c.mu.Unlock()
	return c.nc.Flush()
}

// Ask requests name's value until a rank that offered it answers (before the
// offer there are no responders: it asks again, every 20 ms at first, at
// most every 200 ms).
func (c *natsControl) Ask(ctx context.Context, name string) ([]byte, error) {
	subj := protocol.ExchangeSubject(c.job, name)
	pause := 20 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, c.askTimeout())
		m, err := c.nc.RequestWithContext(rctx, subj, nil)
		cancel()
		if err == nil {
			return m.Data, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("asking for %q: %w", name, context.Cause(ctx))
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("asking for %q: %w", name, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("asking for %q: %w", name, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

func (c *natsControl) Close() error {
	select {
	case <-c.quit:
		return nil
	default:
	}
	close(c.quit)
	c.stop()
	c.wg.Wait()
	if c.state != nil && c.nc.IsConnected() {
		c.beat(true)
		c.nc.FlushTimeout(time.Second)
	}
	c.mu.Lock()
	for _, s := range c.watch {
		s.Unsubscribe()
	}
	c.mu.Unlock()
	for _, s := range c.subs {
		s.Unsubscribe()
	}
	return nil
}
