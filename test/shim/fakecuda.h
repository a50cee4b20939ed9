/* fakecuda.h — what the files of the stand-in libcuda.so.1 share (the
 * library is described in fakecuda.c): the host driver under it, the lock, the
 * devices' primary contexts, the call counters, and every entry point
 * it exports. Included only by test/shim/fakecuda*.c.
 *
 * The files, each calling only those listed after it:
 *   fakecuda_procs.c   cuGetProcAddress and its table of every entry point
 *   fakecuda_mem.c     virtual memory, IPC, plain allocations, pointer queries
 *   fakecuda_pool.c    memory pools: the default and current ones, attributes
 *   fakecuda_stream.c  streams, events, stream capture
 *   fakecuda_ctx.c     init, devices, contexts, primary contexts, peers
 *   fakecuda.c         the shared state, call counters, injected faults
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <pthread.h>
#include <stdint.h>

#include "driver_host.h"

/* cuda.h maps these names to their current versions; here they are the
 * old variants the fake also offers. */
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#define API __attribute__((visibility("default")))
#define MAX_DEV 8
#define FAKE_GENS 16

struct fake_ctx {
	int device;
	bool destroyed;
	unsigned gen; /* bumped when the context is reset or destroyed */
	/* When generation g ended (fake_ctx_end), at [g % FAKE_GENS]: g,
	 * fake_epoch then, the thread that ended it, and whether the end was
	 * one no hook of the shim's sees. */
	unsigned end_gen[FAKE_GENS];
	unsigned long end_epoch[FAKE_GENS];
	pthread_t end_thread[FAKE_GENS];
	bool end_unseen[FAKE_GENS];
	int refs;     /* a primary context's retains: the last release ends it */
	unsigned long long id; /* cuCtxGetId: new each time the context is made */
	struct fake_ctx *made_before; /* the program's contexts, all kept */
};

/* ---- fakecuda.c ---- */

extern pthread_mutex_t fake_lock;  /* guards everything below and the lists */
extern vpmm_driver *fake_drv;      /* NULL until cuInit */
extern size_t fake_capacity;       /* bytes of the device */
extern size_t fake_free_drift;     /* FAKECUDA_FREE_DRIFT (fakecuda.c) */
extern int fake_ndev;
extern struct fake_ctx fake_ctxs[MAX_DEV]; /* the primary contexts */

/* Counts a call of `name` if it is one fakecuda_calls() reports. */
void fake_count(const char *name);

#define NEED_INIT()                                                           \
	do {                                                                  \
		if (!fake_drv)                                                \
			return CUDA_ERROR_NOT_INITIALIZED;                    \
	} while (0)

API unsigned long fakecuda_calls(const char *name);
API void fakecuda_fail(int op, unsigned long nth, int result);

/* ---- fakecuda_ctx.c ---- */

/* The calling thread's current context, or NULL. */
struct fake_ctx *fake_current(void);
/* Counts driver work done with no current context: the real driver refuses
 * some of it, and the shim is meant to set one up first. */
void fake_note_context(void);
/* Ends context c's current generation (fake_lock held): destroyed, its
 * streams and events dead, the moment and the thread noted, and whether
 * no hook sees this end (`unseen`: the runtime's private reset, a primary
 * context's last release). */
void fake_ctx_end(struct fake_ctx *c, bool unseen);
/* Counts a use of a stream or event of generation `gen` of c, which ended
 * (fake_lock held): on a GPU a use of a destroyed object inside libcuda,
 * which may crash there. "dead_handle_raced" where no check could have
 * prevented it: the end unseen by every hook, made by another thread
 * after the calling thread's last cuCtxGetId, and this the first such use
 * since, with no driver work of the thread's between (a pool's background
 * thread between its context check and the event query it guards); a
 * hazard the shim cannot close, rare, that tests count apart. Every other
 * is "dead_handle". */
void fake_dead_use(struct fake_ctx *c, unsigned gen);
/* cuCtxGetId was asked by this thread (fake_lock held). */
void fake_ctx_checked(void);
/* This thread made other driver work (mapping, unmapping, handles): a
 * dead use after it is not the one its last check guarded. */
void fake_ctx_other_work(void);
/* The current context's state as a CUresult: SUCCESS, INVALID_CONTEXT or
 * CONTEXT_IS_DESTROYED (NOT_INITIALIZED before cuInit). */
CUresult fake_ctx_state(void);

API CUresult cuInit(unsigned int flags);
API CUresult cuDriverGetVersion(int *v);
API CUresult cuDeviceGet(CUdevice *dev, int ordinal);
API CUresult cuDeviceGetCount(int *n);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
API void fakecuda_sticky(int result);
API void fakecuda_refuse_destroy(int result);
API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id);
API CUresult cuGetExportTable(const void **table, const CUuuid *id);
API CUresult cuCtxGetCurrent(CUcontext *pctx);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxGetDevice(CUdevice *dev);
API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
API CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
API CUresult cuCtxSynchronize(void);
API CUresult cuCtxSynchronize_v2(CUcontext ctx);
API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
			    unsigned int flags, CUdevice dev);
API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			    CUdevice dev);
API CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			      unsigned int flags);
API CUresult cuCtxDestroy_v2(CUcontext ctx);
API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);

/* ---- fakecuda_stream.c ---- */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags);
API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority);
API CUresult fakecuda_stream_create_unseen(CUstream *s, unsigned int flags);
API CUresult cuStreamDestroy_v2(CUstream s);
API CUresult cuStreamSynchronize(CUstream s);
API CUresult cuStreamSynchronize_ptsz(CUstream s);
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st);
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
API CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx);
API CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *pctx);
API CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags);
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags);
API CUresult cuEventCreate(CUevent *ev, unsigned int flags);
API CUresult cuEventRecord(CUevent ev, CUstream s);
API CUresult cuEventRecord_ptsz(CUevent ev, CUstream s);
API CUresult cuEventQuery(CUevent ev);
API CUresult cuEventSynchronize(CUevent ev);
API CUresult cuEventDestroy_v2(CUevent ev);
API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
API void fakecuda_set_capturing(CUstream s, int on);
API void fakecuda_set_implicit(int on);
API void fakecuda_set_eager(int on);
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuStreamGetCaptureInfo
#undef cuStreamBeginCaptureToGraph
API CUresult cuStreamBeginCapture(CUstream s);
API CUresult cuStreamBeginCapture_ptsz(CUstream s);
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
					 const CUgraphEdgeData *data, size_t n,
					 CUstreamCaptureMode mode);
API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					      const CUgraphEdgeData *data, size_t n,
					      CUstreamCaptureMode mode);
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
API CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id);
API CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
				       CUgraph *g, const CUgraphNode **deps, size_t *n);
API CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
				       CUgraph *g, const CUgraphNode **deps,
				       const CUgraphEdgeData **data, size_t *n);
/* CUDA_SUCCESS, or CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when a capture
 * forbids the calling thread a potentially unsafe call: the captures that
 * forbid it are invalidated, as on the real driver. */
CUresult fake_capture_check(void);

/* ---- fakecuda_mem.c ---- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags flags);
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
				 CUdeviceptr addr, unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle h);
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
		      CUmemGenericAllocationHandle h, unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr p, size_t size);
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
			    size_t count);
API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					  CUmemAllocationHandleType type,
					  unsigned long long flags);
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					    CUmemAllocationHandleType type);
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p);
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
API CUresult cuIpcCloseMemHandle(CUdeviceptr p);
API int fakecuda_accessible(CUdeviceptr p, int device);
API int fakecuda_mapping_of(CUdeviceptr p, CUdeviceptr *base, size_t *size);
API CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize);
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
API CUresult cuMemFree(unsigned int dptr);
API CUresult cuMemFree_v2(CUdeviceptr dptr);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s);
API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total);
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p);
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p);
API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *a, void **data,
				    CUdeviceptr p);
API void fakecuda_mem_info(size_t *free_bytes, size_t *total);

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				     CUstream s);
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);

/* ---- fakecuda_pool.c ---- */

/* A memory pool: the bytes of plain allocations made from it. */
struct fake_pool {
	int device;
	bool made;      /* by cuMemPoolCreate, not a device's default */
	bool destroyed; /* by cuMemPoolDestroy: no longer a valid handle */
	uint64_t used, used_high, reserved, reserved_high, threshold;
};

/* The current context's device's current pool. */
struct fake_pool *fake_pool_current(void);
/* A pool handle the fake made, or NULL. */
struct fake_pool *fake_pool_of(CUmemoryPool pool);
/* n bytes of an allocation from pool p taken (add) or freed; fake_lock
 * held. */
void fake_pool_charge(struct fake_pool *p, size_t n, bool add);

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
API CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			     CUmemoryPool pool);
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);

/* ---- fakecuda_procs.c ---- */

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
			      cuuint64_t flags);

#endif
