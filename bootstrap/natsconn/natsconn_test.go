package natsconn

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/internal/testpki"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func TestValidate(t *testing.T) {
	cr := &creds.Credentials{User: "u", Password: "p"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"loopback plaintext", Config{URL: "nats://127.0.0.1:4222", Creds: cr}, ""},
		{"localhost plaintext", Config{URL: "nats://localhost:4222", Creds: cr}, ""},
		{"remote plaintext", Config{URL: "nats://nats.example.org:4222", Creds: cr}, "not on loopback and not TLS"},
		{"remote plaintext, one of several", Config{URL: "nats://127.0.0.1:4222,nats://10.1.2.3:4222", Creds: cr}, "10.1.2.3"},
		{"remote plaintext, insecure", Config{URL: "nats://nats.example.org:4222", Creds: cr, Insecure: true}, ""},
		{"remote tls", Config{URL: "tls://nats.example.org:4222", Creds: cr}, ""},
		{"no credentials", Config{URL: "nats://127.0.0.1:4222"}, "no NATS credentials"},
		{"credentials in the URL", Config{URL: "nats://u:secret@127.0.0.1:4222", Creds: cr}, "put them in a creds file"},
		{"cert without key", Config{URL: "tls://h:1", Creds: cr, Cert: "c.pem"}, "both the certificate and its key"},
		{"missing CA file", Config{URL: "tls://h:1", Creds: cr, CA: "/nonexistent/ca.pem"}, "no such file"},
		{"bad scheme", Config{URL: "http://127.0.0.1:4222", Creds: cr}, "scheme"},
		{"no URL", Config{Creds: cr}, "no NATS URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestEnvRoundTrip(t *testing.T) {
	c := Config{URL: "tls://a:1,tls://b:2", CredsFile: "/run/creds", CA: "/ca.pem", Insecure: true}
	env := map[string]string{}
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got := FromEnv(func(k string) string { return env[k] })
	if got.URL != c.URL || got.CredsFile != c.CredsFile || got.CA != c.CA || !got.Insecure {
		t.Fatalf("%+v", got)
	}
}

// tlsServer starts a nats-server on loopback that requires TLS and a user.
func tlsServer(t *testing.T, dir string, verifyClients bool) (url string, ca testpki.CA, user creds.Credentials) {
	t.Helper()
	ca = testpki.NewCA(t, dir, "server")
	cert, key := ca.Issue(t, dir, "server")
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: ca.File, Verify: verifyClients})
	if err != nil {
		t.Fatal(err)
	}
	user = creds.Credentials{User: "job-a", Password: "pw-a"}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, TLS: true, TLSConfig: tc,
		TLSVerify: verifyClients, Users: []*server.User{{Username: user.User, Password: user.Password}}}
	s := startServer(t, opts)
	return strings.Replace(s.ClientURL(), "nats://", "tls://", 1), ca, user
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	url, authority, user := tlsServer(t, dir, false)
	ca, otherCA := authority.File, testpki.NewCA(t, dir, "other").File
	good := Config{URL: url, CA: ca, Creds: &user, Timeout: 2 * time.Second}
	nc, err := Connect(good)
	if err != nil {
		t.Fatalf("TLS with the right CA: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("connection not over TLS")
	}
	nc.Close()

	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"server certificate from another CA", Config{URL: url, CA: otherCA, Creds: &user, Timeout: 2 * time.Second}, "certificate"},
		{"plaintext client", Config{URL: strings.Replace(url, "tls://", "nats://", 1), Creds: &user, Timeout: 2 * time.Second}, ""},
		{"wrong password", Config{URL: url, CA: ca, Creds: &creds.Credentials{User: "job-a", Password: "nope"}, Timeout: 2 * time.Second}, "authorization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := Connect(tc.cfg, nats.NoReconnect())
			if err == nil {
				// nats.go upgrades a nats:// URL when the server requires TLS, but
				// only with a verifiable certificate: without our CA it must fail.
				nc.Close()
				t.Fatalf("connected")
			}
			if tc.want != "" && !strings.Contains(strings.ToLower(err.Error()), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestClientCertificate(t *testing.T) {
	dir := t.TempDir()
	url, ca, user := tlsServer(t, dir, true)
	cert, key := ca.Issue(t, dir, "client")
	nc, err := Connect(Config{URL: url, CA: ca.File, Creds: &user, Cert: cert, Key: key, Timeout: 2 * time.Second}, nats.NoReconnect())
	if err != nil {
		t.Fatalf("a client certificate from the server's CA: %v", err)
	}
	nc.Close()
	otherCert, otherKey := testpki.NewCA(t, dir, "other").Issue(t, dir, "stranger")
	if nc, err := Connect(Config{URL: url, CA: ca.File, Creds: &user, Cert: otherCert, Key: otherKey, Timeout: 2 * time.Second}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a client certificate from an unknown CA was accepted")
	}
	if nc, err := Connect(Config{URL: url, CA: ca.File, Creds: &user, Timeout: 2 * time.Second}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a server that verifies clients accepted one without a certificate")
	}
}
