package launch

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
)

// What the launcher writes into a job folder (job.json, summary.json,
// events.jsonl) holds no secret, for job folders are shared (--share-logs) and
// copied into bug reports; each secret is written as Redacted:
//
//   - the value of a variable or flag whose name says it is one (secretName:
//     MESHRUN_NATS_TOKEN, DB_PASSWORD, --api-key, --hf-token=...) in the argv,
//     the command and the environment recorded;
//   - the credentials in a URL (nats://user:password@host: the user and
//     password, or a token), a credentials file's content (password=...) and
//     a PEM private key, wherever they appear;
//   - the passwords of the job's NATS users, which the launcher knows (the
//     embedded server's, whose generated user names go too, and the
//     --nats-creds file's), wherever they appear.
//
// Paths are kept: the credentials file's (MESHRUN_NATS_CREDS), the TLS key's.
// What a rank prints is kept as it printed it (stdout.log, stderr.log).

// Redacted stands for a secret in the files the launcher writes.
const Redacted = "[redacted]"

// secretNameRE matches the upper-cased names of secrets; TOKEN and PASS as
// whole words at their end (--tokens and --passes are not secrets).
var secretNameRE = regexp.MustCompile(`SECRET|PASSW|PASSPHRASE|API_?KEY|PRIVATE_?KEY|ACCESS_?KEY|TOKEN([^A-Z]|$)|PASS([^A-Z]|$)`)

// secretName reports whether a variable or flag of this name holds a secret.
func secretName(name string) bool {
	return secretNameRE.MatchString(strings.ToUpper(strings.ReplaceAll(strings.TrimLeft(name, "-"), "-", "_")))
}

var (
	// urlCredsRE: the user information of a URL, JSON escapes included.
	urlCredsRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)(?:[^/?#@\s"'\\]|\\u[0-9a-fA-F]{4})+@`)
	// credsFileRE: a credentials file's password line, or a password= pair.
	credsFileRE = regexp.MustCompile(`(?i)(password\s*=\s*)[^\s"'\\&]+`)
	// pemKeyRE: a PEM private key.
	pemKeyRE = regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`)
	// envVarRE: a KEY=VALUE argument (env, docker -e) names a variable.
	envVarRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// redactArgs is a command line as recorded: the value of a secret flag
// (--password X, --token=X) and of a secret variable (API_TOKEN=X) redacted,
// and every argument through redactText.
func redactArgs(args []string) []string {
	if args == nil {
		return nil
	}
	out := make([]string, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") && strings.TrimLeft(a, "-") != "" {
			name, _, hasValue := strings.Cut(a, "=")
			if secretName(name) {
				if hasValue {
					out[i] = name + "=" + Redacted
				} else {
					out[i] = a
					if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
						i++
						out[i] = Redacted
					}
				}
				continue
			}
		} else if k, _, ok := strings.Cut(a, "="); ok && envVarRE.MatchString(k) && secretName(k) {
			out[i] = k + "=" + Redacted
			continue
		}
		out[i] = redactText(a)
	}
	return out
}

// redactEnv is an environment as recorded: secret variables' values
// redacted, the others through redactText.
func redactEnv(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		if secretName(k) {
			out[k] = Redacted
		} else {
			out[k] = redactText(v)
		}
	}
	return out
}

// redactText redacts URL credentials, credentials files' passwords, PEM
// private keys and the job's known secrets in s.
func redactText(s string) string {
	return string(redactJSON([]byte(s)))
}

// redactJSON is redactText on JSON text (what writeJSON and the events
// write): it sees secrets through JSON's escapes.
func redactJSON(b []byte) []byte {
	b = urlCredsRE.ReplaceAll(b, []byte("${1}"+Redacted+"@"))
	b = credsFileRE.ReplaceAll(b, []byte("${1}"+Redacted))
	b = pemKeyRE.ReplaceAll(b, []byte(Redacted))
	known.mu.Lock()
	defer known.mu.Unlock()
	for s := range known.n {
		b = bytes.ReplaceAll(b, []byte(s), []byte(Redacted))
		if q, _ := json.Marshal(s); len(q) > 2 && string(q[1:len(q)-1]) != s {
			b = bytes.ReplaceAll(b, q[1:len(q)-1], []byte(Redacted))
		}
	}
	return b
}

// known holds the secrets of the jobs this process runs, counted by job.
var known struct {
	mu sync.Mutex
	n  map[string]int
}

// minSecret: shorter strings are not searched for (they would match ordinary
// words); no generated or sensible password is that short.
const minSecret = 6

// noteSecrets makes the passwords of cfgs' NATS users known secrets, and
// their user names too when generated (the embedded server's), until forget
// is called.
func noteSecrets(generatedUsers bool, cfgs ...natsconn.Config) (forget func()) {
	var list []string
	for _, c := range cfgs {
		cr := c.Creds
		if cr == nil && c.CredsFile != "" {
			if r, err := creds.Read(c.CredsFile); err == nil {
				cr = &r
			}
		}
		if cr == nil {
			continue
		}
		list = append(list, cr.Password)
		if generatedUsers {
			list = append(list, cr.User)
		}
	}
	list = searchable(list)
	known.mu.Lock()
	if known.n == nil {
		known.n = map[string]int{}
	}
	for _, s := range list {
		known.n[s]++
	}
	known.mu.Unlock()
	return func() {
		known.mu.Lock()
		defer known.mu.Unlock()
		for _, s := range list {
			if known.n[s]--; known.n[s] <= 0 {
				delete(known.n, s)
			}
		}
	}
}

// searchable drops the strings shorter than minSecret, and repeats.
func searchable(list []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		if len(s) >= minSecret && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
