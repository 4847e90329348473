package bootstrap_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
)

func TestConformanceTCP(t *testing.T) { collectivetest.Run(t, bootstraptest.JoinedWorlds("tcp")) }

func TestRendezvousMissingRank(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	cfgs := []bootstrap.Config{bootstraptest.Config(s, job, 0, 3, "tcp", collective.Options{}), bootstraptest.Config(s, job, 1, 3, "tcp", collective.Options{})}
	for i := range cfgs {
		cfgs[i].RendezvousTimeout = time.Second
	}
	start := time.Now()
	_, errs := bootstraptest.JoinAll(cfgs)
	for r, err := range errs {
		if !errors.Is(err, collective.ErrRendezvous) || !strings.Contains(err.Error(), "missing ranks [2]") {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestRendezvousDuplicateRank(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	o := collective.Options{}
	cfgs := []bootstrap.Config{bootstraptest.Config(s, job, 0, 3, "tcp", o), bootstraptest.Config(s, job, 1, 3, "tcp", o), bootstraptest.Config(s, job, 1, 3, "tcp", o)}
	for i := range cfgs {
		cfgs[i].RendezvousTimeout = 5 * time.Second
	}
	_, errs := bootstraptest.JoinAll(cfgs)
	for r, err := range errs {
		if !errors.Is(err, collective.ErrRendezvous) || !strings.Contains(err.Error(), "duplicate rank 1") {
			t.Fatalf("join %d: %v", r, err)
		}
	}
}

func TestEnvConfig(t *testing.T) {
	t.Setenv("RANK", "x")
	t.Setenv("WORLD_SIZE", "")
	t.Setenv("MESHRUN_JOB_ID", "")
	t.Setenv("MESHRUN_TRANSPORT", "carrier-pigeon")
	c := bootstrap.EnvConfig()
	err := c.Validate()
	for _, want := range []string{"RANK=\"x\"", "WORLD_SIZE is not set", "no job id", "no NATS url", "carrier-pigeon"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MESHRUN_JOB_ID", "j")
	t.Setenv("MESHRUN_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("MESHRUN_NATS_CREDS", "/nonexistent")
	t.Setenv("MESHRUN_TRANSPORT", "tcp")
	c = bootstrap.EnvConfig()
	if err := c.Validate(); err != nil || c.Rank != 1 || c.WorldSize != 2 {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestAbortAndHeartbeats(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	n := 3
	cfgs := make([]bootstrap.Config, n)
	for i := range cfgs {
		cfgs[i] = bootstraptest.Config(s, job, i, n, "tcp", collective.Options{})
		cfgs[i].HeartbeatInterval = 100 * time.Millisecond
	}
	ws, errs := bootstraptest.JoinAll(cfgs)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, w := range ws {
			w.Close()
		}
	}()
	nc := bootstraptest.AdminConn(t, s)
	var mu sync.Mutex
	latest := map[int]protocol.State{}
	notices := make(chan protocol.Notice, 16)
	// What the launcher reads of the control plane, with nats.go and protocol only.
	nsub, err := nc.Subscribe(protocol.NoticeSubjects(job), func(m *nats.Msg) {
		if n, ok := protocol.ParseNotice(job, m.Subject, m.Data); ok {
			notices <- n
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nsub.Unsubscribe()
	sub, err := nc.Subscribe(protocol.HeartbeatSubjects(job), func(m *nats.Msg) {
		if st, ok := protocol.ParseHeartbeat(job, m.Subject, m.Data); ok {
			mu.Lock()
			latest[st.Rank] = st
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// Ranks 0 and 1 enter an all-reduce on the world; rank 2 never does.
	res := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func() {
			c, err := ws[r].WorldGroup(context.Background())
			if err == nil {
				err = collective.AllReduce(context.Background(), c, make([]float32, 10), collective.Sum)
			}
			res <- err
		}()
	}
	go ws[2].WorldGroup(context.Background())
	time.Sleep(700 * time.Millisecond)
	mu.Lock()
	hangs := protocol.Hangs(latest, time.Now(), 300*time.Millisecond)
	mu.Unlock()
	if len(hangs) != 1 || fmt.Sprint(hangs[0].Missing) != "[2]" || hangs[0].Op != "all_reduce" {
		t.Fatalf("hangs %v", hangs)
	}
	start := time.Now()
	abort, _ := json.Marshal(protocol.AbortNotice("launcher: rank 2 hung"))
	if err := nc.Publish(protocol.AbortSubject(job), abort); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 2; r++ {
		err := <-res
		if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), "rank 2 hung") {
			t.Fatalf("%v", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("abort took %v", d)
	}
	select {
	case n := <-notices:
		if !n.Abort || !strings.Contains(n.Detail, "rank 2 hung") {
			t.Fatalf("notice %+v", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no abort notice seen")
	}
	for i := 0; i < 100 && ws[2].Err() == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(ws[2].Err(), collective.ErrAborted) {
		t.Fatalf("rank 2: %v", ws[2].Err())
	}
}

func TestConformanceNATS(t *testing.T) { collectivetest.Run(t, bootstraptest.JoinedWorlds("nats")) }

func TestConformanceShm(t *testing.T) { collectivetest.Run(t, bootstraptest.JoinedWorlds("shm")) }

func TestConformanceShmSingleCopy(t *testing.T) {
	collectivetest.Run(t, bootstraptest.JoinedWorldsWith("shm", func(c *bootstrap.Config) { c.Shm.SingleCopy = true }))
}
