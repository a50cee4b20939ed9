/* driver.h — the driver layer: the only interface through which the pool
 * touches CUDA.
 *
 * Contract
 *  - Every operation returns a CUresult; the layer never aborts, never logs and
 *    never retries. CUDA_SUCCESS means the effect happened; any other value
 *    means nothing changed (an implementation that half-fails undoes itself).
 *  - event_query returns CUDA_SUCCESS (complete) or CUDA_ERROR_NOT_READY.
 *  - Physical handles are created shareable as POSIX file descriptors, so that
 *    export_fd can hand them to another process later.
 *  - A handle is mapped whole (offset 0, size = the handle's size); map and
 *    unmap take the handle's whole range.
 *  - Implementations are thread-safe: the pool may call them without its lock.
 *  - A negative `device` means the device of the calling thread's context.
 *
 * Two implementations: driver_cuda.c (libcuda.so.1, dlopen'ed at run time) and
 * driver_host.c (host memory that behaves like the GPU, for tests and replay).
 */
#ifndef VPMM_DRIVER_H
#define VPMM_DRIVER_H

#include <stddef.h>
#include <stdbool.h>
#include <cuda.h>

/* One value per driver operation: used for call counts, stats and fault
 * injection. Keep vpmm_op_name() in driver.c in step. */
enum vpmm_op {
	VPMM_OP_GRANULARITY,
	VPMM_OP_VA_RESERVE,
	VPMM_OP_VA_FREE,
	VPMM_OP_MEM_CREATE,
	VPMM_OP_MEM_RELEASE,
	VPMM_OP_MAP,
	VPMM_OP_UNMAP,
	VPMM_OP_SET_ACCESS,
	VPMM_OP_EVENT_CREATE,
	VPMM_OP_EVENT_RECORD,
	VPMM_OP_EVENT_QUERY,
	VPMM_OP_EVENT_SYNC,
	VPMM_OP_EVENT_DESTROY,
	VPMM_OP_STREAM_WAIT,
	VPMM_OP_STREAM_CAPTURING,
	VPMM_OP_MEM_INFO,
	VPMM_OP_EXPORT_FD,
	VPMM_OP_IMPORT_FD,
	VPMM_OP_CTX_CURRENT,
	VPMM_OP_CTX_BIND,
	VPMM_OP_CTX_ID,
	VPMM_OP_COUNT
};

const char *vpmm_op_name(enum vpmm_op op);

typedef struct vpmm_driver vpmm_driver;

struct vpmm_driver {
	const char *name; /* "cuda" or "host" */

	/* Minimum physical allocation granularity of `device`, in bytes. */
	CUresult (*granularity)(vpmm_driver *d, int device, size_t *out);
	/* Reserve `size` bytes of device virtual address space (no memory). */
	CUresult (*va_reserve)(vpmm_driver *d, size_t size, CUdeviceptr *out);
	CUresult (*va_free)(vpmm_driver *d, CUdeviceptr va, size_t size);
	/* Create a physical handle of `size` bytes (a multiple of the
	 * granularity) on `device`. CUDA_ERROR_OUT_OF_MEMORY when the device is full. */
	CUresult (*mem_create)(vpmm_driver *d, int device, size_t size,
			       CUmemGenericAllocationHandle *out);
	/* Drop the creator's reference; memory lives on while still mapped. */
	CUresult (*mem_release)(vpmm_driver *d, CUmemGenericAllocationHandle h);
	/* Map the whole handle (of `size` bytes) at `va`, inside a reservation.
	 * The range is not accessible until set_access. */
	CUresult (*map)(vpmm_driver *d, CUdeviceptr va, size_t size,
			CUmemGenericAllocationHandle h);
	CUresult (*unmap)(vpmm_driver *d, CUdeviceptr va, size_t size);
	/* Grant read/write to each of `devices` over a mapped range. */
	CUresult (*set_access)(vpmm_driver *d, CUdeviceptr va, size_t size,
			       const int *devices, int ndevices);

	/* Events are created without timing. */
	CUresult (*event_create)(vpmm_driver *d, CUevent *out);
	CUresult (*event_record)(vpmm_driver *d, CUevent ev, CUstream s);
	CUresult (*event_query)(vpmm_driver *d, CUevent ev);
	CUresult (*event_sync)(vpmm_driver *d, CUevent ev);
	CUresult (*event_destroy)(vpmm_driver *d, CUevent ev);
	/* Make future work on `s` wait for `ev` on the device (no CPU wait). */
	CUresult (*stream_wait)(vpmm_driver *d, CUstream s, CUevent ev);
	/* *capturing = whether `s` is being captured into a graph. */
	CUresult (*stream_capturing)(vpmm_driver *d, CUstream s, bool *capturing);
	/* Device memory free/total bytes of the current device. */
	CUresult (*mem_info)(vpmm_driver *d, size_t *free_bytes, size_t *total_bytes);
	/* A new file descriptor for the handle (caller closes it). */
	CUresult (*export_fd)(vpmm_driver *d, CUmemGenericAllocationHandle h, int *fd);
	/* A handle for memory another process exported with export_fd (the
	 * descriptor stays the caller's); mem_release drops it. */
	CUresult (*import_fd)(vpmm_driver *d, int fd, CUmemGenericAllocationHandle *out);
	/* The calling thread's current context, and making a context current
	 * on the calling thread: how the pool's own thread works in the
	 * context the pool was created in. */
	CUresult (*ctx_current)(vpmm_driver *d, CUcontext *out);
	CUresult (*ctx_bind)(vpmm_driver *d, CUcontext ctx);
	/* The unique id of `ctx` (NULL: the calling thread's current one).
	 * A context destroyed and made again under the same handle (a reset
	 * primary context) gets a new id, and answers
	 * CUDA_ERROR_CONTEXT_IS_DESTROYED in between: how the pool learns of a
	 * reset nothing told it of. CUDA_ERROR_NOT_SUPPORTED where the driver
	 * has no ids. */
	CUresult (*ctx_id)(vpmm_driver *d, CUcontext ctx, unsigned long long *id);

	/* Frees the driver object. The cuda driver leaves what it handed out to
	 * the owner; the host driver also unmaps and closes what it still tracks,
	 * so a test that forgot something does not leak host memory. */
	void (*destroy)(vpmm_driver *d);
};

/* ---- cuda: libcuda.so.1 loaded at run time -------------------------------- */

/* Resolves a driver entry point by name ("cuMemMap"), NULL when absent.
 * The shim passes one that bypasses its own hooks. */
typedef void *(*vpmm_cuda_resolver)(const char *name, void *arg);

/* resolver NULL: dlopen("libcuda.so.1") and dlsym. Entry points are resolved
 * once, here. Fails with CUDA_ERROR_NOT_FOUND when the library or a needed
 * symbol is missing. Does not call cuInit. */
CUresult vpmm_driver_cuda_create(vpmm_cuda_resolver resolver, void *arg,
				 vpmm_driver **out);

#endif
