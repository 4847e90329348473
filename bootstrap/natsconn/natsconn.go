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
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/nats-io/nats.go"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrConfig reports settings that cannot make a safe connection, a
	// credentials file that is missing, unreadable or garbled among them.
	ErrConfig = errors.New("natsconn: bad NATS settings")
	// ErrRefused reports a server that refused the credentials (its
	// "Authorization Violation"); the error names the credentials file.
	ErrRefused = errors.New("natsconn: NATS refused the credentials")
	// ErrPermission reports a subject the credentials' user may not use (the
	// server's asynchronous "Permissions Violation"); see Config.PermissionError.
	ErrPermission = errors.New("natsconn: NATS permission violation")
)

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
			// A *PathError names the file already; say what it is.
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, fmt.Errorf("%w: credentials file %s: %v", ErrConfig, c.CredsFile, err)
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

// Connect connects with c's options followed by extra. It tries each server
// of the URL once and returns the first answer: a server that refuses the
// credentials is reported at once (ErrRefused, naming the credentials file
// and the server's answer), never retried.
func Connect(c Config, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := c.Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.URL, append(opts, extra...)...)
	if err != nil {
		return nil, c.ConnectError(err)
	}
	return nc, nil
}

// ConnectError explains err, returned by nats.Connect with c's options: a
// refusal of the credentials wraps ErrRefused and names their file and the
// server's answer; anything else names the URL. Both wrap err.
func (c Config) ConnectError(err error) error {
	if refused(err) {
		return fmt.Errorf("%w: NATS at %s rejected %s: %w", ErrRefused, c.URL, c.CredsName(), err)
	}
	return fmt.Errorf("natsconn: connecting to %s: %w", c.URL, err)
}

// refused reports an error of the server refusing the credentials.
func refused(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// CredsName says where c's credentials come from, for errors: "credentials
// file PATH (user U)" (the user when the file is readable), or "the
// credentials of user U". Never the password.
func (c Config) CredsName() string {
	if c.Creds != nil {
		return fmt.Sprintf("the credentials of user %q", c.Creds.User)
	}
	if r, err := creds.Read(c.CredsFile); err == nil {
		return fmt.Sprintf("credentials file %s (user %q)", c.CredsFile, r.User)
	}
	return "credentials file " + c.CredsFile
}

// permissionSubject finds the subject in the server's text: `Permissions
// Violation for Publish to "S"`, `... for Subscription to "S"` or `... for
// Publish with Reply of "S"`.
var permissionSubject = regexp.MustCompile(`(?i)for (publish to|subscription to|publish with reply of) "([^"]+)"`)

// PermissionError explains err, a permissions violation nats.go reported
// (to an ErrorHandler, or as the connection's LastError): it wraps
// ErrPermission and err, and names the operation, the subject, and c's
// credentials. It returns nil when err is no permissions violation.
func (c Config) PermissionError(err error) error {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	what := "a subject"
	if m := permissionSubject.FindStringSubmatch(err.Error()); m != nil {
		op := "publish to"
		switch strings.ToLower(m[1]) {
		case "subscription to":
			op = "subscribe to"
		case "publish with reply of":
			op = "receive replies on"
		}
		what = fmt.Sprintf("%s %q", op, m[2])
	}
	return fmt.Errorf("%w: %s is not allowed for %s (server: %w)", ErrPermission, what, c.CredsName(), err)
}
