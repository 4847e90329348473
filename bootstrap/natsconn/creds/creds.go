// Package creds reads and writes the credentials file a meshrun worker uses to
// reach the job's NATS server (MESHRUN_NATS_CREDS). It has no dependency on the
// server so that workers do not link nats-server.
//
// The file is plain text, mode 0600, one key=value per line; blank lines and
// lines starting with '#' are ignored:
//
//	# meshrun NATS credentials
//	user=job-0192...
//	password=4f1c...
//
// Unknown keys are an error, so a typo is not silently ignored.
package creds

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Credentials is a NATS user and password.
type Credentials struct {
	User     string
	Password string
}

// ErrFormat reports a malformed credentials file.
var ErrFormat = errors.New("creds: malformed credentials file")

// Marshal renders c in the file format.
func (c Credentials) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString("# meshrun NATS credentials\n")
	fmt.Fprintf(&b, "user=%s\npassword=%s\n", c.User, c.Password)
	return b.Bytes()
}

// Parse reads the file format.
func Parse(data []byte) (Credentials, error) {
	var c Credentials
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return Credentials{}, fmt.Errorf("%w: line %d has no '='", ErrFormat, line)
		}
		switch strings.TrimSpace(k) {
		case "user":
			c.User = strings.TrimSpace(v)
		case "password":
			c.Password = strings.TrimSpace(v)
		default:
			return Credentials{}, fmt.Errorf("%w: line %d: unknown key %q", ErrFormat, line, k)
		}
	}
	if c.User == "" || c.Password == "" {
		return Credentials{}, fmt.Errorf("%w: user and password are both required", ErrFormat)
	}
	return c, nil
}

// Write writes c to path with mode 0600, replacing any existing file atomically.
func Write(path string, c Credentials) error {
	tmp, err := os.CreateTemp(dirOf(path), ".creds-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		os.Remove(name)
		return err
	}
	if _, err := tmp.Write(c.Marshal()); err != nil {
		tmp.Close()
		os.Remove(name)
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return err
	}
	return os.Rename(name, path)
}

// Read reads a credentials file. It refuses a file readable or writable by
// group or others.
func Read(path string) (Credentials, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Credentials{}, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return Credentials{}, fmt.Errorf("%w: %s has mode %v, want 0600", ErrFormat, path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, err
	}
	return Parse(data)
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		if i == 0 {
			return "/"
		}
		return path[:i]
	}
	return "."
}
