package runlog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// StepsFile is the rank's per-step records: one JSON object a line, a
// StepRecord for each training step the rank ran, appended as it ends (a
// report of a running job reads what is there so far; a restarted job's
// attempts each write their own folder's).
const StepsFile = "steps.jsonl"

// StepRecord is one training step as a rank ran it. Its times add up:
// StepMS = KernelMS + CollectiveMS + OtherMS, the kernels' and the
// collectives' the sums of their traced spans in the step, OtherMS the rest
// (host work, launches, waiting).
type StepRecord struct {
	Step         int     `json:"step"`
	Loss         float64 `json:"loss"`
	StepMS       float64 `json:"step_ms"`
	KernelMS     float64 `json:"kernel_ms"`
	CollectiveMS float64 `json:"collective_ms"`
	OtherMS      float64 `json:"other_ms"`
	CommBytes    int64   `json:"comm_bytes"`
	// CollectiveBytes are CommBytes by collective kind (all_reduce,
	// all_gather, ...).
	CollectiveBytes map[string]int64 `json:"collective_bytes,omitempty"`
	// TimeMS is when the step ended, in Unix milliseconds.
	TimeMS int64 `json:"time_ms"`
}

// NewStepRecord is the record of a step of d in which the kernels took
// kernel and the collectives coll: OtherMS the rest, never negative (spans
// that overlapped are counted once at most: the parts are scaled to the
// step).
func NewStepRecord(step int, loss float64, d, kernel, coll time.Duration, commBytes int64) StepRecord {
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	if parts := kernel + coll; parts > d && parts > 0 {
		kernel = time.Duration(float64(kernel) * float64(d) / float64(parts))
		coll = d - kernel
	}
	return StepRecord{Step: step, Loss: loss, StepMS: ms(d), KernelMS: ms(kernel), CollectiveMS: ms(coll), OtherMS: ms(d - kernel - coll),
		CommBytes: commBytes, TimeMS: time.Now().UnixMilli()}
}

// Step appends rec to the rank's steps.jsonl (nothing without a folder). A
// write that fails (a full disk) is dropped, as log.jsonl's lines are.
func (r *Rank) Step(rec StepRecord) {
	if r == nil || r.dir == "" {
		return
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	r.stepsMu.Lock()
	defer r.stepsMu.Unlock()
	if r.steps == nil {
		f, err := OpenFile(filepath.Join(r.dir, StepsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND)
		if err != nil {
			if !r.stepsSaid {
				r.stepsSaid = true
				r.Log.Warn("steps.jsonl not written", zap.Error(fmt.Errorf("runlog: %w", err)))
			}
			return
		}
		r.steps = &lossyFile{f: f, name: StepsFile}
	}
	r.steps.Write(append(b, '\n'))
}
