package job

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"

	"github.com/meshrun/meshrun/collective"
)

// InProcess runs fn on n ranks in this process, over the in-process transport,
// and returns the ranks' errors (a failing rank fails every rank's
// collectives), each different one once: ranks that agreed on an outcome
// (a checkpoint save that failed) return the same error.
// MESHRUN_COLLECTIVES chooses the backend of device buffers, as in a job,
// and MESHRUN_NCCL_LIBRARY the nccl backend's library (collectiveBackends):
// InProcess reads them from the process environment, as the worker's own
// in-process ranks read them from its Env.
func InProcess(ctx context.Context, n int, fn func(ctx context.Context, w *collective.World) error) error {
	return inProcess(ctx, os.Getenv, n, fn)
}

// inProcess is InProcess with the settings read from getenv.
func inProcess(ctx context.Context, getenv func(string) string, n int, fn func(ctx context.Context, w *collective.World) error) error {
	ts, cs := collective.LocalTransports(n), collective.LocalControls(n)
	ws := make([]*collective.World, n)
	for i := range ws {
		w, err := collective.NewWorld(ts[i], cs[i], collective.Options{Job: "in-process", Collectives: getenv(collective.EnvBackend), Backends: collectiveBackends(getenv)})
		if err != nil {
			return err
		}
		ws[i] = w
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = fn(ctx, w); errs[i] != nil {
				w.Fail(errs[i])
			}
		}()
	}
	wg.Wait()
	for _, w := range ws {
		w.Close()
	}
	var distinct []error
	for _, err := range errs {
		if err != nil && !slices.ContainsFunc(distinct, func(d error) bool { return d.Error() == err.Error() }) {
			distinct = append(distinct, err)
		}
	}
	return errors.Join(distinct...)
}
