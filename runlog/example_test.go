package runlog_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshrun/meshrun/runlog"
)

// A rank opens its logs from the launcher's environment, traces its work in
// spans and closes the logs before it exits.
func Example() {
	dir, _ := os.MkdirTemp("", "rank-")
	defer os.RemoveAll(dir)
	env := map[string]string{runlog.EnvRankDir: dir, "RANK": "3", "MESHRUN_JOB_ID": "demo"}
	rl, err := runlog.Open(runlog.Options{Getenv: func(k string) string { return env[k] }, NoSignal: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	sp := rl.Span("allreduce", "collective")
	rl.Log.Info("step done")
	sp.End()
	rl.Close()

	b, _ := os.ReadFile(filepath.Join(dir, runlog.TraceFile))
	var events []struct {
		Name string `json:"name"`
		Ph   string `json:"ph"`
		PID  int    `json:"pid"`
	}
	json.Unmarshal(b, &events)
	for _, e := range events {
		if e.Ph == "X" {
			fmt.Printf("span %s on rank %d\n", e.Name, e.PID)
		}
	}
	// Output:
	// span allreduce on rank 3
}
