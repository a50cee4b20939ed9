/* runtime.h — the runtime's allocation calls (runtime.c): what cudaMalloc
 * and its family do under the shim, and the real runtime behind them.
 * hooks.c forwards each exported runtime hook to the function of its name
 * here, with the hook's return address as `caller` (it finds the real
 * runtime of a program that loaded its own RTLD_LOCAL). Includes shim.h.
 */
#ifndef VPMM_RUNTIME_H
#define VPMM_RUNTIME_H

#include "shim.h"

cudaError_t vpmm_cudaMalloc(void **devPtr, size_t size, void *caller);
cudaError_t vpmm_cudaFree(void *devPtr, void *caller);
cudaError_t vpmm_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s, void *caller);
cudaError_t vpmm_cudaFreeAsync(void *devPtr, cudaStream_t s, void *caller);
cudaError_t vpmm_cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s,
				      void *caller);
cudaError_t vpmm_cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s, void *caller);
cudaError_t vpmm_cudaMemGetInfo(size_t *free_bytes, size_t *total, void *caller);

/* Calls the real runtime's cudaFree(NULL) to make the runtime set up its
 * context on this thread (alloc.c, for a runtime call with none). */
cudaError_t vpmm_runtime_init(void *caller);

#endif
