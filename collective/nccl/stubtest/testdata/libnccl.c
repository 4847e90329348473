// A stand-in for libnccl.so.2, for package nccl's tests without a GPU:
// each function records its call and arguments, one line a call, in the
// file $MESHRUN_NCCL_STUB_LOG, and moves nothing (the addresses are never
// dereferenced: sim device addresses are not the process's).
//
// Compiled by the test (TestBinding) with gcc:
//   gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl.so.2 libnccl.c
// -DSTUB_VERSION=N reports version N (default 22105, NCCL 2.21.5);
// -DSTUB_OMIT_GROUPEND leaves ncclGroupEnd out, as a library before 2.10
// lacks functions the binding needs.
//
// A line is "NAME key=value ...", every one with tid= (the calling OS
// thread); comm= is the handle ncclCommInitRank gave. The asynchronous
// error of the communicator of rank R is V where $MESHRUN_NCCL_STUB_ASYNC
// holds "R:V" (several separated by commas), else ncclSuccess.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef STUB_VERSION
#define STUB_VERSION 22105
#endif

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct stub_comm { int nranks, rank; } *ncclComm_t;
typedef int ncclResult_t;
typedef void *cudaStream_t;

static void record(const char *fmt, ...) {
	const char *path = getenv("MESHRUN_NCCL_STUB_LOG");
	if (path == NULL) return;
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line - 64, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof line - 64) n = sizeof line - 65;
	n += snprintf(line + n, 64, " tid=%ld\n", (long)syscall(SYS_gettid));
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
	if (fd < 0) return;
	if (write(fd, line, n) != n) { /* the test finds the line missing */ }
	close(fd);
}

ncclResult_t ncclGetVersion(int *version) {
	*version = STUB_VERSION;
	record("ncclGetVersion version=%d", STUB_VERSION);
	return 0;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	static int serial;
	memset(id->internal, 0, sizeof id->internal);
	snprintf(id->internal, sizeof id->internal, "stub-id-%d", ++serial);
	id->internal[127] = 0x5a; // the last byte travels too
	record("ncclGetUniqueId id=%s", id->internal);
	return 0;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
	struct stub_comm *c = malloc(sizeof *c);
	c->nranks = nranks;
	c->rank = rank;
	*comm = c;
	record("ncclCommInitRank comm=%p nranks=%d rank=%d id=%s last=%d", (void *)c, nranks, rank, id.internal, id.internal[127]);
	return 0;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
	record("ncclCommAbort comm=%p", (void *)comm);
	return 0;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
	record("ncclCommDestroy comm=%p", (void *)comm);
	return 0;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
	*asyncError = 0;
	const char *spec = getenv("MESHRUN_NCCL_STUB_ASYNC");
	for (const char *p = spec; p != NULL && *p != 0;) {
		int rank, value, used = 0;
		if (sscanf(p, "%d:%d%n", &rank, &value, &used) != 2) break;
		if (rank == comm->rank) *asyncError = value;
		p += used;
		if (*p == ',') p++;
	}
	record("ncclCommGetAsyncError comm=%p result=%d", (void *)comm, *asyncError);
	return 0;
}

const char *ncclGetErrorString(ncclResult_t result) {
	switch (result) {
	case 0: return "no error";
	case 1: return "unhandled cuda error";
	case 2: return "unhandled system error";
	case 3: return "internal error";
	case 4: return "invalid argument";
	case 5: return "invalid usage";
	case 6: return "remote process exited or there was a network error";
	case 7: return "NCCL operation in progress";
	}
	return "unknown result code";
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op, ncclComm_t comm, cudaStream_t stream) {
	record("ncclAllReduce comm=%p send=%p recv=%p count=%zu datatype=%d op=%d stream=%p", (void *)comm, send, recv, count, datatype, op, stream);
	return 0;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int datatype, ncclComm_t comm, cudaStream_t stream) {
	record("ncclAllGather comm=%p send=%p recv=%p count=%zu datatype=%d stream=%p", (void *)comm, send, recv, sendcount, datatype, stream);
	return 0;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int datatype, int op, ncclComm_t comm, cudaStream_t stream) {
	record("ncclReduceScatter comm=%p send=%p recv=%p count=%zu datatype=%d op=%d stream=%p", (void *)comm, send, recv, recvcount, datatype, op, stream);
	return 0;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int datatype, int root, ncclComm_t comm, cudaStream_t stream) {
	record("ncclBroadcast comm=%p send=%p recv=%p count=%zu datatype=%d root=%d stream=%p", (void *)comm, send, recv, count, datatype, root, stream);
	return 0;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int datatype, int op, int root, ncclComm_t comm, cudaStream_t stream) {
	record("ncclReduce comm=%p send=%p recv=%p count=%zu datatype=%d op=%d root=%d stream=%p", (void *)comm, send, recv, count, datatype, op, root, stream);
	return 0;
}

ncclResult_t ncclSend(const void *send, size_t count, int datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
	record("ncclSend comm=%p send=%p count=%zu datatype=%d peer=%d stream=%p", (void *)comm, send, count, datatype, peer, stream);
	return 0;
}

ncclResult_t ncclRecv(void *recv, size_t count, int datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
	record("ncclRecv comm=%p recv=%p count=%zu datatype=%d peer=%d stream=%p", (void *)comm, recv, count, datatype, peer, stream);
	return 0;
}

ncclResult_t ncclGroupStart(void) {
	record("ncclGroupStart");
	return 0;
}

#ifndef STUB_OMIT_GROUPEND
ncclResult_t ncclGroupEnd(void) {
	record("ncclGroupEnd");
	return 0;
}
#endif
