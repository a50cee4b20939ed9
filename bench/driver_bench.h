/* driver_bench.h — what the small driver benchmarks (vmm_costs.cu,
 * async_map.cu) share: a driver call that must succeed, and the clock. They
 * are single-file programs built with nvcc; a failed call ends the program,
 * since every figure after it would be wrong. */
#ifndef VPMM_DRIVER_BENCH_H
#define VPMM_DRIVER_BENCH_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CU(x)                                                                  \
	do {                                                                   \
		CUresult r_ = (x);                                             \
		if (r_ != CUDA_SUCCESS) {                                      \
			fprintf(stderr, "%s: %d\n", #x, (int)r_);              \
			exit(1);                                               \
		}                                                              \
	} while (0)

static inline double now_us(void)
{
	timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

#endif
