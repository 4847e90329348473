package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/natsconn"
	"github.com/meshrun/meshrun/natsconn/creds"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Config is how a worker joins its job. EnvConfig reads it from the environment
// the launcher sets:
//
//	RANK, WORLD_SIZE                 this rank and the number of ranks (required)
//	LOCAL_RANK, LOCAL_WORLD_SIZE     rank and ranks on this node
//	NODE_RANK, NNODES                this node and the number of nodes
//	MESHRUN_JOB_ID                   job id (required): subjects are meshrun.<job>.…
//	MESHRUN_NATS_URL                 NATS server (required)
//	MESHRUN_NATS_CREDS               path of a 0600 credentials file (format: see
//	                                 package natsconn/creds: user=… and password=… lines)
//	MESHRUN_TRANSPORT                auto (default) | shm | tcp | nats | none
//	                                 (none: control plane only, for simulation)
//	MESHRUN_TCP_HOST                 address the tcp data listener binds and
//	                                 announces (default 127.0.0.1 on one node;
//	                                 on several, the host name's address, else
//	                                 the one that reaches the NATS server)
//	MESHRUN_COLLECTIVE_TIMEOUT       deadline of one collective (Go duration)
//	MESHRUN_RENDEZVOUS_TIMEOUT       deadline of the rendezvous (Go duration)
//	MESHRUN_CHUNK_BYTES              pipelining chunk of large collectives
//	MESHRUN_SMALL_BYTES              largest collective using direct algorithms
type Config struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	NodeRank, NNodes          int
	Job                       string
	NATSURL                   string
	CredsFile                 string
	// Creds, when set, is used instead of CredsFile (tests, in-process callers).
	Creds *creds.Credentials
	// NATSCA, NATSCert and NATSKey are TLS files (MESHRUN_NATS_CA, _CERT, _KEY);
	// NATSInsecure allows plaintext to a non-loopback server
	// (MESHRUN_NATS_INSECURE). The policy is natsconn's.
	NATSCA, NATSCert, NATSKey string
	NATSInsecure              bool
	// Dialer, when set, opens the rank's NATS connection (nats.SetCustomDialer).
	// For simulation and fault injection: bench/control closes the socket it
	// returns to kill a simulated rank's control plane abruptly.
	Dialer nats.CustomDialer
	// Transport: "auto" (shm when every rank is on one host, else tcp), "shm",
	// "tcp", "nats", or "none": no data plane at all, every collective fails
	// with ErrInvalid; the control plane (rendezvous, heartbeats, notices,
	// abort) runs for real. "none" is for simulating many ranks in one process
	// (bench/control).
	Transport string
	TCPHost   string
	// RendezvousTimeout bounds the wait for the whole roster; default 30 s.
	RendezvousTimeout time.Duration
	// HeartbeatInterval (default 500 ms) and HeartbeatTimeout (default 5 s): a
	// rank silent for HeartbeatTimeout is lost.
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// Options of the World (timeouts, chunking, logger).
	Options

	envErrs []string
}

// EnvConfig reads the Config from the environment; problems are reported by
// Validate (and Join), all at once.
func EnvConfig() Config {
	var c Config
	num := func(name string, required bool, dst *int) {
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			if required {
				c.envErrs = append(c.envErrs, name+" is not set")
			}
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			c.envErrs = append(c.envErrs, fmt.Sprintf("%s=%q is not a non-negative integer", name, v))
			return
		}
		*dst = n
	}
	dur := func(name string, dst *time.Duration) {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				c.envErrs = append(c.envErrs, fmt.Sprintf("%s=%q is not a positive duration", name, v))
				return
			}
			*dst = d
		}
	}
	num("RANK", true, &c.Rank)
	num("WORLD_SIZE", true, &c.WorldSize)
	num("LOCAL_RANK", false, &c.LocalRank)
	num("LOCAL_WORLD_SIZE", false, &c.LocalWorldSize)
	num("NODE_RANK", false, &c.NodeRank)
	num("NNODES", false, &c.NNodes)
	c.Job = os.Getenv("MESHRUN_JOB_ID")
	nc := natsconn.FromEnv(os.Getenv)
	c.NATSURL, c.CredsFile, c.NATSCA, c.NATSCert, c.NATSKey, c.NATSInsecure = nc.URL, nc.CredsFile, nc.CA, nc.Cert, nc.Key, nc.Insecure
	c.Transport = os.Getenv("MESHRUN_TRANSPORT")
	c.TCPHost = os.Getenv("MESHRUN_TCP_HOST")
	dur("MESHRUN_COLLECTIVE_TIMEOUT", &c.DataTimeout)
	dur("MESHRUN_RENDEZVOUS_TIMEOUT", &c.RendezvousTimeout)
	num("MESHRUN_CHUNK_BYTES", false, &c.ChunkBytes)
	num("MESHRUN_SMALL_BYTES", false, &c.SmallBytes)
	num("MESHRUN_STAGE_BYTES", false, &c.StageBytes)
	c.Collectives = os.Getenv(EnvBackend)
	return c
}

// Validate reports every problem of the config at once.
func (c *Config) Validate() error {
	errs := append([]string(nil), c.envErrs...)
	if c.WorldSize < 1 {
		errs = append(errs, "world size must be at least 1")
	} else if c.Rank < 0 || c.Rank >= c.WorldSize {
		errs = append(errs, fmt.Sprintf("rank %d outside world of %d", c.Rank, c.WorldSize))
	}
	if c.Job == "" {
		errs = append(errs, "no job id (MESHRUN_JOB_ID)")
	} else if strings.ContainsAny(c.Job, ".*> \t\n") {
		errs = append(errs, fmt.Sprintf("job id %q must not contain '.', '*', '>' or spaces", c.Job))
	}
	if c.NATSURL == "" {
		errs = append(errs, "no NATS url (MESHRUN_NATS_URL)")
	}
	if c.Creds == nil && c.CredsFile == "" {
		errs = append(errs, "no NATS credentials (MESHRUN_NATS_CREDS)")
	}
	if c.NATSURL != "" && (c.Creds != nil || c.CredsFile != "") {
		if err := c.natsConfig().Validate(); err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), natsconn.ErrConfig.Error()+": "))
		}
	}
	switch c.Transport {
	case "", "auto", "shm", "tcp", "nats", "none":
	default:
		errs = append(errs, fmt.Sprintf("transport %q: want auto, shm, tcp, nats or none", c.Transport))
	}
	if _, err := ParseBackend(c.Collectives); err != nil {
		errs = append(errs, fmt.Sprintf("%s=%q: want auto, host, staged or nccl", EnvBackend, c.Collectives))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

func (c *Config) defaults() {
	if c.Transport == "" {
		c.Transport = "auto"
	}
	if c.RendezvousTimeout <= 0 {
		c.RendezvousTimeout = 30 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 5 * time.Second
	}
	if c.Options.Job == "" {
		c.Options.Job = c.Job
	}
	c.Options.defaults()
}

// natsConfig is the rank's NATS connection settings.
func (c *Config) natsConfig() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, CredsFile: c.CredsFile, Creds: c.Creds, CA: c.NATSCA, Cert: c.NATSCert,
		Key: c.NATSKey, Insecure: c.NATSInsecure, Name: fmt.Sprintf("meshrun-%s-rank-%d", c.Job, c.Rank)}
}

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
func Join(ctx context.Context, cfg Config) (*World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	log := cfg.Logger.With(zap.Int("rank", cfg.Rank))
	nconf := cfg.natsConfig()
	natsOpts, err := nconf.Options()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var wp atomic.Pointer[World]
	lostCh := make(chan error, 1)
	// A permissions violation or a lost connection arrives asynchronously:
	// before the World exists it cancels every wait of the join (jctx), after
	// it fails the World.
	jctx, jcancel := context.WithCancelCause(ctx)
	defer jcancel(nil)
	onLost := func(err error) {
		e := &Error{Kind: ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: fmt.Sprintf("connection to NATS at %s lost: %v", cfg.NATSURL, err)}
		if w := wp.Load(); w != nil {
			w.fail(e)
			return
		}
		select {
		case lostCh <- err:
		default:
		}
		jcancel(e)
	}
	var denied atomic.Pointer[Error]
	onDenied := func(err error) *Error {
		pe := nconf.PermissionError(err)
		if pe == nil {
			return nil
		}
		e := &Error{Kind: ErrPermission, Rank: -1, Reporter: cfg.Rank, Detail: fmt.Sprintf("%s; MESHRUN_JOB_ID is %q: are it and the credentials of the same job?",
			strings.TrimPrefix(pe.Error(), natsconn.ErrPermission.Error()+": "), cfg.Job)}
		if w := wp.Load(); w != nil {
			w.fail(e)
			return e
		}
		denied.CompareAndSwap(nil, e)
		jcancel(e)
		return e
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
			onLost(err)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { onDenied(err) }),
	)...)
	if err != nil {
		err = nconf.ConnectError(err)
		if errors.Is(err, natsconn.ErrRefused) {
			return nil, &Error{Kind: ErrAuth, Rank: -1, Reporter: cfg.Rank, Detail: strings.TrimPrefix(err.Error(), natsconn.ErrRefused.Error()+": ")}
		}
		return nil, &Error{Kind: ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: fmt.Sprintf("connecting to NATS at %s: %v", cfg.NATSURL, errors.Unwrap(err))}
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	// deniedErr is the permissions violation the server reported, if any: the
	// handler's, or the connection's last error (set before a later flush
	// returns, while the handler may still be on its way).
	deniedErr := func() error {
		if e := denied.Load(); e != nil {
			return e
		}
		if e := onDenied(nc.LastError()); e != nil {
			return e
		}
		return nil
	}
	ctl, err := newNatsControl(nc, cfg.Job, cfg.Rank, cfg.WorldSize, cfg.HeartbeatInterval, cfg.HeartbeatTimeout, cfg.RendezvousTimeout, log)
	if e := deniedErr(); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, &Error{Kind: ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: err.Error()}
	}
	// Say this rank is joining (for the launcher, which tells a rank that
	// exits before it joins apart from one that finished its work).
	nc.Publish(protocol.JoiningSubject(cfg.Job, cfg.Rank), nil)
	host, _ := os.Hostname()
	me := Announce{Rank: cfg.Rank, Size: cfg.WorldSize, Host: host, Boot: bootID(), PID: os.Getpid(), Nonce: randomHex(8)}
	if cfg.Transport == "shm" || cfg.Transport == "auto" {
		me.Shm = randomHex(shmTokenBytes)
	}
	var ln net.Listener
	if cfg.Transport == "tcp" || cfg.Transport == "auto" {
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
		l, err := TCPListen(bind)
		if err != nil {
			return nil, fmt.Errorf("%w: tcp listener on %s: %v", ErrInvalid, bind, err)
		}
		ln = l
		me.Addr = l.Addr().String()
		if tcpHost == "" {
			me.Addr = net.JoinHostPort(host, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
			log.Warn("tcp data listener on every interface: no address of this host found", zap.String("addr", me.Addr))
		}
	}
	// Rank 0 decides at the deadline; the others wait a little longer for its answer.
	rto := cfg.RendezvousTimeout
	if cfg.Rank != 0 {
		rto += 2 * time.Second
	}
	rctx, cancel := context.WithTimeout(jctx, rto)
	roster, err := rendezvous(rctx, nc, cfg.Job, me)
	cancel()
	if e := deniedErr(); e != nil {
		err = e // the cause of a rendezvous cut short
	} else if err != nil {
		var lost *Error
		if errors.As(context.Cause(jctx), &lost) && errors.Is(lost, ErrControlLost) {
			err = lost
		}
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	kind := cfg.Transport
	if kind == "auto" {
		kind = "tcp"
		if roster.SameHost() && shmAvailable() {
			kind = "shm"
		}
	}
	tctx, cancel := context.WithTimeout(jctx, cfg.RendezvousTimeout)
	defer cancel()
	var t Transport
	switch kind {
	case "tcp":
		addrs := make([]string, cfg.WorldSize)
		for i, a := range roster.Ranks {
			addrs[i] = a.Addr
		}
		t, err = newTCPTransport(tctx, cfg.Rank, cfg.WorldSize, ln, addrs, roster.Secret, cfg.Job, log)
		ln = nil // the transport's now, closed by it
	case "shm":
		if ln != nil {
			ln.Close()
		}
		ln = nil
		t, err = newShmTransport(tctx, cfg.Rank, cfg.WorldSize, roster, log)
	case "nats":
		t, err = NewNatsTransport(tctx, nc, cfg.Job, cfg.Rank, cfg.WorldSize)
	case "none":
		t = noneTransport{rank: cfg.Rank, size: cfg.WorldSize}
	}
	if e := deniedErr(); e != nil {
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
	select {
	case e := <-lostCh:
		t.Close()
		return nil, &Error{Kind: ErrControlLost, Rank: -1, Reporter: cfg.Rank, Detail: e.Error()}
	default:
	}
	w, err := NewWorld(t, ctl, cfg.Options)
	if err != nil {
		t.Close()
		return nil, err
	}
	w.log = log
	wp.Store(w)
	if e := denied.Load(); e != nil {
		w.Close() // reported between the last check and Store
		return nil, e
	}
	w.OnClose(func() error { nc.Close(); return nil })
	ok = true
	log.Info("joined", zap.String("job", cfg.Job), zap.Int("world", cfg.WorldSize), zap.String("transport", t.Name()), zap.String("data_addr", me.Addr))
	return w, nil
}

// dataHost is the address the tcp data listener of a rank of a job on several
// nodes binds when MESHRUN_TCP_HOST is not set: an address of this machine
// that hostname resolves to, not loopback (what the peers dialed when the host
// name was announced), else the address this machine reaches the NATS server
// from (a connected UDP socket: no packet is sent), not loopback. Empty when
// neither exists.
func dataHost(hostname, natsURL string) string {
	usable := func(ip net.IP) bool {
		return ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast()
	}
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				local[n.IP.String()] = true
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, hostname)
	cancel()
	if err == nil {
		for _, ip := range ips {
			if usable(ip.IP) && local[ip.IP.String()] {
				return ip.IP.String()
			}
		}
	}
	for _, u := range strings.Split(natsURL, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Hostname() == "" {
			continue
		}
		port := pu.Port()
		if port == "" {
			port = "4222"
		}
		c, err := net.Dial("udp", net.JoinHostPort(pu.Hostname(), port))
		if err != nil {
			continue
		}
		ip := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		if usable(ip) {
			return ip.String()
		}
	}
	return ""
}
