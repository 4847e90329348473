package launch

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
)

// TestRedact: the names that hold secrets, and what the launcher records of
// a command line, an environment and any text: secrets as [redacted], the
// rest as it was (paths, --tokens, --passes).
func TestRedact(t *testing.T) {
	for name, want := range map[string]bool{
		"MESHRUN_NATS_TOKEN": true, "MESHRUN_JOB_SECRET": true, "MESHRUN_NATS_PASS": true, "DB_PASSWORD": true,
		"HF_TOKEN": true, "--api-key": true, "--hf-token": true, "--client_secret": true, "AWS_SECRET_ACCESS_KEY": true,
		"--passphrase": true, "MESHRUN_TOKEN_FILE": true,
		"MESHRUN_NATS_CREDS": false, "MESHRUN_NATS_KEY": false, "MESHRUN_NATS_URL": false, "--tokens": false,
		"--passes": false, "--nats-creds": false, "--nats-key": false, "MASTER_PORT": false, "PWD": false,
	} {
		if got := secretName(name); got != want {
			t.Errorf("secretName(%q) = %v, want %v", name, got, want)
		}
	}

	args := []string{"launcher", "run", "--nats-creds", "/secure/job.creds", "--", "train",
		"--password", "pw1", "--token=tok1", "-api-key", "k1", "--tokens", "512", "--passes", "3",
		"HF_TOKEN=tok2", "nats://alice:pw2@nats.example:4222", "tls://tok3@nats.example", "--db-password", "--verbose",
		"https://example.com/x?password=pw3&y=1"}
	want := []string{"launcher", "run", "--nats-creds", "/secure/job.creds", "--", "train",
		"--password", Redacted, "--token=" + Redacted, "-api-key", Redacted, "--tokens", "512", "--passes", "3",
		"HF_TOKEN=" + Redacted, "nats://" + Redacted + "@nats.example:4222", "tls://" + Redacted + "@nats.example", "--db-password", "--verbose",
		"https://example.com/x?password=" + Redacted + "&y=1"}
	if got := redactArgs(args); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("redactArgs:\n got %q\nwant %q", got, want)
	}

	env := redactEnv(map[string]string{
		"MESHRUN_NATS_TOKEN": "tok", "MESHRUN_NATS_CREDS": "/run/job.creds", "MESHRUN_NATS_KEY": "/secure/client.key",
		"MESHRUN_NATS_URL": "nats://job:pw@127.0.0.1:4222", "CREDS_TEXT": "# meshrun NATS credentials\nuser=job-1\npassword=pw4\n",
		"KEY_PEM": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n", "MASTER_PORT": "29500",
	})
	for k, v := range map[string]string{
		"MESHRUN_NATS_TOKEN": Redacted, "MESHRUN_NATS_CREDS": "/run/job.creds", "MESHRUN_NATS_KEY": "/secure/client.key",
		"MESHRUN_NATS_URL": "nats://" + Redacted + "@127.0.0.1:4222", "CREDS_TEXT": "# meshrun NATS credentials\nuser=job-1\npassword=" + Redacted + "\n",
		"KEY_PEM": Redacted + "\n", "MASTER_PORT": "29500",
	} {
		if env[k] != v {
			t.Errorf("redactEnv: %s = %q, want %q", k, env[k], v)
		}
	}

	// Known secrets, as JSON writes them (& and < escaped), until forgotten.
	cfg := natsconn.Config{Creds: &creds.Credentials{User: "job-0a1b2c3d", Password: "pw&<long-secret"}}
	forget := noteSecrets(true, cfg, natsconn.Config{Creds: &creds.Credentials{User: "adm1", Password: "short"}})
	b, _ := json.Marshal(map[string]string{"error": `NATS rejected user "job-0a1b2c3d" with pw&<long-secret`, "note": "short adm1"})
	got := string(redactJSON(b))
	if strings.Contains(got, "job-0a1b2c3d") || strings.Contains(got, "long-secret") || !strings.Contains(got, `user \"[redacted]\" with [redacted]`) {
		t.Errorf("known secrets: %s", got)
	}
	if !strings.Contains(got, "short adm1") {
		t.Errorf("secrets under %d characters are not searched for: %s", minSecret, got)
	}
	forget()
	if got := redactText("pw&<long-secret"); got != "pw&<long-secret" {
		t.Errorf("a forgotten secret is still redacted: %q", got)
	}
}
