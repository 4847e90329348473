/* Open MPI peer benchmark for bench/collective, compiled by the runner with
 * mpicc at run time. Usage: mpi_bench OPS SIZES (comma-separated). Rank 0 prints
 * one JSON line per (op, size) in the runner's format. Timing: 1 warm-up call,
 * then 3 repetitions of (barrier, K back-to-back calls); the best repetition's
 * mean is reported, as the runner does for meshrun and Gloo. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iters_for(long size) {
	long k = (32L << 20) / size;
	if (k < 3) k = 3;
	if (k > 200) k = 200;
	return (int)k;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (argc < 3) {
		if (rank == 0) fprintf(stderr, "usage: mpi_bench OPS SIZES\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	char ops[256];
	strncpy(ops, argv[1], sizeof ops - 1);
	ops[sizeof ops - 1] = 0;
	for (char *op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
		char sizes[1024];
		strncpy(sizes, argv[2], sizeof sizes - 1);
		sizes[sizeof sizes - 1] = 0;
		char *save = NULL;
		for (char *s = strtok_r(sizes, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
			long size = atol(s);
			long n = size / 4;
			float *a = malloc(size), *b = malloc(size);
			for (long i = 0; i < n; i++) a[i] = 1.0f;
			int k = iters_for(size);
			double best = 1e30;
			for (int rep = -1; rep < 3; rep++) {
				int kk = rep < 0 ? 1 : k;
				MPI_Barrier(MPI_COMM_WORLD);
				double t0 = MPI_Wtime();
				for (int i = 0; i < kk; i++) {
					if (!strcmp(op, "all_reduce"))
						MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
					else if (!strcmp(op, "all_gather"))
						MPI_Allgather(a, (int)(n / world), MPI_FLOAT, b, (int)(n / world), MPI_FLOAT, MPI_COMM_WORLD);
					else if (!strcmp(op, "reduce_scatter"))
						MPI_Reduce_scatter_block(a, b, (int)(n / world), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
				}
				double t = (MPI_Wtime() - t0) / kk;
				if (rep >= 0 && t < best) best = t;
			}
			if (rank == 0)
				printf("{\"impl\":\"mpi\",\"op\":\"%s\",\"ranks\":%d,\"bytes\":%ld,\"sec\":%.9g,\"algo\":\"mpi\"}\n", op, world, size, best);
			fflush(stdout);
			free(a);
			free(b);
		}
	}
	MPI_Finalize();
	return 0;
}
