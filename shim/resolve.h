/* resolve.h — the real functions behind every hook (resolve.c): glibc's
 * dlsym, libcuda and its entry points, the real runtime. Includes shim.h
 * only.
 */
#ifndef VPMM_RESOLVE_H
#define VPMM_RESOLVE_H

#include "shim.h"

typedef CUresult (*vpmm_gpa_v2_fn)(const char *, void **, int, cuuint64_t,
				    CUdriverProcAddressQueryResult *);
typedef CUresult (*vpmm_gpa_v1_fn)(const char *, void **, int, cuuint64_t);

/* The edge data of cuStreamBeginCaptureToGraph and the capture query's
 * third form (CUDA 12.3): opaque with older headers, which have neither. */
#if CUDA_VERSION >= 12030
typedef CUgraphEdgeData vpmm_edge_data;
#else
typedef struct vpmm_edge_data vpmm_edge_data;
#endif

/* The driver entry points we wrap: their forwarding targets. */
enum vpmm_wrapped {
	VPMM_W_GPA_V2,
	VPMM_W_GPA_V1,
	VPMM_W_MEM_ALLOC,
	VPMM_W_MEM_FREE,
	VPMM_W_ALLOC_ASYNC,
	VPMM_W_ALLOC_ASYNC_PTSZ,
	VPMM_W_FREE_ASYNC,
	VPMM_W_FREE_ASYNC_PTSZ,
	VPMM_W_MEM_GET_INFO,
	VPMM_W_ADDRESS_RANGE,
	VPMM_W_PTR_ATTR,
	VPMM_W_PTR_ATTRS,
	VPMM_W_STREAM_DESTROY,
	VPMM_W_IPC_GET,
	VPMM_W_IPC_OPEN,
	VPMM_W_IPC_CLOSE,
	VPMM_W_PEER_ENABLE,
	VPMM_W_MEM_CREATE,
	VPMM_W_CTX_DESTROY,
	VPMM_W_CTX_CREATE,
	VPMM_W_CTX_CREATE_V3,
	VPMM_W_CTX_CREATE_V4,
	VPMM_W_GREEN_CTX_CREATE,
	VPMM_W_PRIMARY_RESET,
	VPMM_W_STREAM_CREATE,
	VPMM_W_STREAM_CREATE_PRIO,
	VPMM_W_GREEN_STREAM_CREATE,
	/* stream capture (capture.c) */
	VPMM_W_BEGIN_CAPTURE,
	VPMM_W_BEGIN_CAPTURE_PTSZ,
	VPMM_W_BEGIN_CAPTURE_V2,
	VPMM_W_BEGIN_CAPTURE_V2_PTSZ,
	VPMM_W_BEGIN_TO_GRAPH,
	VPMM_W_BEGIN_TO_GRAPH_PTSZ,
	VPMM_W_END_CAPTURE,
	VPMM_W_END_CAPTURE_PTSZ,
	/* queries.c, mempool.c */
	VPMM_W_RETAIN_HANDLE,
	VPMM_W_DEVICE_SET_MEMPOOL,
	VPMM_W_MEM_SET_MEMPOOL,
	VPMM_W_MEMPOOL_DESTROY,
	VPMM_W_MEMPOOL_GET_ATTR,
	VPMM_W_MEMPOOL_SET_ATTR,
	VPMM_W_MEMPOOL_TRIM,
	VPMM_W_COUNT
};

struct vpmm_real {
	void *libcuda; /* NULL: no driver here; every driver hook passes through */
	int driver_version;
	vpmm_gpa_v2_fn gpa_v2;
	vpmm_gpa_v1_fn gpa_v1;
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
	CUresult (*mem_get_info)(size_t *, size_t *);
	CUresult (*address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*ptr_attr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*ptr_attrs)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*ipc_close)(CUdeviceptr);
	CUresult (*peer_enable)(CUcontext, unsigned);
	CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t,
			       const CUmemAllocationProp *, unsigned long long);
	CUresult (*ctx_destroy)(CUcontext);
	CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
	CUresult (*ctx_create_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
	CUresult (*ctx_create_v4)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
	CUresult (*green_ctx_create)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
	CUresult (*primary_reset)(CUdevice);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*stream_create_prio)(CUstream *, unsigned, int);
	CUresult (*green_stream_create)(CUstream *, CUgreenCtx, unsigned, int);
	/* queries.c, mempool.c */
	CUresult (*retain_handle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*device_set_mempool)(CUdevice, CUmemoryPool);
	CUresult (*mem_set_mempool)(CUmemLocation *, CUmemAllocationType, CUmemoryPool);
	CUresult (*mempool_destroy)(CUmemoryPool);
	CUresult (*mempool_get_attr)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*mempool_set_attr)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*mempool_trim)(CUmemoryPool, size_t);
	CUresult (*device_default_mempool)(CUmemoryPool *, CUdevice);
	/* Helpers for the other rooms; any may be NULL on an old driver. */
	CUresult (*ctx_get_current)(CUcontext *);
	CUresult (*ctx_get_device)(CUdevice *);
	CUresult (*ctx_synchronize)(void);
	CUresult (*ctx_synchronize_v2)(CUcontext);
	CUresult (*ctx_push)(CUcontext);
	CUresult (*ctx_pop)(CUcontext *);
	CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*stream_get_ctx)(CUstream, CUcontext *);
	CUresult (*stream_synchronize)(CUstream);
	CUresult (*event_query)(CUevent);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*primary_get_state)(CUdevice, unsigned int *, int *);
	CUresult (*event_create)(CUevent *, unsigned);
	CUresult (*event_record)(CUevent, CUstream);
	CUresult (*event_destroy)(CUevent);
	CUresult (*stream_wait_event)(CUstream, CUevent, unsigned);
	CUresult (*ctx_get_id)(CUcontext, unsigned long long *);
	/* Stream capture (capture.c): the wrapped entry points, then the
	 * helpers; the capture query in the newest form the driver has. */
	CUresult (*begin_capture)(CUstream);
	CUresult (*begin_capture_ptsz)(CUstream);
	CUresult (*begin_capture_v2)(CUstream, CUstreamCaptureMode);
	CUresult (*begin_capture_v2_ptsz)(CUstream, CUstreamCaptureMode);
	CUresult (*begin_to_graph)(CUstream, CUgraph, const CUgraphNode *,
				   const vpmm_edge_data *, size_t, CUstreamCaptureMode);
	CUresult (*begin_to_graph_ptsz)(CUstream, CUgraph, const CUgraphNode *,
					const vpmm_edge_data *, size_t, CUstreamCaptureMode);
	CUresult (*end_capture)(CUstream, CUgraph *);
	CUresult (*end_capture_ptsz)(CUstream, CUgraph *);
	CUresult (*capture_info_v3)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
				    const CUgraphNode **, const vpmm_edge_data **, size_t *);
	CUresult (*capture_info_v2)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
				    const CUgraphNode **, size_t *);
	CUresult (*capture_info_v1)(CUstream, CUstreamCaptureStatus *, cuuint64_t *);
	CUresult (*exchange_capture_mode)(CUstreamCaptureMode *);
};

extern struct vpmm_real vpmm_real VPMM_HIDDEN;

/* glibc's dlsym (the real one); set by vpmm_resolve_dlsym(). */
extern void *(*vpmm_real_dlsym_fn)(void *, const char *) VPMM_HIDDEN;
void vpmm_resolve_dlsym(void);
/* Everything else: libcuda and its entry points. Idempotent, thread-safe. */
void vpmm_resolve(void);
/* r = the real entry point `field` called with the rest, libcuda resolved
 * first; where it lacks that entry point, the calling hook returns
 * CUDA_ERROR_NOT_INITIALIZED. */
#define VPMM_REAL_CALL(r, field, ...)                                         \
	do {                                                                  \
		vpmm_resolve();                                               \
		if (!vpmm_real.field)                                         \
			return CUDA_ERROR_NOT_INITIALIZED;                    \
		(r) = vpmm_real.field(__VA_ARGS__);                           \
	} while (0)
/* Whether this thread is inside vpmm_resolve() (dlopen of libcuda). */
bool vpmm_resolving(void);

/* Our wrapper for a pointer the real libcuda handed out, or NULL when the
 * pointer is none of the wrapped entry points. */
void *vpmm_wrapper_for(void *real_fn);
/* Whether a symbol name is one a wrapper may stand for ("cuMemAlloc_v2"). */
bool vpmm_wrapped_name(const char *name);
/* A real driver entry point by exported name, never one of our wrappers:
 * the resolver given to the cuda driver layer. */
void *vpmm_real_entry(const char *name, void *arg);

enum vpmm_rt {
	VPMM_RT_MALLOC,
	VPMM_RT_FREE,
	VPMM_RT_MALLOC_ASYNC,
	VPMM_RT_FREE_ASYNC,
	VPMM_RT_MALLOC_ASYNC_PTSZ,
	VPMM_RT_FREE_ASYNC_PTSZ,
	VPMM_RT_MEM_GET_INFO,
	VPMM_RT_COUNT
};
/* The real runtime function behind a runtime hook, found next after us in
 * the global scope or else in the scope of `caller` (the hook's return
 * address: a runtime loaded RTLD_LOCAL, as Python extensions load theirs);
 * NULL when neither has one. */
void *vpmm_real_runtime(enum vpmm_rt fn, void *caller);

/* The wrappers (hooks.c), one per enum vpmm_wrapped: the exported entry
 * points that cuGetProcAddress and dlsym answers are swapped for. */
extern const vpmm_fnptr vpmm_wrappers[VPMM_W_COUNT] VPMM_HIDDEN;

#endif
