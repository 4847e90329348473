package bootstrap_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
)

// TestTransportNone: ranks joined with transport "none" (bench/control's
// simulated ranks) run the real control plane: a collective fails with
// ErrInvalid, an abort fails every rank with ErrAborted.
func TestTransportNone(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	ws := bootstraptest.JoinWorlds(t, s, job, 3, "none", collective.Options{})
	defer func() {
		for _, w := range ws {
			w.Close()
		}
	}()
	nc := bootstraptest.AdminConn(t, s)
	body, _ := json.Marshal(protocol.AbortNotice("test"))
	nc.Publish(protocol.AbortSubject(job), body)
	nc.Flush()
	for r, w := range ws {
		for i := 0; i < 200 && w.Err() == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if !errors.Is(w.Err(), collective.ErrAborted) {
			t.Errorf("rank %d: %v, want ErrAborted", r, w.Err())
		}
	}
	job2 := bootstraptest.NewJob()
	s2 := bootstraptest.StartServer(t, job2)
	ws2 := bootstraptest.JoinWorlds(t, s2, job2, 2, "none", collective.Options{})
	defer func() {
		for _, w := range ws2 {
			w.Close()
		}
	}()
	if _, err := ws2[0].WorldGroup(context.Background()); err == nil || !strings.Contains(err.Error(), `transport "none" carries no data`) {
		t.Fatalf("world group over transport none: %v, want the transport's refusal", err)
	}
}
