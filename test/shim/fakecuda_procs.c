/* fakecuda_procs.c — the fake's cuGetProcAddress(_v2): a table of every
 * entry point the fake exports, by base name, first version and
 * per-thread-default-stream variant; "cuGetProcAddress" is one of the
 * names, and a v1 cuMemAlloc/cuMemFree/cuMemGetInfo answers below 3020.
 *
 * Owns: the table. Calls every other file of the fake (the table names
 * their entry points) and fakecuda.c's counters.
 */
#include "fakecuda.h"

#include <stdbool.h>
#include <string.h>

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */

typedef void (*fn_t)(void);

struct proc {
	const char *name;
	int version; /* first version of this variant */
	bool ptsz;
	fn_t fn;
};

#define P(name, ver, fn) {name, ver, false, (fn_t)fn}
#define PT(name, ver, fn) {name, ver, true, (fn_t)fn}
static const struct proc procs[] = {
	P("cuGetProcAddress", 11030, cuGetProcAddress),
	P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
	P("cuInit", 2000, cuInit),
	P("cuDriverGetVersion", 2020, cuDriverGetVersion),
	P("cuDeviceGet", 2000, cuDeviceGet),
	P("cuDeviceGetCount", 2000, cuDeviceGetCount),
	P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
	P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
	P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	P("cuCtxGetId", 12000, cuCtxGetId),
	P("cuGetExportTable", 3000, cuGetExportTable),
	P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	P("cuCtxGetDevice", 2000, cuCtxGetDevice),
	P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	P("cuCtxSynchronize", 2000, cuCtxSynchronize),
	P("cuCtxCreate", 3020, cuCtxCreate_v2),
	P("cuCtxCreate", 11040, cuCtxCreate_v3),
	P("cuCtxCreate", 12050, cuCtxCreate_v4),
	P("cuGreenCtxCreate", 12040, cuGreenCtxCreate),
	P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	P("cuStreamCreate", 2000, cuStreamCreate),
	P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
	P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	P("cuStreamSynchronize", 2000, cuStreamSynchronize),
	PT("cuStreamSynchronize", 2000, cuStreamSynchronize_ptsz),
	P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
	PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
	P("cuStreamGetCtx", 9020, cuStreamGetCtx),
	PT("cuStreamGetCtx", 9020, cuStreamGetCtx_ptsz),
	P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
	PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent_ptsz),
	P("cuEventCreate", 2000, cuEventCreate),
	P("cuEventRecord", 2000, cuEventRecord),
	PT("cuEventRecord", 2000, cuEventRecord_ptsz),
	P("cuEventQuery", 2000, cuEventQuery),
	P("cuEventSynchronize", 2000, cuEventSynchronize),
	P("cuEventDestroy", 4000, cuEventDestroy_v2),
	P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
	P("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
	PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
	P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
	PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
	P("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph),
	PT("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph_ptsz),
	P("cuStreamEndCapture", 10000, cuStreamEndCapture),
	PT("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
	P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
	P("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
	P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
	P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	P("cuMemAddressReserve", 10020, cuMemAddressReserve),
	P("cuMemAddressFree", 10020, cuMemAddressFree),
	P("cuMemCreate", 10020, cuMemCreate),
	P("cuMemRelease", 10020, cuMemRelease),
	P("cuMemMap", 10020, cuMemMap),
	P("cuMemUnmap", 10020, cuMemUnmap),
	P("cuMemSetAccess", 10020, cuMemSetAccess),
	P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
	P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
	P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
	P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
	P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
	P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
	P("cuMemAlloc", 2000, cuMemAlloc),
	P("cuMemAlloc", 3020, cuMemAlloc_v2),
	P("cuMemFree", 2000, cuMemFree),
	P("cuMemFree", 3020, cuMemFree_v2),
	P("cuMemGetInfo", 2000, cuMemGetInfo),
	P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
	P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
	P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
	P("cuMemAllocAsync", 11020, cuMemAllocAsync),
	PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
	P("cuMemFreeAsync", 11020, cuMemFreeAsync),
	PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
	P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
	P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
	P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
	P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
	P("cuMemSetMemPool", 13000, cuMemSetMemPool),
	P("cuMemPoolCreate", 11020, cuMemPoolCreate),
	P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
	P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
	P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
};
#undef P
#undef PT

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	bool named = false;
	bool want_ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
		const struct proc *p = &procs[i];
		if (strcmp(p->name, symbol))
			continue;
		named = true;
		if (p->version > version)
			continue;
		if (p->ptsz && !want_ptsz)
			continue;
		if (!best || p->version > best->version ||
		    (p->version == best->version && p->ptsz))
			best = p;
	}
	if (!best) {
		*pfn = NULL;
		if (status)
			*status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
					: CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	*pfn = (void *)(uintptr_t)best->fn;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
			     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	fake_count("cuGetProcAddress_v2");
	return lookup(symbol, pfn, version, flags, status);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	fake_count("cuGetProcAddress");
	return lookup(symbol, pfn, version, flags, NULL);
}
