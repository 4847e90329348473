package bootstrap_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats-server/v2/server"
)

// failFastBound is how soon a join that cannot succeed must fail: far below
// the rendezvous timeout (30 s by default, left at its default here).
const failFastBound = 2 * time.Second

// joinFails joins with cfg, which must fail, within failFastBound; it returns
// the error.
func joinFails(t *testing.T, cfg bootstrap.Config) error {
	t.Helper()
	start := time.Now()
	w, err := bootstrap.Join(context.Background(), cfg)
	took := time.Since(start)
	if err == nil {
		w.Close()
		t.Fatalf("rank %d joined", cfg.Rank)
	}
	t.Logf("rank %d: failed after %v: %v", cfg.Rank, took.Round(time.Millisecond), err)
	if took > failFastBound {
		t.Errorf("rank %d: failed after %v, want < %v", cfg.Rank, took, failFastBound)
	}
	return err
}

// TestJoinPermissionViolation: a rank whose credentials belong to another job
// (MESHRUN_JOB_ID is not theirs) fails its join at once with ErrPermission,
// naming the subject the server refused, instead of waiting out the
// rendezvous. Rank 0 (which subscribes to the rendezvous) and any other rank
// (which publishes its announce) alike.
func TestJoinPermissionViolation(t *testing.T) {
	mine, other := bootstraptest.NewJob(), bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, mine, other)
	otherCreds, _ := s.Credentials(other)
	for _, rank := range []int{0, 1} {
		err := joinFails(t, bootstrap.Config{Rank: rank, WorldSize: 2, Job: mine, NATSURL: s.URL(), Creds: &otherCreds, Transport: "tcp"})
		if !errors.Is(err, collective.ErrPermission) {
			t.Errorf("rank %d: error %v, want ErrPermission", rank, err)
		}
		for _, want := range []string{`"meshrun.` + mine + `.`, "Permissions Violation", `MESHRUN_JOB_ID is "` + mine + `"`, otherCreds.User} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: error %q lacks %q", rank, err, want)
			}
		}
		if strings.Contains(err.Error(), otherCreds.Password) {
			t.Errorf("rank %d: error leaks the password", rank)
		}
	}
}

// TestJoinPublishViolation: a user that may read the job's subjects but not
// publish its rendezvous announce: the server says so asynchronously, and the
// join fails at once naming the subject instead of waiting for a roster.
func TestJoinPublishViolation(t *testing.T) {
	job := bootstraptest.NewJob()
	user := creds.Credentials{User: "reader", Password: "pw-reader"}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, Users: []*server.User{{
		Username: user.User, Password: user.Password,
		Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{protocol.ControlSubjects(job), protocol.JoiningSubjects(job), "_INBOX.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{protocol.JobSubjects(job), "_INBOX.>"}},
		},
	}}}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(ns.Shutdown)
	err = joinFails(t, bootstrap.Config{Rank: 1, WorldSize: 2, Job: job, NATSURL: ns.ClientURL(), Creds: &user, Transport: "tcp"})
	if !errors.Is(err, collective.ErrPermission) || !strings.Contains(err.Error(), `publish to "`+protocol.RendezvousSubject(job)+`"`) {
		t.Errorf("error %v, want ErrPermission naming the rendezvous subject", err)
	}
}

// TestJoinCredentialsErrors: a credentials file that is missing, garbled,
// readable by others, or that the server rejects fails the join at once,
// naming the file (and, for a rejection, the server's answer); the connection
// is tried once per listed server, not retried.
func TestJoinCredentialsErrors(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	good, _ := s.Credentials(job)
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wrong := creds.Credentials{User: good.User, Password: "not-the-password"}
	stranger := creds.Credentials{User: "nobody", Password: "nothing"}
	for _, tc := range []struct {
		name, file, url string
		kind            error
		want            []string
	}{
		{"missing", filepath.Join(dir, "missing.creds"), "", collective.ErrInvalid, []string{"no such file"}},
		{"garbled", write("garbled.creds", "user job\npassword\n", 0o600), "", collective.ErrInvalid, []string{"line 1 has no '='"}},
		{"readable by others", write("open.creds", string(good.Marshal()), 0o644), "", collective.ErrInvalid, []string{"want 0600"}},
		{"wrong password", write("wrong.creds", string(wrong.Marshal()), 0o600), "", collective.ErrAuth, []string{"Authorization Violation", good.User}},
		{"unknown user", write("stranger.creds", string(stranger.Marshal()), 0o600), "", collective.ErrAuth, []string{"Authorization Violation", `"nobody"`}},
		{"wrong password, two servers listed", filepath.Join(dir, "wrong.creds"), s.URL() + "," + s.URL(), collective.ErrAuth, []string{"Authorization Violation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if url == "" {
				url = s.URL()
			}
			err := joinFails(t, bootstrap.Config{Rank: 1, WorldSize: 2, Job: job, NATSURL: url, CredsFile: tc.file, Transport: "tcp"})
			if !errors.Is(err, tc.kind) {
				t.Errorf("error %v, want %v", err, tc.kind)
			}
			for _, want := range append([]string{tc.file}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), good.Password) || strings.Contains(err.Error(), wrong.Password) {
				t.Error("error leaks a password")
			}
		})
	}
}
