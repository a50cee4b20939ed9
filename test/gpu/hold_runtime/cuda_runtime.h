// cuda_runtime.h (stand-in) — the few runtime calls test/gpu/hold.cu makes,
// over a simulated device (fake_runtime.cpp), so that the hold's logic is
// checked on a machine without a GPU (test/gpu/pressure_cpu.sh). Owns
// nothing else; never on a real build's include path.
#pragma once
#include <stddef.h>

typedef enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
} cudaError_t;

cudaError_t cudaSetDevice(int device);
cudaError_t cudaFree(void *p);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
