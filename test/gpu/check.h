// check.h — how the GPU test programs that run alone (shim_cuda.cu,
// share.cu, contexts.cu, graphs.cu) stop at the first failure: one "FAIL
// file:line what" line on stderr and exit status 1, which
// scripts/gpu-shim.sh, gpu-share.sh and gpu-graphs.sh report. (oom.cu and soak.cu report every check instead:
// reliability.h.)
#ifndef VPMM_TEST_GPU_CHECK_H
#define VPMM_TEST_GPU_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                              \
	do {                                                                  \
		cudaError_t e_ = (call);                                      \
		if (e_ != cudaSuccess) {                                      \
			fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
				cudaGetErrorString(e_));                      \
			exit(1);                                              \
		}                                                             \
	} while (0)
#define REQUIRE(cond)                                                         \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                              \
		}                                                             \
	} while (0)

#endif
