/* hooks.c — the exported hooks. Each one only forwards: to the dispatch
 * layer (dispatch.c), which serves the call from the pool, or to the real
 * function, unchanged. No policy lives here.
 *
 * Three families:
 *  - the runtime's allocation calls, for programs linked with libcudart.so;
 *  - the driver's allocation and query entry points, exported under their
 *    own names (programs linked with -lcuda call them directly) and handed
 *    out by cuGetProcAddress and dlsym (everyone else);
 *  - vpmm_torch_malloc / vpmm_torch_free for PyTorch's CUDAPluggableAllocator.
 *
 * Recursion: a hook that hands a call to the real runtime raises
 * vpmm_tls_inside for the call's duration, so the driver entry points the
 * runtime then reaches through our wrappers go straight to libcuda. Real
 * functions are always called through resolved pointers, never by name.
 */
#include <string.h>
#include <sys/types.h>

#include "shim.h"

#undef cuGetProcAddress

/* ---- the real runtime, for pass-through ------------------------------------------ */

static void *runtime(enum vpmm_rt fn, void *caller)
{
	static bool warned;
	void *p = vpmm_real_runtime(fn, caller);
	if (!p && !warned) {
		warned = true;
		vpmm_log(VPMM_LOG_ERROR, "the real CUDA runtime was not found: runtime calls fail");
	}
	vpmm_count(VPMM_HOOK_passthrough);
	return p;
}

#define RT(type, fn, caller) VPMM_PTR_TO_FN(type, runtime(fn, caller))

typedef cudaError_t (*rt_malloc_t)(void **, size_t);
typedef cudaError_t (*rt_free_t)(void *);
typedef cudaError_t (*rt_malloc_async_t)(void **, size_t, cudaStream_t);
typedef cudaError_t (*rt_free_async_t)(void *, cudaStream_t);
typedef cudaError_t (*rt_mem_info_t)(size_t *, size_t *);

cudaError_t vpmm_runtime_init(void *caller)
{
	rt_free_t f = RT(rt_free_t, VPMM_RT_FREE, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(NULL);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_malloc(enum vpmm_rt fn, void *caller, void **p, size_t n)
{
	rt_malloc_t f = RT(rt_malloc_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, n);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_free(void *caller, void *p)
{
	rt_free_t f = RT(rt_free_t, VPMM_RT_FREE, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_malloc_async(enum vpmm_rt fn, void *caller, void **p,
				     size_t n, cudaStream_t s)
{
	rt_malloc_async_t f = RT(rt_malloc_async_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, n, s);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_free_async(enum vpmm_rt fn, void *caller, void *p,
				   cudaStream_t s)
{
	rt_free_async_t f = RT(rt_free_async_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, s);
	vpmm_tls_inside--;
	return e;
}

/* ---- runtime hooks ----------------------------------------------------------------- */

VPMM_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size);
VPMM_EXPORT cudaError_t cudaFree(void *devPtr);
VPMM_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);

static cudaError_t rt_malloc(enum vpmm_hook h, enum vpmm_rt fn, enum vpmm_via via,
			     void *caller, void **devPtr, size_t size,
			     cudaStream_t s, bool async)
{
	CUdeviceptr p = 0;
	CUresult r;
	vpmm_count(h);
	if (devPtr && !size && !vpmm_tls_inside && vpmm_active()) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	if (devPtr && vpmm_do_malloc(&p, size, async ? s : VPMM_NO_STREAM, via, -1,
				     caller, &r)) {
		if (r == CUDA_SUCCESS)
			*devPtr = (void *)(uintptr_t)p;
		return (cudaError_t)r;
	}
	return async ? real_malloc_async(fn, caller, devPtr, size, s)
		     : real_malloc(fn, caller, devPtr, size);
}

static cudaError_t rt_free(enum vpmm_hook h, enum vpmm_rt fn, enum vpmm_via via,
			   void *caller, void *devPtr, cudaStream_t s, bool async)
{
	CUresult r;
	vpmm_count(h);
	if (vpmm_do_free((CUdeviceptr)(uintptr_t)devPtr, async ? s : VPMM_NO_STREAM,
			 via, &r))
		return (cudaError_t)r;
	return async ? real_free_async(fn, caller, devPtr, s) : real_free(caller, devPtr);
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return rt_malloc(VPMM_HOOK_cudaMalloc, VPMM_RT_MALLOC, VPMM_VIA_RUNTIME,
			 __builtin_return_address(0), devPtr, size, NULL, false);
}

cudaError_t cudaFree(void *devPtr)
{
	return rt_free(VPMM_HOOK_cudaFree, VPMM_RT_FREE, VPMM_VIA_RUNTIME,
		       __builtin_return_address(0), devPtr, NULL, false);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s)
{
	return rt_malloc(VPMM_HOOK_cudaMallocAsync, VPMM_RT_MALLOC_ASYNC,
			 VPMM_VIA_RUNTIME, __builtin_return_address(0), devPtr,
			 size, s, true);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s)
{
	return rt_free(VPMM_HOOK_cudaFreeAsync, VPMM_RT_FREE_ASYNC, VPMM_VIA_RUNTIME,
		       __builtin_return_address(0), devPtr, s, true);
}

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s)
{
	return rt_malloc(VPMM_HOOK_cudaMallocAsync_ptsz, VPMM_RT_MALLOC_ASYNC_PTSZ,
			 VPMM_VIA_RUNTIME_PTSZ, __builtin_return_address(0), devPtr,
			 size, s, true);
}

cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s)
{
	return rt_free(VPMM_HOOK_cudaFreeAsync_ptsz, VPMM_RT_FREE_ASYNC_PTSZ,
		       VPMM_VIA_RUNTIME_PTSZ, __builtin_return_address(0), devPtr,
		       s, true);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	void *caller = __builtin_return_address(0);
	rt_mem_info_t f;
	cudaError_t e;
	vpmm_count(VPMM_HOOK_cudaMemGetInfo);
	f = RT(rt_mem_info_t, VPMM_RT_MEM_GET_INFO, caller);
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(free_bytes, total);
	vpmm_tls_inside--;
	if (e == cudaSuccess && free_bytes && total)
		vpmm_add_reusable(free_bytes, *total);
	return e;
}

/* ---- driver wrappers ------------------------------------------------------------------ */

/* The real entry point, or NOT_INITIALIZED when libcuda is not here. */
#define REAL(field, ...)                                                      \
	do {                                                                  \
		vpmm_resolve();                                               \
		vpmm_count(VPMM_HOOK_passthrough);                            \
		return vpmm_real.field ? vpmm_real.field(__VA_ARGS__)         \
				       : CUDA_ERROR_NOT_INITIALIZED;          \
	} while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) VPMM_EXPORT;
CUresult cuMemFree_v2(CUdeviceptr dptr) VPMM_EXPORT;
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) VPMM_EXPORT;
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) VPMM_EXPORT;
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) VPMM_EXPORT;
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) VPMM_EXPORT;
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) VPMM_EXPORT;
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
				 CUdeviceptr dptr) VPMM_EXPORT;
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
			       CUdeviceptr ptr) VPMM_EXPORT;
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
				void **data, CUdeviceptr ptr) VPMM_EXPORT;
CUresult cuStreamDestroy_v2(CUstream s) VPMM_EXPORT;
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) VPMM_EXPORT;
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
			       unsigned int flags) VPMM_EXPORT;
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) VPMM_EXPORT;
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) VPMM_EXPORT;
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags) VPMM_EXPORT;
CUresult cuCtxDestroy_v2(CUcontext ctx) VPMM_EXPORT;
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) VPMM_EXPORT;
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus) VPMM_EXPORT;
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags) VPMM_EXPORT;

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAlloc_v2);
	if (vpmm_do_malloc(dptr, bytesize, VPMM_NO_STREAM, VPMM_VIA_DRIVER, -1, NULL, &r))
		return r;
	REAL(mem_alloc, dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFree_v2);
	if (vpmm_do_free(dptr, VPMM_NO_STREAM, VPMM_VIA_DRIVER, &r))
		return r;
	REAL(mem_free, dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAllocAsync);
	if (vpmm_do_malloc(dptr, bytesize, s, VPMM_VIA_DRIVER, -1, NULL, &r))
		return r;
	REAL(alloc_async, dptr, bytesize, s);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAllocAsync_ptsz);
	if (vpmm_do_malloc(dptr, bytesize, s, VPMM_VIA_DRIVER_PTSZ, -1, NULL, &r))
		return r;
	REAL(alloc_async_ptsz, dptr, bytesize, s);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFreeAsync);
	if (vpmm_do_free(dptr, s, VPMM_VIA_DRIVER, &r))
		return r;
	REAL(free_async, dptr, s);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFreeAsync_ptsz);
	if (vpmm_do_free(dptr, s, VPMM_VIA_DRIVER_PTSZ, &r))
		return r;
	REAL(free_async_ptsz, dptr, s);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemGetInfo_v2);
	vpmm_resolve();
	if (!vpmm_real.mem_get_info)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.mem_get_info(free_bytes, total);
	if (r == CUDA_SUCCESS && free_bytes && total)
		vpmm_add_reusable(free_bytes, *total);
	return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
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
	REAL(address_range, pbase, psize, dptr);
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	CUdeviceptr base;
	size_t size;
	vpmm_count(VPMM_HOOK_cuPointerGetAttribute);
	if (data && (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
		     attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE)) {
		switch (vpmm_find_live(ptr, &base, &size)) {
		case VPMM_POOL_LIVE:
			if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
				*(CUdeviceptr *)data = base;
			else
				*(size_t *)data = size;
			return CUDA_SUCCESS;
		case VPMM_POOL_NOT_LIVE:
			return CUDA_ERROR_INVALID_VALUE; /* no allocation there */
		case VPMM_NOT_POOLS:
			break;
		}
	}
	REAL(ptr_attr, data, attribute, ptr);
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
				void **data, CUdeviceptr ptr)
{
	CUdeviceptr base;
	size_t size;
	CUresult r;
	vpmm_count(VPMM_HOOK_cuPointerGetAttributes);
	vpmm_resolve();
	if (!vpmm_real.ptr_attrs)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.ptr_attrs(n, attributes, data, ptr);
	if (r != CUDA_SUCCESS || !attributes || !data)
		return r;
	switch (vpmm_find_live(ptr, &base, &size)) {
	case VPMM_POOL_LIVE:
		break;
	case VPMM_POOL_NOT_LIVE:
		/* No allocation there: the null values this call gives a
		 * pointer it does not know, not the pool's mapping. */
		base = 0;
		size = 0;
		break;
	case VPMM_NOT_POOLS:
		return r;
	}
	for (unsigned i = 0; i < n; i++) {
		if (!data[i])
			continue;
		if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
			*(CUdeviceptr *)data[i] = base;
		else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
			*(size_t *)data[i] = size;
	}
	return r;
}

/* The pool records events on streams other than the caller's: it must hear
 * of a stream's end before the handle dangles (cudaStreamDestroy comes here
 * through cuGetProcAddress). */
CUresult cuStreamDestroy_v2(CUstream s)
{
	vpmm_count(VPMM_HOOK_cuStreamDestroy_v2);
	vpmm_stream_destroying(s);
	REAL(stream_destroy, s);
}

/* Pool memory is shared through the shim on both sides (ipc.c); the
 * driver's own IPC refuses VMM memory. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcGetMemHandle);
	if (vpmm_ipc_get(handle, dptr, &r))
		return r;
	REAL(ipc_get, handle, dptr);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcOpenMemHandle_v2);
	if (vpmm_ipc_open(pdptr, &handle, flags, &r))
		return r;
	REAL(ipc_open, pdptr, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcCloseMemHandle);
	if (vpmm_ipc_close(dptr, &r))
		return r;
	REAL(ipc_close, dptr);
}

/* Peer access does not reach VMM mappings by itself: once the driver
 * enabled it, the peer's pool grants this device access to its pages. */
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuCtxEnablePeerAccess);
	vpmm_resolve();
	if (!vpmm_real.peer_enable)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.peer_enable(peer, flags);
	if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
		vpmm_peer_enabled(peer);
	return r;
}

/* Passed through: the program's own handle, noted (vpmm_own_mapping). */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemCreate);
	vpmm_resolve();
	if (!vpmm_real.mem_create)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.mem_create(handle, size, prop, flags);
	if (r == CUDA_SUCCESS)
		vpmm_own_mapping(prop, size);
	return r;
}

/* A context's streams and events die with it, the pool's memory does not
 * (cuMemCreate memory outlives contexts): the pools living in it must hear
 * of it before the real call (cudaDeviceReset reaches the reset through
 * cuGetProcAddress). */
CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	vpmm_count(VPMM_HOOK_cuCtxDestroy_v2);
	vpmm_context_ending(ctx, -1);
	REAL(ctx_destroy, ctx);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	vpmm_count(VPMM_HOOK_cuDevicePrimaryCtxReset_v2);
	vpmm_context_ending(NULL, (int)dev);
	REAL(primary_reset, dev);
}

/* ---- cuGetProcAddress ----------------------------------------------------------------- */

/* The runtime asks for "cuGetProcAddress" through cuGetProcAddress itself
 * and then resolves every entry point through the answer: handing back our
 * own here is what makes all later lookups pass through us. */
static void wrap_answer(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	void *w;
	if (!pfn || !*pfn || !vpmm_active())
		return;
	w = vpmm_wrapper_for(*pfn);
	if (w && w != *pfn) {
		*pfn = w;
		vpmm_count(VPMM_HOOK_proc_wrapped);
	} else if (!w && vpmm_log_on(VPMM_LOG_DEBUG) && symbol &&
		   (!strncmp(symbol, "cuMem", 5) || !strncmp(symbol, "cuPointer", 9))) {
		/* an old variant, or one newer than ours: passed through */
		vpmm_log(VPMM_LOG_DEBUG, "cuGetProcAddress(%s, %d, %llu): not wrapped",
			 symbol, version, (unsigned long long)flags);
	}
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGetProcAddress_v2);
	vpmm_resolve();
	if (!vpmm_real.gpa_v2)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS)
		wrap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGetProcAddress);
	vpmm_resolve();
	if (!vpmm_real.gpa_v1)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = vpmm_real.gpa_v1(symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS)
		wrap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}

const vpmm_fnptr vpmm_wrappers[VPMM_W_COUNT] = {
	[VPMM_W_GPA_V2] = (vpmm_fnptr)cuGetProcAddress_v2,
	[VPMM_W_GPA_V1] = (vpmm_fnptr)cuGetProcAddress,
	[VPMM_W_MEM_ALLOC] = (vpmm_fnptr)cuMemAlloc_v2,
	[VPMM_W_MEM_FREE] = (vpmm_fnptr)cuMemFree_v2,
	[VPMM_W_ALLOC_ASYNC] = (vpmm_fnptr)cuMemAllocAsync,
	[VPMM_W_ALLOC_ASYNC_PTSZ] = (vpmm_fnptr)cuMemAllocAsync_ptsz,
	[VPMM_W_FREE_ASYNC] = (vpmm_fnptr)cuMemFreeAsync,
	[VPMM_W_FREE_ASYNC_PTSZ] = (vpmm_fnptr)cuMemFreeAsync_ptsz,
	[VPMM_W_MEM_GET_INFO] = (vpmm_fnptr)cuMemGetInfo_v2,
	[VPMM_W_ADDRESS_RANGE] = (vpmm_fnptr)cuMemGetAddressRange_v2,
	[VPMM_W_PTR_ATTR] = (vpmm_fnptr)cuPointerGetAttribute,
	[VPMM_W_PTR_ATTRS] = (vpmm_fnptr)cuPointerGetAttributes,
	[VPMM_W_STREAM_DESTROY] = (vpmm_fnptr)cuStreamDestroy_v2,
	[VPMM_W_IPC_GET] = (vpmm_fnptr)cuIpcGetMemHandle,
	[VPMM_W_IPC_OPEN] = (vpmm_fnptr)cuIpcOpenMemHandle_v2,
	[VPMM_W_IPC_CLOSE] = (vpmm_fnptr)cuIpcCloseMemHandle,
	[VPMM_W_PEER_ENABLE] = (vpmm_fnptr)cuCtxEnablePeerAccess,
	[VPMM_W_MEM_CREATE] = (vpmm_fnptr)cuMemCreate,
	[VPMM_W_CTX_DESTROY] = (vpmm_fnptr)cuCtxDestroy_v2,
	[VPMM_W_PRIMARY_RESET] = (vpmm_fnptr)cuDevicePrimaryCtxReset_v2,
};

/* ---- PyTorch's CUDAPluggableAllocator ----------------------------------------------------- */

/* Declared in vpmm/vpmm.h. */

/* Stream-ordered on `stream`, no device synchronisation. What the pool
 * cannot serve goes to the driver's own stream-ordered allocator
 * (vpmm_torch_real), so the pair stays symmetric. */
void *vpmm_torch_malloc(ssize_t size, int device, cudaStream_t stream)
{
	CUdeviceptr p = 0;
	CUresult r;
	vpmm_count(VPMM_HOOK_vpmm_torch_malloc);
	if (size <= 0)
		return NULL;
	if (!vpmm_do_malloc(&p, (size_t)size, stream, VPMM_VIA_TORCH, device, NULL, &r))
		r = vpmm_torch_real(&p, (size_t)size, device, stream);
	/* The pool's own out-of-memory line is already out; anything else
	 * (a device that does not exist, no driver) says so here, since
	 * PyTorch sees only NULL. */
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY)
		vpmm_log(VPMM_LOG_ERROR, "vpmm_torch_malloc(%zd, device %d): CUresult %d", size,
			 device, (int)r);
	return r == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
}

void vpmm_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
	CUresult r;
	(void)size;
	vpmm_count(VPMM_HOOK_vpmm_torch_free);
	if (!ptr)
		return;
	if (!vpmm_do_free(p, stream, VPMM_VIA_TORCH, &r))
		r = vpmm_torch_real(&p, 0, device, stream);
	if (r != CUDA_SUCCESS)
		vpmm_log(VPMM_LOG_ERROR, "vpmm_torch_free(%p): CUresult %d", ptr, (int)r);
}
