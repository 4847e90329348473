package natsconn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// plainServer starts a nats-server on loopback with one user.
func plainServer(t *testing.T, user creds.Credentials) string {
	t.Helper()
	return startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: user.User, Password: user.Password}}}).ClientURL()
}

// startServer starts a nats-server with opts, stopped when the test ends.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// TestConnectCredentialsErrors: a missing, garbled or refused credentials file
// fails Connect at once, naming the file (and the server's answer); nats.go
// does not retry a refused connection, even with the server listed twice.
func TestConnectCredentialsErrors(t *testing.T) {
	user := creds.Credentials{User: "job-a", Password: "pw-a"}
	url := plainServer(t, user)
	dir := t.TempDir()
	write := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wrong := write("wrong.creds", creds.Credentials{User: "job-a", Password: "guess"}.Marshal())
	for _, tc := range []struct {
		name, url, file string
		kind            error
		want            string
	}{
		{"missing", url, filepath.Join(dir, "missing.creds"), ErrConfig, "no such file"},
		{"garbled", url, write("garbled.creds", []byte("password=x\n")), ErrConfig, "user and password are both required"},
		{"refused", url, wrong, ErrRefused, `(user "job-a"): nats: Authorization Violation`},
		{"refused by both listed servers", url + "," + url, wrong, ErrRefused, "Authorization Violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			nc, err := Connect(Config{URL: tc.url, CredsFile: tc.file, Timeout: 2 * time.Second})
			took := time.Since(start)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want %v naming %s and %q", err, tc.kind, tc.file, tc.want)
			}
			if tc.kind == ErrRefused && !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("error %v does not wrap nats.ErrAuthorization", err)
			}
			if strings.Contains(err.Error(), "guess") {
				t.Error("error leaks the password")
			}
			if took > 2*time.Second {
				t.Errorf("failed after %v, want < 2s", took)
			}
		})
	}
}

func TestPermissionError(t *testing.T) {
	c := Config{CredsFile: "/run/job.creds"}
	for _, tc := range []struct {
		server string // the server's -ERR text
		want   string // "" = not a permissions violation
	}{
		{`Permissions Violation for Subscription to "meshrun.j.ctl.>"`, `subscribe to "meshrun.j.ctl.>" is not allowed for credentials file /run/job.creds`},
		{`Permissions Violation for Subscription to "meshrun.j.rdv" using queue "q"`, `subscribe to "meshrun.j.rdv"`},
		{`Permissions Violation for Publish to "meshrun.j.rdv"`, `publish to "meshrun.j.rdv"`},
		{`Permissions Violation for Publish with Reply of "x.y"`, `receive replies on "x.y"`},
		{`Permissions Violation for something new`, `a subject is not allowed`},
	} {
		err := c.PermissionError(fmt.Errorf("%w: %s", nats.ErrPermissionViolation, tc.server))
		if !errors.Is(err, ErrPermission) || !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), tc.want) ||
			!strings.Contains(err.Error(), tc.server) {
			t.Errorf("%s: %v, want %q", tc.server, err, tc.want)
		}
	}
	if err := c.PermissionError(nats.ErrMaxSubscriptionsExceeded); err != nil {
		t.Errorf("not a permissions violation: %v", err)
	}
	if err := c.PermissionError(nil); err != nil {
		t.Errorf("nil: %v", err)
	}
}
