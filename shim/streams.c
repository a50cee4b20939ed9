/* streams.c — the streams and contexts of a call.
 *
 * Owns: which context a call runs in and which device's pool serves it,
 * the threads' last stream and context (a cache: a stream's context never
 * changes, so only a destroy or a context's end makes an entry stale), and
 * what a stream's destroy does to the pools.
 *
 * Decisions, and why:
 *  - The pool of a call is the device of the context the call runs in: the
 *    current context, or the stream's for an explicit stream (pushed for the
 *    call if it differs, so the pool's events belong to the stream's
 *    context). A pluggable-allocator call names its device and may come
 *    from a thread that has no context yet (PyTorch's autograd threads):
 *    the device's primary context, the one the runtime would bind, is
 *    pushed for it (vpmm_enter_device).
 *  - A stream of another context than the pool's (another device's, or one
 *    of a context the program made) never becomes one of the pool's: the
 *    pool records its events on its streams, and the driver refuses an
 *    event of one context recorded on another's stream (vpmm_foreign_stream).
 * May call: devices.h (the pools, their contexts, the primary context),
 * live_streams.h (streams met and destroyed), process.h, resolve.h, the log.
 */
#include <stdatomic.h>

#include "devices.h"
#include "live_streams.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "streams.h"

/* The last stream this thread used, its context and device: a stream's
 * context never changes, so only a destroy (which may free the handle for
 * reuse) makes the entry stale — stream_gen counts destroys, and
 * the ends of contexts. */
static atomic_ulong stream_gen;
static __thread struct {
	CUstream s;
	CUcontext ctx;
	int dev;
	unsigned long gen;
	bool valid;
} tls_enter;
/* The last current context this thread's default-stream calls saw, and its
 * device: a context's device never changes, and a context's end bumps
 * stream_gen (its handle may come back for another device's context). It
 * keeps the default-stream path at one driver call while giving the
 * stream's context (vpmm_foreign_stream). */
static __thread struct {
	CUcontext ctx;
	int dev;
	unsigned long gen;
	bool valid;
} tls_cur;

CUresult vpmm_enter(CUstream s, int *device, struct vpmm_ctx_scope *sc)
{
	CUcontext cur = NULL, sctx = NULL;
	CUdevice dev;
	CUresult r;
	bool stream = s != VPMM_NO_STREAM && !vpmm_default_stream(s) && vpmm_real.stream_get_ctx;
	unsigned long gen = atomic_load_explicit(&stream_gen, memory_order_acquire);

	sc->pushed = false;
	sc->stream_ctx = NULL;
	if (stream && tls_enter.valid && tls_enter.s == s && tls_enter.gen == gen) {
		r = vpmm_real.ctx_get_current(&cur);
		if (r != CUDA_SUCCESS)
			return r;
		if (cur != tls_enter.ctx) {
			r = vpmm_real.ctx_push(tls_enter.ctx);
			if (r != CUDA_SUCCESS)
				return r;
			sc->pushed = true;
		}
		*device = tls_enter.dev;
		sc->stream_ctx = tls_enter.ctx;
		return CUDA_SUCCESS;
	}
	if (stream) {
		vpmm_live_stream_seen(s);
		r = vpmm_real.stream_get_ctx(s, &sctx);
		if (r != CUDA_SUCCESS)
			return r;
		r = vpmm_real.ctx_get_current(&cur);
		if (r != CUDA_SUCCESS)
			return r;
		if (sctx && sctx != cur) {
			r = vpmm_real.ctx_push(sctx);
			if (r != CUDA_SUCCESS)
				return r;
			sc->pushed = true;
		}
	}
	if (!stream && (s == VPMM_NO_STREAM || vpmm_default_stream(s))) {
		r = vpmm_real.ctx_get_current(&cur);
		if (r != CUDA_SUCCESS)
			return r;
		if (!cur)
			return CUDA_ERROR_INVALID_CONTEXT; /* as cuCtxGetDevice says */
		if (tls_cur.valid && tls_cur.ctx == cur && tls_cur.gen == gen) {
			*device = tls_cur.dev;
		} else {
			r = vpmm_real.ctx_get_device(&dev);
			if (r != CUDA_SUCCESS)
				return r;
			*device = (int)dev;
			tls_cur.ctx = cur;
			tls_cur.dev = (int)dev;
			tls_cur.gen = gen;
			tls_cur.valid = true;
		}
		sc->stream_ctx = cur;
		return CUDA_SUCCESS;
	}
	r = vpmm_real.ctx_get_device(&dev);
	if (r != CUDA_SUCCESS)
		goto fail;
	*device = (int)dev;
	sc->stream_ctx = sctx;
	if (stream && sctx) {
		tls_enter.s = s;
		tls_enter.ctx = sctx;
		tls_enter.dev = (int)dev;
		tls_enter.gen = gen;
		tls_enter.valid = true;
	}
	return CUDA_SUCCESS;
fail:
	if (sc->pushed) {
		vpmm_real.ctx_pop(&cur);
		sc->pushed = false;
	}
	return r;
}

CUresult vpmm_enter_device(int dev, struct vpmm_ctx_scope *sc)
{
	CUcontext cur = NULL, want;
	CUdevice d;
	CUresult r;

	sc->pushed = false;
	if (dev < 0 || dev >= VPMM_MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	r = vpmm_real.ctx_get_current(&cur);
	if (r != CUDA_SUCCESS)
		return r;
	if (cur && (cur == vpmm_device_ctx(dev) ||
		    (vpmm_real.ctx_get_device(&d) == CUDA_SUCCESS && (int)d == dev)))
		return CUDA_SUCCESS;
	want = vpmm_primary_of(dev);
	if (!want)
		return CUDA_ERROR_INVALID_CONTEXT;
	r = vpmm_real.ctx_push(want);
	if (r == CUDA_SUCCESS)
		sc->pushed = true;
	return r;
}

/* Whether the entered stream belongs to another context than the one the
 * pool of `dev` lives in: another device's stream freeing this device's
 * memory, or a stream of a context the program made (cuCtxCreate), the
 * default stream of such a context included (NULL names the current
 * context's default stream, not the pool's). The
 * pool records its events on every stream it knows from its own context,
 * and the driver refuses an event recorded on another context's stream,
 * so such a stream must never become one of the pool's: its calls are
 * served as synchronous ones, as for the per-thread default stream
 * (allocations take settled memory, frees synchronise the stream first). */
bool vpmm_foreign_stream(const struct vpmm_ctx_scope *sc, int dev)
{
	CUcontext pc = vpmm_device_ctx(dev);
	return sc->stream_ctx && pc && sc->stream_ctx != pc;
}

void vpmm_stream_destroying(CUstream s)
{
	vpmm_live_stream_destroying(s);
	if (vpmm_tls_inside || !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
	    !vpmm_active())
		return;
	atomic_fetch_add_explicit(&stream_gen, 1, memory_order_release);
	/* The stream's last event is recorded in its own context, which need
	 * not be current: cuStreamDestroy needs no context, and takes a stream
	 * of any device (cudaStreamDestroy of device 1's stream while device 0
	 * is current). Without it the record failed (an event is recorded only
	 * on a stream of its context), and the frees pending on the stream
	 * could never be known complete. Where the stream's context cannot be
	 * asked, a thread with none gets the pool's. */
	CUcontext cur = NULL, sctx = NULL, popped;
	bool none = vpmm_real.ctx_get_current(&cur) != CUDA_SUCCESS || !cur;
	bool spushed = false;
	if (vpmm_real.stream_get_ctx && vpmm_real.stream_get_ctx(s, &sctx) == CUDA_SUCCESS &&
	    sctx && sctx != cur && vpmm_real.ctx_push(sctx) == CUDA_SUCCESS) {
		spushed = true;
		none = false;
	}
	int n = vpmm_device_count();
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = vpmm_device_pool(i, NULL);
		bool pushed = false;
		if (!p)
			continue;
		if (none)
			vpmm_push_pool_ctx(i, &pushed);
		int e = vpmm_pool_stream_gone(p, s);
		vpmm_pop_ctx(pushed);
		if (e)
			vpmm_log(VPMM_LOG_WARN,
				 "device %d: a destroyed stream's last event failed (CUresult %d): "
				 "what it freed since its last event waits for the next synchronisation",
				 i, (int)vpmm_pool_last_result(p));
	}
	if (spushed)
		vpmm_real.ctx_pop(&popped);
}

void vpmm_streams_forget(void)
{
	atomic_fetch_add_explicit(&stream_gen, 1, memory_order_release);
}
