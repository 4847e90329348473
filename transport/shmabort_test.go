package transport_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/internal/testtime"
)

// TestShmAbortWakesWaiter: a receive asleep on an shm ring's futex (nothing
// sent, past its spins and yields) returns the abort's error at once when
// the link is aborted, as a World's failure or Close aborts it: not at its
// next look after a 2 ms sleep (which took 1.5-1.9 ms in the median, 0.04-0.1
// ms with the wake-up). Sixteen aborts, each on a fresh world of two ranks;
// their median is held to 0.5 ms (scaled: testtime).
func TestShmAbortWakesWaiter(t *testing.T) {
	errAbort := errors.New("test abort")
	var took []time.Duration
	for range 16 {
		ws := shmWorlds(t, 2, 0)
		tr := ws[0].Transport()
		done := make(chan error, 1)
		var want collective.Header
		go func() { done <- tr.Recv(collective.Deadline{}, 1, &want, make([]byte, 64)) }()
		time.Sleep(30 * time.Millisecond) // asleep on the futex by now
		start := time.Now()
		tr.Abort([]int{1}, errAbort)
		select {
		case err := <-done:
			took = append(took, time.Since(start))
			if !errors.Is(err, errAbort) {
				t.Fatalf("the receive returned %v, want the abort's error", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the receive never returned after the abort")
		}
	}
	slices.Sort(took)
	median := took[len(took)/2]
	t.Logf("from the abort to the receive's return: %v", took)
	if limit := testtime.Scale(500 * time.Microsecond); median > limit {
		t.Errorf("median %v from the abort to the receive's return, want < %v", median, limit)
	}
}
