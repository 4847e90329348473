//go:build cgo

package cudadriver

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_name_fn)(int, const char **);

// open_lib loads lib; on failure it returns NULL with the loader's reason
// (dlerror's message is per thread: asked on the thread that failed).
static void *open_lib(const char *lib, char *why, size_t n) {
	dlerror();
	void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(why, n, "%s", e ? e : "");
	}
	return h;
}

static int call_init(void *f) { return ((cu_init_fn)f)(0); }
static int call_count(void *f, int *n) { return ((cu_count_fn)f)(n); }
static const char *call_name(void *f, int code) {
	const char *s = NULL;
	if (f == NULL || ((cu_name_fn)f)(code, &s) != 0) return NULL;
	return s;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// mu serializes the loads: one driver initialization at a time.
var mu sync.Mutex

func count(lib string) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	name := C.CString(lib)
	defer C.free(unsafe.Pointer(name))
	var why [512]C.char
	h := C.open_lib(name, &why[0], C.size_t(len(why)))
	if h == nil {
		reason := C.GoString(&why[0])
		if reason == "" {
			reason = lib + ": cannot be loaded"
		}
		return 0, fmt.Errorf("%w: %s", ErrNoDriver, reason)
	}
	// The handle stays open: the driver is not unloaded once initialized.
	sym := func(s string) unsafe.Pointer {
		cs := C.CString(s)
		defer C.free(unsafe.Pointer(cs))
		return C.dlsym(h, cs)
	}
	initFn, countFn, nameFn := sym("cuInit"), sym("cuDeviceGetCount"), sym("cuGetErrorName")
	if initFn == nil || countFn == nil {
		return 0, fmt.Errorf("%s has no cuInit or cuDeviceGetCount: not the NVIDIA driver", lib)
	}
	fail := func(call string, code C.int) error {
		e := &cuError{call: call, code: int(code)}
		if s := C.call_name(nameFn, code); s != nil {
			e.name = C.GoString(s)
		}
		return e
	}
	switch r := C.call_init(initFn); r {
	case 0:
	case errNoDevice:
		return 0, nil
	default:
		return 0, fail("cuInit", r)
	}
	var n C.int
	if r := C.call_count(countFn, &n); r != 0 {
		return 0, fail("cuDeviceGetCount", r)
	}
	return int(n), nil
}
