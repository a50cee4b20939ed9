/* shim.h — what every part of libvpmm.so shares (nothing here is exported):
 * the visibility macros, the runtime's few types, the log (log.c), the hook
 * counters (count.c) and the recursion guard (process.c). Each room of the
 * shim has its own header for the rest; docs/design.md ("The map of the
 * code") lists them. This header includes no other shim header.
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

/* The most verbose enum vpmm_log_level shown; WARN until set. */
extern int vpmm_log_shown VPMM_HIDDEN;
void vpmm_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define vpmm_log_on(level) (vpmm_log_shown >= (level))
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

/* ---- hook counters (count.c) ------------------------------------------------ */

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
	X(cuCtxCreate)              /* every form */                            \
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
	X(sync_free)                /* context synchronisations for a free */ \
	X(cuStreamCreate)                                                     \
	X(cuStreamCreateWithPriority)                                         \
	X(cuGreenCtxCreate)                                                   \
	X(cuGreenCtxStreamCreate)                                             \
	X(fence_free)               /* synchronous frees fenced, not synced */ \
	X(fence_malloc)             /* synchronous mallocs on the legacy stream */ \
	X(fence_owed)               /* legacy records that runs of frees owed */ \
	X(fence_clean)              /* fence_malloc with nothing to wait for */ \
	X(fence_spared)             /* fence_malloc with a record owed, not needed */ \
	X(fence_done)               /* fence_malloc after the old work completed */ \
	X(cuStreamBeginCapture)     /* every form */                            \
	X(cuStreamEndCapture)                                                 \
	X(capture_deferred)         /* frees of pool memory a capture held back */ \
	X(capture_flushed)          /* those made once their capture ended */ \
	X(cuMemRetainAllocationHandle)                                        \
	X(cuDeviceSetMemPool)                                                 \
	X(cuMemSetMemPool)                                                    \
	X(cuMemPoolDestroy)                                                   \
	X(cuMemPoolGetAttribute)                                              \
	X(cuMemPoolSetAttribute)                                              \
	X(cuMemPoolTrimTo)

enum vpmm_hook {
#define X(n) VPMM_HOOK_##n,
	VPMM_HOOKS(X)
#undef X
	VPMM_HOOK_COUNT
};

void vpmm_count(enum vpmm_hook h);
/* The sum of one counter over every thread, by name ("cudaMalloc",
 * "pool_malloc", ...); ULLONG_MAX for a name that is none. */
unsigned long long vpmm_count_total(const char *name);

/* Non-zero while this thread runs a real function on a hook's behalf: the
 * driver entry points the real runtime reaches through our wrappers then go
 * straight to libcuda, so one allocation never passes two hooks. */
extern __thread int vpmm_tls_inside VPMM_HIDDEN;

/* Function pointers travel as vpmm_fnptr; ISO C converts them to void *
 * only through an integer, hence the two helpers. */
typedef void (*vpmm_fnptr)(void);
static inline void *vpmm_fn_to_ptr(vpmm_fnptr f)
{
	return (void *)(uintptr_t)f;
}
#define VPMM_PTR_TO_FN(type, p) ((type)(uintptr_t)(p))

#endif
