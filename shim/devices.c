/* devices.c — one pool per device and the contexts the pools live in.
 *
 * Owns: the table of devices (each one's pool, made on first use in the
 * context of the call that needed it; whether making it failed; that
 * context; the primary context retained for callers with none), the peers
 * the program enabled (granted by every pool, even one made later), and
 * what a context's end does to the pools living in it.
 * May call: process.h (options, driver layer), streams.h (a context's end
 * makes the threads' remembered streams stale), resolve.h, the log.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "devices.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "streams.h"

struct dev_pool {
	_Atomic(vpmm_pool *) pool;
	_Atomic bool failed; /* creation failed: this device passes through */
	_Atomic(CUcontext) ctx; /* the context the pool was created in */
	_Atomic(CUcontext) primary; /* retained once, for callers with none */
	/* Its context is being ended by the program's call, from
	 * vpmm_context_ending to vpmm_context_ended. */
	_Atomic bool ending;
};

static struct {
	pthread_mutex_t lock;  /* pool creation, primary retains, peers */
	atomic_int ndev;       /* 1 + highest device with a pool */
	struct dev_pool dev[VPMM_MAX_DEVICES];
	/* peers[d]: devices the program let access device d's memory; a pool
	 * made later grants them too. Written under lock; read without it by
	 * every synchronous malloc and free (vpmm_device_alone). */
	_Atomic uint64_t peers[VPMM_MAX_DEVICES];
} st = {.lock = PTHREAD_MUTEX_INITIALIZER};

static CUcontext active_primary(int dev);

static vpmm_pool *existing_pool(int dev)
{
	if (dev < 0 || dev >= VPMM_MAX_DEVICES)
		return NULL;
	return atomic_load_explicit(&st.dev[dev].pool, memory_order_acquire);
}

vpmm_pool *vpmm_device_pool(int device, CUcontext *ctx)
{
	vpmm_pool *p = existing_pool(device);
	if (p && ctx)
		*ctx = atomic_load(&st.dev[device].ctx);
	return p;
}

CUcontext vpmm_device_ctx(int dev)
{
	return atomic_load_explicit(&st.dev[dev].ctx, memory_order_relaxed);
}

bool vpmm_device_failed(int dev)
{
	return atomic_load(&st.dev[dev].failed);
}

int vpmm_device_count(void)
{
	return atomic_load_explicit(&st.ndev, memory_order_acquire);
}

bool vpmm_device_alone(int dev)
{
	int n = atomic_load_explicit(&st.ndev, memory_order_acquire);
	bool alone = true;
	for (int i = 0; alone && i < n; i++)
		alone = i == dev || !existing_pool(i);
	return alone && atomic_load_explicit(&st.peers[dev], memory_order_acquire) == 0;
}

static int owner_of(CUdeviceptr ptr)
{
	int n = atomic_load_explicit(&st.ndev, memory_order_acquire);
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
		if (p && vpmm_pool_owns(p, ptr))
			return i;
	}
	return -1;
}

int vpmm_owner_device(CUdeviceptr ptr)
{
	return vpmm_active() ? owner_of(ptr) : -1;
}

/* ---- the pools ------------------------------------------------------------------ */

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
	vpmm_driver *drv = vpmm_process_driver();
	if (e == -EINVAL && drv->granularity(drv, cfg->device, &gran) == CUDA_SUCCESS) {
		if (cfg->page_size > gran &&
		    drv->mem_info(drv, &dev_free, &dev_total) != CUDA_SUCCESS)
			dev_total = 0;
		vpmm_config_check_device(cfg, gran, dev_total, why, n);
		return;
	}
	if (e != -ENOMEM)
		return;
	/* The reservation of VPMM_VA_SIZE, made first, or the pages. */
	if (drv->granularity(drv, cfg->device, &gran) == CUDA_SUCCESS && gran &&
	    cfg->va_size <= SIZE_MAX - gran) {
		size_t size = (cfg->va_size + gran - 1) / gran * gran;
		CUresult r = drv->va_reserve(drv, size, &va);
		if (r == CUDA_SUCCESS) {
			drv->va_free(drv, va, size);
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

/* The pool of `dev`, created on first use in the current context; NULL when
 * the device passes through. */
vpmm_pool *vpmm_device_pool_make(int dev)
{
	vpmm_pool *p;
	bool made = false;
	if (dev < 0 || dev >= VPMM_MAX_DEVICES)
		return NULL;
	p = atomic_load_explicit(&st.dev[dev].pool, memory_order_acquire);
	if (p || atomic_load_explicit(&st.dev[dev].failed, memory_order_relaxed))
		return p;

	pthread_mutex_lock(&st.lock);
	p = atomic_load_explicit(&st.dev[dev].pool, memory_order_relaxed);
	if (!p && !atomic_load_explicit(&st.dev[dev].failed, memory_order_relaxed)) {
		struct vpmm_config cfg = *vpmm_process_config();
		CUcontext ctx = NULL;
		int e;
		cfg.device = dev;
		vpmm_real.ctx_get_current(&ctx);
		e = vpmm_pool_create(&cfg, vpmm_process_driver(), &p);
		if (e) {
			char why[256] = "";
			no_pool_why(&cfg, e, why, sizeof why);
			atomic_store(&st.dev[dev].failed, true);
			/* A setting refused (the reason names its variable) is
			 * the user's error to see even under VPMM_LOG=error; a
			 * driver or a device that cannot make a pool (no
			 * granularity, out of memory now), a warning. */
			vpmm_log(strncmp(why, "VPMM_", 5) == 0 ? VPMM_LOG_ERROR : VPMM_LOG_WARN,
				 "device %d: no pool (%s): passing its allocations through", dev,
				 why[0] ? why : strerror(-e));
			p = NULL;
		} else {
			for (int d = 0; d < VPMM_MAX_DEVICES; d++)
				if (atomic_load(&st.peers[dev]) >> d & 1)
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

/* ---- contexts ------------------------------------------------------------------- */

/* The primary context of `dev`, retained once for the process. */
CUcontext vpmm_primary_of(int dev)
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
	return vpmm_primary_of(dev);
}

/* The pool of `dev` lost its context (the program destroyed it while the
 * primary context was inactive: vpmm_context_ending): it lives on in `c`,
 * the context of the first call that allocates from it, which its
 * background thread binds too. */
void vpmm_adopt_context(int dev, CUcontext c)
{
	CUcontext none = NULL;
	if (!c && vpmm_real.ctx_get_current(&c) != CUDA_SUCCESS)
		return;
	if (c && atomic_compare_exchange_strong(&st.dev[dev].ctx, &none, c))
		vpmm_pool_drop_events(existing_pool(dev), c, false);
}

/* Makes the context the pool of `device` was created in current on this
 * thread (pushed when another one, or none, is). Work that creates or
 * records the pool's events must run there: an event of another device's
 * context cannot be recorded on the pool's streams. */
CUresult vpmm_push_pool_ctx(int device, bool *pushed)
{
	CUcontext cur = NULL, want;
	*pushed = false;
	if (device < 0 || device >= VPMM_MAX_DEVICES)
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
	if (r != CUDA_SUCCESS || (int)owner < 0 || (int)owner >= VPMM_MAX_DEVICES ||
	    (int)me < 0 || (int)me >= VPMM_MAX_DEVICES || me == owner)
		return;
	pthread_mutex_lock(&st.lock);
	atomic_fetch_or(&st.peers[owner], (uint64_t)1 << (int)me);
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
	 * threads' last-stream entries (vpmm_enter) must not outlive them. */
	vpmm_streams_forget();
	/* The reset primary context: only one the shim already holds can be
	 * a pool's (vpmm_device_pool_make holds it once the pool lives in
	 * it); retaining it here made the primary context of a program of its
	 * own contexts only to have it reset (no_primary_made). */
	if (!ctx) {
		if (device < 0 || device >= VPMM_MAX_DEVICES || !existing_pool(device))
			return;
		ctx = atomic_load_explicit(&st.dev[device].primary, memory_order_acquire);
		if (!ctx)
			return;
	}
	int n = vpmm_device_count();
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
		CUcontext cur = NULL, popped, next = NULL;
		bool pushed = false;
		if (!p || atomic_load(&st.dev[i].ctx) != ctx)
			continue;
		/* The background thread stays out of the driver until the
		 * real call returned: an event it queried meanwhile could die
		 * inside the query. */
		vpmm_pool_pause(p, true);
		atomic_store(&st.dev[i].ending, true);
		if (vpmm_real.ctx_get_current(&cur) != CUDA_SUCCESS || cur != ctx) {
			if (vpmm_real.ctx_push(ctx) != CUDA_SUCCESS)
				continue; /* already gone: nothing of it to settle */
			pushed = true;
		}
		vpmm_pool_poll(p, true);
		bool synced = vpmm_real.ctx_synchronize() == CUDA_SUCCESS;
		if (synced)
			vpmm_pool_poll(p, false);
		/* The pool goes on in the primary context only where it is
		 * active: retaining an inactive one made a context the
		 * program never asked for (its memory, its flags fixed, the
		 * state cuDevicePrimaryCtxGetState reports: no_primary_made).
		 * Else the pool waits for the next context that allocates
		 * (vpmm_adopt_context). */
		next = device < 0 ? active_primary(i) : ctx; /* a reset keeps the handle */
		vpmm_pool_drop_events(p, next, synced);
		if (pushed)
			vpmm_real.ctx_pop(&popped);
		if (device < 0)
			atomic_store(&st.dev[i].ctx, next);
	}
}

/* After the program's cuCtxDestroy or primary reset returned `r`: each pool
 * whose context ended lets go of what vpmm_context_ending could not settle
 * (its synchronisation failed: a sticky error, whose remedy is this very
 * reset), and its background thread goes on. Before, the events still on
 * the context's streams stayed, and the next allocation queried one of
 * them, destroyed (primary_reset_sticky). A call that failed ended
 * nothing. */
void vpmm_context_ended(CUresult r)
{
	int n = vpmm_device_count();
	for (int i = 0; i < n; i++) {
		vpmm_pool *p = existing_pool(i);
		if (!p || !atomic_exchange(&st.dev[i].ending, false))
			continue;
		if (r == CUDA_SUCCESS)
			vpmm_pool_context_ended(p);
		vpmm_pool_pause(p, false);
	}
}

/* A program that makes its own handles (JAX's XLA for every buffer,
 * PyTorch's expandable_segments, NCCL's buffers on every rank) keeps that
 * memory out of the pool. That is expected, so it is said at the info
 * level (VPMM_LOG=info), once per process, for whoever wonders why the
 * pool serves little: a warning worried every NCCL user for nothing
 * (docs/shim.md, "Programs that map their own memory"). */
void vpmm_own_mapping(const CUmemAllocationProp *prop, size_t size)
{
	static atomic_flag told = ATOMIC_FLAG_INIT;
	if (vpmm_tls_inside || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    !vpmm_active() || atomic_flag_test_and_set(&told))
		return;
	vpmm_log(VPMM_LOG_INFO,
		 "device %d: the program maps memory of its own (cuMemCreate of %zu bytes): the pool serves none of it",
		 prop->location.id, size);
}

void vpmm_devices_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	for (int i = 0; i < VPMM_MAX_DEVICES; i++) {
		atomic_store(&st.dev[i].pool, NULL);
		atomic_store(&st.dev[i].failed, false);
		atomic_store(&st.dev[i].primary, NULL);
		atomic_store(&st.dev[i].ctx, NULL);
	}
	st.lock = fresh;
	for (int i = 0; i < VPMM_MAX_DEVICES; i++)
		atomic_store(&st.peers[i], 0);
	atomic_store(&st.ndev, 0);
}
