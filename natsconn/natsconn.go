// Package natsconn is how every meshrun process reaches NATS: the launcher, the
// workers' collective layer, tools. One place decides the security policy:
//
//   - a plaintext connection to anything but a loopback address is refused
//     unless Insecure is set: use TLS (tls:// URLs, or a CA file);
//   - with TLS the server's certificate is verified against CA (or the system
//     roots); Cert and Key add a client certificate;
//   - credentials come from a creds file (user/password, see natsconn/creds) and
//     are never passed on a command line.
//
// Workers read the same settings from the environment the launcher sets:
// MESHRUN_NATS_URL, MESHRUN_NATS_CREDS, MESHRUN_NATS_CA, MESHRUN_NATS_CERT,
// MESHRUN_NATS_KEY, MESHRUN_NATS_INSECURE.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/natsconn/creds"
	"github.com/nats-io/nats.go"
)

// ErrConfig reports settings that cannot make a safe connection.
var ErrConfig = errors.New("natsconn: bad NATS settings")

// Config is one NATS endpoint and how to authenticate to it.
type Config struct {
	// URL is one server or several, comma separated (nats://, tls://).
	URL string
	// CredsFile is a 0600 credentials file; Creds, when set, is used instead.
	CredsFile string
	Creds     *creds.Credentials
	// CA verifies the server's certificate (PEM); Cert and Key are a client
	// certificate. Any of them turns TLS on.
	CA, Cert, Key string
	// Insecure allows plaintext to a non-loopback address.
	Insecure bool
	// Name is the connection's name as the server shows it.
	Name string
	// Timeout of the connection attempt; default 5 s.
	Timeout time.Duration
}

// Environment variables a launcher sets for its workers.
const (
	EnvURL      = "MESHRUN_NATS_URL"
	EnvCreds    = "MESHRUN_NATS_CREDS"
	EnvCA       = "MESHRUN_NATS_CA"
	EnvCert     = "MESHRUN_NATS_CERT"
	EnvKey      = "MESHRUN_NATS_KEY"
	EnvInsecure = "MESHRUN_NATS_INSECURE"
)

// FromEnv reads a Config from the environment.
func FromEnv(getenv func(string) string) Config {
	if getenv == nil {
		getenv = os.Getenv
	}
	insecure, _ := strconv.ParseBool(getenv(EnvInsecure))
	return Config{URL: getenv(EnvURL), CredsFile: getenv(EnvCreds), CA: getenv(EnvCA),
		Cert: getenv(EnvCert), Key: getenv(EnvKey), Insecure: insecure}
}

// Env renders c as the environment FromEnv reads (the creds file path, never
// the secret itself).
func (c Config) Env() []string {
	out := []string{EnvURL + "=" + c.URL}
	for _, kv := range [][2]string{{EnvCreds, c.CredsFile}, {EnvCA, c.CA}, {EnvCert, c.Cert}, {EnvKey, c.Key}} {
		if kv[1] != "" {
			out = append(out, kv[0]+"="+kv[1])
		}
	}
	if c.Insecure {
		out = append(out, EnvInsecure+"=true")
	}
	return out
}

// TLS reports whether the connection uses TLS.
func (c Config) TLS() bool {
	if c.CA != "" || c.Cert != "" || c.Key != "" {
		return true
	}
	for _, u := range strings.Split(c.URL, ",") {
		if strings.HasPrefix(strings.TrimSpace(u), "tls://") {
			return true
		}
	}
	return false
}

// Validate reports every problem at once, before any connection is tried.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("no NATS URL"))
	}
	for _, raw := range strings.Split(c.URL, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("NATS URL %q: want nats://host:port or tls://host:port", raw))
			continue
		}
		if u.Scheme != "nats" && u.Scheme != "tls" {
			errs = append(errs, fmt.Errorf("NATS URL %q: scheme %q, want nats or tls", raw, u.Scheme))
		}
		if u.User != nil {
			errs = append(errs, fmt.Errorf("NATS URL %q carries credentials: put them in a creds file", redact(u)))
		}
		if !c.TLS() && !c.Insecure && !loopback(u.Hostname()) {
			errs = append(errs, fmt.Errorf("NATS URL %q is not on loopback and not TLS: use tls:// with a CA, or say --insecure", raw))
		}
	}
	if c.Creds == nil && c.CredsFile == "" {
		errs = append(errs, errors.New("no NATS credentials (a creds file)"))
	}
	if (c.Cert == "") != (c.Key == "") {
		errs = append(errs, errors.New("a client certificate needs both the certificate and its key"))
	}
	for _, f := range []string{c.CA, c.Cert, c.Key} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

func redact(u *url.URL) string {
	v := *u
	v.User = nil
	return v.String()
}

// loopback reports whether host is a loopback name or address.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Options returns the nats.go options of c (credentials and TLS).
func (c Config) Options() ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cr := c.Creds
	if cr == nil {
		r, err := creds.Read(c.CredsFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		cr = &r
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	opts := []nats.Option{nats.UserInfo(cr.User, cr.Password), nats.Timeout(timeout)}
	if c.Name != "" {
		opts = append(opts, nats.Name(c.Name))
	}
	if c.TLS() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CA != "" {
			pem, err := os.ReadFile(c.CA)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrConfig, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrConfig, c.CA)
			}
			tc.RootCAs = pool
		}
		if c.Cert != "" {
			cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
			if err != nil {
				return nil, fmt.Errorf("%w: client certificate: %v", ErrConfig, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// Connect connects with c's options followed by extra.
func Connect(c Config, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := c.Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.URL, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("natsconn: connecting to %s: %w", c.URL, err)
	}
	return nc, nil
}
