package cpu

import "sync"

// runner is a job split into parts; part i is run by one goroutine.
type runner interface{ run(part int) }

type workItem struct {
	r    runner
	part int
	wg   *sync.WaitGroup
}

// A pool of long-lived worker goroutines, grown on demand and never shrunk, so
// that a call does not start goroutines or allocate.
var (
	workCh    = make(chan workItem)
	workersMu sync.Mutex
	nworkers  int
)

func ensureWorkers(n int) {
	workersMu.Lock()
	defer workersMu.Unlock()
	for ; nworkers < n; nworkers++ {
		go func() {
			for it := range workCh {
				it.r.run(it.part)
				it.wg.Done()
			}
		}()
	}
}

// parallel runs parts 0..n-1 of r, part 0 on the calling goroutine, and returns
// when all are done.
func parallel(r runner, n int, wg *sync.WaitGroup) {
	if n <= 1 {
		r.run(0)
		return
	}
	ensureWorkers(n - 1)
	wg.Add(n - 1)
	for i := 1; i < n; i++ {
		workCh <- workItem{r, i, wg}
	}
	r.run(0)
	wg.Wait()
}

// span returns the half-open range of part t when n units are split into parts
// as evenly as possible.
func span(n, parts, t int) (int, int) {
	return t * n / parts, (t + 1) * n / parts
}

// freeList keeps large buffers for reuse. Unlike sync.Pool it is not emptied by
// the garbage collector, so packed-panel buffers survive between calls; it holds
// at most one buffer per goroutine that ever ran a part concurrently.
type freeList[T any] struct {
	mu    sync.Mutex
	items []*T
}

func (f *freeList[T]) get() *T {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.items); n > 0 {
		it := f.items[n-1]
		f.items = f.items[:n-1]
		return it
	}
	return new(T)
}

func (f *freeList[T]) put(it *T) {
	f.mu.Lock()
	f.items = append(f.items, it)
	f.mu.Unlock()
}
