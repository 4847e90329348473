package natsrv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/nats-io/nats.go"
)

func TestStartPermissionsAndCreds(t *testing.T) {
	s, err := Start(Options{Jobs: []string{"j1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || s.Port() <= 0 {
		t.Fatalf("url %s port %d", s.URL(), s.Port())
	}
	// No credentials: refused.
	if nc, err := nats.Connect(s.URL(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted")
	}
	path := filepath.Join(t.TempDir(), "creds")
	if err := s.WriteCredentials("j1", path); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode().Perm())
	}
	c, err := creds.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(s.URL(), nats.UserInfo(c.User, c.Password),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, e error) { errs <- e }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("meshrun.j1.x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("meshrun.j1.x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(2 * time.Second); err != nil || string(m.Data) != "hi" {
		t.Fatalf("own subject: %v", err)
	}
	// Another job's subjects are denied.
	if _, err := nc.SubscribeSync("meshrun.j2.x"); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-errs:
		if !strings.Contains(strings.ToLower(e.Error()), "permission") {
			t.Fatalf("want permission violation, got %v", e)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("subscription to another job's subject was not refused")
	}
	// Added job works after reload.
	c2, err := s.AddJob("j2")
	if err != nil {
		t.Fatal(err)
	}
	nc2, err := nats.Connect(s.URL(), nats.UserInfo(c2.User, c2.Password))
	if err != nil {
		t.Fatal(err)
	}
	nc2.Close()
}

func TestCredsFormat(t *testing.T) {
	c := creds.Credentials{User: "u", Password: "p"}
	got, err := creds.Parse(c.Marshal())
	if err != nil || got != c {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", "user=u\n", "user=u\npassword=p\nx=1\n", "garbage\n"} {
		if _, err := creds.Parse([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p := filepath.Join(t.TempDir(), "c")
	os.WriteFile(p, c.Marshal(), 0o644)
	if _, err := creds.Read(p); err == nil {
		t.Error("0644 file accepted")
	}
}
