/* dispatch.c — the shim's process state and the allocation semantics that
 * every hook shares.
 *
 * Owns: the options (read once, on first use), the cuda driver layer (built
 * over the real entry points), one pool per device, the fork handler, the
 * hook counters, and the translation of pool errors to CUresult (the runtime
 * hooks reuse the number: see shim.h).
 *
 * Decisions, and why:
 *  - The pool of a call is the device of the context the call runs in: the
 *    current context, or the stream's for an explicit stream (pushed for the
 *    call if it differs, so the pool's events belong to the stream's
 *    context). A runtime call on a thread with no context first lets the real
 *    runtime set one up, by the real cudaFree(NULL) (the documented way to
 *    initialise it), then proceeds; a driver call with no context goes to the
 *    real function, which reports the error the program expects. A
 *    pluggable-allocator call names its device and may come from a thread
 *    that has no context yet (PyTorch's autograd threads): the device's
 *    primary context, the one the runtime would bind, is pushed for it.
 *  - Synchronous frees (cudaFree, cuMemFree_v2) synchronise the pool's
 *    context, then free on VPMM_NO_STREAM (settled at once). This is what
 *    the real calls do, and what programs such as PyTorch without caching
 *    rely on: no kernel issued before the free may still touch the memory
 *    when it is handed out again, on any stream. A cheaper scheme (an event
 *    on the legacy default stream, which orders after every blocking stream)
 *    does not cover streams created non-blocking, which PyTorch uses for its
 *    side streams, so it was rejected.
 *  - Per-thread default streams: CU_STREAM_PER_THREAD is one handle for as
 *    many streams as threads, and the pool orders work by handle (it may
 *    record an event on another stream's handle from any thread). So work on
 *    a per-thread default stream is treated as synchronous: allocations take
 *    settled memory (VPMM_NO_STREAM) and frees first synchronise the calling
 *    thread's per-thread stream. Correct, but such frees block.
 *  - Allocations on a capturing stream go to the real function (the graph
 *    owns them). Freeing pool memory on a capturing stream is refused with
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: the free would happen at graph
 *    launch, and the pool cannot order reuse after a launch it never sees.
 *  - Teardown: once the driver answers CUDA_ERROR_DEINITIALIZED, or the
 *    pool's context is gone (nothing of it can still run), frees of pool
 *    memory succeed quietly.
 *  - Fork: the child starts with no pools and no driver layer, as if nothing
 *    had happened (CUDA itself is unusable in a child of an initialised
 *    parent; the first hook call sets up again and the real calls report
 *    that). The parent's structures are left alone, not freed: their locks
 *    may have been held by threads that do not exist in the child.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h> /* environ */

#include "shim.h"
#include "server.h"
#include "trace.h"

#define MAX_DEVICES 64

struct dev_pool {
	_Atomic(vpmm_pool *) pool;
	_Atomic bool failed; /* creation failed: this device passes through */
	_Atomic(CUcontext) ctx; /* the context the pool was created in */
	_Atomic(CUcontext) primary; /* retained once, for callers with none */
};

static struct {
	pthread_mutex_t lock;
	atomic_int ready;      /* options read and setup done (active or not) */
	bool active;
	atomic_bool torn_down; /* the driver said DEINITIALIZED */
	atomic_int ndev;       /* 1 + highest device with a pool */
	struct vpmm_config cfg;
	vpmm_driver *drv;
	struct dev_pool dev[MAX_DEVICES];
	/* peers[d]: devices the program let access device d's memory; a pool
	 * made later grants them too. Under lock. */
	uint64_t peers[MAX_DEVICES];
} st = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Hook counters, striped: threads allocating at once would otherwise all
 * write one cache line on every call. A thread picks its stripe once. */
#define COUNT_STRIPES 16
static struct {
	_Atomic uint64_t n[VPMM_HOOK_COUNT];
} __attribute__((aligned(64))) counts[COUNT_STRIPES];
static atomic_uint next_stripe;
static __thread int my_stripe = -1;
static const char *const hook_names[VPMM_HOOK_COUNT] = {
#define X(n) #n,
	VPMM_HOOKS(X)
#undef X
};

__thread int vpmm_tls_inside;

void vpmm_count(enum vpmm_hook h)
{
	if (my_stripe < 0)
		my_stripe = (int)(atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) %
				  COUNT_STRIPES);
	atomic_fetch_add_explicit(&counts[my_stripe].n[h], 1, memory_order_relaxed);
}

/* ---- setup ------------------------------------------------------------------ */

static const char *env_get(const char *name)
{
	return getenv(name);
}

static void warn_misspelled(const char *given, const char *meant, void *arg)
{
	(void)arg;
	vpmm_log(VPMM_LOG_WARN, "%s is not a libvpmm variable and does nothing: %s?", given,
		 meant);
}

static void atfork_child(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	for (int i = 0; i < MAX_DEVICES; i++) {
		atomic_store(&st.dev[i].pool, NULL);
		atomic_store(&st.dev[i].failed, false);
		atomic_store(&st.dev[i].primary, NULL);
		atomic_store(&st.dev[i].ctx, NULL);
	}
	st.lock = fresh;
	memset(st.peers, 0, sizeof st.peers);
	st.drv = NULL;
	st.active = false;
	atomic_store(&st.torn_down, false);
	atomic_store(&st.ndev, 0);
	atomic_store(&st.ready, 0);
}

/* ---- vpmm-dump's server and the trace ------------------------------------------ */

static vpmm_pool *existing_pool(int dev);
static CUcontext primary_of(int dev);
static CUcontext active_primary(int dev);

/* The server's view of the pools (any thread; pools are never destroyed). */
static size_t server_pools(vpmm_pool **out, size_t cap, void *arg)
{
	size_t n = 0;
	int ndev = atomic_load_explicit(&st.ndev, memory_order_acquire);
	for (int i = 0; i < ndev && n < cap; i++) {
		vpmm_pool *p = existing_pool(i);
		if (p)
			out[n++] = p;
	}
	return n;
}

/* Trims the pool of `dev` in its own context: the bytes released, or a
 * negative errno. `wait`: the context's work completes first, and every
 * free that waited on it settles. */
static long long trim_one(int dev, size_t keep, bool wait)
{
	vpmm_pool *p = existing_pool(dev);
	bool pushed = false;
	if (!p)
		return -ENODEV;
	/* trimming closes streams' epochs: events of the pool's context */
	CUresult r = vpmm_push_pool_ctx(dev, &pushed);
	long long n = -EIO;
	if (r == CUDA_SUCCESS) {
		if (wait) {
			vpmm_pool_poll(p, true);
			if (vpmm_real.ctx_synchronize() == CUDA_SUCCESS)
				vpmm_pool_poll(p, false);
		}
		n = vpmm_pool_trim(p, keep);
	}
	vpmm_pop_ctx(pushed);
	return n;
}

long long vpmm_shim_trim(int device, size_t keep, unsigned flags)
{
	int ndev = atomic_load_explicit(&st.ndev, memory_order_acquire);
	bool wait = flags & VPMM_TRIM_WAIT;
	long long sum = 0;
	if (flags & ~VPMM_TRIM_WAIT)
		return -EINVAL;
	if (device >= 0)
		return trim_one(device, keep, wait);
	for (int i = 0; i < ndev; i++) {
		long long n = trim_one(i, keep, wait);
		if (n == -ENODEV)
			continue;
		if (n < 0)
			return n;
		sum += n;
	}
	return sum;
}

static int server_trim(uint64_t keep, uint64_t *released, void *arg)
{
	long long n = vpmm_shim_trim(-1, keep > SIZE_MAX ? SIZE_MAX : (size_t)keep, 0);
	*released = n > 0 ? (uint64_t)n : 0;
	return n < 0 ? (int)n : 0;
}

static void start_observers(const struct vpmm_env_options *o)
{
	if (o->trace[0]) {
		int e = vpmm_trace_open(o->trace);
		if (e)
			vpmm_log(VPMM_LOG_WARN, "VPMM_TRACE=%s: %s: not tracing", o->trace,
				 vpmm_trace_strerror(e));
	}
	struct vpmm_server_config sc = {
		.socket = o->socket_off ? "off" : o->socket,
		.pools = server_pools,
		.env = o,
		.trim = server_trim,
		.trace_start = vpmm_trace_open,
		.trace_strerror = vpmm_trace_strerror,
		.trace_stop = vpmm_trace_close,
		.trace_flush = vpmm_trace_flush,
		.trace_status = vpmm_trace_status,
		.ipc = vpmm_ipc_serve,
		.tick = vpmm_ipc_tick,
	};
	vpmm_server_start(&sc); /* says why on stderr if it cannot serve */
}

/* Reads the options and builds the driver layer; st.active says whether it
 * all worked. Every way out before the end leaves the shim passing through. */
static void setup_locked(void)
{
	static bool atfork_registered;
	char err[256] = "";
	struct vpmm_env_options o;
	CUresult r;

	vpmm_env_options_default(&o);
	if (vpmm_env_options_from_env(&o, env_get, err, sizeof err))
		goto bad_option;
	vpmm_log_level = (int)o.log_level;
	vpmm_options_misspelled(environ, warn_misspelled, NULL);
	if (o.disable) {
		VPMM_LOGF(VPMM_LOG_INFO, "VPMM_DISABLE is set: passing everything through");
		return;
	}
	vpmm_config_default(&st.cfg);
	if (vpmm_config_from_env(&st.cfg, env_get, err, sizeof err))
		goto bad_option;
	/* In a program, zombies are unmapped and memory beyond the release
	 * threshold given back by the pool's own thread, off the callers'. */
	st.cfg.background = true;
	st.cfg.release = o.has_release_threshold;
	st.cfg.release_threshold = o.release_threshold;
	vpmm_resolve();
	if (!vpmm_real.libcuda)
		return; /* resolve.c said why */
	if (!vpmm_real.ctx_get_current || !vpmm_real.ctx_get_device ||
	    !vpmm_real.ctx_synchronize || !vpmm_real.ctx_push || !vpmm_real.ctx_pop ||
	    !vpmm_real.stream_is_capturing || !vpmm_real.stream_synchronize) {
		vpmm_log(VPMM_LOG_WARN, "libcuda lacks context or stream entry points: passing everything through");
		return;
	}
	r = vpmm_driver_cuda_create(vpmm_real_entry, NULL, &st.drv);
	if (r != CUDA_SUCCESS) {
		vpmm_log(VPMM_LOG_WARN, "libcuda lacks the virtual memory entry points (CUresult %d): passing everything through",
			 (int)r);
		return;
	}
	if (!atfork_registered && pthread_atfork(NULL, NULL, atfork_child) == 0)
		atfork_registered = true;
	st.active = true;
	start_observers(&o);
	VPMM_LOGF(VPMM_LOG_INFO, "active (driver version %d, log level %s)",
		  vpmm_real.driver_version, vpmm_log_level_name(o.log_level));
	return;

bad_option:
	vpmm_log(VPMM_LOG_ERROR, "%s; passing everything through", err);
}

bool vpmm_active(void)
{
	if (atomic_load_explicit(&st.ready, memory_order_acquire))
		return st.active;
	pthread_mutex_lock(&st.lock);
	if (!atomic_load_explicit(&st.ready, memory_order_relaxed)) {
		setup_locked();
		atomic_store_explicit(&st.ready, 1, memory_order_release);
	}
	pthread_mutex_unlock(&st.lock);
	return st.active;
}

static void grant_peer(vpmm_pool *p, int dev, int peer)
{
	int e = vpmm_pool_grant(p, peer);
	if (e)
		vpmm_log(VPMM_LOG_WARN,
			 "device %d: peer access for device %d to its pool memory failed (%s, CUresult %d)",
			 dev, peer, strerror(-e), (int)vpmm_pool_last_result(p));
	else
		VPMM_LOGF(VPMM_LOG_INFO, "device %d: pool memory accessible from device %d", dev, peer);
}

/* Why vpmm_pool_create failed with `e`, naming the option at fault where
 * one is: a combination, or a value the device cannot take. */
static void no_pool_why(const struct vpmm_config *cfg, int e, char *why, size_t n)
{
	size_t gran = 0, dev_free, dev_total = 0;
	CUdeviceptr va;
	if (e == -EINVAL && st.drv->granularity(st.drv, cfg->device, &gran) == CUDA_SUCCESS) {
		if (cfg->page_size > gran &&
		    st.drv->mem_info(st.drv, &dev_free, &dev_total) != CUDA_SUCCESS)
			dev_total = 0;
		vpmm_config_check_device(cfg, gran, dev_total, why, n);
		return;
	}
	if (e != -ENOMEM)
		return;
	/* The reservation of VPMM_VA_SIZE, made first, or the pages. */
	if (st.drv->granularity(st.drv, cfg->device, &gran) == CUDA_SUCCESS && gran &&
	    cfg->va_size <= SIZE_MAX - gran) {
		size_t size = (cfg->va_size + gran - 1) / gran * gran;
		CUresult r = st.drv->va_reserve(st.drv, size, &va);
		if (r == CUDA_SUCCESS) {
			st.drv->va_free(st.drv, va, size);
		} else {
			char a[32];
			snprintf(why, n, "VPMM_VA_SIZE=%s: the driver cannot reserve that much "
				 "address space (CUresult %d; the default is 8T)",
				 vpmm_size_text(cfg->va_size, a, sizeof a), (int)r);
			return;
		}
	}
	if (cfg->initial_pages)
		snprintf(why, n, "%s; VPMM_PAGES=%zu maps them up front", strerror(-e),
			 cfg->initial_pages);
}

/* The pool of `dev`, created on first use in context `ctx`; NULL when the
 * device passes through. */
static vpmm_pool *pool_for(int dev)
{
	vpmm_pool *p;
	bool made = false;
	if (dev < 0 || dev >= MAX_DEVICES)
		return NULL;
	p = atomic_load_explicit(&st.dev[dev].pool, memory_order_acquire);
	if (p || atomic_load_explicit(&st.dev[dev].failed, memory_order_relaxed))
		return p;

	pthread_mutex_lock(&st.lock);
	p = atomic_load_explicit(&st.dev[dev].pool, memory_order_relaxed);
	if (!p && !atomic_load_explicit(&st.dev[dev].failed, memory_order_relaxed)) {
		struct vpmm_config cfg = st.cfg;
		CUcontext ctx = NULL;
		int e;
		cfg.device = dev;
		vpmm_real.ctx_get_current(&ctx);
		e = vpmm_pool_create(&cfg, st.drv, &p);
		if (e) {
			char why[256] = "";
			no_pool_why(&cfg, e, why, sizeof why);
			atomic_store(&st.dev[dev].failed, true);
			vpmm_log(VPMM_LOG_WARN, "device %d: no pool (%s): passing its allocations through",
				 dev, why[0] ? why : strerror(-e));
			p = NULL;
		} else {
			for (int d = 0; d < MAX_DEVICES; d++)
				if (st.peers[dev] >> d & 1)
					grant_peer(p, dev, d);
			atomic_store_explicit(&st.dev[dev].ctx, ctx, memory_order_relaxed);
			atomic_store_explicit(&st.dev[dev].pool, p, memory_order_release);
			if (atomic_load(&st.ndev) <= dev)
				atomic_store(&st.ndev, dev + 1);
			VPMM_LOGF(VPMM_LOG_INFO, "device %d: pool created, page size %zu",
				  dev, vpmm_pool_page_size(p));
			made = true;
		}
	}
	pthread_mutex_unlock(&st.lock);
	/* The pool's events and the streams it knows live in its context,
	 * and the program's last cuDevicePrimaryCtxRelease would end the
	 * primary context (no hook sees it coming: the count is the
	 * driver's), after which every allocation needing them failed. The
	 * shim holds the primary context once, as the runtime does; only an
	 * active one, so that a program of its own contexts gets none made
	 * for it. */
	if (made)
		active_primary(dev);
	return p;
}

static vpmm_pool *existing_pool(int dev)
{
	if (dev < 0 || dev >= MAX_DEVICES)
		return NULL;
	return atomic_load_explicit(&st.dev[dev].pool, memory_order_acquire);
}

static struct dev_pool *owner_of(CUdeviceptr ptr)
{
	int n = atomic_load_explicit(&st.ndev, memory_order_acquire);
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
		if (p && vpmm_pool_owns(p, ptr))
			return &st.dev[i];
	}
	return NULL;
}

/* ---- streams and contexts ----------------------------------------------------- */

static bool default_stream(CUstream s)
{
	return !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The stream as the pool should key it: one handle per stream. */
static CUstream pool_stream(CUstream s, enum vpmm_via via)
{
	if (s == VPMM_NO_STREAM || s == CU_STREAM_LEGACY)
		return s == CU_STREAM_LEGACY ? NULL : s;
	if (!s && (via == VPMM_VIA_DRIVER_PTSZ || via == VPMM_VIA_RUNTIME_PTSZ))
		return CU_STREAM_PER_THREAD;
	return s;
}

struct ctx_scope {
	bool pushed;
	/* The context of the entered stream, once entered: an explicit
	 * stream's own, or for the default streams (and none) the current
	 * one, since NULL and CU_STREAM_LEGACY name the current context's
	 * default stream. NULL where unknown. */
	CUcontext stream_ctx;
};

/* Makes the context of `s` current for the call (pushing it if another one
 * is) and gives its device. */
/* The last stream this thread used, its context and device: a stream's
 * context never changes, so only a destroy (which may free the handle for
 * reuse) makes the entry stale — stream_gen counts destroys. */
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
 * stream's context (foreign_stream). */
static __thread struct {
	CUcontext ctx;
	int dev;
	unsigned long gen;
	bool valid;
} tls_cur;

static CUresult enter(CUstream s, int *device, struct ctx_scope *sc)
{
	CUcontext cur = NULL, sctx = NULL;
	CUdevice dev;
	CUresult r;
	bool stream = s != VPMM_NO_STREAM && !default_stream(s) && vpmm_real.stream_get_ctx;
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
	if (!stream && (s == VPMM_NO_STREAM || default_stream(s))) {
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

/* The primary context of `dev`, retained once for the process. */
static CUcontext primary_of(int dev)
{
	CUcontext c = atomic_load_explicit(&st.dev[dev].primary, memory_order_acquire);
	CUdevice d;
	if (c || !vpmm_real.device_get || !vpmm_real.primary_retain)
		return c;
	pthread_mutex_lock(&st.lock);
	c = atomic_load_explicit(&st.dev[dev].primary, memory_order_relaxed);
	if (!c && vpmm_real.device_get(&d, dev) == CUDA_SUCCESS &&
	    vpmm_real.primary_retain(&c, d) == CUDA_SUCCESS)
		atomic_store_explicit(&st.dev[dev].primary, c, memory_order_release);
	pthread_mutex_unlock(&st.lock);
	return c;
}

/* The primary context of `dev`, retained once for the process, if it is
 * active; NULL if not: retaining an inactive one would make it. */
static CUcontext active_primary(int dev)
{
	int active = 0;
	unsigned flags;
	CUdevice d;
	CUcontext c = atomic_load_explicit(&st.dev[dev].primary, memory_order_acquire);
	if (c || !vpmm_real.primary_get_state || !vpmm_real.device_get ||
	    vpmm_real.device_get(&d, dev) != CUDA_SUCCESS ||
	    vpmm_real.primary_get_state(d, &flags, &active) != CUDA_SUCCESS || !active)
		return c;
	return primary_of(dev);
}

/* The pool of `dev` lost its context (the program destroyed it while the
 * primary context was inactive: vpmm_context_ending): it lives on in `c`,
 * the context of the first call that allocates from it, which its
 * background thread binds too. */
static void adopt_context(int dev, CUcontext c)
{
	CUcontext none = NULL;
	if (!c && vpmm_real.ctx_get_current(&c) != CUDA_SUCCESS)
		return;
	if (c && atomic_compare_exchange_strong(&st.dev[dev].ctx, &none, c))
		vpmm_pool_drop_events(existing_pool(dev), c);
}

/* Makes a context of device `dev` current for the call: the current one if
 * it is on `dev`, else the device's primary context, pushed. */
static CUresult enter_device(int dev, struct ctx_scope *sc)
{
	CUcontext cur = NULL, want;
	CUdevice d;
	CUresult r;

	sc->pushed = false;
	if (dev < 0 || dev >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	r = vpmm_real.ctx_get_current(&cur);
	if (r != CUDA_SUCCESS)
		return r;
	if (cur && (cur == atomic_load_explicit(&st.dev[dev].ctx, memory_order_relaxed) ||
		    (vpmm_real.ctx_get_device(&d) == CUDA_SUCCESS && (int)d == dev)))
		return CUDA_SUCCESS;
	want = primary_of(dev);
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
static bool foreign_stream(const struct ctx_scope *sc, int dev)
{
	CUcontext pc = atomic_load_explicit(&st.dev[dev].ctx, memory_order_relaxed);
	return sc->stream_ctx && pc && sc->stream_ctx != pc;
}

static void leave(struct ctx_scope *sc)
{
	CUcontext c;
	if (sc->pushed)
		vpmm_real.ctx_pop(&c);
	sc->pushed = false;
}

/* 1 capturing, 0 not, <0 the query failed (the real call will say why). */
static int capturing(CUstream s)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	if (vpmm_real.stream_is_capturing(s, &cs) != CUDA_SUCCESS)
		return -1;
	return cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

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
	case -EIO:
		r = vpmm_pool_last_result(p);
		return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

/* ---- the operations ------------------------------------------------------------ */

/* The one line an out-of-memory failure gets: what was asked, what the pool
 * holds, what the device has left (the pool already tried everything it
 * could: waited for every stream's frees, remapped, returned empty slabs). */
static void log_out_of_memory(vpmm_pool *pool, int dev, size_t size)
{
	static struct vpmm_log_limit limit;
	struct vpmm_stats ps;
	size_t dev_free = 0, dev_total = 0;
	uint64_t take;
	if (!vpmm_log_on(VPMM_LOG_ERROR) || !(take = vpmm_log_limit_take(&limit)))
		return;
	char more[96] = "";
	if (take > 1)
		snprintf(more, sizeof more, " (and %" PRIu64 " more since the last such line)",
			 take - 1);
	else if (atomic_load_explicit(&limit.seen, memory_order_relaxed) == VPMM_LOG_BURST)
		snprintf(more, sizeof more, " (more: one line a second, with their count)");
	vpmm_pool_stats(pool, &ps);
	if (vpmm_real.mem_get_info)
		vpmm_real.mem_get_info(&dev_free, &dev_total);
	char limit_s[64] = "";
	if (st.cfg.limit)
		snprintf(limit_s, sizeof limit_s, ", VPMM_LIMIT %zu", st.cfg.limit);
	vpmm_log_limited(&limit, VPMM_LOG_ERROR,
			 "device %d: out of memory: requested %zu bytes; live %" PRIu64
			 ", mapped %" PRIu64 ", reusable %" PRIu64 ", device free %zu of %zu%s%s",
			 dev, size, ps.live, ps.mapped, ps.reusable, dev_free, dev_total, limit_s,
			 more);
}

bool vpmm_do_malloc(CUdeviceptr *out, size_t size, CUstream stream,
		    enum vpmm_via via, int device, void *caller, CUresult *res)
{
	struct ctx_scope sc = {false};
	vpmm_pool *pool;
	CUstream ps;
	CUresult r;
	int dev = device, e;

	if (vpmm_tls_inside || !out || !size || !vpmm_active())
		return false;

	if (via == VPMM_VIA_TORCH) {
		if (enter_device(device, &sc) != CUDA_SUCCESS)
			return false;
	} else {
		r = enter(stream, &dev, &sc);
		if (r != CUDA_SUCCESS && via >= VPMM_VIA_RUNTIME &&
		    (stream == VPMM_NO_STREAM || default_stream(stream))) {
			cudaError_t ce = vpmm_runtime_init(caller);
			if (ce != cudaSuccess) {
				*res = (CUresult)ce;
				return true;
			}
			r = enter(stream, &dev, &sc);
		}
		if (r != CUDA_SUCCESS)
			return false;
	}

	ps = pool_stream(stream, via);
	if (ps != VPMM_NO_STREAM && capturing(ps) != 0)
		goto pass; /* the graph owns it, or the real call reports the error */
	if (ps == CU_STREAM_PER_THREAD)
		ps = VPMM_NO_STREAM;
	pool = pool_for(dev);
	if (!pool)
		goto pass;
	if (!atomic_load_explicit(&st.dev[dev].ctx, memory_order_relaxed))
		adopt_context(dev, sc.stream_ctx);
	/* Served from another context, the pool still records on its own
	 * streams (to learn that their frees completed) and makes the events
	 * for that in the current context: made in the caller's, the record
	 * was refused and the allocation failed with
	 * CUDA_ERROR_INVALID_HANDLE (user_context_waits). So the pool's
	 * context is made current for the call; never on the hot path. */
	bool pool_pushed = false;
	if (foreign_stream(&sc, dev)) {
		ps = VPMM_NO_STREAM;
		vpmm_push_pool_ctx(dev, &pool_pushed);
	}
	e = vpmm_pool_malloc(pool, size, ps, out);
	vpmm_pop_ctx(pool_pushed);
	vpmm_trace_event(e ? VPMM_TRACE_ALLOCATE_FAILURE : VPMM_TRACE_ALLOCATE, e ? 0 : *out,
			 size, ps == VPMM_NO_STREAM ? NULL : ps);
	if (e == -ENOMEM)
		log_out_of_memory(pool, dev, size);
	leave(&sc);
	*res = pool_result(pool, e);
	if (!e)
		vpmm_count(VPMM_HOOK_pool_malloc);
	else
		VPMM_LOGF(VPMM_LOG_DEBUG, "device %d: malloc of %zu failed (%d)", dev, size, e);
	return true;
pass:
	leave(&sc);
	return false;
}

void vpmm_stream_destroying(CUstream s)
{
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
	int n = atomic_load_explicit(&st.ndev, memory_order_acquire);
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
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
				 "what it freed since its last event stays out of use",
				 i, (int)vpmm_pool_last_result(p));
	}
	if (spushed)
		vpmm_real.ctx_pop(&popped);
}

/* Synchronise the pool's context, as the real synchronous free would. */
/* Makes the context the pool of `device` was created in current on this
 * thread (pushed when another one, or none, is). Work that creates or
 * records the pool's events must run there: an event of another device's
 * context cannot be recorded on the pool's streams. */
CUresult vpmm_push_pool_ctx(int device, bool *pushed)
{
	CUcontext cur = NULL, want;
	*pushed = false;
	if (device < 0 || device >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	want = atomic_load(&st.dev[device].ctx);
	if (!want)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (vpmm_real.ctx_get_current(&cur) == CUDA_SUCCESS && cur == want)
		return CUDA_SUCCESS;
	CUresult r = vpmm_real.ctx_push(want);
	*pushed = r == CUDA_SUCCESS;
	return r;
}

void vpmm_pop_ctx(bool pushed)
{
	CUcontext c;
	if (pushed)
		vpmm_real.ctx_pop(&c);
}

/* vpmm_pool_poll in the pool's context. */
static void poll_pool(struct dev_pool *dp, bool before_sync)
{
	bool pushed;
	if (vpmm_push_pool_ctx((int)(dp - st.dev), &pushed) != CUDA_SUCCESS)
		return; /* the next poll, or a malloc's own, settles it */
	vpmm_pool_poll(atomic_load(&dp->pool), before_sync);
	vpmm_pop_ctx(pushed);
}

static CUresult sync_context(struct dev_pool *dp)
{
	CUcontext cur = NULL, popped, ctx = atomic_load(&dp->ctx);
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

bool vpmm_do_free(CUdeviceptr ptr, CUstream stream, enum vpmm_via via,
		  CUresult *res)
{
	struct ctx_scope sc = {false};
	struct dev_pool *dp;
	CUstream ps;
	CUresult r;
	int dev, e;

	if (vpmm_tls_inside || !ptr || !vpmm_active())
		return false;
	dp = owner_of(ptr);
	if (!dp)
		return false;
	if (atomic_load_explicit(&st.torn_down, memory_order_relaxed))
		goto quiet;

	ps = pool_stream(stream, via);
	if (ps == VPMM_NO_STREAM) {
		/* The synchronisation completes every stream's work: frees made
		 * on streams settle with it, if events say so (one per stream
		 * with frees in its open epoch), instead of staying out of
		 * reach of other streams and of merging. */
		poll_pool(dp, true);
		r = sync_context(dp);
	} else if (ps == CU_STREAM_PER_THREAD) {
		if (capturing(ps) == 1)
			goto refuse;
		r = vpmm_real.stream_synchronize(ps);
		ps = VPMM_NO_STREAM;
	} else {
		r = via == VPMM_VIA_TORCH ? enter_device((int)(dp - st.dev), &sc)
					  : enter(ps, &dev, &sc);
		if (r != CUDA_SUCCESS)
			return false; /* a bad stream: the real call says so */
		if (capturing(ps) == 1)
			goto refuse;
		r = CUDA_SUCCESS;
		/* The default stream names the current context's own: with
		 * another device current, it is that device's stream. */
		if (via != VPMM_VIA_TORCH &&
		    (foreign_stream(&sc, (int)(dp - st.dev)) ||
		     (!sc.stream_ctx && dev != (int)(dp - st.dev)))) {
			r = vpmm_real.stream_synchronize(ps);
			ps = VPMM_NO_STREAM;
		}
	}
	switch (r) {
	case CUDA_SUCCESS:
		break;
	case CUDA_ERROR_DEINITIALIZED:
		atomic_store(&st.torn_down, true);
		goto quiet;
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
	case CUDA_ERROR_INVALID_CONTEXT:
		/* The context is gone, so is all of its work: nothing can touch
		 * the memory any more. Settle it, ignoring the pool's answer. */
		vpmm_pool_free(atomic_load(&dp->pool), ptr, VPMM_NO_STREAM);
		goto quiet;
	default:
		leave(&sc);
		*res = r; /* e.g. a sticky kernel error, as the real call reports */
		return true;
	}
	if (vpmm_trace_on()) { /* before the free: then the address may be reused */
		CUdeviceptr base;
		size_t size = 0;
		vpmm_pool_find(atomic_load(&dp->pool), ptr, &base, &size);
		vpmm_trace_event(VPMM_TRACE_FREE, ptr, size, ps == VPMM_NO_STREAM ? NULL : ps);
	}
	switch (vpmm_ipc_defer_free((int)(dp - st.dev), ptr, ps)) {
	case 1:
		leave(&sc);
		vpmm_count(VPMM_HOOK_pool_free);
		*res = CUDA_SUCCESS;
		return true;
	case -1:
		leave(&sc);
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	e = vpmm_pool_free(atomic_load(&dp->pool), ptr, ps);
	if (ps == VPMM_NO_STREAM && r == CUDA_SUCCESS)
		poll_pool(dp, false);
	leave(&sc);
	*res = pool_result(atomic_load(&dp->pool), e);
	if (!e)
		vpmm_count(VPMM_HOOK_pool_free);
	return true;
refuse:
	leave(&sc);
	vpmm_log(VPMM_LOG_WARN, "freeing pool memory on a capturing stream is not supported");
	*res = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	return true;
quiet:
	*res = CUDA_SUCCESS;
	return true;
}

/* What the pool does not serve for the pluggable allocator (a capturing
 * stream, the shim disabled) goes to the driver's own stream-ordered
 * allocator, in a context of the device as the pool would use. */
CUresult vpmm_torch_real(CUdeviceptr *inout, size_t size, int device, CUstream stream)
{
	struct ctx_scope sc = {false};
	CUresult r;
	vpmm_resolve();
	if (!vpmm_real.alloc_async || !vpmm_real.free_async || !vpmm_real.ctx_get_current ||
	    !vpmm_real.ctx_push || !vpmm_real.ctx_pop)
		return CUDA_ERROR_NOT_INITIALIZED;
	vpmm_count(VPMM_HOOK_passthrough);
	r = enter_device(device, &sc);
	if (r != CUDA_SUCCESS)
		return r;
	r = size ? vpmm_real.alloc_async(inout, size, stream)
		 : vpmm_real.free_async(*inout, stream);
	leave(&sc);
	return r;
}

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
	if (vpmm_tls_inside || !free_bytes || !vpmm_active())
		return;
	if (vpmm_real.ctx_get_device(&dev) != CUDA_SUCCESS || (int)dev < 0 ||
	    (int)dev >= MAX_DEVICES)
		return;
	p = existing_pool((int)dev);
	if (!p) {
		/* No pool yet: the limit holds once it is made. */
		if (st.cfg.limit && !atomic_load(&st.dev[dev].failed) && *free_bytes > st.cfg.limit)
			*free_bytes = st.cfg.limit;
		return;
	}
	vpmm_pool_stats(p, &s);
	mappable = *free_bytes < total ? *free_bytes : total;
	if (st.cfg.limit) {
		size_t room = st.cfg.limit > s.mapped ? st.cfg.limit - (size_t)s.mapped : 0;
		if (mappable > room)
			mappable = room;
	}
	*free_bytes = s.reusable > total - mappable ? total : mappable + (size_t)s.reusable;
}

enum vpmm_where vpmm_find_live(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	struct dev_pool *dp;
	if (vpmm_tls_inside || !vpmm_active() || !(dp = owner_of(ptr)))
		return VPMM_NOT_POOLS;
	return vpmm_pool_find(atomic_load(&dp->pool), ptr, base, size) == 0 ? VPMM_POOL_LIVE
									     : VPMM_POOL_NOT_LIVE;
}

vpmm_driver *vpmm_shim_driver(void)
{
	return vpmm_active() ? st.drv : NULL;
}

vpmm_pool *vpmm_device_pool(int device, CUcontext *ctx)
{
	vpmm_pool *p = existing_pool(device);
	if (p && ctx)
		*ctx = atomic_load(&st.dev[device].ctx);
	return p;
}

int vpmm_owner_device(CUdeviceptr ptr)
{
	struct dev_pool *dp = vpmm_active() ? owner_of(ptr) : NULL;
	return dp ? (int)(dp - st.dev) : -1;
}

void vpmm_peer_enabled(CUcontext peer)
{
	CUdevice me, owner;
	CUcontext popped;
	if (vpmm_tls_inside || !peer || !vpmm_active())
		return;
	if (vpmm_real.ctx_get_device(&me) != CUDA_SUCCESS ||
	    vpmm_real.ctx_push(peer) != CUDA_SUCCESS)
		return;
	CUresult r = vpmm_real.ctx_get_device(&owner);
	vpmm_real.ctx_pop(&popped);
	if (r != CUDA_SUCCESS || (int)owner < 0 || (int)owner >= MAX_DEVICES ||
	    (int)me < 0 || (int)me >= MAX_DEVICES || me == owner)
		return;
	pthread_mutex_lock(&st.lock);
	st.peers[owner] |= (uint64_t)1 << (int)me;
	vpmm_pool *p = existing_pool((int)owner);
	pthread_mutex_unlock(&st.lock);
	/* A pool made meanwhile granted it already; a second grant is a no-op. */
	if (p)
		grant_peer(p, (int)owner, (int)me);
}

/* Before the program destroys `ctx` or resets the primary context of
 * `device` (ctx NULL). Its streams and events die with it; the pool's
 * memory does not (cuMemCreate memory outlives contexts) and the device
 * goes on. So, while the context still exists, each pool living in it:
 * closes its streams' open epochs, synchronises the context (the real call
 * ends that work anyway) and settles what completed, so that nothing waits
 * on an event that will never answer; then drops its recycled events, which
 * the driver is about to destroy. Without this, the pool went on recording
 * on the dead streams and with the dead events, and every later allocation
 * that needed them failed; and a synchronous free synchronised the dead
 * context only, not the work of the context the device went on in.
 * A pool whose context the program destroyed lives on in the device's
 * primary context (the one the runtime binds); a reset primary context
 * keeps its handle. */
void vpmm_context_ending(CUcontext ctx, int device)
{
	if (vpmm_tls_inside || !vpmm_active())
		return;
	VPMM_LOGF(VPMM_LOG_DEBUG, "%s %p (device %d) ends", ctx ? "context" : "primary context of",
		  (void *)ctx, device);
	/* The context's streams die without a cuStreamDestroy, and the driver
	 * may hand their handles to new streams of other contexts: the
	 * threads' last-stream entries (enter) must not outlive them. */
	atomic_fetch_add_explicit(&stream_gen, 1, memory_order_release);
	/* The reset primary context: only one the shim already holds can be
	 * a pool's (pool_for holds it once the pool lives in it); retaining
	 * it here made the primary context of a program of its own contexts
	 * only to have it reset (no_primary_made). */
	if (!ctx) {
		if (device < 0 || device >= MAX_DEVICES || !existing_pool(device))
			return;
		ctx = atomic_load_explicit(&st.dev[device].primary, memory_order_acquire);
		if (!ctx)
			return;
	}
	int n = atomic_load_explicit(&st.ndev, memory_order_acquire);
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
		CUcontext cur = NULL, popped, next = NULL;
		bool pushed = false;
		if (!p || atomic_load(&st.dev[i].ctx) != ctx)
			continue;
		if (vpmm_real.ctx_get_current(&cur) != CUDA_SUCCESS || cur != ctx) {
			if (vpmm_real.ctx_push(ctx) != CUDA_SUCCESS)
				continue; /* already gone: nothing of it to settle */
			pushed = true;
		}
		vpmm_pool_poll(p, true);
		if (vpmm_real.ctx_synchronize() == CUDA_SUCCESS)
			vpmm_pool_poll(p, false);
		/* The pool goes on in the primary context only where it is
		 * active: retaining an inactive one made a context the
		 * program never asked for (its memory, its flags fixed, the
		 * state cuDevicePrimaryCtxGetState reports: no_primary_made).
		 * Else the pool waits for the next context that allocates
		 * (adopt_context). */
		if (device < 0)
			next = active_primary(i);
		vpmm_pool_drop_events(p, next);
		if (pushed)
			vpmm_real.ctx_pop(&popped);
		if (device < 0)
			atomic_store(&st.dev[i].ctx, next);
	}
}

/* A program that makes its own handles (JAX's XLA for every buffer,
 * PyTorch's expandable_segments, NCCL) keeps that memory out of the pool,
 * and one preloaded into such a program would otherwise see no effect and
 * no reason for it: the first such handle of device memory is logged, once
 * per process (docs/design.md, "Programs that map their own memory"). */
void vpmm_own_mapping(const CUmemAllocationProp *prop, size_t size)
{
	static atomic_flag told = ATOMIC_FLAG_INIT;
	if (vpmm_tls_inside || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    !vpmm_active() || atomic_flag_test_and_set(&told))
		return;
	vpmm_log(VPMM_LOG_WARN,
		 "device %d: the program maps memory of its own (cuMemCreate of %zu bytes): the pool serves none of it",
		 prop->location.id, size);
}

/* ---- the library's own API ------------------------------------------------------- */

/* Declared in vpmm/vpmm.h, which says what each one promises. */

const char *vpmm_version(void)
{
	return VPMM_VERSION;
}

/* 1 when allocations go to the pool, 0 when everything passes through. */
int vpmm_shim_active(void)
{
	return vpmm_active();
}

/* The stats of `device`'s pool: 0, or -ENODEV when it has none (yet). */
int vpmm_shim_stats(int device, struct vpmm_stats *out)
{
	vpmm_pool *p = existing_pool(device);
	if (!out)
		return -EINVAL;
	if (!p)
		return -ENODEV;
	vpmm_pool_stats(p, out);
	return 0;
}

/* vpmm_pool_check() of the device's pool: the number of broken invariants
 * (each written to log, which may be NULL), or -ENODEV without a pool. */
long vpmm_shim_check(int device, FILE *log)
{
	vpmm_pool *p = existing_pool(device);
	return p ? (long)vpmm_pool_check(p, log) : -ENODEV;
}

/* The stats as one JSON object; returns the length it needed (snprintf-like)
 * or a negative errno. */
long vpmm_shim_stats_json(int device, char *buf, size_t len)
{
	struct vpmm_stats s;
	char *text = NULL;
	size_t n = 0;
	FILE *f;
	int e = vpmm_shim_stats(device, &s);
	if (e)
		return e;
	f = open_memstream(&text, &n);
	if (!f)
		return -ENOMEM;
	vpmm_stats_print(&s, f, true);
	if (fclose(f) || !text) {
		free(text);
		return -ENOMEM;
	}
	while (n && text[n - 1] == '\n')
		text[--n] = '\0';
	if (buf && len)
		snprintf(buf, len, "%s", text);
	free(text);
	return (long)n;
}

/* The region map of `device`'s pool (vpmm_pool_layout's format). */
long vpmm_shim_layout(int device, char *buf, size_t len, size_t unit)
{
	vpmm_pool *p = existing_pool(device);
	if (!p)
		return -ENODEV;
	return (long)vpmm_pool_layout(p, buf, len, unit);
}

const char *vpmm_shim_socket(void)
{
	return vpmm_server_socket();
}

/* How often a hook (or counter: "pool_malloc", "passthrough", ...) ran;
 * ULLONG_MAX for a name that is none. */
unsigned long long vpmm_shim_hook_calls(const char *name)
{
	for (int i = 0; name && i < VPMM_HOOK_COUNT; i++)
		if (!strcmp(name, hook_names[i])) {
			unsigned long long sum = 0;
			for (int k = 0; k < COUNT_STRIPES; k++)
				sum += atomic_load_explicit(&counts[k].n[i], memory_order_relaxed);
			return sum;
		}
	return ~0ULL;
}
