package collective

import (
	"fmt"
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// ArenaTransport is a Transport whose ranks map each other's shared-memory
// arenas (transport shm): a rank's buffers from its arena (AllocShared) can
// be read by its peers with a plain memory copy, which the arena algorithms
// (arenaalgo.go) do. Collective asks a Transport for it with a type
// assertion; a transport without arenas does not implement it.
type ArenaTransport interface {
	Transport
	// Arena is this rank's own arena, nil when it has none.
	Arena() Arena
	// PeerArena is the data region of rank's arena as mapped here (nil
	// without one, or once closed). What it returns may be read only
	// between ReadArenas and the function ReadArenas returns.
	PeerArena(rank int) []byte
	// ReadArenas keeps the peers' arenas mapped until the returned
	// function is called.
	ReadArenas() (release func())
}

// Arena hands out the buffers of a rank's arena.
type Arena interface {
	// Alloc hands out n bytes (rounded up to whole pages).
	Alloc(n int) ([]byte, error)
	// Offset returns where b starts in the arena, if it lies in it.
	Offset(b []byte) (int, bool)
	// Release gives back the buffer that starts at b.
	Release(b []byte) error
}

// arenaOf returns w's own arena, nil without one.
func arenaOf(w *World) Arena {
	if at, ok := w.t.(ArenaTransport); ok {
		return at.Arena()
	}
	return nil
}

// AllocShared returns n elements of shared memory from w's arena: collectives over
// buffers from it, on every member, copy each byte once (see arenaalgo.go). It
// is valid until FreeShared (and stays mapped after Close). Without an arena (a
// transport other than shm, or MESHRUN_SHM_ARENA=0) or when it is full it
// returns an error; make is then the fallback, and the collectives work the
// same, through the rings.
func AllocShared[T Float](w *World, n int) ([]T, error) {
	a := arenaOf(w)
	if a == nil {
		return nil, fmt.Errorf("%w: no shared-memory arena on the %s transport", ErrInvalid, w.t.Name())
	}
	var zero T
	b, err := a.Alloc(n * int(unsafe.Sizeof(zero)))
	if err != nil {
		return nil, err
	}
	return asElems[T](b), nil
}

// FreeShared gives back a buffer AllocShared returned.
func FreeShared[T Float](w *World, s []T) error {
	a := arenaOf(w)
	if a == nil {
		return fmt.Errorf("%w: no shared-memory arena on the %s transport", ErrInvalid, w.t.Name())
	}
	return a.Release(asBytes(s))
}

// SharedHost returns host memory whose tensors come from w's arena while it
// has room (and from the Go heap after that, or on a transport without an
// arena): a program that allocates its host tensors from it gets the arena
// algorithms for every collective over them without asking. Everything but
// Alloc and Free is host's (tensor.Host).
func SharedHost(w *World) tensor.Memory {
	if arenaOf(w) == nil {
		return tensor.Host
	}
	return sharedHost{Memory: tensor.Host, w: w}
}

type sharedHost struct {
	tensor.Memory
	w *World
}

func (m sharedHost) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := tensor.NumElements(shape)
	if n > 0 {
		var t *tensor.Tensor
		var err error
		switch dt {
		case tensor.Float32:
			var b []float32
			if b, err = AllocShared[float32](m.w, n); err == nil {
				t, err = tensor.FromFloat32(b, shape...)
			}
		case tensor.Float64:
			var b []float64
			if b, err = AllocShared[float64](m.w, n); err == nil {
				t, err = tensor.FromFloat64(b, shape...)
			}
		case tensor.BFloat16:
			var b []tensor.BF16
			if b, err = AllocShared[tensor.BF16](m.w, n); err == nil {
				t, err = tensor.FromBFloat16(b, shape...)
			}
		default:
			err = ErrInvalid
		}
		if err == nil {
			return t, nil // fresh arena pages are zero
		}
	}
	return m.Memory.Alloc(dt, shape...)
}

func (m sharedHost) Free(t *tensor.Tensor) error {
	if t == nil || !t.OnHost() || t.Len() == 0 {
		return m.Memory.Free(t)
	}
	a := arenaOf(m.w)
	b := tensor.HostBytes(t)
	if _, ok := a.Offset(b); ok {
		return a.Release(b)
	}
	return m.Memory.Free(t)
}
