package launch

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshrun/meshrun/protocol"
)

// attemptSync is what the launchers of several nodes agree on around
// attempts: node 0 hands out each attempt's MASTER_ADDR and MASTER_PORT
// (protocol.MasterSubject), and before a restart every node says its ranks
// of the attempt have all exited (protocol.AttemptSubject), so that no rank
// of an attempt meets a rank of the next.
type attemptSync struct {
	mu     sync.Mutex
	master masterInfo              // node 0: the current attempt's
	asked  map[int]map[int]bool    // node 0: attempt -> the nodes that have it
	done   map[int]map[int]Outcome // attempt -> node -> how its ranks ended
	change chan struct{}           // closed and replaced on every change of done
	subs   []*nats.Subscription
}

// masterInfo is an attempt's MASTER_ADDR and MASTER_PORT.
type masterInfo struct {
	Attempt int    `json:"attempt"`
	Addr    string `json:"addr"`
	Port    int    `json:"port"`
}

// attemptMsg is a node's word that its ranks of an attempt all exited, and
// how.
type attemptMsg struct {
	Node    int     `json:"node"`
	Attempt int     `json:"attempt"`
	Outcome Outcome `json:"outcome"`
}

// syncer starts the plane's attempt agreement on first use.
func (p *plane) syncer() (*attemptSync, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sync != nil {
		return p.sync, nil
	}
	s := &attemptSync{master: masterInfo{Attempt: -1}, asked: map[int]map[int]bool{}, done: map[int]map[int]Outcome{}, change: make(chan struct{})}
	sub, err := p.nc.Subscribe(protocol.AttemptSubject(p.job), func(m *nats.Msg) {
		var a attemptMsg
		if json.Unmarshal(m.Data, &a) != nil {
			return
		}
		s.mu.Lock()
		if s.done[a.Attempt] == nil {
			s.done[a.Attempt] = map[int]Outcome{}
		}
		s.done[a.Attempt][a.Node] = a.Outcome
		close(s.change)
		s.change = make(chan struct{})
		s.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	s.subs = append(s.subs, sub)
	if p.node == 0 {
		sub, err := p.nc.Subscribe(protocol.MasterSubject(p.job), func(m *nats.Msg) {
			var q masterQuery
			json.Unmarshal(m.Data, &q)
			s.mu.Lock()
			b, _ := json.Marshal(s.master)
			if q.Attempt == s.master.Attempt && s.master.Attempt >= 0 {
				if s.asked[q.Attempt] == nil {
					s.asked[q.Attempt] = map[int]bool{}
				}
				s.asked[q.Attempt][q.Node] = true
				close(s.change)
				s.change = make(chan struct{})
			}
			s.mu.Unlock()
			m.Respond(b)
		})
		if err != nil {
			return nil, err
		}
		s.subs = append(s.subs, sub)
	}
	if err := p.nc.Flush(); err != nil {
		return nil, err
	}
	p.sync = s
	return s, nil
}

// setMaster is node 0's: attempt's MASTER_ADDR and MASTER_PORT, for the
// other nodes to ask.
func (p *plane) setMaster(m masterInfo) error {
	s, err := p.syncer()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.master = m
	s.mu.Unlock()
	return nil
}

// masterQuery is a node's request for an attempt's MASTER_ADDR/PORT.
type masterQuery struct {
	Node    int `json:"node"`
	Attempt int `json:"attempt"`
}

// mastersHandedOut is node 0's: it waits until every other node of nnodes
// has asked for attempt's MASTER_ADDR and MASTER_PORT, at most wait, so
// that a node 0 whose ranks finish first does not leave the others asking
// an empty room. It returns the nodes that never asked.
func (p *plane) mastersHandedOut(attempt, nnodes int, wait time.Duration) []int {
	s, err := p.syncer()
	if err != nil {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		var missing []int
		for n := 1; n < nnodes; n++ {
			if !s.asked[attempt][n] {
				missing = append(missing, n)
			}
		}
		change := s.change
		s.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-change:
		case <-timer.C:
			return missing
		}
	}
}

// askMaster asks node 0's launcher for attempt's MASTER_ADDR and MASTER_PORT,
// until it has them or wait has passed.
func (p *plane) askMaster(attempt int, wait time.Duration) (masterInfo, error) {
	deadline := time.Now().Add(wait)
	last := "no answer"
	for time.Now().Before(deadline) {
		q, _ := json.Marshal(masterQuery{Node: p.node, Attempt: attempt})
		msg, err := p.nc.Request(protocol.MasterSubject(p.job), q, 500*time.Millisecond)
		if err == nil {
			var m masterInfo
			if json.Unmarshal(msg.Data, &m) == nil && m.Attempt == attempt {
				return m, nil
			}
			last = fmt.Sprintf("node 0 is at attempt %d", m.Attempt)
		} else {
			last = err.Error()
		}
		select {
		case err := <-p.fatal: // node 0 (or another) cannot start: no answer will come
			return masterInfo{}, err
		case <-time.After(100 * time.Millisecond):
		}
	}
	return masterInfo{}, fmt.Errorf("node 0's launcher did not hand out MASTER_ADDR/MASTER_PORT of attempt %d within %v (%s)", attempt, wait, last)
}

// attemptDone tells the other launchers this node's ranks of attempt have all
// exited, with their outcome, and waits until every one of the nnodes nodes
// has said so; it returns every node's outcome.
func (p *plane) attemptDone(attempt int, o Outcome, nnodes int, wait time.Duration) (map[int]Outcome, error) {
	s, err := p.syncer()
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(attemptMsg{Node: p.node, Attempt: attempt, Outcome: o})
	if err := p.nc.Publish(protocol.AttemptSubject(p.job), b); err != nil {
		return nil, err
	}
	p.nc.Flush()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		have, change := len(s.done[attempt]), s.change
		var missing []int
		out := map[int]Outcome{}
		for n := 0; n < nnodes; n++ {
			if o, ok := s.done[attempt][n]; ok {
				out[n] = o
			} else {
				missing = append(missing, n)
			}
		}
		s.mu.Unlock()
		if have >= nnodes {
			return out, nil
		}
		select {
		case <-change:
		case <-timer.C:
			return nil, fmt.Errorf("restart: nodes %s did not finish attempt %d within %v", FormatRanks(missing), attempt, wait)
		}
	}
}

// reset forgets the heartbeats of the attempt that ended and any notice not
// yet read: the next attempt starts from nothing.
func (p *plane) reset() {
	p.mu.Lock()
	clear(p.beats)
	clear(p.seen)
	clear(p.joining)
	p.mu.Unlock()
	for {
		select {
		case <-p.notices:
		case <-p.joins:
		default:
			return
		}
	}
}

// rootCause is the failure a remote launcher reported.
func (m nodeMsg) rootCause() RootCause {
	rc := RootCause{Rank: m.Rank, Node: m.Node, ExitCode: m.ExitCode, Signal: m.Signal, TimeMS: m.TimeMS}
	if m.Kind == "hang" {
		rc.Hung, rc.Error = true, m.Reason
	}
	if m.Kind == "rank_failed" && m.Crash != "" {
		rc.Crash, rc.Error, rc.Stack = m.Crash, m.Reason, m.Stack
	}
	return rc
}

// reachableAddr is an address of this node the other nodes reach: --local-addr
// when given, else the local address of the route to the job's NATS server
// (the other nodes reach that server, and so this host's network), else the
// host name. An address, not a name: a pod's bare host name, for one, does
// not resolve in its peers.
func (j *job) reachableAddr() string {
	if j.LocalAddr != "" {
		return j.LocalAddr
	}
	first, _, _ := strings.Cut(j.NATS, ",")
	if u, err := url.Parse(first); err == nil && u.Host != "" {
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = "4222"
		}
		// A UDP "connection" sends nothing: it only picks the route.
		if c, err := net.Dial("udp", net.JoinHostPort(host, port)); err == nil {
			ip := c.LocalAddr().(*net.UDPAddr).IP
			c.Close()
			if !ip.IsUnspecified() {
				return ip.String()
			}
		}
	}
	return hostname()
}

// master is attempt n's MASTER_ADDR and MASTER_PORT (what torch's env://
// rendezvous reads): --master-addr and --master-port when given; else on one
// node 127.0.0.1 and a port free there, on several node 0's reachable address
// (reachableAddr) and a
// port free on it, which node 0's launcher hands to the others. A new port
// each attempt: the last one's may linger in TIME_WAIT.
func (j *job) master(p *plane, n int) (string, int, error) {
	addr, port := j.MasterAddr, j.MasterPort
	if j.nnodes > 1 && j.NodeRank != 0 && (addr == "" || port == 0) {
		m, err := p.askMaster(n, restartWait)
		if err != nil {
			return "", 0, err
		}
		return m.Addr, m.Port, nil
	}
	if addr == "" {
		addr = "127.0.0.1"
		if j.nnodes > 1 {
			addr = j.reachableAddr()
		}
	}
	if port == 0 {
		bind := "127.0.0.1"
		if j.nnodes > 1 {
			bind = ""
		}
		var err error
		if port, err = freePort(bind); err != nil {
			return "", 0, fmt.Errorf("MASTER_PORT: %v", err)
		}
	}
	if j.nnodes > 1 {
		if err := p.setMaster(masterInfo{Attempt: n, Addr: addr, Port: port}); err != nil {
			return "", 0, err
		}
	}
	return addr, port, nil
}

// freePort is a TCP port free on host ("" every interface) a moment ago.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
