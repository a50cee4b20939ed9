/* alloc.h — the allocation semantics every hook shares (alloc.c): malloc and
 * free on the pool, synchronous or stream-ordered, and what the memory
 * queries answer for pool memory. Includes shim.h and streams.h.
 */
#ifndef VPMM_ALLOC_H
#define VPMM_ALLOC_H

#include "shim.h"
#include "streams.h"

/* Each returns true when it handled the call (the result in *res) and false
 * when the call must go to the real function unchanged. `stream` is as the
 * caller gave it; VPMM_NO_STREAM for the synchronous calls. `caller`: the
 * hook's return address, for finding the real runtime. */
bool vpmm_do_malloc(CUdeviceptr *out, size_t size, CUstream stream,
		    enum vpmm_via via, int device, void *caller, CUresult *res);
bool vpmm_do_free(CUdeviceptr ptr, CUstream stream, enum vpmm_via via,
		  CUresult *res);
/* Turns the driver's free bytes of the current device into what its pool
 * can still hand out: plus its reusable bytes, within VPMM_LIMIT. */
void vpmm_add_reusable(size_t *free_bytes, size_t total);
/* Where ptr lies: in a live pool allocation (with its base and size), in a
 * pool's address space but no live allocation (freed, a slab's unused
 * block: the driver would answer with the pool's mapping there), or
 * outside every pool. */
enum vpmm_where { VPMM_NOT_POOLS, VPMM_POOL_LIVE, VPMM_POOL_NOT_LIVE };
enum vpmm_where vpmm_find_live(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);

#endif
