// Package natsrv runs an embedded nats-server for one or more meshrun jobs: in
// process, bound to loopback on a random port, with per-job credentials whose
// permissions are limited to the job's subjects, monitoring off and no signal
// handlers. Tests start one per test; the launcher starts one per run on a single
// machine.
package natsrv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// ErrStart reports a server that did not start.
var ErrStart = errors.New("natsrv: server did not start")

// Options configure Start. The zero value is valid: loopback, a random port, one
// admin user, no job users.
type Options struct {
	// Host to listen on; default 127.0.0.1. Listening on anything else is the
	// caller's decision, never a default.
	Host string
	// Port; 0 or -1 picks a free port.
	Port int
	// Jobs get one user each, allowed to publish and subscribe only under
	// "meshrun.<job>.>" and "_INBOX.>". More can be added with AddJob.
	Jobs []string
	// Admin reuses these admin credentials (e.g. across a restart); default random.
	Admin *creds.Credentials
	// JobCreds reuses per-job credentials (e.g. across a restart).
	JobCreds map[string]creds.Credentials
	// MaxPayload in bytes; default the server's (1 MiB).
	MaxPayload int32
	// ReadyTimeout bounds the wait for the listener; default 5 s.
	ReadyTimeout time.Duration
	// Logger receives the server's notices and errors; nil discards them.
	Logger *zap.Logger
}

// Server is a running embedded server.
type Server struct {
	ns    *server.Server
	opts  *server.Options
	admin creds.Credentials
	mu    sync.Mutex
	jobs  map[string]creds.Credentials
}

func random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// JobSubjects is the subject space of a job: every subject the job's ranks use
// lies under it (protocol.JobSubjects).
func JobSubjects(job string) string { return protocol.JobSubjects(job) }

func jobUser(job string, c creds.Credentials) *server.User {
	allow := &server.SubjectPermission{Allow: []string{JobSubjects(job), "_INBOX.>"}}
	return &server.User{
		Username: c.User,
		Password: c.Password,
		Permissions: &server.Permissions{
			Publish:   allow,
			Subscribe: allow,
		},
	}
}

// Start starts a server and waits until it accepts connections.
func Start(o Options) (*Server, error) {
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := o.Port
	if port == 0 {
		port = -1
	}
	ready := o.ReadyTimeout
	if ready <= 0 {
		ready = 5 * time.Second
	}
	s := &Server{jobs: map[string]creds.Credentials{}}
	if o.Admin != nil {
		s.admin = *o.Admin
	} else {
		s.admin = creds.Credentials{User: "admin-" + random(4), Password: random(24)}
	}
	users := []*server.User{{Username: s.admin.User, Password: s.admin.Password}}
	for job, c := range o.JobCreds {
		s.jobs[job] = c
		users = append(users, jobUser(job, c))
	}
	for _, job := range o.Jobs {
		if _, ok := s.jobs[job]; ok {
			continue
		}
		c := creds.Credentials{User: "job-" + random(6), Password: random(24)}
		s.jobs[job] = c
		users = append(users, jobUser(job, c))
	}
	so := &server.Options{
		Host:       host,
		Port:       port,
		NoSigs:     true,
		NoLog:      o.Logger == nil,
		HTTPPort:   0,
		Users:      users,
		MaxPayload: o.MaxPayload,
		// Workers block on collectives; a large write deadline avoids the server
		// cutting a busy but healthy client.
		WriteDeadline: 10 * time.Second,
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStart, err)
	}
	if o.Logger != nil {
		ns.SetLoggerV2(zapLogger{o.Logger.Named("nats-server").Sugar()}, false, false, false)
	}
	go ns.Start()
	if !ns.ReadyForConnections(ready) {
		ns.Shutdown()
		return nil, fmt.Errorf("%w: not ready within %v", ErrStart, ready)
	}
	s.ns, s.opts = ns, so
	return s, nil
}

// URL is the client URL, nats://127.0.0.1:<port>.
func (s *Server) URL() string { return s.ns.ClientURL() }

// Port is the port the server listens on.
func (s *Server) Port() int {
	if a, ok := s.ns.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Admin returns the credentials of the admin user (all subjects), for the
// launcher and tests.
func (s *Server) Admin() creds.Credentials { return s.admin }

// Credentials returns the job's credentials, or false if the job has no user.
func (s *Server) Credentials(job string) (creds.Credentials, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.jobs[job]
	return c, ok
}

// JobCreds returns a copy of every job's credentials (to restart a server with
// the same users).
func (s *Server) JobCreds() map[string]creds.Credentials {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]creds.Credentials, len(s.jobs))
	for k, v := range s.jobs {
		out[k] = v
	}
	return out
}

// AddJob creates a user for job (or returns the existing one) and reloads the
// server's authorization.
func (s *Server) AddJob(job string) (creds.Credentials, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.jobs[job]; ok {
		return c, nil
	}
	c := creds.Credentials{User: "job-" + random(6), Password: random(24)}
	users := []*server.User{{Username: s.admin.User, Password: s.admin.Password}}
	for j, jc := range s.jobs {
		users = append(users, jobUser(j, jc))
	}
	users = append(users, jobUser(job, c))
	no := s.opts.Clone()
	no.Users = users
	if err := s.ns.ReloadOptions(no); err != nil {
		return creds.Credentials{}, fmt.Errorf("natsrv: add job %s: %w", job, err)
	}
	s.opts = no
	s.jobs[job] = c
	return c, nil
}

// WriteCredentials writes job's credentials to path with mode 0600, in the
// format of package creds (MESHRUN_NATS_CREDS).
func (s *Server) WriteCredentials(job, path string) error {
	c, ok := s.Credentials(job)
	if !ok {
		return fmt.Errorf("natsrv: no user for job %q", job)
	}
	return creds.Write(path, c)
}

// Shutdown stops the server and waits until it has stopped.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// zapLogger adapts zap to the server's logger interface.
type zapLogger struct{ l *zap.SugaredLogger }

func (z zapLogger) Noticef(format string, v ...any) { z.l.Infof(format, v...) }
func (z zapLogger) Warnf(format string, v ...any)   { z.l.Warnf(format, v...) }
func (z zapLogger) Fatalf(format string, v ...any)  { z.l.Errorf(format, v...) }
func (z zapLogger) Errorf(format string, v ...any)  { z.l.Errorf(format, v...) }
func (z zapLogger) Debugf(format string, v ...any)  { z.l.Debugf(format, v...) }
func (z zapLogger) Tracef(format string, v ...any)  {}

// Stats are the server's cumulative message counters, as its monitoring
// endpoint /varz reports them (read through the Go API: monitoring stays off).
type Stats struct {
	Connections       int
	InMsgs, OutMsgs   int64
	InBytes, OutBytes int64
	SlowConsumers     int64
}

// Stats reads the server's counters (bench/control measures control-plane
// traffic with them).
func (s *Server) Stats() (Stats, error) {
	v, err := s.ns.Varz(nil)
	if err != nil {
		return Stats{}, err
	}
	return Stats{Connections: v.Connections, InMsgs: v.InMsgs, OutMsgs: v.OutMsgs, InBytes: v.InBytes, OutBytes: v.OutBytes, SlowConsumers: v.SlowConsumers}, nil
}
