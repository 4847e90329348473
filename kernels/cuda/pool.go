//go:build cuda

package cuda

import (
	"errors"

	"gorgonia.org/cu"
)

// The provider's memory pool: a freed buffer is kept, by its rounded size,
// for the next Alloc of that size, instead of cuMemFree, which waits for
// the whole device, and cuMemAlloc, which costs tens of microseconds or more.
// Every use of a buffer is queued on the provider's one stream (kernels,
// cuBLAS, NCCL, copies), so work queued after a buffer's reuse runs after
// the work its last owner queued: no wait is needed. A failed cuMemAlloc
// releases the pool (after the stream's work) and tries once more. The GPT
// step's attention, layer norm, bias-gradient and loss scratch, freed and
// allocated anew each call, synchronized the stream each time before the
// pool.

// poolSize is the size a buffer of n bytes is allocated at and pooled by:
// n rounded up to 512 bytes, and to 2 MiB above 1 MiB.
func poolSize(n int) int {
	if n <= 1<<20 {
		return (n + 511) &^ 511
	}
	return (n + 2<<20 - 1) &^ (2<<20 - 1)
}

// take returns a buffer of at least n bytes (inside do): a pooled one, or
// a new one.
func (p *Provider) take(n int) (cu.DevicePtr, error) {
	size := poolSize(n)
	if l := p.pool[size]; len(l) > 0 {
		ptr := l[len(l)-1]
		p.pool[size] = l[:len(l)-1]
		p.pooled -= size
		return ptr, nil
	}
	ptr, err := cu.MemAlloc(int64(size))
	if err != nil && p.pooled > 0 {
		if rerr := p.releasePool(); rerr != nil {
			return 0, errors.Join(err, rerr)
		}
		ptr, err = cu.MemAlloc(int64(size))
	}
	return ptr, err
}

// give pools a buffer of n bytes that take returned (inside do).
func (p *Provider) give(ptr cu.DevicePtr, n int) {
	if p.pool == nil {
		p.pool = map[int][]cu.DevicePtr{}
	}
	size := poolSize(n)
	p.pool[size] = append(p.pool[size], ptr)
	p.pooled += size
}

// releasePool frees the pooled buffers once the stream's work is done
// (inside do).
func (p *Provider) releasePool() error {
	if p.pooled == 0 {
		return nil
	}
	err := p.sync()
	for size, l := range p.pool {
		for _, ptr := range l {
			err = errors.Join(err, cu.MemFree(ptr))
		}
		delete(p.pool, size)
	}
	p.pooled = 0
	return err
}
