/* shim.h — what the parts of libvpmm.so share (nothing here is exported).
 *
 *   log.c      "vpmm: " lines on stderr, filtered by VPMM_LOG
 *   resolve.c  the real functions behind every hook, found once
 *   dlsym.c    the dlsym hook (caller-preserving entry, wrapper lookup)
 *   dispatch.c process state: options, the cuda driver, one pool per device,
 *              the allocation semantics every hook shares, and the
 *              library's own vpmm_shim_* API (stats, layout, trim, hook
 *              counts), declared in the public vpmm/vpmm.h
 *   hooks.c    the exported hooks: they only forward (vpmm_torch_* too)
 *
 * The runtime's types are declared here rather than taken from
 * cuda_runtime.h: the shim needs an int and a handful of codes, and the
 * runtime codes it returns are numerically the driver's (CUDA aligned the
 * two enums for every code the shim forwards: 1, 2, 3, 4, 100, 201, 400, 700,
 * 709, 800, 801, 900-907, 999).
 */
#ifndef VPMM_SHIM_H
#define VPMM_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

#include "vpmm.h"
#include "options.h"
#include "vpmm/vpmm.h" /* the exported vpmm_* API: its one declaration */

#define VPMM_EXPORT __attribute__((visibility("default")))
#define VPMM_HIDDEN __attribute__((visibility("hidden")))
/* Code that may run before a sanitizer's runtime is ready: AddressSanitizer,
 * preloaded first, calls the exported dlsym while it starts, before its
 * shadow memory exists, and an instrumented load there crashes. */
#define VPMM_EARLY __attribute__((no_sanitize("address", "undefined")))

typedef int cudaError_t;
typedef CUstream cudaStream_t;
enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
};

/* ---- log.c ------------------------------------------------------------------ */

extern int vpmm_log_level VPMM_HIDDEN; /* enum vpmm_log_level; WARN until set */
void vpmm_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define vpmm_log_on(level) (vpmm_log_level >= (level))
#define VPMM_LOGF(level, ...)                                                 \
	do {                                                                  \
		if (vpmm_log_on(level))                                       \
			vpmm_log(level, __VA_ARGS__);                         \
	} while (0)

/* A kind of line that may come in floods (out of memory in a loop): the
 * first VPMM_LOG_BURST are shown, then one a second at most, and none
 * waits for stderr. Zero-initialised. */
#define VPMM_LOG_BURST 5
struct vpmm_log_limit {
	_Atomic uint64_t seen, held, last_ns;
};
/* Whether to show this one: 0, or 1 + how many were not shown since the
 * last one that was (the caller says so in the line). */
uint64_t vpmm_log_limit_take(struct vpmm_log_limit *l) VPMM_HIDDEN;
/* vpmm_log without waiting: a line stderr does not take at once is dropped
 * and counted in the next. */
void vpmm_log_limited(struct vpmm_log_limit *l, int level, const char *fmt, ...)
	VPMM_HIDDEN __attribute__((format(printf, 3, 4)));

/* ---- hook counters (dispatch.c) ------------------------------------------------ */

#define VPMM_HOOKS(X)                                                         \
	X(cudaMalloc)                                                         \
	X(cudaFree)                                                           \
	X(cudaMallocAsync)                                                    \
	X(cudaFreeAsync)                                                      \
	X(cudaMallocAsync_ptsz)                                               \
	X(cudaFreeAsync_ptsz)                                                 \
	X(cudaMemGetInfo)                                                     \
	X(cuMemAlloc_v2)                                                      \
	X(cuMemFree_v2)                                                       \
	X(cuMemAllocAsync)                                                    \
	X(cuMemAllocAsync_ptsz)                                               \
	X(cuMemFreeAsync)                                                     \
	X(cuMemFreeAsync_ptsz)                                                \
	X(cuMemGetInfo_v2)                                                    \
	X(cuMemGetAddressRange_v2)                                            \
	X(cuPointerGetAttribute)                                              \
	X(cuPointerGetAttributes)                                             \
	X(cuStreamDestroy_v2)                                                 \
	X(cuIpcGetMemHandle)                                                  \
	X(cuIpcOpenMemHandle_v2)                                              \
	X(cuIpcCloseMemHandle)                                                \
	X(cuCtxEnablePeerAccess)                                              \
	X(cuCtxDestroy_v2)                                                    \
	X(cuDevicePrimaryCtxReset_v2)                                         \
	X(cuMemCreate)              /* the program's own mappings */            \
	X(cuGetProcAddress)                                                   \
	X(cuGetProcAddress_v2)                                                \
	X(dlsym_wrapped)            /* dlsym answers that were our wrappers */  \
	X(proc_wrapped)             /* cuGetProcAddress answers likewise */     \
	X(vpmm_torch_malloc)                                                  \
	X(vpmm_torch_free)                                                    \
	X(pool_malloc)              /* allocations the pool served */           \
	X(pool_free)                /* frees the pool took */                   \
	X(passthrough)              /* calls handed to the real function */     \
	X(sync_free)                /* context synchronisations for a free */

enum vpmm_hook {
#define X(n) VPMM_HOOK_##n,
	VPMM_HOOKS(X)
#undef X
	VPMM_HOOK_COUNT
};

void vpmm_count(enum vpmm_hook h);

/* Non-zero while this thread runs a real function on a hook's behalf: the
 * driver entry points the real runtime reaches through our wrappers then go
 * straight to libcuda, so one allocation never passes two hooks. */
extern __thread int vpmm_tls_inside VPMM_HIDDEN;

/* ---- resolve.c --------------------------------------------------------------- */

typedef CUresult (*vpmm_gpa_v2_fn)(const char *, void **, int, cuuint64_t,
				    CUdriverProcAddressQueryResult *);
typedef CUresult (*vpmm_gpa_v1_fn)(const char *, void **, int, cuuint64_t);

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
	VPMM_W_PRIMARY_RESET,
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
	CUresult (*primary_reset)(CUdevice);
	/* Helpers for the dispatch layer; any may be NULL on an old driver. */
	CUresult (*ctx_get_current)(CUcontext *);
	CUresult (*ctx_get_device)(CUdevice *);
	CUresult (*ctx_synchronize)(void);
	CUresult (*ctx_synchronize_v2)(CUcontext);
	CUresult (*ctx_push)(CUcontext);
	CUresult (*ctx_pop)(CUcontext *);
	CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*stream_get_ctx)(CUstream, CUcontext *);
	CUresult (*stream_synchronize)(CUstream);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*primary_get_state)(CUdevice, unsigned int *, int *);
};

extern struct vpmm_real vpmm_real VPMM_HIDDEN;

/* glibc's dlsym (the real one); set by vpmm_resolve_dlsym(). */
extern void *(*vpmm_real_dlsym_fn)(void *, const char *) VPMM_HIDDEN;
void vpmm_resolve_dlsym(void);
/* Everything else: libcuda and its entry points. Idempotent, thread-safe. */
void vpmm_resolve(void);
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

/* The wrappers (hooks.c), one per enum vpmm_wrapped. Function pointers
 * travel as vpmm_fnptr; ISO C converts them to void * only through an
 * integer, hence the two helpers. */
typedef void (*vpmm_fnptr)(void);
extern const vpmm_fnptr vpmm_wrappers[VPMM_W_COUNT] VPMM_HIDDEN;
static inline void *vpmm_fn_to_ptr(vpmm_fnptr f)
{
	return (void *)(uintptr_t)f;
}
#define VPMM_PTR_TO_FN(type, p) ((type)(uintptr_t)(p))

/* ---- dispatch.c -------------------------------------------------------------- */

/* Whether the shim routes anything (options valid, not disabled, libcuda
 * and the cuda driver layer set up). Reads the options once; cheap after.
 * When false, cuGetProcAddress and dlsym hand out real pointers untouched. */
bool vpmm_active(void);

/* How a call reached us: decides the default stream's meaning and what to
 * do when the thread has no context. */
enum vpmm_via {
	VPMM_VIA_DRIVER,      /* cu* wrapper: legacy default stream */
	VPMM_VIA_DRIVER_PTSZ, /* cu*_ptsz wrapper: per-thread default stream */
	VPMM_VIA_RUNTIME,     /* runtime hook: may initialise the runtime */
	VPMM_VIA_RUNTIME_PTSZ,
	VPMM_VIA_TORCH,       /* CUDAPluggableAllocator: the device is given */
};

/* Each returns true when it handled the call (the result in *res) and false
 * when the call must go to the real function unchanged. `stream` is as the
 * caller gave it; VPMM_NO_STREAM for the synchronous calls. */
/* The program is destroying stream s: every pool retires it first. */
void vpmm_stream_destroying(CUstream s);
bool vpmm_do_malloc(CUdeviceptr *out, size_t size, CUstream stream,
		    enum vpmm_via via, int device, void *caller, CUresult *res);
bool vpmm_do_free(CUdeviceptr ptr, CUstream stream, enum vpmm_via via,
		  CUresult *res);
/* The pluggable allocator's pass-through: size > 0 allocates into *inout,
 * size 0 frees *inout, on `stream`, in a context of `device`. */
CUresult vpmm_torch_real(CUdeviceptr *inout, size_t size, int device, CUstream stream);
/* Turns the driver's free bytes of the current device into what its pool
 * can still hand out: plus its reusable bytes, within VPMM_LIMIT. */
void vpmm_add_reusable(size_t *free_bytes, size_t total);
/* Where ptr lies: in a live pool allocation (with its base and size), in a
 * pool's address space but no live allocation (freed, a slab's unused
 * block: the driver would answer with the pool's mapping there), or
 * outside every pool. */
enum vpmm_where { VPMM_NOT_POOLS, VPMM_POOL_LIVE, VPMM_POOL_NOT_LIVE };
enum vpmm_where vpmm_find_live(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);

/* For ipc.c: the driver layer, a device's pool (NULL if none) and the
 * context it was made in, the device whose pool owns ptr (-1: none). */
vpmm_driver *vpmm_shim_driver(void);
/* The context of device's pool made current (pushed if needed), and back. */
CUresult vpmm_push_pool_ctx(int device, bool *pushed);
void vpmm_pop_ctx(bool pushed);
vpmm_pool *vpmm_device_pool(int device, CUcontext *ctx);
int vpmm_owner_device(CUdeviceptr ptr);
/* The program enabled peer access from the current context to `peer`'s
 * memory: the peer's pool grants the current device. */
void vpmm_peer_enabled(CUcontext peer);
/* The program is about to destroy context `ctx` (cuCtxDestroy), or to reset
 * the primary context of `device` (cuDevicePrimaryCtxReset; ctx NULL): the
 * pools living in it settle what the context's work held and drop the
 * events the driver is about to destroy. */
void vpmm_context_ending(CUcontext ctx, int device);
/* The program made a handle of its own (cuMemCreate succeeded): memory the
 * pool does not serve. Said once per process. */
void vpmm_own_mapping(const CUmemAllocationProp *prop, size_t size);

/* ---- ipc.c ------------------------------------------------------------------------ */

/* Each returns true when it handled the call (the result in *res), false
 * when the call is the driver's own (not pool memory, not our handle). */
bool vpmm_ipc_get(CUipcMemHandle *handle, CUdeviceptr ptr, CUresult *res);
bool vpmm_ipc_open(CUdeviceptr *out, const CUipcMemHandle *handle, unsigned flags,
		   CUresult *res);
bool vpmm_ipc_close(CUdeviceptr ptr, CUresult *res);
/* A free of pool memory that was shared: 1 when it was deferred until the
 * last opener closes (the caller reports success), -1 when the program
 * freed it before and it is only kept for the openers (a double free), 0
 * when the pool frees it now. */
int vpmm_ipc_defer_free(int device, CUdeviceptr ptr, CUstream stream);
/* The server's ipc-* requests and its once-a-second tick (server.h). */
const char *vpmm_ipc_serve(const char *request, const char *arg, long peer, char *fields,
			   size_t len, int *fds, unsigned *nfds);
void vpmm_ipc_tick(void);

/* Calls the real runtime's cudaFree(NULL) to make the runtime set up its
 * context on this thread (dispatch.c uses it; hooks.c defines it). */
cudaError_t vpmm_runtime_init(void *caller);

#endif
