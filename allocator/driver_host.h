/* driver_host.h — a driver that behaves like a GPU on host memory.
 *
 *  - VA reservation: a PROT_NONE mapping. A physical handle: a memfd. Map:
 *    MAP_FIXED|MAP_SHARED of the memfd, inaccessible until set_access, so a page
 *    mapped at two addresses shows the same bytes at both, as on the GPU.
 *  - Unbacked mode only accounts (no memory is touched): VAs are numbers, for
 *    replaying traces of tens of GB.
 *  - Streams are queues. Recorded events stay pending until the test completes
 *    them (vpmm_host_stream_complete); a stream_wait blocks later entries of
 *    its stream until the awaited event completes — as the device would.
 *  - Misuse that the real driver rejects (mapping over a mapping, unmapping
 *    what is not mapped, unknown handles) is rejected with the same codes.
 *  - Faults: the N-th next call of any operation can be made to fail, and
 *    any operation can be held at a gate.
 *  - A hook runs before every operation, on the caller's thread: what the
 *    device does on its own time (host_device.h).
 *  - Capacity: creating handles beyond it returns CUDA_ERROR_OUT_OF_MEMORY.
 *    Another tenant (vpmm_host_set_tenant) holds part of it, as a second
 *    process on the same GPU would: it shrinks what mem_create may take and
 *    what mem_info reports free.
 */
#ifndef VPMM_DRIVER_HOST_H
#define VPMM_DRIVER_HOST_H

#include "driver.h"

struct vpmm_host_options {
	size_t granularity; /* bytes, power of two >= 4096; 0 = 2 MiB */
	size_t capacity;    /* device bytes; 0 = 1 TiB */
	bool unbacked;      /* account only, touch no memory */
};

CUresult vpmm_driver_host_create(const struct vpmm_host_options *opt,
				 vpmm_driver **out);

/* A new stream. (CUstream)0 and CU_STREAM_PER_THREAD also work as streams. */
CUstream vpmm_host_stream_create(vpmm_driver *d);

/* The program destroys `s`: its handle is refused from now on (and may come
 * back from vpmm_host_stream_create), while the work queued on it still runs,
 * as on the device: vpmm_host_complete_all() and a sync on one of its events
 * reach it. Its memory is freed once its queue ran empty. */
void vpmm_host_stream_destroy(vpmm_driver *d, CUstream s);

/* Run the queue of `s` as far as it can go: every recorded event completes,
 * up to the first wait on an event that has not completed. Returns how many
 * events completed. */
unsigned vpmm_host_stream_complete(vpmm_driver *d, CUstream s);
/* Complete every stream (repeats until nothing moves). */
unsigned vpmm_host_complete_all(vpmm_driver *d);
/* Run the queue of the stream numbered n modulo the streams there are (the
 * created ones, then the special ones), as vpmm_host_stream_complete: for
 * a device that completes work of streams it picks itself. */
unsigned vpmm_host_complete_nth(vpmm_driver *d, size_t n);
/* Whether `s` has a pending wait on `ev` queued (not yet passed). */
bool vpmm_host_stream_waits_on(vpmm_driver *d, CUstream s, CUevent ev);
/* Number of waits ever queued on `s`. */
unsigned long vpmm_host_stream_wait_count(vpmm_driver *d, CUstream s);
/* Mark `s` as capturing or not. */
void vpmm_host_set_capturing(vpmm_driver *d, CUstream s, bool capturing);

/* Another process holds `bytes` of the device from now on (0: none). It may
 * hold more than is free: the pool's handles stay, and every mem_create
 * fails until enough is given back. Thread-safe. */
void vpmm_host_set_tenant(vpmm_driver *d, size_t bytes);
/* Bytes of the device neither the tenant nor any handle holds. */
size_t vpmm_host_free_bytes(vpmm_driver *d);

/* Called at the start of every operation, on the caller's thread and
 * before the driver's lock is taken, so that it may call the controls here
 * (complete streams, move the tenant) or sleep: what the real device does
 * on its own time while the pool works (host_device.h builds on it). Set
 * or cleared (fn NULL) only while no other thread calls the driver. */
typedef void (*vpmm_host_hook)(void *arg, enum vpmm_op op);
void vpmm_host_set_hook(vpmm_driver *d, vpmm_host_hook fn, void *arg);

/* The nth (1 = next) call of `op` from now returns `result` (0 disarms). */
void vpmm_host_fail(vpmm_driver *d, enum vpmm_op op, unsigned long nth,
		    CUresult result);
/* While closed, every call of `op` waits, counted already (from another
 * thread: the closing thread's own call would wait forever). For work that
 * must be seen half done. */
void vpmm_host_gate(vpmm_driver *d, enum vpmm_op op, bool closed);
/* Calls of `op` so far (failed ones included). */
unsigned long vpmm_host_calls(vpmm_driver *d, enum vpmm_op op);

/* Whether `va` is mapped and `device` was granted access to it (set_access
 * since it was mapped; a negative device in set_access is device 0). */
bool vpmm_host_accessible(vpmm_driver *d, CUdeviceptr va, int device);

/* The context ends as a reset of the primary context ends it, without the
 * pool being told: every stream and event made so far dies with the work
 * queued on it (their handles are refused from now on, each use counted),
 * the default streams start empty, memory stays mapped. With `remade` the
 * context is made again at once under a new id (ctx_id); without, ctx_id
 * and every event and stream operation answer
 * CUDA_ERROR_CONTEXT_IS_DESTROYED until vpmm_host_ctx_remake. */
void vpmm_host_ctx_reset(vpmm_driver *d, bool remade);
void vpmm_host_ctx_remake(vpmm_driver *d);
/* Calls that named a stream or event of an ended context: on a GPU, a use
 * of a destroyed object (a crash inside libcuda). */
unsigned long vpmm_host_dead_calls(vpmm_driver *d);

/* What is alive in the driver: for leak checks after a pool is destroyed. */
struct vpmm_host_live {
	size_t handles;      /* created, not yet released (or still mapped) */
	size_t handle_bytes; /* physical bytes in use (count towards capacity) */
	size_t reservations;
	size_t mappings;
	size_t events;
};
void vpmm_host_live(vpmm_driver *d, struct vpmm_host_live *out);

#endif
