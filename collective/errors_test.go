package collective_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
)

// The launcher and runlog read the culprit through protocol, which does not
// know collective's Error.
func TestCulpritThroughProtocol(t *testing.T) {
	err := fmt.Errorf("step 7: %w", &collective.Error{Kind: collective.ErrPeerLost, Rank: 5, Reporter: 3, Op: "allreduce"})
	if got := protocol.Culprit(err); got != 5 {
		t.Errorf("protocol.Culprit = %d, want 5", got)
	}
	if got := collective.Culprit(err); got != 5 {
		t.Errorf("collective.Culprit = %d, want 5", got)
	}
	unknown := &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: 2}
	if got := protocol.Culprit(unknown); got != -1 {
		t.Errorf("no culprit: %d", got)
	}
	if got := protocol.Culprit(errors.New("plain")); got != -1 {
		t.Errorf("plain error: %d", got)
	}
	if got := protocol.Culprit(nil); got != -1 {
		t.Errorf("nil: %d", got)
	}
}
