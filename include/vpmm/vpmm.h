/* vpmm/vpmm.h — the process-level API of libvpmm.so: what a program (or a
 * language binding) running with the pool may ask of it: its version, each
 * device's counters, a consistency check, the region map, giving free memory
 * back, the two entry points of PyTorch's CUDAPluggableAllocator, and an
 * observer of allocations and frees.
 *
 * The shim's sources include this header, so these declarations are the
 * definitions' own. Valid C and C++; it needs neither cuda.h nor anything of
 * the build tree (vpmm/version.h and vpmm/stats.h are installed beside it).
 *
 * Reaching the library:
 *  - linked (`pkg-config --cflags --libs libvpmm`): the program then runs
 *    with the pool as if libvpmm.so were preloaded, as long as libvpmm comes
 *    before libcudart and libcuda in the link line (the hooks must win);
 *  - preloaded (LD_PRELOAD) or dlopen'ed by path (the pluggable allocator's
 *    way): look the functions up with dlsym, on RTLD_DEFAULT or on the
 *    handle; the declarations here give their types.
 *
 * Devices are CUDA device ordinals. A device has a pool once the pool served
 * its first allocation there; before that, the calls taking a device answer
 * -ENODEV. Negative errnos come from <errno.h>. Every function may be called
 * from any thread. Only vpmm_torch_malloc() creates a pool; only it,
 * vpmm_torch_free() and vpmm_shim_trim() call the driver; and
 * vpmm_shim_active() sets the library up as the first hooked call would
 * (reads the VPMM_* settings, opens libcuda, starts the vpmm-dump socket).
 */
#ifndef VPMM_VPMM_H
#define VPMM_VPMM_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h> /* ssize_t */

#include "vpmm/stats.h"
#include "vpmm/version.h"

#if defined(__GNUC__)
#define VPMM_API __attribute__((visibility("default")))
#else
#define VPMM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* cuda.h's CUstream and cudaStream_t point to this struct. */
struct CUstream_st;

/* The version of the library loaded ("0.1.0"): VPMM_VERSION of its build,
 * which may differ from the header's. */
VPMM_API const char *vpmm_version(void);

/* 1 when allocations go to the pool, 0 when everything passes through
 * (VPMM_DISABLE=1, a bad VPMM_* value, no CUDA driver). */
VPMM_API int vpmm_shim_active(void);

/* The counters of `device`'s pool into *out: 0, -ENODEV when the device has
 * no pool (yet), -EINVAL when out is NULL. See vpmm/stats.h on layout. */
VPMM_API int vpmm_shim_stats(int device, struct vpmm_stats *out);

/* The same as one JSON object on one line, {"live":..,"live_peak":..,...}
 * (the names of vpmm/stats.h), written into buf (NUL-terminated, cut to
 * len). Returns the length the whole object needs without the NUL
 * (snprintf-like: call again with a larger buffer when >= len), or a
 * negative errno (-ENODEV: no pool). buf may be NULL when len is 0. */
VPMM_API long vpmm_shim_stats_json(int device, char *buf, size_t len);

/* The pool's consistency check: the number of broken invariants, each
 * written to log (may be NULL); -ENODEV without a pool. 0 is healthy. */
VPMM_API long vpmm_shim_check(int device, FILE *log);

/* The region map of `device`'s pool, such as "[4M][*6M][1M][-11M]": live
 * [X], free [-X], unmapped hole [*X], awaiting unmap [~X]; sizes in
 * multiples of `unit` bytes, or with a K/M/G/T suffix when unit is 0.
 * Returns the length needed (snprintf-like) or -ENODEV. */
VPMM_API long vpmm_shim_layout(int device, char *buf, size_t len, size_t unit);

/* Gives free memory back to the driver: free pages whose queued work has
 * completed are unmapped and released until at most `keep` reusable bytes
 * stay in the pool, of `device` or, for a negative device, of every device.
 * Memory freed on a stream whose work is still queued stays, unless flags
 * has VPMM_TRIM_WAIT: then the pool's context is synchronised first (as
 * cudaDeviceSynchronize; torch.cuda.empty_cache() waits likewise), so that
 * every free page can go. Returns the bytes released (0 when there was
 * nothing to release, or no pool at all for a negative device), -ENODEV
 * when `device` has no pool, -EINVAL for unknown flags, or another negative
 * errno when the driver refused (what was released before the failure
 * stays released). Without flags, what `vpmm-dump --trim` asks for. */
#define VPMM_TRIM_WAIT 1u
VPMM_API long long vpmm_shim_trim(int device, size_t keep, unsigned flags);

/* The path of the Unix socket this process serves for vpmm-dump (and any
 * client of its protocol, such as the Python package's snapshot), or ""
 * while it serves none (not set up yet, VPMM_SOCKET=off, or it could not
 * start). */
VPMM_API const char *vpmm_shim_socket(void);

/* How often a hook (an exported CUDA name such as "cudaMalloc") or an
 * internal counter ("pool_malloc", "pool_free", "passthrough",
 * "sync_free") ran in this process; ULLONG_MAX for a name that is none. */
VPMM_API unsigned long long vpmm_shim_hook_calls(const char *name);

/* PyTorch's CUDAPluggableAllocator:
 *   torch.cuda.memory.CUDAPluggableAllocator(path_to_libvpmm_so,
 *                                            "vpmm_torch_malloc",
 *                                            "vpmm_torch_free")
 * Stream-ordered on `stream` (a cudaStream_t), in `device`'s primary
 * context when the calling thread has none; no device synchronisation on
 * free. When the memory cannot be had, the call throws a C++
 * std::runtime_error whose message says out of memory (or the driver's
 * error), since PyTorch would take NULL as a tensor at address 0; PyTorch
 * raises it in Python as a RuntimeError. It throws only where the process
 * has the C++ runtime; a C program without it gets NULL. */
VPMM_API void *vpmm_torch_malloc(ssize_t size, int device, struct CUstream_st *stream);
VPMM_API void vpmm_torch_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream);

/* An observer of the pool's allocations and frees (the Python package's
 * allocation history uses it): `fn(ctx, event)` is called on the thread
 * that allocated, right after each allocation the pool served, and on the
 * thread that frees, right before the pool takes each free (so that the
 * address cannot be handed out again before the call returns), whichever
 * entry point the call came through (vpmm_torch_malloc/free, the runtime's
 * or the driver's). Allocations the pool passed to the real functions are
 * not observed. No lock of the library is held during the call; it may
 * allocate and free through the library itself (that call is observed
 * too), and it must return quickly: every allocation waits for it.
 *
 * vpmm_set_alloc_observer(fn, ctx) replaces the observer; fn NULL removes
 * it. A call already under way on another thread may still reach the
 * previous fn, which must therefore stay callable (code that is never
 * unloaded). Returns 0. Without an observer, an allocation pays two
 * atomic loads. */
enum vpmm_alloc_event_kind { VPMM_EVENT_ALLOC = 1, VPMM_EVENT_FREE = 2 };
struct vpmm_alloc_event {
	int kind;                   /* VPMM_EVENT_ALLOC or VPMM_EVENT_FREE */
	int device;                 /* the pool's device */
	unsigned long long address; /* the allocation's address */
	size_t size;                /* alloc: bytes asked for; free: the allocation's
				       bytes in the pool (0 when not found) */
	struct CUstream_st *stream; /* the pool's stream; NULL: synchronous */
};
typedef void (*vpmm_alloc_observer)(void *ctx, const struct vpmm_alloc_event *event);
VPMM_API int vpmm_set_alloc_observer(vpmm_alloc_observer fn, void *ctx);

#ifdef __cplusplus
}
#endif

#endif
