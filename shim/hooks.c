/* hooks.c — the exported CUDA entry points of libvpmm.so. Each one only
 * forwards, in one line, to the function of its name with vpmm_ in front
 * (the torch pair: to vpmm_pluggable_*), where its semantics live:
 *  - the runtime's allocation calls, for programs linked with libcudart.so:
 *    runtime.c (given the hook's return address, which finds the real
 *    runtime of a program that loaded its own);
 *  - the driver's allocation and query entry points, exported under their
 *    own names (programs linked with -lcuda call them directly) and handed
 *    out by cuGetProcAddress and dlsym (everyone else): driver_calls.c;
 *  - the queries about an address (range, pointer attributes, the
 *    allocation handle): queries.c; CUDA's memory pools (the device's
 *    current pool, the default pool's attributes): mempool.c;
 *  - cuGetProcAddress itself: wrap.c;
 *  - vpmm_torch_malloc / vpmm_torch_free for PyTorch's
 *    CUDAPluggableAllocator (declared in vpmm/vpmm.h): torch.c.
 * Also the table of wrappers (vpmm_wrappers) that cuGetProcAddress and
 * dlsym answers are swapped for. The exported dlsym is in dlsym.c. The
 * exported library API (vpmm_shim_*, vpmm_version) is in api.c.
 *
 * The capture entry points forward to capture.c.
 *
 * Owns: the exported entry points and vpmm_wrappers, nothing else.
 * May call: runtime.h, driver_calls.h, capture.h, queries.h, mempool.h,
 * wrap.h, torch.h; resolve.h for the table's indexes and type. Nothing
 * else.
 */
#include <stdint.h>
#include <sys/types.h>

#include "capture.h"
#include "driver_calls.h"
#include "mempool.h"
#include "queries.h"
#include "resolve.h"
#include "runtime.h"
#include "shim.h"
#include "torch.h"
#include "wrap.h"

#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuStreamBeginCaptureToGraph

/* ---- the runtime --------------------------------------------------------------------- */

VPMM_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size);
VPMM_EXPORT cudaError_t cudaFree(void *devPtr);
VPMM_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s);
VPMM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);

#define CALLER __builtin_return_address(0)

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return vpmm_cudaMalloc(devPtr, size, CALLER);
}

cudaError_t cudaFree(void *devPtr)
{
	return vpmm_cudaFree(devPtr, CALLER);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s)
{
	return vpmm_cudaMallocAsync(devPtr, size, s, CALLER);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s)
{
	return vpmm_cudaFreeAsync(devPtr, s, CALLER);
}

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s)
{
	return vpmm_cudaMallocAsync_ptsz(devPtr, size, s, CALLER);
}

cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s)
{
	return vpmm_cudaFreeAsync_ptsz(devPtr, s, CALLER);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	return vpmm_cudaMemGetInfo(free_bytes, total, CALLER);
}

/* ---- the driver ---------------------------------------------------------------------- */

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
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) VPMM_EXPORT;
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
			CUdevice dev) VPMM_EXPORT;
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			CUdevice dev) VPMM_EXPORT;
CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			  unsigned int flags) VPMM_EXPORT;
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) VPMM_EXPORT;
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) VPMM_EXPORT;
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
				    int priority) VPMM_EXPORT;
CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags,
				int priority) VPMM_EXPORT;
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
				     void *addr) VPMM_EXPORT;
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) VPMM_EXPORT;
CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			 CUmemoryPool pool) VPMM_EXPORT;
CUresult cuMemPoolDestroy(CUmemoryPool pool) VPMM_EXPORT;
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
			       void *value) VPMM_EXPORT;
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
			       void *value) VPMM_EXPORT;
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) VPMM_EXPORT;
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus) VPMM_EXPORT;
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags) VPMM_EXPORT;
CUresult cuStreamBeginCapture(CUstream s) VPMM_EXPORT;
CUresult cuStreamBeginCapture_ptsz(CUstream s) VPMM_EXPORT;
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) VPMM_EXPORT;
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) VPMM_EXPORT;
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
				     const vpmm_edge_data *data, size_t n,
				     CUstreamCaptureMode mode) VPMM_EXPORT;
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					  const vpmm_edge_data *data, size_t n,
					  CUstreamCaptureMode mode) VPMM_EXPORT;
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) VPMM_EXPORT;
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) VPMM_EXPORT;

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return vpmm_cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return vpmm_cuMemFree_v2(dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	return vpmm_cuMemAllocAsync(dptr, bytesize, s);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	return vpmm_cuMemAllocAsync_ptsz(dptr, bytesize, s);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	return vpmm_cuMemFreeAsync(dptr, s);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	return vpmm_cuMemFreeAsync_ptsz(dptr, s);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	return vpmm_cuMemGetInfo_v2(free_bytes, total);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
				 CUdeviceptr dptr)
{
	return vpmm_cuMemGetAddressRange_v2(pbase, psize, dptr);
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
			       CUdeviceptr ptr)
{
	return vpmm_cuPointerGetAttribute(data, attribute, ptr);
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
				void **data, CUdeviceptr ptr)
{
	return vpmm_cuPointerGetAttributes(n, attributes, data, ptr);
}

CUresult cuStreamDestroy_v2(CUstream s)
{
	return vpmm_cuStreamDestroy_v2(s);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	return vpmm_cuIpcGetMemHandle(handle, dptr);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
			       unsigned int flags)
{
	return vpmm_cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	return vpmm_cuIpcCloseMemHandle(dptr);
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	return vpmm_cuCtxEnablePeerAccess(peer, flags);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	return vpmm_cuMemCreate(handle, size, prop, flags);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	return vpmm_cuCtxDestroy_v2(ctx);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return vpmm_cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
			CUdevice dev)
{
	return vpmm_cuCtxCreate_v3(pctx, params, n, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			CUdevice dev)
{
	return vpmm_cuCtxCreate_v4(pctx, params, flags, dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	return vpmm_cuDevicePrimaryCtxReset_v2(dev);
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
	return vpmm_cuStreamCreate(phStream, flags);
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	return vpmm_cuStreamCreateWithPriority(phStream, flags, priority);
}

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			  unsigned int flags)
{
	return vpmm_cuGreenCtxCreate(phCtx, desc, dev, flags);
}

CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags,
				int priority)
{
	return vpmm_cuGreenCtxStreamCreate(phStream, greenCtx, flags, priority);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	return vpmm_cuMemRetainAllocationHandle(handle, addr);
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	return vpmm_cuDeviceSetMemPool(dev, pool);
}

CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			 CUmemoryPool pool)
{
	return vpmm_cuMemSetMemPool(location, type, pool);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	return vpmm_cuMemPoolDestroy(pool);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	return vpmm_cuMemPoolGetAttribute(pool, attr, value);
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	return vpmm_cuMemPoolSetAttribute(pool, attr, value);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	return vpmm_cuMemPoolTrimTo(pool, minBytesToKeep);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	return vpmm_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags)
{
	return vpmm_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
}

CUresult cuStreamBeginCapture(CUstream s)
{
	return vpmm_cuStreamBeginCapture(s);
}

CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return vpmm_cuStreamBeginCapture_ptsz(s);
}

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	return vpmm_cuStreamBeginCapture_v2(s, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
	return vpmm_cuStreamBeginCapture_v2_ptsz(s, mode);
}

CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
				     const vpmm_edge_data *data, size_t n,
				     CUstreamCaptureMode mode)
{
	return vpmm_cuStreamBeginCaptureToGraph(s, g, deps, data, n, mode);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					  const vpmm_edge_data *data, size_t n,
					  CUstreamCaptureMode mode)
{
	return vpmm_cuStreamBeginCaptureToGraph_ptsz(s, g, deps, data, n, mode);
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	return vpmm_cuStreamEndCapture(s, g);
}

CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	return vpmm_cuStreamEndCapture_ptsz(s, g);
}

/* ---- the wrappers, by enum vpmm_wrapped ---------------------------------------------- */

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
	[VPMM_W_CTX_CREATE] = (vpmm_fnptr)cuCtxCreate_v2,
	[VPMM_W_CTX_CREATE_V3] = (vpmm_fnptr)cuCtxCreate_v3,
	[VPMM_W_CTX_CREATE_V4] = (vpmm_fnptr)cuCtxCreate_v4,
	[VPMM_W_GREEN_CTX_CREATE] = (vpmm_fnptr)cuGreenCtxCreate,
	[VPMM_W_PRIMARY_RESET] = (vpmm_fnptr)cuDevicePrimaryCtxReset_v2,
	[VPMM_W_STREAM_CREATE] = (vpmm_fnptr)cuStreamCreate,
	[VPMM_W_STREAM_CREATE_PRIO] = (vpmm_fnptr)cuStreamCreateWithPriority,
	[VPMM_W_GREEN_STREAM_CREATE] = (vpmm_fnptr)cuGreenCtxStreamCreate,
	[VPMM_W_BEGIN_CAPTURE] = (vpmm_fnptr)cuStreamBeginCapture,
	[VPMM_W_BEGIN_CAPTURE_PTSZ] = (vpmm_fnptr)cuStreamBeginCapture_ptsz,
	[VPMM_W_BEGIN_CAPTURE_V2] = (vpmm_fnptr)cuStreamBeginCapture_v2,
	[VPMM_W_BEGIN_CAPTURE_V2_PTSZ] = (vpmm_fnptr)cuStreamBeginCapture_v2_ptsz,
	[VPMM_W_BEGIN_TO_GRAPH] = (vpmm_fnptr)cuStreamBeginCaptureToGraph,
	[VPMM_W_BEGIN_TO_GRAPH_PTSZ] = (vpmm_fnptr)cuStreamBeginCaptureToGraph_ptsz,
	[VPMM_W_END_CAPTURE] = (vpmm_fnptr)cuStreamEndCapture,
	[VPMM_W_END_CAPTURE_PTSZ] = (vpmm_fnptr)cuStreamEndCapture_ptsz,
	[VPMM_W_RETAIN_HANDLE] = (vpmm_fnptr)cuMemRetainAllocationHandle,
	[VPMM_W_DEVICE_SET_MEMPOOL] = (vpmm_fnptr)cuDeviceSetMemPool,
	[VPMM_W_MEM_SET_MEMPOOL] = (vpmm_fnptr)cuMemSetMemPool,
	[VPMM_W_MEMPOOL_DESTROY] = (vpmm_fnptr)cuMemPoolDestroy,
	[VPMM_W_MEMPOOL_GET_ATTR] = (vpmm_fnptr)cuMemPoolGetAttribute,
	[VPMM_W_MEMPOOL_SET_ATTR] = (vpmm_fnptr)cuMemPoolSetAttribute,
	[VPMM_W_MEMPOOL_TRIM] = (vpmm_fnptr)cuMemPoolTrimTo,
};

/* ---- PyTorch's CUDAPluggableAllocator ------------------------------------------------- */

void *vpmm_torch_malloc(ssize_t size, int device, cudaStream_t stream)
{
	return vpmm_pluggable_malloc(size, device, stream, __builtin_return_address(0));
}

void vpmm_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
	vpmm_pluggable_free(ptr, size, device, stream);
}
