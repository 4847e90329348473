package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/transport"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Join connects this rank to its job: NATS, rendezvous, data transport,
// heartbeats. The World fails (every pending call with ErrControlLost) if the
// NATS connection drops; nothing reconnects.
//
// What cannot succeed fails at once rather than at the rendezvous deadline:
// a credentials file that is missing, unreadable or garbled (ErrInvalid,
// naming the file), credentials the server refuses (ErrAuth, naming the file
// and the server's answer; the connection is tried once, never retried), and
// a subject of the job the server does not allow these credentials
// (ErrPermission, naming the subject; a joined World fails with it too).
func Join(ctx context.Context, cfg Config) (*collective.World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	j := &joining{cfg: cfg, log: cfg.Logger.With(zap.Int("rank", cfg.Rank)), nconf: cfg.natsConfig(), lostCh: make(chan error, 1)}
	j.jctx, j.jcancel = context.WithCancelCause(ctx)
	defer j.jcancel(nil)
	if err := j.dial(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			j.nc.Close()
		}
	}()
	ctl, err := newNatsControl(j.nc, cfg.Job, cfg.Rank, cfg.WorldSize, cfg.HeartbeatInterval, cfg.HeartbeatTimeout, cfg.RendezvousTimeout, j.log)
	if e := j.deniedErr(); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: err.Error()}
	}
	// Say this rank is joining (for the launcher, which tells a rank that
	// exits before it joins apart from one that finished its work).
	j.nc.Publish(protocol.JoiningSubject(cfg.Job, cfg.Rank), nil)
	me, ln, err := j.announce()
	if err != nil {
		return nil, err
	}
	roster, err := j.rendezvous(me)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	t, err := j.dataPlane(roster, ln)
	if err != nil {
		return nil, err
	}
	w, err := j.world(t, ctl)
	if err != nil {
		return nil, err
	}
	ok = true
	j.log.Info("joined", zap.String("job", cfg.Job), zap.Int("world", cfg.WorldSize), zap.String("transport", t.Name()), zap.String("data_addr", me.Addr))
	return w, nil
}

// joining is one rank's Join in progress: what its steps share.
//
// A permissions violation or a lost connection arrives asynchronously:
// before the World exists it cancels every wait of the join (jctx), after
// it fails the World.
type joining struct {
	cfg     Config
	log     *zap.Logger
	nconf   natsconn.Config
	nc      *nats.Conn
	jctx    context.Context
	jcancel context.CancelCauseFunc
	wp      atomic.Pointer[collective.World] // the World, once built
	lostCh  chan error                       // the connection's loss before the World exists
	denied  atomic.Pointer[collective.Error] // the first permissions violation before it
}

// onLost reports the connection to the NATS server lost.
func (j *joining) onLost(err error) {
	e := &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: j.cfg.Rank, Detail: fmt.Sprintf("connection to NATS at %s lost: %v", j.cfg.NATSURL, err)}
	if w := j.wp.Load(); w != nil {
		w.Fail(e)
		return
	}
	select {
	case j.lostCh <- err:
	default:
	}
	j.jcancel(e)
}

// onDenied reports err if it is a permissions violation, and returns it
// as the join's error (nil when it is none).
func (j *joining) onDenied(err error) *collective.Error {
	pe := j.nconf.PermissionError(err)
	if pe == nil {
		return nil
	}
	e := &collective.Error{Kind: collective.ErrPermission, Rank: -1, Reporter: j.cfg.Rank, Detail: fmt.Sprintf("%s; MESHRUN_JOB_ID is %q: are it and the credentials of the same job?",
		strings.TrimPrefix(pe.Error(), natsconn.ErrPermission.Error()+": "), j.cfg.Job)}
	if w := j.wp.Load(); w != nil {
		w.Fail(e)
		return e
	}
	j.denied.CompareAndSwap(nil, e)
	j.jcancel(e)
	return e
}

// deniedErr is the permissions violation the server reported, if any: the
// handler's, or the connection's last error (set before a later flush
// returns, while the handler may still be on its way).
func (j *joining) deniedErr() error {
	if e := j.denied.Load(); e != nil {
		return e
	}
	if e := j.onDenied(j.nc.LastError()); e != nil {
		return e
	}
	return nil
}

// dial connects to the NATS server, once: credentials it refuses are
// ErrAuth, any other failure ErrControlLost.
func (j *joining) dial() error {
	cfg := j.cfg
	natsOpts, err := j.nconf.Options()
	if err != nil {
		return fmt.Errorf("%w: %v", collective.ErrInvalid, err)
	}
	if cfg.Dialer != nil {
		natsOpts = append(natsOpts, nats.SetCustomDialer(cfg.Dialer))
	}
	nc, err := nats.Connect(cfg.NATSURL, append(natsOpts,
		nats.NoReconnect(),
		// The client's pings are a backstop (a link that dies while this rank
		// watches no one, or during the join): a dead rank is found by the
		// rank that watches its heartbeats, and a watcher first checks its
		// own link to the server (natsControl.loop). Every second, 3 at most
		// outstanding, they called hundreds of healthy connections stale
		// while 4,096 ranks joined on 2 cores.
		nats.PingInterval(max(cfg.HeartbeatTimeout, time.Second)), nats.MaxPingsOutstanding(3),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil {
				err = c.LastError() // the client's reason (stale connection, EOF), if it had one
			}
			if err == nil {
				err = errors.New("disconnected")
			}
			j.onLost(err)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { j.onDenied(err) }),
	)...)
	if err != nil {
		err = j.nconf.ConnectError(err)
		if errors.Is(err, natsconn.ErrRefused) {
			return &collective.Error{Kind: collective.ErrAuth, Rank: -1, Reporter: cfg.Rank, Detail: strings.TrimPrefix(err.Error(), natsconn.ErrRefused.Error()+": ")}
		}
		return &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: fmt.Sprintf("connecting to NATS at %s: %v", cfg.NATSURL, errors.Unwrap(err))}
	}
	j.nc = nc
	return nil
}

// announce returns what this rank tells the rendezvous, with the tcp data
// listener it announces (nil when the transport cannot be tcp).
func (j *joining) announce() (collective.Announce, net.Listener, error) {
	cfg := j.cfg
	host, _ := os.Hostname()
	me := collective.Announce{Rank: cfg.Rank, Size: cfg.WorldSize, Host: host, Boot: bootID(), PID: os.Getpid(), Nonce: randomHex(8)}
	if cfg.Transport == "shm" || cfg.Transport == "auto" {
		me.Shm = randomHex(transport.ShmTokenBytes)
	}
	if cfg.Transport != "tcp" && cfg.Transport != "auto" {
		return me, nil, nil
	}
	// The listener binds the address it announces: loopback on one node,
	// MESHRUN_TCP_HOST on several, else the host name's address or the one
	// that reaches the NATS server (dataHost). Only when none is found does it
	// listen on every interface, announced under the host name.
	tcpHost := cfg.TCPHost
	if tcpHost == "" && cfg.NNodes <= 1 {
		tcpHost = "127.0.0.1"
	}
	if tcpHost == "" {
		tcpHost = dataHost(host, cfg.NATSURL)
	}
	bind := tcpHost
	if bind == "" {
		bind = "0.0.0.0"
	}
	l, err := transport.TCPListen(bind)
	if err != nil {
		return me, nil, fmt.Errorf("%w: tcp listener on %s: %v", collective.ErrInvalid, bind, err)
	}
	me.Addr = l.Addr().String()
	if tcpHost == "" {
		me.Addr = net.JoinHostPort(host, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
		j.log.Warn("tcp data listener on every interface: no address of this host found", zap.String("addr", me.Addr))
	}
	return me, l, nil
}

// rendezvous runs the job's rendezvous; a permissions violation or the
// connection's loss that cut it short is its error.
func (j *joining) rendezvous(me collective.Announce) (*collective.Roster, error) {
	// Rank 0 decides at the deadline; the others wait a little longer for its answer.
	rto := j.cfg.RendezvousTimeout
	if j.cfg.Rank != 0 {
		rto += 2 * time.Second
	}
	rctx, cancel := context.WithTimeout(j.jctx, rto)
	roster, err := rendezvous(rctx, j.nc, j.cfg.Job, me)
	cancel()
	if e := j.deniedErr(); e != nil {
		return nil, e // the cause of a rendezvous cut short
	}
	if err != nil {
		var lost *collective.Error
		if errors.As(context.Cause(j.jctx), &lost) && errors.Is(lost, collective.ErrControlLost) {
			return nil, lost
		}
		return nil, err
	}
	return roster, nil
}

// dataPlane chooses the transport (auto: shm when every rank is on this
// host and /dev/shm is usable, else tcp) and builds it; it owns ln.
func (j *joining) dataPlane(roster *collective.Roster, ln net.Listener) (collective.Transport, error) {
	cfg := j.cfg
	kind := cfg.Transport
	if kind == "auto" {
		kind = "tcp"
		if roster.SameHost() && transport.ShmAvailable() {
			kind = "shm"
		}
	}
	tctx, cancel := context.WithTimeout(j.jctx, cfg.RendezvousTimeout)
	defer cancel()
	var t collective.Transport
	var err error
	switch kind {
	case "tcp":
		addrs := make([]string, cfg.WorldSize)
		for i, a := range roster.Ranks {
			addrs[i] = a.Addr
		}
		t, err = transport.NewTCPTransport(tctx, cfg.Rank, cfg.WorldSize, ln, addrs, roster.Secret, cfg.Job, j.log)
		ln = nil // the transport's now, closed by it
	case "shm":
		if ln != nil {
			ln.Close()
		}
		ln = nil
		t, err = transport.NewShmTransport(tctx, cfg.Rank, cfg.WorldSize, roster, j.shmOptions())
	case "nats":
		t, err = transport.NewNatsTransport(tctx, natsData{j.nc}, cfg.Job, cfg.Rank, cfg.WorldSize)
	case "none":
		t = transport.None(cfg.Rank, cfg.WorldSize)
	}
	if e := j.deniedErr(); e != nil {
		if err == nil {
			t.Close()
		}
		err = e
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	return t, nil
}

// world builds the World over t and ctl, unless the connection was lost or
// a permission refused meanwhile; it closes t when it fails.
func (j *joining) world(t collective.Transport, ctl collective.Control) (*collective.World, error) {
	select {
	case e := <-j.lostCh:
		t.Close()
		return nil, &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: j.cfg.Rank, Detail: e.Error()}
	default:
	}
	o := j.cfg.Options
	o.Logger = j.log
	w, err := collective.NewWorld(t, ctl, o)
	if err != nil {
		t.Close()
		return nil, err
	}
	j.wp.Store(w)
	if e := j.denied.Load(); e != nil {
		w.Close() // reported between the last check and Store
		return nil, e
	}
	nc := j.nc
	w.OnClose(func() error { nc.Close(); return nil })
	return w, nil
}

// shmOptions is the shm transport's configuration, logging as the rank.
func (j *joining) shmOptions() transport.ShmOptions {
	o := j.cfg.Shm
	o.Logger = j.log
	return o
}
