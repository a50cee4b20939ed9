/* torch.h — PyTorch's CUDAPluggableAllocator pair (torch.c): hooks.c
 * forwards vpmm_torch_malloc and vpmm_torch_free here. Includes shim.h.
 */
#ifndef VPMM_TORCH_H
#define VPMM_TORCH_H

#include <sys/types.h>

#include "shim.h"

/* caller: the return address of the exported entry point (torch.c: who
 * gets a C++ exception on failure). */
void *vpmm_pluggable_malloc(ssize_t size, int device, cudaStream_t stream, void *caller);
void vpmm_pluggable_free(void *ptr, ssize_t size, int device, cudaStream_t stream);

#endif
