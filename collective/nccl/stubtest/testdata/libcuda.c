// A stand-in for the CUDA driver (libcuda.so.1), for package nccl's tests
// without a GPU: the binding links it for cuStreamQuery, which records its
// call in $MESHRUN_NCCL_STUB_LOG (as libnccl.c's functions do) and reports
// the stream's work done, after CUDA_ERROR_NOT_READY (600) for the first N
// queries where $MESHRUN_CUDA_STUB_NOT_READY is N.
//
// Compiled by the test (TestBinding) with gcc:
//   gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda.c
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int CUresult;
typedef struct CUstream_st *CUstream;

CUresult cuStreamQuery(CUstream stream) {
	static int queries;
	const char *nr = getenv("MESHRUN_CUDA_STUB_NOT_READY");
	CUresult r = 0;
	if (nr != NULL && __atomic_add_fetch(&queries, 1, __ATOMIC_SEQ_CST) <= atoi(nr)) r = 600;
	const char *path = getenv("MESHRUN_NCCL_STUB_LOG");
	if (path == NULL) return r;
	char line[256];
	int n = snprintf(line, sizeof line, "cuStreamQuery stream=%p result=%d tid=%ld\n", (void *)stream, r, (long)syscall(SYS_gettid));
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
	if (fd >= 0) {
		if (write(fd, line, n) != n) { /* the test finds the line missing */ }
		close(fd);
	}
	return r;
}
