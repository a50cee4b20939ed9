/* alloc.c — the allocation semantics every hook shares: malloc and free on
 * the pool, synchronous or stream-ordered, the translation of pool errors
 * to CUresult (the runtime hooks reuse the number: see shim.h), and what the
 * memory queries answer for pool memory.
 *
 * Decisions, and why:
 *  - A runtime call on a thread with no context first lets the real runtime
 *    set one up, by the real cudaFree(NULL) (the documented way to
 *    initialise it), then proceeds; a driver call with no context goes to
 *    the real function, which reports the error the program expects.
 *  - Synchronous frees (cudaFree, cuMemFree_v2) keep the real calls'
 *    promise, which programs such as PyTorch without caching rely on: no
 *    kernel issued before the free may still touch the memory when it is
 *    handed out again, on any stream. By default (VPMM_SYNC_FREE=events)
 *    without stopping the host: the free is a free on the legacy default
 *    stream, which waits for every non-blocking stream of the context
 *    before its memory is reused, and a synchronous malloc is a malloc on
 *    the legacy stream after which every non-blocking stream waits for it
 *    (fence.c says when those are made, and why that covers every
 *    stream). Where the shim cannot know every stream that may touch the
 *    memory (streams made behind its back,
 *    another context or a peer on the device, a capture, more than
 *    VPMM_FENCE_STREAMS_MAX non-blocking streams, a malloc from another
 *    context than the pool's), and with VPMM_SYNC_FREE=device: the free synchronises the
 *    pool's context, then frees on VPMM_NO_STREAM (settled at once), and
 *    the malloc takes settled memory only.
 *  - Per-thread default streams: CU_STREAM_PER_THREAD is one handle for as
 *    many streams as threads, and the pool orders work by handle (it may
 *    record an event on another stream's handle from any thread). So work on
 *    a per-thread default stream is treated as synchronous: allocations take
 *    settled memory (VPMM_NO_STREAM) and frees first synchronise the calling
 *    thread's per-thread stream. Correct, but such frees block.
 *  - Stream capture (CUDA graphs): allocations on a capturing stream go to
 *    the real function (the graph owns them, as graph memory nodes), and so
 *    does a synchronous allocation that a capture forbids this thread, so
 *    that the program gets the driver's own refusal (and the capture its
 *    invalidation). A free of pool memory that a capture forbids (on a
 *    captured stream, or synchronous during a capture that forbids
 *    synchronising) is deferred until the capture ends, never refused:
 *    capture.c says how and why.
 *  - A signal handler that allocates or frees while its thread is inside the
 *    pool gets CUDA_ERROR_NOT_PERMITTED and one error line: the pool's
 *    locks are not async-signal-safe, and waiting would wait for ever.
 *  - Stream-ordered allocations on a device whose current memory pool
 *    the program made itself (cudaDeviceSetMemPool) go to the real
 *    function: the program chose that pool (mempool.c).
 *  - Teardown: once the driver answers CUDA_ERROR_DEINITIALIZED, or the
 *    pool's context is gone (nothing of it can still run), frees of pool
 *    memory succeed quietly.
 * Also the allocation observer of vpmm/vpmm.h (vpmm_set_alloc_observer),
 * told of every allocation and free the pool takes.
 * May call: streams.h (the call's context and stream), devices.h (the
 * pools), live_streams.h (the fences), process.h, ipc.h (frees of shared
 * memory), mempool.h (the pool the program chose), runtime.h
 * (vpmm_runtime_init), capture.h (deferred frees), trace.h, resolve.h,
 * oom.h (what a refusal reports), the log, the observer.
 */
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>

#include "alloc.h"
#include "capture.h"
#include "devices.h"
#include "ipc.h"
#include "live_streams.h"
#include "mempool.h"
#include "oom.h"
#include "process.h"
#include "resolve.h"
#include "runtime.h"
#include "shim.h"
#include "streams.h"
#include "trace.h"

static CUresult pool_result(vpmm_pool *p, int e)
{
	CUresult r;
	switch (e) {
	case 0:
		return CUDA_SUCCESS;
	case -ENOMEM:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case -EINVAL:
		return CUDA_ERROR_INVALID_VALUE;
	case -EDEADLK: /* a signal handler that interrupted the pool */
		vpmm_log(VPMM_LOG_ERROR,
			 "an allocation call from a signal handler that interrupted the pool on the "
			 "same thread is refused (CUDA_ERROR_NOT_PERMITTED): the pool's locks are "
			 "not async-signal-safe");
		return CUDA_ERROR_NOT_PERMITTED;
	case -EIO:
		r = vpmm_pool_last_result(p);
		return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

/* ---- the observer ---------------------------------------------------------------- */

/* The function and its context, published together under a sequence
 * count (odd while a writer changes them; writers serialised by the
 * mutex): a reader retries until it read both between two equal even
 * counts, and gives up on this event after many tries (a child forked
 * while its parent's writer was between the stores would see an odd
 * count for ever). Without an observer, a reader pays two loads. */
static atomic_uint observer_seq;
static _Atomic(vpmm_alloc_observer) observer_fn;
static _Atomic(void *) observer_ctx;
static pthread_mutex_t observer_lock = PTHREAD_MUTEX_INITIALIZER;

int vpmm_set_alloc_observer(vpmm_alloc_observer fn, void *ctx)
{
	pthread_mutex_lock(&observer_lock);
	unsigned s = atomic_load_explicit(&observer_seq, memory_order_relaxed);
	atomic_store_explicit(&observer_seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&observer_fn, fn, memory_order_relaxed);
	atomic_store_explicit(&observer_ctx, ctx, memory_order_relaxed);
	atomic_store_explicit(&observer_seq, s + 2, memory_order_release);
	pthread_mutex_unlock(&observer_lock);
	return 0;
}

/* For a free, `size` 0: the pool's size of the allocation is looked up
 * (only while observed). */
static void observe(int kind, int dev, vpmm_pool *pool, CUdeviceptr ptr, size_t size,
		    CUstream stream)
{
	vpmm_alloc_observer fn;
	void *ctx;
	for (int tries = 0;; tries++) {
		unsigned s = atomic_load_explicit(&observer_seq, memory_order_acquire);
		fn = atomic_load_explicit(&observer_fn, memory_order_relaxed);
		if (!fn && !(s & 1))
			return;
		ctx = atomic_load_explicit(&observer_ctx, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (!(s & 1) && atomic_load_explicit(&observer_seq, memory_order_relaxed) == s)
			break;
		if (tries == 1000000)
			return;
	}
	if (!fn)
		return;
	if (kind == VPMM_EVENT_FREE) {
		CUdeviceptr base;
		if (vpmm_pool_find(pool, ptr, &base, &size) != 0)
			size = 0;
	}
	struct vpmm_alloc_event ev = {kind, dev, (unsigned long long)ptr, size,
				      stream == VPMM_NO_STREAM ? NULL : stream};
	fn(ctx, &ev);
}

/* ---- the operations ------------------------------------------------------------ */

static CUresult sync_context(int dev);

/* Whether a synchronous call on device `dev`, in context `ctx` (current),
 * may use the legacy stream and the fences instead of a synchronisation. */
static bool fences_stand(int dev, CUcontext ctx)
{
	return !vpmm_process_sync_device() && ctx && ctx == vpmm_device_ctx(dev) &&
	       vpmm_device_alone(dev) && vpmm_fence_possible(ctx, dev);
}

bool vpmm_do_malloc(CUdeviceptr *out, size_t size, CUstream stream,
		    enum vpmm_via via, int device, void *caller, CUresult *res)
{
	struct vpmm_ctx_scope sc = {false};
	vpmm_pool *pool;
	CUstream ps;
	CUresult r;
	int dev = device, e;

	if (vpmm_tls_inside || !out || !size || !vpmm_active())
		return false;
	vpmm_capture_poll();
	if (stream == VPMM_NO_STREAM && vpmm_capture_forbids_sync())
		return false; /* the driver refuses it, as without the pool */

	if (via == VPMM_VIA_TORCH) {
		if (vpmm_enter_device(device, &sc) != CUDA_SUCCESS)
			return false;
	} else {
		r = vpmm_enter(stream, &dev, &sc);
		if (r != CUDA_SUCCESS && via >= VPMM_VIA_RUNTIME &&
		    (stream == VPMM_NO_STREAM || vpmm_default_stream(stream))) {
			cudaError_t ce = vpmm_runtime_init(caller);
			if (ce != cudaSuccess) {
				*res = (CUresult)ce;
				return true;
			}
			r = vpmm_enter(stream, &dev, &sc);
		}
		if (r != CUDA_SUCCESS)
			return false;
		/* A stream-ordered allocation on a device whose current memory
		 * pool the program chose: CUDA's (mempool.c). */
		if (stream != VPMM_NO_STREAM && vpmm_mempool_chosen(dev))
			goto pass;
	}

	ps = vpmm_pool_stream(stream, via);
	if (ps != VPMM_NO_STREAM && vpmm_capturing(ps) != 0)
		goto pass; /* the graph owns it, or the real call reports the error */
	if (ps == CU_STREAM_PER_THREAD)
		ps = VPMM_NO_STREAM;
	pool = vpmm_device_pool_make(dev);
	if (!pool)
		goto pass;
	if (!vpmm_device_ctx(dev))
		vpmm_adopt_context(dev, sc.stream_ctx);
	/* Served from another context, the pool still records on its own
	 * streams (to learn that their frees completed) and makes the events
	 * for that in the current context: made in the caller's, the record
	 * was refused and the allocation failed with
	 * CUDA_ERROR_INVALID_HANDLE (user_context_waits). So the pool's
	 * context is made current for the call; never on the hot path. */
	bool pool_pushed = false;
	if (vpmm_foreign_stream(&sc, dev)) {
		ps = VPMM_NO_STREAM;
		vpmm_push_pool_ctx(dev, &pool_pushed);
	}
	/* A synchronous malloc in the pool's own context takes memory on the
	 * legacy stream (pending there or not), then fences the non-blocking
	 * streams, unless the fences cannot stand for a synchronisation. */
	CUcontext fence_ctx = NULL;
	if (ps == VPMM_NO_STREAM && !pool_pushed && fences_stand(dev, sc.stream_ctx)) {
		fence_ctx = sc.stream_ctx;
		ps = NULL;
	}
	e = vpmm_pool_malloc(pool, size, ps, out);
	if (!e && (fence_ctx || (!ps && !pool_pushed))) {
		/* On the legacy stream: the record synchronous frees owe it. */
		if (fence_ctx)
			vpmm_count(VPMM_HOOK_fence_malloc);
		r = fence_ctx ? vpmm_fence_malloc(fence_ctx, *out, size)
			      : vpmm_fence_owed(sc.stream_ctx);
		/* A fence left half made: the synchronisation it stood for. */
		if (r != CUDA_SUCCESS && (r = sync_context(dev)) != CUDA_SUCCESS) {
			vpmm_pool_free(pool, *out, ps);
			vpmm_leave(&sc);
			*res = r;
			return true;
		}
	}
	vpmm_pop_ctx(pool_pushed);
	vpmm_trace_event(e ? VPMM_TRACE_ALLOCATE_FAILURE : VPMM_TRACE_ALLOCATE, e ? 0 : *out,
			 size, ps);
	if (e == -ENOMEM)
		vpmm_oom_refused(pool, dev, size, via == VPMM_VIA_TORCH);
	vpmm_leave(&sc);
	*res = pool_result(pool, e);
	if (!e) {
		vpmm_count(VPMM_HOOK_pool_malloc);
		observe(VPMM_EVENT_ALLOC, dev, pool, *out, size, ps);
	} else
		VPMM_LOGF(VPMM_LOG_DEBUG, "device %d: malloc of %zu failed (%d)", dev, size, e);
	return true;
pass:
	vpmm_leave(&sc);
	return false;
}

/* vpmm_pool_poll in the pool's context. */
static void poll_pool(int dev, bool before_sync)
{
	bool pushed;
	if (vpmm_push_pool_ctx(dev, &pushed) != CUDA_SUCCESS)
		return; /* the next poll, or a malloc's own, settles it */
	vpmm_pool_poll(vpmm_device_pool(dev, NULL), before_sync);
	vpmm_pop_ctx(pushed);
}

/* Synchronise the pool's context, as the real synchronous free would. */
static CUresult sync_context(int dev)
{
	CUcontext cur = NULL, popped, ctx = vpmm_device_ctx(dev);
	CUresult r;
	vpmm_count(VPMM_HOOK_sync_free);
	if (vpmm_real.ctx_synchronize_v2 && ctx)
		return vpmm_real.ctx_synchronize_v2(ctx);
	r = vpmm_real.ctx_get_current(&cur);
	if (r != CUDA_SUCCESS)
		return r;
	if (cur == ctx || !ctx)
		return vpmm_real.ctx_synchronize();
	r = vpmm_real.ctx_push(ctx);
	if (r != CUDA_SUCCESS)
		return r;
	r = vpmm_real.ctx_synchronize();
	vpmm_real.ctx_pop(&popped);
	return r;
}

/* The allocation of `pool` at ptr: *size 0 if none. */
static void range_of(vpmm_pool *pool, CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	if (vpmm_pool_find_own(pool, ptr, base, size) && vpmm_pool_find(pool, ptr, base, size))
		*size = 0;
}

/* A synchronous free of ptr by fences: the pool's context made current
 * (*pushed says whether it was pushed; pop it after the pool's free), the
 * legacy stream made to wait for every non-blocking stream, the fence
 * told what is freed. False: nothing to undo, the caller synchronises
 * instead. */
static bool fence_free(int owner, vpmm_pool *pool, CUdeviceptr ptr, bool *pushed)
{
	CUcontext ctx = vpmm_device_ctx(owner);
	CUdeviceptr base = 0;
	size_t size = 0;
	*pushed = false;
	if (vpmm_process_sync_device() || !ctx || !vpmm_device_alone(owner) ||
	    vpmm_push_pool_ctx(owner, pushed) != CUDA_SUCCESS)
		return false;
	if (vpmm_fence_possible(ctx, owner)) {
		range_of(pool, ptr, &base, &size);
		if (vpmm_fence_free(ctx, base, size) == CUDA_SUCCESS) {
			vpmm_count(VPMM_HOOK_fence_free);
			return true;
		}
	}
	vpmm_pop_ctx(*pushed);
	*pushed = false;
	return false;
}

/* What a free that no fence told (fence_free) tells the malloc fence
 * (fence.c), before the pool's free (after it, the memory may be handed
 * out): the range, if it is freed on the legacy stream while non-blocking
 * streams exist, so that only a malloc of that memory fences them again;
 * else that something was freed. Without them the range would spare a
 * record only to a synchronous malloc while a synchronous free's is
 * owed, and cost every stream-ordered free on the legacy stream (the
 * pluggable allocator's) a lookup and the table's lock: 9 % a pair on
 * the host driver. */
static void tell_fence(vpmm_pool *pool, CUdeviceptr ptr, CUstream ps)
{
	CUdeviceptr base;
	size_t size = 0;
	if (!ps && vpmm_fence_wants_ranges())
		range_of(pool, ptr, &base, &size);
	if (size)
		vpmm_fence_freed_range(base, size);
	else
		vpmm_fence_freeing();
}

bool vpmm_do_free(CUdeviceptr ptr, CUstream stream, enum vpmm_via via,
		  CUresult *res)
{
	bool fence_pushed = false;
	struct vpmm_ctx_scope sc = {false};
	vpmm_pool *pool;
	CUstream ps;
	CUresult r;
	int owner, dev, e;

	if (vpmm_tls_inside || !ptr || !vpmm_active())
		return false;
	owner = vpmm_owner_device(ptr);
	if (owner < 0)
		return false;
	pool = vpmm_device_pool(owner, NULL);
	if (vpmm_torn_down())
		goto quiet;
	if (vpmm_capture_defer(ptr, stream, via, res))
		return true;

	ps = vpmm_pool_stream(stream, via);
	bool fenced = ps == VPMM_NO_STREAM && fence_free(owner, pool, ptr, &fence_pushed);
	if (fenced) {
		/* Freed on the legacy stream, which waits for every stream's
		 * work issued so far: reusable at once there (and by the
		 * synchronous mallocs, which fence), by others once it
		 * completed. */
		ps = NULL;
		r = CUDA_SUCCESS;
	} else if (ps == VPMM_NO_STREAM) {
		/* The synchronisation completes every stream's work: frees made
		 * on streams settle with it, if events say so (one per stream
		 * with frees in its open epoch), instead of staying out of
		 * reach of other streams and of merging. */
		poll_pool(owner, true);
		r = sync_context(owner);
	} else if (ps == CU_STREAM_PER_THREAD) {
		r = vpmm_real.stream_synchronize(ps);
		ps = VPMM_NO_STREAM;
	} else {
		r = via == VPMM_VIA_TORCH ? vpmm_enter_device(owner, &sc)
					  : vpmm_enter(ps, &dev, &sc);
		if (r != CUDA_SUCCESS)
			return false; /* a bad stream: the real call says so */
		/* A pool that lost its context takes the stream's, as a malloc
		 * would: the stream becomes one of the pool's, with events of
		 * its context. Taken later by another context's malloc, the
		 * pool forgot this stream without a last event (its frees
		 * stayed pending for good) and recorded the events made here
		 * on the other context's streams (free_without_context). */
		if (!vpmm_device_ctx(owner))
			vpmm_adopt_context(owner, sc.stream_ctx);
		r = CUDA_SUCCESS;
		/* The default stream names the current context's own: with
		 * another device current, it is that device's stream. */
		if (via != VPMM_VIA_TORCH &&
		    (vpmm_foreign_stream(&sc, owner) ||
		     (!sc.stream_ctx && dev != owner))) {
			r = vpmm_real.stream_synchronize(ps);
			ps = VPMM_NO_STREAM;
		}
	}
	switch (r) {
	case CUDA_SUCCESS:
		break;
	case CUDA_ERROR_DEINITIALIZED:
		vpmm_set_torn_down();
		goto quiet;
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
	case CUDA_ERROR_INVALID_CONTEXT:
		/* The context is gone, so is all of its work: nothing can touch
		 * the memory any more. Settle it, ignoring the pool's answer. */
		observe(VPMM_EVENT_FREE, owner, pool, ptr, 0, VPMM_NO_STREAM);
		vpmm_fence_freeing();
		vpmm_pool_free(pool, ptr, VPMM_NO_STREAM);
		goto quiet;
	default:
		vpmm_leave(&sc);
		*res = r; /* e.g. a sticky kernel error, as the real call reports */
		return true;
	}
	if (vpmm_trace_on()) { /* before the free: then the address may be reused */
		CUdeviceptr base;
		size_t size = 0;
		vpmm_pool_find(pool, ptr, &base, &size);
		vpmm_trace_event(VPMM_TRACE_FREE, ptr, size, ps);
	}
	observe(VPMM_EVENT_FREE, owner, pool, ptr, 0, ps); /* before: as the trace */
	switch (vpmm_ipc_defer_free(owner, ptr, ps)) {
	case 1:
		vpmm_pop_ctx(fence_pushed);
		vpmm_leave(&sc);
		vpmm_count(VPMM_HOOK_pool_free);
		*res = CUDA_SUCCESS;
		return true;
	case -1:
		vpmm_pop_ctx(fence_pushed);
		vpmm_leave(&sc);
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	if (!fenced)
		tell_fence(pool, ptr, ps);
	e = vpmm_pool_free(pool, ptr, ps);
	vpmm_pop_ctx(fence_pushed);
	if (ps == VPMM_NO_STREAM && r == CUDA_SUCCESS)
		poll_pool(owner, false);
	vpmm_leave(&sc);
	*res = pool_result(pool, e);
	if (!e)
		vpmm_count(VPMM_HOOK_pool_free);
	return true;
quiet:
	*res = CUDA_SUCCESS;
	return true;
}

/* ---- what the queries answer ---------------------------------------------------- */

/* What the device's free memory means to a program under the pool: what
 * the pool can still hand out. That is its reusable bytes plus what the
 * device can still map; under VPMM_LIMIT, plus only what the limit leaves
 * unmapped, since beyond it the pool maps nothing more. Without the limit
 * here, a program that sizes a buffer by the free memory (a KV cache, a
 * workspace) asked for the device's free bytes and got out of memory. */
void vpmm_add_reusable(size_t *free_bytes, size_t total)
{
	struct vpmm_stats s;
	CUdevice dev;
	vpmm_pool *p;
	size_t mappable;
	const struct vpmm_config *cfg = vpmm_process_config();
	if (vpmm_tls_inside || !free_bytes || !vpmm_active())
		return;
	if (vpmm_real.ctx_get_device(&dev) != CUDA_SUCCESS || (int)dev < 0 ||
	    (int)dev >= VPMM_MAX_DEVICES)
		return;
	p = vpmm_device_pool((int)dev, NULL);
	if (!p) {
		/* No pool yet: the limit holds once it is made. */
		if (cfg->limit && !vpmm_device_failed((int)dev) && *free_bytes > cfg->limit)
			*free_bytes = cfg->limit;
		return;
	}
	vpmm_pool_stats(p, &s);
	mappable = *free_bytes < total ? *free_bytes : total;
	if (cfg->limit) {
		size_t room = cfg->limit > s.mapped ? cfg->limit - (size_t)s.mapped : 0;
		if (mappable > room)
			mappable = room;
	}
	*free_bytes = s.reusable > total - mappable ? total : mappable + (size_t)s.reusable;
}

enum vpmm_where vpmm_find_live(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	int owner;
	if (vpmm_tls_inside || !vpmm_active() || (owner = vpmm_owner_device(ptr)) < 0)
		return VPMM_NOT_POOLS;
	return vpmm_pool_find(vpmm_device_pool(owner, NULL), ptr, base, size) == 0
		       ? VPMM_POOL_LIVE
		       : VPMM_POOL_NOT_LIVE;
}
