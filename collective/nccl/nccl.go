//go:build cuda

package nccl

/*
#cgo LDFLAGS: -ldl -lcuda
#include <dlfcn.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The one CUDA driver function the binding calls, declared as cuda.h does
// (CUresult is an int-sized enum; CUDA_SUCCESS is 0, CUDA_ERROR_NOT_READY
// 600): building needs no CUDA header, linking the driver (-lcuda).
typedef struct CUstream_st *CUstream;
typedef int CUresult;
CUresult cuStreamQuery(CUstream hStream);
enum { MR_CUDA_SUCCESS = 0, MR_CUDA_ERROR_NOT_READY = 600 };

typedef struct { char internal[128]; } mr_uid;
typedef void *mr_comm;
typedef int mr_res;

static void *mr_lib;
static mr_res (*p_getVersion)(int *);
static mr_res (*p_getUniqueId)(mr_uid *);
static mr_res (*p_commInitRank)(mr_comm *, int, mr_uid, int);
static mr_res (*p_commAbort)(mr_comm);
static mr_res (*p_commDestroy)(mr_comm);
static mr_res (*p_commGetAsyncError)(mr_comm, mr_res *);
static const char *(*p_getErrorString)(mr_res);
static mr_res (*p_allReduce)(const void *, void *, size_t, int, int, mr_comm, void *);
static mr_res (*p_allGather)(const void *, void *, size_t, int, mr_comm, void *);
static mr_res (*p_reduceScatter)(const void *, void *, size_t, int, int, mr_comm, void *);
static mr_res (*p_broadcast)(const void *, void *, size_t, int, int, mr_comm, void *);
static mr_res (*p_reduce)(const void *, void *, size_t, int, int, int, mr_comm, void *);
static mr_res (*p_send)(const void *, size_t, int, int, mr_comm, void *);
static mr_res (*p_recv)(void *, size_t, int, int, mr_comm, void *);
static mr_res (*p_groupStart)(void);
static mr_res (*p_groupEnd)(void);

static char mr_missing[128];
#define MR_SYM(v, name) do { \
	*(void **)(&v) = dlsym(mr_lib, name); \
	if (!v) { snprintf(mr_missing, sizeof mr_missing, "undefined symbol %s (NCCL 2.10 or later needed)", name); return mr_missing; } \
} while (0)

// mr_load opens the library and resolves every function: NULL, or what failed.
static const char *mr_load(const char *path) {
	mr_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!mr_lib) return dlerror();
	MR_SYM(p_getVersion, "ncclGetVersion");
	MR_SYM(p_getUniqueId, "ncclGetUniqueId");
	MR_SYM(p_commInitRank, "ncclCommInitRank");
	MR_SYM(p_commAbort, "ncclCommAbort");
	MR_SYM(p_commDestroy, "ncclCommDestroy");
	MR_SYM(p_commGetAsyncError, "ncclCommGetAsyncError");
	MR_SYM(p_getErrorString, "ncclGetErrorString");
	MR_SYM(p_allReduce, "ncclAllReduce");
	MR_SYM(p_allGather, "ncclAllGather");
	MR_SYM(p_reduceScatter, "ncclReduceScatter");
	MR_SYM(p_broadcast, "ncclBroadcast");
	MR_SYM(p_reduce, "ncclReduce");
	MR_SYM(p_send, "ncclSend");
	MR_SYM(p_recv, "ncclRecv");
	MR_SYM(p_groupStart, "ncclGroupStart");
	MR_SYM(p_groupEnd, "ncclGroupEnd");
	return NULL;
}

static int mr_version(void) { int v = 0; p_getVersion(&v); return v; }
static mr_res mr_unique_id(char *out) { mr_uid u; mr_res r = p_getUniqueId(&u); memcpy(out, u.internal, 128); return r; }
static mr_res mr_init(uintptr_t *comm, int n, const char *id, int rank) {
	mr_uid u; memcpy(u.internal, id, 128);
	mr_comm c = NULL;
	mr_res r = p_commInitRank(&c, n, u, rank);
	*comm = (uintptr_t)c;
	return r;
}
static mr_res mr_abort(uintptr_t c) { return p_commAbort((mr_comm)c); }
static mr_res mr_destroy(uintptr_t c) { return p_commDestroy((mr_comm)c); }
static mr_res mr_async(uintptr_t c) { mr_res e = 0; mr_res r = p_commGetAsyncError((mr_comm)c, &e); return r ? r : e; }
static const char *mr_error(mr_res r) { return p_getErrorString(r); }

// The calls run on the provider's stream (the memory's Stream), the one its
// kernels run on: they start after the work queued before them, and the
// kernels queued after them wait for them. They are made with the provider's
// context current (the backend makes every call inside the memory's Run).
static mr_res mr_all_reduce(uintptr_t c, uint64_t s, uint64_t d, size_t n, int dt, int op, uintptr_t st) {
	return p_allReduce((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, dt, op, (mr_comm)c, (void *)st);
}
static mr_res mr_all_gather(uintptr_t c, uint64_t s, uint64_t d, size_t n, int dt, uintptr_t st) {
	return p_allGather((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, dt, (mr_comm)c, (void *)st);
}
static mr_res mr_reduce_scatter(uintptr_t c, uint64_t s, uint64_t d, size_t n, int dt, int op, uintptr_t st) {
	return p_reduceScatter((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, dt, op, (mr_comm)c, (void *)st);
}
static mr_res mr_broadcast(uintptr_t c, uint64_t s, uint64_t d, size_t n, int dt, int root, uintptr_t st) {
	return p_broadcast((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, dt, root, (mr_comm)c, (void *)st);
}
static mr_res mr_reduce(uintptr_t c, uint64_t s, uint64_t d, size_t n, int dt, int op, int root, uintptr_t st) {
	return p_reduce((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, dt, op, root, (mr_comm)c, (void *)st);
}
static mr_res mr_send(uintptr_t c, uint64_t b, size_t n, int dt, int peer, uintptr_t st) {
	return p_send((const void *)(uintptr_t)b, n, dt, peer, (mr_comm)c, (void *)st);
}
static mr_res mr_recv(uintptr_t c, uint64_t b, size_t n, int dt, int peer, uintptr_t st) {
	return p_recv((void *)(uintptr_t)b, n, dt, peer, (mr_comm)c, (void *)st);
}
static mr_res mr_group_start(void) { return p_groupStart(); }
static mr_res mr_group_end(void) { return p_groupEnd(); }

// mr_query: 1 when the stream's work is done, 0 while it runs, else minus
// the CUresult.
static int mr_query(uintptr_t st) {
	CUresult r = cuStreamQuery((CUstream)st);
	return r == MR_CUDA_SUCCESS ? 1 : r == MR_CUDA_ERROR_NOT_READY ? 0 : -(int)r;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/tensor"
)

// Backend is the nccl backend for CUDA tensors over the library Open loads
// from path (MESHRUN_NCCL_LIBRARY's value, read by the worker: package job;
// "" is libnccl.so.2), for a World's Options.Backends.
func Backend(path string) collective.DeviceBackend {
	return collective.NCCLBackend(tensor.CUDA, func(*collective.World) (collective.NCCL, error) { return Open(path) })
}

var (
	once     sync.Once
	loadPath string // what the process loads (the first Open's path)
	loaded   *library
	loadErr  error
)

// load opens the library once per process: the first call's path; a later
// call naming another is refused.
func load(path string) (*library, error) {
	if path == "" {
		path = "libnccl.so.2"
	}
	once.Do(func() {
		loadPath = path
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		if msg := C.mr_load(cpath); msg != nil {
			loadErr = fmt.Errorf("%s: %s", path, C.GoString(msg))
			return
		}
		v := int(C.mr_version())
		loaded = &library{name: fmt.Sprintf("NCCL %d.%d.%d", v/10000, v/100%100, v%100)}
		if v < 21000 { // ncclAvg and ncclBfloat16 came with 2.10
			loaded, loadErr = nil, fmt.Errorf("%s: NCCL %d is older than 2.10", path, v)
		}
	})
	if path != loadPath {
		return nil, fmt.Errorf("nccl: %s: this process loads %s (one library per process)", path, loadPath)
	}
	return loaded, loadErr
}

// Open loads the library at path (once per process; "" is libnccl.so.2:
// the worker passes MESHRUN_NCCL_LIBRARY's value) and returns it as the
// nccl backend's function table, or why it cannot: a file the loader cannot
// open, a function missing ("undefined symbol ncclGroupEnd (NCCL 2.10 or
// later needed)"), a version before 2.10, another path than the process
// loaded. The backend for CUDA tensors (Backend) uses it; a test can give
// it to collective.NCCLBackend for another device's memory that has a
// Stream (kernels/sim's).
func Open(path string) (collective.NCCL, error) {
	l, err := load(path)
	if err != nil {
		return nil, err
	}
	return l, nil
}

type library struct{ name string }

func (l *library) Name() string { return l.name }

func (l *library) UniqueID() ([]byte, error) {
	id := make([]byte, 128)
	if r := C.mr_unique_id((*C.char)(unsafe.Pointer(&id[0]))); r != 0 {
		return nil, ncclErr("ncclGetUniqueId", r)
	}
	return id, nil
}

// device is what the library needs of the CUDA memory (kernels/cuda's
// Memory): the provider's stream, on which every call of a communicator
// runs.
type device interface{ Stream() uintptr }

// InitRank joins the communicator. Like every call of the library, it is made
// with the provider's context current, inside the memory's Run (the
// backend's doing: see collective.NCCL); the communicator keeps that
// context and the memory's stream.
func (l *library) InitRank(mem tensor.Memory, n int, id []byte, rank int) (collective.NCCLComm, error) {
	d, ok := mem.(device)
	if !ok || d.Stream() == 0 {
		return nil, fmt.Errorf("nccl: %v memory has no stream of its own for NCCL's work", mem.Device())
	}
	if len(id) != 128 {
		return nil, fmt.Errorf("nccl: unique id of %d bytes, want 128", len(id))
	}
	c := &comm{stream: C.uintptr_t(d.Stream())}
	if res := C.mr_init(&c.h, C.int(n), (*C.char)(unsafe.Pointer(&id[0])), C.int(rank)); res != 0 {
		return nil, ncclErr("ncclCommInitRank", res)
	}
	return c, nil
}

func ncclErr(call string, r C.mr_res) error {
	return fmt.Errorf("%s: %s (ncclResult %d)", call, C.GoString(C.mr_error(r)), int(r))
}

// The enums of NCCL's API (nccl.h), stable since 2.10.
func dtype(dt tensor.DType) C.int {
	switch dt {
	case tensor.Float64:
		return 8 // ncclFloat64
	case tensor.BFloat16:
		return 9 // ncclBfloat16
	}
	return 7 // ncclFloat32
}

func redop(op collective.ReduceOp) C.int {
	switch op {
	case collective.Avg:
		return 4 // ncclAvg
	case collective.Max:
		return 2 // ncclMax
	case collective.Min:
		return 3 // ncclMin
	}
	return 0 // ncclSum
}

// comm is one communicator: its handle and the stream its work runs on. Its
// methods are called with the context current (inside the memory's Run).
type comm struct {
	h      C.uintptr_t
	stream C.uintptr_t
}

func check(name string, r C.mr_res) error {
	if r != 0 {
		return ncclErr(name, r)
	}
	return nil
}

func addr(a uintptr) C.uint64_t { return C.uint64_t(a) }

func (c *comm) AllReduce(send, recv uintptr, n int, dt tensor.DType, op collective.ReduceOp) error {
	return check("ncclAllReduce", C.mr_all_reduce(c.h, addr(send), addr(recv), C.size_t(n), dtype(dt), redop(op), c.stream))
}

func (c *comm) AllGather(send, recv uintptr, n int, dt tensor.DType) error {
	return check("ncclAllGather", C.mr_all_gather(c.h, addr(send), addr(recv), C.size_t(n), dtype(dt), c.stream))
}

func (c *comm) ReduceScatter(send, recv uintptr, n int, dt tensor.DType, op collective.ReduceOp) error {
	return check("ncclReduceScatter", C.mr_reduce_scatter(c.h, addr(send), addr(recv), C.size_t(n), dtype(dt), redop(op), c.stream))
}

func (c *comm) Broadcast(send, recv uintptr, n int, dt tensor.DType, root int) error {
	return check("ncclBroadcast", C.mr_broadcast(c.h, addr(send), addr(recv), C.size_t(n), dtype(dt), C.int(root), c.stream))
}

func (c *comm) Reduce(send, recv uintptr, n int, dt tensor.DType, op collective.ReduceOp, root int) error {
	return check("ncclReduce", C.mr_reduce(c.h, addr(send), addr(recv), C.size_t(n), dtype(dt), redop(op), C.int(root), c.stream))
}

func (c *comm) Send(buf uintptr, n int, dt tensor.DType, peer int) error {
	return check("ncclSend", C.mr_send(c.h, addr(buf), C.size_t(n), dtype(dt), C.int(peer), c.stream))
}

func (c *comm) Recv(buf uintptr, n int, dt tensor.DType, peer int) error {
	return check("ncclRecv", C.mr_recv(c.h, addr(buf), C.size_t(n), dtype(dt), C.int(peer), c.stream))
}

// Grouped runs f's calls between ncclGroupStart and ncclGroupEnd. NCCL's
// group state belongs to the thread: the backend calls Grouped inside one
// Run, which keeps the goroutine on its locked thread throughout.
func (c *comm) Grouped(f func() error) error {
	if err := check("ncclGroupStart", C.mr_group_start()); err != nil {
		return err
	}
	err := f()
	if r := C.mr_group_end(); r != 0 && err == nil {
		err = ncclErr("ncclGroupEnd", r)
	}
	return err
}

// Query reads the communicator's asynchronous error, then whether the
// stream's work has completed.
func (c *comm) Query() (bool, error) {
	if r := C.mr_async(c.h); r != 0 && r != 7 { // 7: ncclInProgress
		return false, ncclErr("ncclCommGetAsyncError", r)
	}
	switch q := C.mr_query(c.stream); {
	case q > 0:
		return true, nil
	case q < 0:
		return false, fmt.Errorf("cuStreamQuery: CUresult %d", -int(q))
	}
	return false, nil
}

func (c *comm) Abort() error { return check("ncclCommAbort", C.mr_abort(c.h)) }

func (c *comm) Destroy() error { return check("ncclCommDestroy", C.mr_destroy(c.h)) }
