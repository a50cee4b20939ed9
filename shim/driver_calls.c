/* driver_calls.c — the driver's entry points under the shim, each reached
 * from its exported hook (hooks.c), directly or through a cuGetProcAddress
 * or dlsym answer: allocation, free, the free memory query, and the calls
 * whose news the pools need (stream and context ends, peer access, the
 * program's own handles, IPC). The queries about an address are
 * queries.c's, CUDA's memory pools mempool.c's.
 *
 * Owns: what each driver call means for pool memory, and the pass-through
 * (REAL) of everything else to the real entry point. Policy lives in the
 * rooms it calls: alloc.h (malloc/free, free memory), streams.h, devices.h,
 * ipc.h, live_streams.h (the streams made), capture.h, process.h
 * (whether the shim is active, VPMM_SYNC_FREE); resolve.h gives the real
 * functions.
 */
#include "alloc.h"
#include "capture.h"
#include "devices.h"
#include "driver_calls.h"
#include "ipc.h"
#include "live_streams.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "streams.h"

/* ---- the calls ------------------------------------------------------------------ */

/* The real entry point, or NOT_INITIALIZED when libcuda is not here. */
#define REAL(field, ...)                                                      \
	do {                                                                  \
		vpmm_resolve();                                               \
		vpmm_count(VPMM_HOOK_passthrough);                            \
		return vpmm_real.field ? vpmm_real.field(__VA_ARGS__)         \
				       : CUDA_ERROR_NOT_INITIALIZED;          \
	} while (0)

CUresult vpmm_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAlloc_v2);
	if (vpmm_do_malloc(dptr, bytesize, VPMM_NO_STREAM, VPMM_VIA_DRIVER, -1, NULL, &r))
		return r;
	REAL(mem_alloc, dptr, bytesize);
}

CUresult vpmm_cuMemFree_v2(CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFree_v2);
	if (vpmm_do_free(dptr, VPMM_NO_STREAM, VPMM_VIA_DRIVER, &r))
		return r;
	REAL(mem_free, dptr);
}

CUresult vpmm_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAllocAsync);
	if (vpmm_do_malloc(dptr, bytesize, s, VPMM_VIA_DRIVER, -1, NULL, &r))
		return r;
	REAL(alloc_async, dptr, bytesize, s);
}

CUresult vpmm_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemAllocAsync_ptsz);
	if (vpmm_do_malloc(dptr, bytesize, s, VPMM_VIA_DRIVER_PTSZ, -1, NULL, &r))
		return r;
	REAL(alloc_async_ptsz, dptr, bytesize, s);
}

CUresult vpmm_cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFreeAsync);
	if (vpmm_do_free(dptr, s, VPMM_VIA_DRIVER, &r))
		return r;
	REAL(free_async, dptr, s);
}

CUresult vpmm_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemFreeAsync_ptsz);
	if (vpmm_do_free(dptr, s, VPMM_VIA_DRIVER_PTSZ, &r))
		return r;
	REAL(free_async_ptsz, dptr, s);
}

CUresult vpmm_cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemGetInfo_v2);
	VPMM_REAL_CALL(r, mem_get_info, free_bytes, total);
	if (r == CUDA_SUCCESS && free_bytes && total)
		vpmm_add_reusable(free_bytes, *total);
	return r;
}

/* The pool records events on streams other than the caller's: it must hear
 * of a stream's end before the handle dangles (cudaStreamDestroy comes here
 * through cuGetProcAddress). A capture on it ends with it: the frees it
 * deferred are made once the stream is gone. */
CUresult vpmm_cuStreamDestroy_v2(CUstream s)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuStreamDestroy_v2);
	vpmm_stream_destroying(s);
	vpmm_resolve();
	vpmm_count(VPMM_HOOK_passthrough);
	r = vpmm_real.stream_destroy ? vpmm_real.stream_destroy(s) : CUDA_ERROR_NOT_INITIALIZED;
	vpmm_capture_stream_destroyed(s, r);
	return r;
}

/* Pool memory is shared through the shim on both sides (ipc.c); the
 * driver's own IPC refuses VMM memory. */
CUresult vpmm_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcGetMemHandle);
	if (vpmm_ipc_get(handle, dptr, &r))
		return r;
	REAL(ipc_get, handle, dptr);
}

CUresult vpmm_cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcOpenMemHandle_v2);
	if (vpmm_ipc_open(pdptr, &handle, flags, &r))
		return r;
	REAL(ipc_open, pdptr, handle, flags);
}

CUresult vpmm_cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuIpcCloseMemHandle);
	if (vpmm_ipc_close(dptr, &r))
		return r;
	REAL(ipc_close, dptr);
}

/* Peer access does not reach VMM mappings by itself: once the driver
 * enabled it, the peer's pool grants this device access to its pages. */
CUresult vpmm_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuCtxEnablePeerAccess);
	VPMM_REAL_CALL(r, peer_enable, peer, flags);
	if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
		vpmm_peer_enabled(peer);
	return r;
}

/* Passed through: the program's own handle, noted (vpmm_own_mapping). */
CUresult vpmm_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemCreate);
	VPMM_REAL_CALL(r, mem_create, handle, size, prop, flags);
	if (r == CUDA_SUCCESS)
		vpmm_own_mapping(prop, size);
	return r;
}

/* A context's streams and events die with it, the pool's memory does not
 * (cuMemCreate memory outlives contexts): the pools living in it hear of it
 * before the real call and after it. (The CUDA 13 runtime's
 * cudaDeviceReset reaches the reset through its private table instead: the
 * pool learns of that one by the context's id, allocator/reset.c.) */
CUresult vpmm_cuCtxDestroy_v2(CUcontext ctx)
{
	vpmm_count(VPMM_HOOK_cuCtxDestroy_v2);
	vpmm_context_ending(ctx, -1);
	vpmm_live_streams_ctx_end(ctx);
	vpmm_resolve();
	vpmm_count(VPMM_HOOK_passthrough);
	CUresult r = vpmm_real.ctx_destroy ? vpmm_real.ctx_destroy(ctx) : CUDA_ERROR_NOT_INITIALIZED;
	vpmm_context_ended(r);
	return r;
}

/* A context the program makes: its legacy stream reaches pool memory
 * without passing the pool context's fences, so the table counts it as a
 * stream of its own until it is destroyed (live_streams.c). */
static CUresult ctx_made(CUresult r, CUcontext *pctx, CUdevice dev)
{
	if (r == CUDA_SUCCESS && pctx && *pctx)
		vpmm_live_streams_ctx_made(*pctx, (int)dev);
	return r;
}

/* Every form: the real call, then the table hears of the context. */
#define CTX_CREATE(field, ...)                                                \
	do {                                                                  \
		CUresult r_;                                                  \
		vpmm_count(VPMM_HOOK_cuCtxCreate);                            \
		VPMM_REAL_CALL(r_, field, __VA_ARGS__);                       \
		return ctx_made(r_, pctx, dev);                               \
	} while (0)

CUresult vpmm_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CTX_CREATE(ctx_create, pctx, flags, dev);
}

CUresult vpmm_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
			     unsigned int flags, CUdevice dev)
{
	CTX_CREATE(ctx_create_v3, pctx, params, n, flags, dev);
}

CUresult vpmm_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			     CUdevice dev)
{
	CTX_CREATE(ctx_create_v4, pctx, params, flags, dev);
}

CUresult vpmm_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	vpmm_count(VPMM_HOOK_cuDevicePrimaryCtxReset_v2);
	vpmm_context_ending(NULL, (int)dev);
	vpmm_live_streams_device_reset((int)dev);
	vpmm_resolve();
	vpmm_count(VPMM_HOOK_passthrough);
	CUresult r = vpmm_real.primary_reset ? vpmm_real.primary_reset(dev) : CUDA_ERROR_NOT_INITIALIZED;
	vpmm_context_ended(r);
	return r;
}

/* Every stream the program makes is noted (live_streams.h): the fences of
 * the synchronous frees must reach each non-blocking one, and a new one
 * waits for what the legacy stream still has queued. */
static void stream_made(CUstream s, unsigned flags)
{
	vpmm_live_stream_created(s, flags);
	if ((flags & CU_STREAM_NON_BLOCKING) && !vpmm_tls_inside && vpmm_active() &&
	    !vpmm_process_sync_device())
		vpmm_fence_new_stream(s);
}

CUresult vpmm_cuStreamCreate(CUstream *phStream, unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuStreamCreate);
	VPMM_REAL_CALL(r, stream_create, phStream, flags);
	if (r == CUDA_SUCCESS)
		stream_made(*phStream, flags);
	return r;
}

CUresult vpmm_cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuStreamCreateWithPriority);
	VPMM_REAL_CALL(r, stream_create_prio, phStream, flags, priority);
	if (r == CUDA_SUCCESS)
		stream_made(*phStream, flags);
	return r;
}

/* A green context has a default stream of its own, beside the legacy
 * stream of the context the pool lives in, and reaches pool memory
 * (it shares the primary context's memory): no fence reaches its work,
 * from the moment it exists, streams made or not. The synchronous frees
 * synchronise from then on. */
CUresult vpmm_cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			       unsigned int flags)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGreenCtxCreate);
	VPMM_REAL_CALL(r, green_ctx_create, phCtx, desc, dev, flags);
	if (r == CUDA_SUCCESS)
		vpmm_live_streams_untrackable("a green context");
	return r;
}

/* A green context's stream runs beside the legacy stream of the context
 * the pool lives in: no fence reaches it. */
CUresult vpmm_cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags,
				     int priority)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuGreenCtxStreamCreate);
	VPMM_REAL_CALL(r, green_stream_create, phStream, greenCtx, flags, priority);
	if (r == CUDA_SUCCESS)
		vpmm_live_streams_untrackable("a green context's stream");
	return r;
}
