package launch

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/protocol"
)

// The launcher's own NATS connection carries, on the job's subjects (package
// protocol names them; the launcher never imports collective):
//
//	meshrun.J.ctl.abort  the abort it broadcasts on the first failure (protocol.AbortNotice)
//	meshrun.J.ctl.fail   the ranks' failure notices, read to learn whom a collective blamed
//	meshrun.J.ctl.hb.*   the ranks' heartbeats, read for --hang-after
//	meshrun.J.launcher   launcher to launcher (several nodes): a rank's failure with its
//	                     ms time, so that every node names the same first failure;
//	                     a launcher that cannot start
//	meshrun.J.launcher.hello, .master, .attempt
//	                     presence (presence.go), MASTER_ADDR/PORT and restarts (attempts.go)

// nodeMsg is what a launcher tells the other launchers of the job.
type nodeMsg struct {
	Node int `json:"node"`
	// Kind: "rank_failed" (a rank of Node failed first there), "teardown"
	// (Node is ending the job for Reason: timeout, interrupted).
	Kind     string `json:"kind"`
	Rank     int    `json:"rank"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	TimeMS   int64  `json:"time_ms"`
	Reason   string `json:"reason,omitempty"`
	// Attempt is the attempt the message is about (--max-restarts); Detail
	// explains a "fatal" teardown.
	Attempt int    `json:"attempt"`
	Detail  string `json:"detail,omitempty"`
	// Crash and Stack: a rank_failed rank's Go runtime crash (RootCause's),
	// its line in Reason.
	Crash string   `json:"crash,omitempty"`
	Stack []string `json:"stack,omitempty"`
}

// plane is the launcher's connection to the job's NATS.
type plane struct {
	nc      *nats.Conn
	job     string
	node    int
	notices chan protocol.Notice
	remote  chan nodeMsg
	// fatal carries problems that end the job at once, before any collective
	// deadline: the supervisor tears the job down naming them.
	fatal chan error
	// sync is what launchers of several nodes agree on between attempts.
	sync *attemptSync

	// joins carries the ranks that say they are joining (JoiningSubject).
	joins chan int

	mu      sync.Mutex
	joining map[int]time.Time // ranks that said they are joining, this attempt
	nodes   map[int]hello     // the other nodes' launchers (announce)
	beats   map[int]protocol.State
	seen    map[int]time.Time
	subs    []*nats.Subscription
}

// connectPlane connects the launcher to its job's subjects; say reports
// what it notices outside of an attempt's events (see announce).
//
// local lists the ranks whose heartbeats it reads: nil for every rank of the
// job (one node, or node 0, which looks for hangs); the node's own ranks on
// the other nodes, so that the launchers together read each heartbeat about
// twice, not once per node.
func connectPlane(conf natsconn.Config, job string, node int, local []int, say func(format string, a ...any)) (*plane, error) {
	// The server refuses a subject of the job to credentials of another job
	// asynchronously: that ends the job at once (p.fatal), naming the subject.
	fatal := make(chan error, 8)
	denied := func(err error) error {
		pe := conf.PermissionError(err)
		if pe != nil {
			pe = fmt.Errorf("%w; --job-id is %q: are it and the credentials of the same job?", pe, job)
		}
		return pe
	}
	nc, err := natsconn.Connect(conf, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if pe := denied(err); pe != nil {
			select {
			case fatal <- pe:
			default:
			}
		}
	}))
	if err != nil {
		return nil, err
	}
	p := &plane{nc: nc, job: job, node: node, notices: make(chan protocol.Notice, 64), remote: make(chan nodeMsg, 64), fatal: fatal,
		joins: make(chan int, 256), joining: map[int]time.Time{}, nodes: map[int]hello{}, beats: map[int]protocol.State{}, seen: map[int]time.Time{}}
	// Failure notices and aborts: whom a collective blamed (see Notice.Decided).
	sub, err := nc.Subscribe(protocol.NoticeSubjects(job), func(m *nats.Msg) {
		n, ok := protocol.ParseNotice(job, m.Subject, m.Data)
		if !ok {
			return
		}
		select {
		case p.notices <- n:
		default:
		}
	})
	if err == nil {
		p.subs = append(p.subs, sub)
		sub, err = nc.Subscribe(protocol.LauncherSubject(job), func(m *nats.Msg) {
			var n nodeMsg
			if json.Unmarshal(m.Data, &n) != nil || n.Node == p.node {
				return
			}
			if n.Kind == kindCannotStart {
				p.onCannotStart(n, say)
				return
			}
			select {
			case p.remote <- n:
			default:
			}
		})
	}
	if err == nil {
		p.subs = append(p.subs, sub)
		sub, err = nc.Subscribe(protocol.JoiningSubjects(job), func(m *nats.Msg) {
			r, ok := protocol.ParseJoiningSubject(job, m.Subject)
			if !ok {
				return
			}
			p.mu.Lock()
			p.joining[r] = time.Now()
			p.mu.Unlock()
			select {
			case p.joins <- r:
			default:
			}
		})
	}
	// Heartbeats: for --hang-after, and to know which ranks joined.
	beat := func(m *nats.Msg) {
		s, ok := protocol.ParseHeartbeat(job, m.Subject, m.Data)
		if !ok {
			return
		}
		p.mu.Lock()
		p.beats[s.Rank] = s
		p.seen[s.Rank] = time.Now()
		p.mu.Unlock()
	}
	subjects := []string{protocol.HeartbeatSubjects(job)}
	if local != nil {
		subjects = subjects[:0]
		for _, r := range local {
			subjects = append(subjects, protocol.HeartbeatSubject(job, r))
		}
	}
	for _, subj := range subjects {
		if err != nil {
			break
		}
		p.subs = append(p.subs, sub)
		sub, err = nc.Subscribe(subj, beat)
	}
	if err == nil {
		p.subs = append(p.subs, sub)
		err = nc.Flush()
	}
	if pe := denied(nc.LastError()); pe != nil {
		err = pe
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats %s: %w", conf.URL, err)
	}
	return p, nil
}

// abort aborts the job: every rank's pending and future collectives fail with
// ErrAborted carrying reason.
func (p *plane) abort(reason string) error {
	data, _ := json.Marshal(protocol.AbortNotice(reason))
	if err := p.nc.Publish(protocol.AbortSubject(p.job), data); err != nil {
		return err
	}
	return p.nc.FlushTimeout(2 * time.Second)
}

func (p *plane) tell(m nodeMsg) {
	m.Node = p.node
	b, _ := json.Marshal(m)
	p.nc.Publish(protocol.LauncherSubject(p.job), b)
	p.nc.FlushTimeout(time.Second)
}

// hangs are the collectives in flight for longer than after that some rank has
// not entered.
func (p *plane) hangs(now time.Time, after time.Duration) []protocol.Hang {
	p.mu.Lock()
	latest := make(map[int]protocol.State, len(p.beats))
	for r, s := range p.beats {
		latest[r] = s
	}
	p.mu.Unlock()
	var out []protocol.Hang
	for _, h := range protocol.Hangs(latest, now, after) {
		if len(h.Missing) > 0 {
			out = append(out, h)
		}
	}
	return out
}

// joined reports what the plane heard from rank this attempt: that it is
// joining (JoiningSubject), and that it joined (a heartbeat).
func (p *plane) joined(rank int) (joining, joined bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, joining = p.joining[rank]
	_, joined = p.seen[rank]
	return joining, joined
}

// joiners are the ranks that said they are joining this attempt.
func (p *plane) joiners() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for r := range p.joining {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// lastBeat is when rank's last heartbeat arrived.
func (p *plane) lastBeat(rank int) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.seen[rank]
	return t, ok
}

func (p *plane) close() {
	for _, s := range p.subs {
		s.Unsubscribe()
	}
	p.nc.Close()
}
