package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

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
	state   func() collective.State
	notice  func(collective.Notice)
	peers   map[int]collective.State // of the watched ranks and those seen closed
	seen    map[int]time.Time        // when each watched rank was last heard
	heard   map[int]bool             // watched ranks whose heartbeats have come
	watch   map[int]*nats.Subscription
	pending []collective.Notice
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
		ch: make(chan *nats.Msg, 1024), peers: map[int]collective.State{}, seen: map[int]time.Time{}, heard: map[int]bool{},
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
	s := collective.State{Rank: c.rank, Time: time.Now()}
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
			c.deliver(collective.Notice{Code: protocol.CodePeerClosed, Rank: s.Rank, Reporter: c.rank})
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
		var s collective.State
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

func (c *natsControl) deliver(n collective.Notice) {
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

func (c *natsControl) Publish(n collective.Notice) error {
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
func (c *natsControl) Attach(state func() collective.State, notice func(collective.Notice)) {
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
						var s collective.State
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
				fn(collective.Notice{Code: protocol.CodeControlLost, Rank: -1, Reporter: c.rank, Detail: fmt.Sprintf("the NATS server at %s did not answer within %v (%v); rank %d, silent for %v, is not blamed",
					c.nc.ConnectedUrlRedacted(), at, err, lost, now.Sub(last).Round(time.Millisecond))})
				continue
			}
			detail := fmt.Sprintf("no heartbeat for %v (stopped, hung or dead)", time.Since(last).Round(time.Millisecond))
			if joining {
				detail = fmt.Sprintf("no heartbeat in the %v since this rank started watching it, and nothing on its state subject (gone while joining)", time.Since(last).Round(time.Millisecond))
			}
			fn(collective.Notice{Code: protocol.CodePeerLost, Rank: lost, Reporter: c.rank, Detail: detail})
			// Tell the others: only this rank watches it.
			c.Publish(collective.Notice{Code: protocol.CodePeerLost, Rank: lost, Reporter: c.rank, Detail: detail, Decided: true})
		}
	}
}

// PeerState returns the last heartbeat of a watched rank; any other rank is
// asked for its state (at most askTimeout).
func (c *natsControl) PeerState(rank int) (collective.State, time.Time, bool) {
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
	var s collective.State
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
