/* driver_calls.h — the driver's entry points under the shim
 * (driver_calls.c): hooks.c forwards each exported cu* hook to the function
 * of its name with vpmm_ in front, same arguments. Includes shim.h only.
 */
#ifndef VPMM_DRIVER_CALLS_H
#define VPMM_DRIVER_CALLS_H

#include "shim.h"

CUresult vpmm_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult vpmm_cuMemFree_v2(CUdeviceptr dptr);
CUresult vpmm_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s);
CUresult vpmm_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s);
CUresult vpmm_cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
CUresult vpmm_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
CUresult vpmm_cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
CUresult vpmm_cuStreamDestroy_v2(CUstream s);
CUresult vpmm_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult vpmm_cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
			       unsigned int flags);
CUresult vpmm_cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult vpmm_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
CUresult vpmm_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult vpmm_cuCtxDestroy_v2(CUcontext ctx);
CUresult vpmm_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult vpmm_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
			     unsigned int flags, CUdevice dev);
CUresult vpmm_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			     CUdevice dev);
CUresult vpmm_cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult vpmm_cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult vpmm_cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
CUresult vpmm_cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			       unsigned int flags);
CUresult vpmm_cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags,
				     int priority);

#endif
