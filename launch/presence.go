package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/protocol"
)

// Launchers of a job on an external NATS know of each other before any of
// them starts a rank (protocol.PresenceSubject): each says hello as it joins
// and the others answer with theirs. A launcher refuses to start
//   - when another launcher already runs its node of the job (the job id is
//     taken: the same command run twice, or two jobs given one --job-id), and
//   - when another node runs with a different --nnodes or --nproc-per-node,
//
// within presenceWindow, naming the other launcher's host and pid; the job
// that runs is left alone (its launcher says a newcomer was refused).
//
// A launcher that cannot start (bad flags, no worker, a workload the worker
// refuses) tells the others (kindCannotStart), which end at once naming its
// reason instead of waiting for its ranks until the rendezvous deadline;
// unless a launcher of that node already said hello, in which case the
// message is from a second launcher and ignored.

// presenceWindow is how long a joining launcher waits for the others'
// answers to its hello.
const presenceWindow = 300 * time.Millisecond

// kindCannotStart is a nodeMsg's Kind from a launcher that failed before
// starting its ranks; Detail says why.
const kindCannotStart = "cannot_start"

// ErrJobTaken reports a launcher refused because another already runs its
// node of the job, or runs another node with a different shape.
var ErrJobTaken = errors.New("launch: job id taken")

// hello is a launcher's word that it runs one node of the job.
type hello struct {
	Instance string `json:"instance"` // one per launcher process and job
	Node     int    `json:"node"`
	NNodes   int    `json:"nnodes"`
	NProc    int    `json:"nproc_per_node"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	StartMS  int64  `json:"start_ms"`
}

func (h hello) String() string {
	return fmt.Sprintf("the launcher of node %d on %s (pid %d, since %s)", h.Node, h.Host, h.PID, time.UnixMilli(h.StartMS).Format(consoleStamp))
}

// hello is this launcher's.
func (j *job) hello() hello {
	host, _ := os.Hostname()
	return hello{Instance: uuid.NewString(), Node: j.NodeRank, NNodes: j.nnodes, NProc: len(j.ranks), Host: host, PID: os.Getpid(),
		StartMS: time.Now().UnixMilli()}
}

// conflict is why me cannot run beside other, a launcher of the same job;
// "" when they can.
func (me hello) conflict(other hello, job string) string {
	switch {
	case other.Node == me.Node:
		return fmt.Sprintf("node %d of job %s already runs: %s; pick another --job-id (or --node-rank)", me.Node, job, other)
	case other.NNodes != me.NNodes:
		return fmt.Sprintf("%s runs job %s with --nnodes %d; this launcher has --nnodes %d", other, job, other.NNodes, me.NNodes)
	case other.NProc != me.NProc:
		return fmt.Sprintf("%s runs job %s with %d ranks per node; this launcher has %d (every node runs as many)", other, job, other.NProc, me.NProc)
	}
	return ""
}

// announce says hello to the job's other launchers and waits window for
// their answers: it returns an error wrapping ErrJobTaken when one of them
// conflicts with me (see hello.conflict). From then on the plane answers the
// hellos of launchers that join later, and says (through say) when it sees
// a conflicting one, which refuses itself.
func (p *plane) announce(me hello, window time.Duration, say func(format string, a ...any)) error {
	var conflicts []string
	joining := true
	sub, err := p.nc.Subscribe(protocol.PresenceSubject(p.job), func(m *nats.Msg) {
		var h hello
		if json.Unmarshal(m.Data, &h) != nil || h.Instance == me.Instance {
			return
		}
		if m.Reply != "" {
			b, _ := json.Marshal(me)
			m.Respond(b)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		why := me.conflict(h, p.job)
		switch {
		case why == "":
			p.nodes[h.Node] = h
		case joining:
			conflicts = append(conflicts, why)
		default:
			say("refused a second launcher: %s; this job goes on", h)
		}
	})
	if err != nil {
		return err
	}
	p.subs = append(p.subs, sub)
	inbox := p.nc.NewRespInbox()
	answers, err := p.nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer answers.Unsubscribe()
	b, _ := json.Marshal(me)
	if err := p.nc.PublishRequest(protocol.PresenceSubject(p.job), inbox, b); err != nil {
		return err
	}
	for deadline := time.Now().Add(window); ; {
		m, err := answers.NextMsg(time.Until(deadline))
		if err != nil {
			break // the window has passed
		}
		var h hello
		if json.Unmarshal(m.Data, &h) != nil || h.Instance == me.Instance {
			continue
		}
		p.mu.Lock()
		if why := me.conflict(h, p.job); why != "" {
			conflicts = append(conflicts, why)
		} else {
			p.nodes[h.Node] = h
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	joining = false
	if len(conflicts) > 0 {
		return fmt.Errorf("%w: %s", ErrJobTaken, conflicts[0])
	}
	return nil
}

// onCannotStart handles another node's word that its launcher failed before
// starting its ranks: unless that node already has a launcher (which said
// hello), the job cannot run, and the plane says so on p.fatal.
func (p *plane) onCannotStart(m nodeMsg, say func(format string, a ...any)) {
	p.mu.Lock()
	h, live := p.nodes[m.Node]
	p.mu.Unlock()
	if live {
		say("a second launcher for node %d could not start (%s); %s runs it: this job goes on", m.Node, m.Detail, h)
		return
	}
	select {
	case p.fatal <- fmt.Errorf("node %d cannot start: %s", m.Node, m.Detail):
	default:
	}
}

// cannotStart marks a failure of this launcher before it started any rank:
// the job's other launchers should hear of it (RunOptions.tellCannotStart).
type cannotStart struct{ error }

func (c cannotStart) Unwrap() error { return c.error }

// tellCannotStart tells the other launchers of a job on an external NATS
// that this one failed before starting its ranks, and why (err's first
// line); best effort, within a second. Nothing for a job of one node.
func (o RunOptions) tellCannotStart(err error) {
	if o.NNodes <= 1 || o.NATS == "" || o.NATSCreds == "" || o.JobID == "" {
		return
	}
	conf := o.natsConfig()
	conf.Timeout = time.Second
	conf.Name = fmt.Sprintf("meshrun-launcher-%d", o.NodeRank)
	if errors.Is(err, natsconn.ErrPermission) || errors.Is(err, natsconn.ErrRefused) {
		return // these credentials cannot tell the job anything
	}
	nc, cerr := natsconn.Connect(conf, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if cerr != nil {
		return
	}
	defer nc.Close()
	detail, _, _ := strings.Cut(err.Error(), "\n")
	b, _ := json.Marshal(nodeMsg{Node: o.NodeRank, Kind: kindCannotStart, Detail: detail, TimeMS: time.Now().UnixMilli()})
	nc.Publish(protocol.LauncherSubject(o.JobID), b)
	nc.FlushTimeout(time.Second)
}
