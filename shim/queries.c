/* queries.c — what the driver's queries about an address answer for pool
 * memory: cuMemGetAddressRange, cuPointerGetAttribute(s) and
 * cuMemRetainAllocationHandle, each reached from its exported hook
 * (hooks.c). One truth: the allocation the pool handed out, never the
 * handles under it, which the driver alone would describe.
 *
 * Decisions, and why:
 *  - The range (cuMemGetAddressRange, RANGE_START_ADDR/RANGE_SIZE) and the
 *    mapping (MAPPING_BASE_ADDR/MAPPING_SIZE) are the allocation's base and
 *    size. The driver answers one handle's mapping, which may start in a
 *    neighbour and end inside the allocation: a program that takes the
 *    base from one query and the size from another (NCCL's registration)
 *    would map the wrong memory.
 *  - cuMemRetainAllocationHandle on pool memory is refused with
 *    CUDA_ERROR_INVALID_VALUE, as the driver refuses memory that no
 *    cuMemCreate made (cudaMalloc's). No handle covers exactly an
 *    allocation (a handle is shared with neighbours, an allocation may lie
 *    on several), and an exported handle would hand the neighbours' data
 *    to another process. NCCL then registers the buffer through
 *    cudaIpcGetMemHandle, which the shim serves (NCCL_LEGACY_CUDA_REGISTER=1),
 *    or not at all (its default): its copy path, and no failure.
 *  - IS_LEGACY_CUDA_IPC_CAPABLE: 1 exactly where the shim's
 *    cudaIpcGetMemHandle succeeds (ipc.h). ALLOWED_HANDLE_TYPES: none, as
 *    no handle can be retained to export.
 *  - Pool memory with no live allocation (freed, a slab's unused block):
 *    what the driver answers for memory it does not know, not the pool's
 *    mapping there: no range (CUDA_ERROR_NOT_FOUND), every
 *    cuPointerGetAttribute CUDA_ERROR_INVALID_VALUE, and from
 *    cuPointerGetAttributes (which succeeds on unknown pointers) null
 *    values, the device ordinal -2 (the runtime's cudaInvalidDeviceId).
 *  - The rest is the driver's answer, true of every allocation of the pool
 *    alike: context, device ordinal, memory type, MAPPED, ACCESS_FLAGS,
 *    IS_GPU_DIRECT_RDMA_CAPABLE (the pool's handles'), MEMPOOL_HANDLE (NULL:
 *    pool memory is no CUDA pool's, as cudaMalloc's is not). BUFFER_ID and
 *    MEMORY_BLOCK_ID stay the driver's, which name the handle under the
 *    address: allocations sharing a handle share them.
 *  - Booleans and handle-type masks are written by the driver first, in the
 *    width it uses; the shim then changes their lowest byte only, which
 *    holds 0 or 1 and every handle type bit (little-endian hosts).
 *
 * Owns: the answers to those queries for pool memory (nothing kept).
 * May call: alloc.h (what is live), devices.h (whose VA), ipc.h (what
 * exports), process.h, resolve.h, the log.
 */
#include <string.h>

#include "alloc.h"
#include "devices.h"
#include "ipc.h"
#include "process.h"
#include "queries.h"
#include "resolve.h"
#include "shim.h"

/* The device ordinal cuPointerGetAttributes gives a pointer it does not
 * know (cudaInvalidDeviceId). */
#define NO_DEVICE (-2)

CUresult vpmm_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	CUdeviceptr base;
	size_t size;
	vpmm_count(VPMM_HOOK_cuMemGetAddressRange_v2);
	switch (vpmm_find_live(dptr, &base, &size)) {
	case VPMM_POOL_LIVE:
		if (pbase)
			*pbase = base;
		if (psize)
			*psize = size;
		return CUDA_SUCCESS;
	case VPMM_POOL_NOT_LIVE:
		return CUDA_ERROR_NOT_FOUND; /* as for a pointer freed by cuMemFree */
	case VPMM_NOT_POOLS:
		break;
	}
	vpmm_resolve();
	vpmm_count(VPMM_HOOK_passthrough);
	return vpmm_real.address_range ? vpmm_real.address_range(pbase, psize, dptr)
				       : CUDA_ERROR_NOT_INITIALIZED;
}

/* The lowest byte of a boolean or a mask the driver wrote. */
static void set_low_byte(void *data, unsigned char v)
{
	memcpy(data, &v, 1);
}

/* A live allocation's answer to `a`, over what the driver wrote (the
 * address attributes are written whole, without asking the driver). */
static void answer_live(CUpointer_attribute a, void *data, CUdeviceptr ptr, CUdeviceptr base,
			size_t size)
{
	switch (a) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		*(CUdeviceptr *)data = base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		*(size_t *)data = size;
		break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		set_low_byte(data, vpmm_ipc_exportable(ptr) ? 1 : 0);
		break;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		set_low_byte(data, 0);
		break;
	default:
		break;
	}
}

/* The null value cuPointerGetAttributes gives a pointer it does not know. */
static void answer_unknown(CUpointer_attribute a, void *data)
{
	switch (a) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
	case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
		memset(data, 0, sizeof(uint64_t));
		break;
	case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
		memset(data, 0, sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS));
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = 0;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = NO_DEVICE;
		break;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
	case CU_POINTER_ATTRIBUTE_MAPPED:
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
	case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
		set_low_byte(data, 0);
		break;
	default:
		break; /* newer than this header: the driver's answer */
	}
}

static bool address_attribute(CUpointer_attribute a)
{
	return a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
	       a == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
	       a == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR ||
	       a == CU_POINTER_ATTRIBUTE_MAPPING_SIZE;
}

CUresult vpmm_cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	CUdeviceptr base = 0;
	size_t size = 0;
	CUresult r;
	vpmm_count(VPMM_HOOK_cuPointerGetAttribute);
	vpmm_resolve();
	enum vpmm_where w = data ? vpmm_find_live(ptr, &base, &size) : VPMM_NOT_POOLS;
	if (w == VPMM_POOL_NOT_LIVE)
		return CUDA_ERROR_INVALID_VALUE; /* no allocation there */
	if (w == VPMM_POOL_LIVE && address_attribute(attribute)) {
		answer_live(attribute, data, ptr, base, size);
		return CUDA_SUCCESS;
	}
	if (w == VPMM_NOT_POOLS)
		vpmm_count(VPMM_HOOK_passthrough);
	if (!vpmm_real.ptr_attr)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.ptr_attr(data, attribute, ptr);
	if (r == CUDA_SUCCESS && w == VPMM_POOL_LIVE)
		answer_live(attribute, data, ptr, base, size);
	return r;
}

CUresult vpmm_cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
				     void **data, CUdeviceptr ptr)
{
	CUdeviceptr base = 0;
	size_t size = 0;
	CUresult r;
	vpmm_count(VPMM_HOOK_cuPointerGetAttributes);
	VPMM_REAL_CALL(r, ptr_attrs, n, attributes, data, ptr);
	if (r != CUDA_SUCCESS || !attributes || !data)
		return r;
	enum vpmm_where w = vpmm_find_live(ptr, &base, &size);
	if (w == VPMM_NOT_POOLS)
		return r;
	for (unsigned i = 0; i < n; i++) {
		if (!data[i])
			continue;
		if (w == VPMM_POOL_LIVE)
			answer_live(attributes[i], data[i], ptr, base, size);
		else
			answer_unknown(attributes[i], data[i]);
	}
	return r;
}

CUresult vpmm_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	static bool said;
	vpmm_count(VPMM_HOOK_cuMemRetainAllocationHandle);
	vpmm_resolve();
	if (!vpmm_tls_inside && vpmm_active() && vpmm_owner_device((CUdeviceptr)(uintptr_t)addr) >= 0) {
		if (!__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
			vpmm_log(VPMM_LOG_INFO,
				 "cuMemRetainAllocationHandle on pool memory is refused: its handles are shared with neighbours (callers such as NCCL fall back)");
		return CUDA_ERROR_INVALID_VALUE;
	}
	vpmm_count(VPMM_HOOK_passthrough);
	return vpmm_real.retain_handle ? vpmm_real.retain_handle(handle, addr)
				       : CUDA_ERROR_NOT_INITIALIZED;
}
