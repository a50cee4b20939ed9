/* mempool.h — CUDA's memory pools under the shim (mempool.c): the pool a
 * program chose for a device, and the answers of the device's default
 * pool. hooks.c forwards each exported hook to the function of its name
 * with vpmm_ in front. Includes shim.h only.
 */
#ifndef VPMM_MEMPOOL_H
#define VPMM_MEMPOOL_H

#include "shim.h"

/* Whether the program made a pool of its own current for `dev`
 * (cuDeviceSetMemPool): its stream-ordered allocations are then CUDA's. */
bool vpmm_mempool_chosen(int dev);

CUresult vpmm_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult vpmm_cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			      CUmemoryPool pool);
CUresult vpmm_cuMemPoolDestroy(CUmemoryPool pool);
CUresult vpmm_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
				    void *value);
CUresult vpmm_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
				    void *value);
CUresult vpmm_cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep);

#endif
