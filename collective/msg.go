package collective

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshrun/meshrun/natsrv/creds"
	"github.com/nats-io/nats.go"
)

// MaxMsg bounds a control message.
const MaxMsg = 64 << 10

// messenger is the optional part of a Control that carries small control
// messages between ranks (both controls in this package implement it).
type messenger interface {
	publishMsg(topic string, from int, data []byte) error
	subscribeMsg(topic string, fn func(from int, data []byte)) (func(), error)
}

func checkTopic(topic string, n int) error {
	if topic == "" || strings.ContainsAny(topic, "*> \t\r\n") || strings.HasPrefix(topic, ".") || strings.HasSuffix(topic, ".") {
		return fmt.Errorf("%w: control message topic %q", ErrInvalid, topic)
	}
	if n > MaxMsg {
		return fmt.Errorf("%w: control message of %d bytes (at most %d)", ErrInvalid, n, MaxMsg)
	}
	return nil
}

// PublishMsg sends a small control message (at most MaxMsg bytes) on topic to
// every rank subscribed to it (over NATS: meshrun.<job>.msg.<topic>). Delivery
// is at most once, like core NATS: use it for hints and small coordination, not
// for data a rank cannot do without.
func (w *World) PublishMsg(topic string, data []byte) error {
	if err := checkTopic(topic, len(data)); err != nil {
		return err
	}
	m, ok := w.ctrl.(messenger)
	if !ok {
		return fmt.Errorf("%w: the control plane carries no messages", ErrInvalid)
	}
	return m.publishMsg(topic, w.rank, data)
}

// SubscribeMsg calls fn with every control message on topic and its sender's
// rank. The returned function unsubscribes.
func (w *World) SubscribeMsg(topic string, fn func(from int, data []byte)) (func(), error) {
	if err := checkTopic(topic, 0); err != nil {
		return nil, err
	}
	m, ok := w.ctrl.(messenger)
	if !ok {
		return nil, fmt.Errorf("%w: the control plane carries no messages", ErrInvalid)
	}
	return m.subscribeMsg(topic, fn)
}

const rankHeader = "Meshrun-Rank"

func (c *natsControl) publishMsg(topic string, from int, data []byte) error {
	m := nats.NewMsg(Subject(c.job, "msg."+topic))
	m.Header.Set(rankHeader, strconv.Itoa(from))
	m.Data = data
	if err := c.nc.PublishMsg(m); err != nil {
		return &Error{Kind: ErrControlLost, Rank: -1, Reporter: from, Detail: err.Error()}
	}
	return nil
}

func (c *natsControl) subscribeMsg(topic string, fn func(from int, data []byte)) (func(), error) {
	sub, err := c.nc.Subscribe(Subject(c.job, "msg."+topic), func(m *nats.Msg) {
		r, err := strconv.Atoi(m.Header.Get(rankHeader))
		if err != nil {
			r = -1
		}
		fn(r, m.Data)
	})
	if err != nil {
		return nil, &Error{Kind: ErrControlLost, Rank: -1, Reporter: c.rank, Detail: err.Error()}
	}
	if err := c.nc.FlushTimeout(2 * time.Second); err != nil {
		sub.Unsubscribe()
		return nil, &Error{Kind: ErrControlLost, Rank: -1, Reporter: c.rank, Detail: err.Error()}
	}
	return func() { sub.Unsubscribe() }, nil
}

type localSub struct {
	topic string
	fn    func(int, []byte)
}

var localMsgs sync.Map // *localHub -> *localMsgBus

type localMsgBus struct {
	mu   sync.Mutex
	next int
	subs map[int]localSub
}

func (c *localControl) bus() *localMsgBus {
	b, _ := localMsgs.LoadOrStore(c.h, &localMsgBus{subs: map[int]localSub{}})
	return b.(*localMsgBus)
}

func (c *localControl) publishMsg(topic string, from int, data []byte) error {
	b := c.bus()
	b.mu.Lock()
	var fns []func(int, []byte)
	for _, s := range b.subs {
		if s.topic == topic {
			fns = append(fns, s.fn)
		}
	}
	b.mu.Unlock()
	cp := append([]byte(nil), data...)
	for _, fn := range fns {
		fn(from, cp)
	}
	return nil
}

func (c *localControl) subscribeMsg(topic string, fn func(from int, data []byte)) (func(), error) {
	b := c.bus()
	b.mu.Lock()
	id := b.next
	b.next++
	b.subs[id] = localSub{topic, fn}
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		delete(b.subs, id)
		b.mu.Unlock()
	}, nil
}

// Abort connects to the job's NATS server with c, publishes an abort for job
// (see PublishAbort) and disconnects: for a launcher that holds no connection.
func Abort(url string, c creds.Credentials, job, reason string) error {
	nc, err := nats.Connect(url, nats.UserInfo(c.User, c.Password), nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		return &Error{Kind: ErrControlLost, Rank: -1, Reporter: -1, Detail: err.Error()}
	}
	defer nc.Close()
	return PublishAbort(nc, job, reason)
}
