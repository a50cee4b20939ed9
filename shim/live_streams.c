/* live_streams.c — every stream the program made: the table the fences
 * (fence.c) stand on.
 *
 * Owns: the table of live streams (context, device, blocking or not, the
 * event a fence records on it), whether the table can be trusted to hold
 * every stream (the shim interposed before CUDA started, no stream made
 * behind its back), the contexts' ids, and what a context's end or reset
 * ends. The fences, and why they stand for a synchronisation, are in
 * fence.c.
 *  - A context reset that no hook sees (cudaDeviceReset goes through the
 *    runtime's private table) keeps the context's handle but changes its
 *    id (cuCtxGetId), and ends its streams and events. The id is compared
 *    whenever a stream is made or a fence is asked for; a new one drops the
 *    context's entries without destroying their dead events.
 * May call: resolve.h, fence.c (a dying stream's last work kept), the
 * log and the hook counters (shim.h).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "live_streams.h"
#include "live_streams_int.h"
#include "resolve.h"

struct vpmm_ls_table vpmm_ls = {.lock = PTHREAD_MUTEX_INITIALIZER, .gen = 1};

/* Described in live_streams_int.h. */
atomic_bool vpmm_ls_untrusted;
atomic_uint vpmm_ls_nb_count, vpmm_ls_owed_count, vpmm_ls_nb_owed_count;

static unsigned hash(CUstream s)
{
	uintptr_t v = (uintptr_t)s;
	v ^= v >> 17;
	v *= 0x9e3779b97f4a7c15ull;
	return (unsigned)(v >> 40) % BUCKETS;
}

static struct live **find_locked(CUstream s)
{
	struct live **l = &vpmm_ls.bucket[hash(s)];
	while (*l && (*l)->s != s)
		l = &(*l)->next;
	return l;
}

static void nb_remove_locked(struct live *e)
{
	struct live *last = vpmm_ls.nb[--vpmm_ls.n_nb];
	atomic_store_explicit(&vpmm_ls_nb_count, vpmm_ls.n_nb, memory_order_release);
	vpmm_ls.nb[e->nb_idx] = last;
	last->nb_idx = e->nb_idx;
}

static void ctx_count_locked(CUcontext ctx, int dev, int delta)
{
	unsigned k, none = CTX_MAX;
	vpmm_ls.gen++;
	for (k = 0; k < CTX_MAX; k++) {
		if (vpmm_ls.ctxs[k].streams && vpmm_ls.ctxs[k].ctx == ctx && vpmm_ls.ctxs[k].dev == dev)
			break;
		if (!vpmm_ls.ctxs[k].streams && none == CTX_MAX)
			none = k;
	}
	if (k == CTX_MAX) {
		if (delta < 0)
			return;
		if (none == CTX_MAX) {
			vpmm_ls.ctx_overflow = true;
			return;
		}
		k = none;
		vpmm_ls.ctxs[k].ctx = ctx;
		vpmm_ls.ctxs[k].dev = dev;
	}
	vpmm_ls.ctxs[k].streams += (unsigned)delta;
}

static void drop_locked(struct live **l)
{
	struct live *e = *l;
	*l = e->next;
	ctx_count_locked(e->ctx, e->dev, -1);
	if (e->nonblocking)
		nb_remove_locked(e);
	if (e->ev && vpmm_real.event_destroy)
		vpmm_real.event_destroy(e->ev);
	free(e);
}

void vpmm_ls_distrust(const char *why)
{
	if (!atomic_exchange(&vpmm_ls_untrusted, true))
		vpmm_log(VPMM_LOG_INFO, "%s: synchronous frees synchronise the context from now on", why);
}

/* Whether CUDA ran before the shim could see its streams: the shim was
 * loaded late (libcuda already initialised), or it is not the first to
 * define the stream creators (not preloaded: calls bypass it). */
__attribute__((constructor)) static void check_first(void)
{
	vpmm_resolve_dlsym();
	void *mine = vpmm_fn_to_ptr(vpmm_wrappers[VPMM_W_STREAM_CREATE]);
	if (vpmm_real_dlsym_fn(RTLD_DEFAULT, "cuStreamCreate") != mine) {
		atomic_store(&vpmm_ls_untrusted, true);
		return;
	}
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!cu)
		return; /* no CUDA yet: every stream is made through us */
	CUresult (*cur)(CUcontext *) =
		VPMM_PTR_TO_FN(CUresult(*)(CUcontext *), vpmm_real_dlsym_fn(cu, "cuCtxGetCurrent"));
	CUcontext c = NULL;
	if (cur && cur(&c) != CUDA_ERROR_NOT_INITIALIZED)
		atomic_store(&vpmm_ls_untrusted, true);
	dlclose(cu);
}

void vpmm_live_stream_created(CUstream s, unsigned flags)
{
	CUcontext ctx = NULL;
	CUdevice dev = -1;
	if (!s)
		return;
	vpmm_resolve();
	if (!vpmm_real.ctx_get_current || vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS ||
	    !vpmm_real.ctx_get_device || vpmm_real.ctx_get_device(&dev) != CUDA_SUCCESS) {
		vpmm_ls_distrust("a stream of unknown context");
		return;
	}
	struct live *e = calloc(1, sizeof *e);
	pthread_mutex_lock(&vpmm_ls.lock);
	vpmm_ls_check_id_locked(ctx);
	struct live **l = find_locked(s);
	if (*l) /* a handle the driver reused: the old stream died unseen */
		drop_locked(l);
	bool nb = flags & CU_STREAM_NON_BLOCKING;
	if (e && nb && vpmm_ls.n_nb == vpmm_ls.cap_nb) {
		unsigned cap = vpmm_ls.cap_nb ? 2 * vpmm_ls.cap_nb : 64;
		struct live **n = realloc(vpmm_ls.nb, cap * sizeof *n);
		if (n) {
			vpmm_ls.nb = n;
			vpmm_ls.cap_nb = cap;
		} else {
			free(e);
			e = NULL;
		}
	}
	if (e) {
		*e = (struct live){.s = s, .ctx = ctx, .dev = (int)dev, .nonblocking = nb};
		if (nb) {
			e->nb_idx = vpmm_ls.n_nb;
			vpmm_ls.nb[vpmm_ls.n_nb++] = e;
			atomic_store_explicit(&vpmm_ls_nb_count, vpmm_ls.n_nb, memory_order_release);
		}
		e->next = vpmm_ls.bucket[hash(s)];
		vpmm_ls.bucket[hash(s)] = e;
		ctx_count_locked(ctx, (int)dev, 1);
	}
	pthread_mutex_unlock(&vpmm_ls.lock);
	if (!e)
		vpmm_ls_distrust("no memory to track a stream");
}

void vpmm_live_streams_untrackable(const char *why)
{
	vpmm_ls_distrust(why);
}

void vpmm_live_stream_seen(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
	    atomic_load_explicit(&vpmm_ls_untrusted, memory_order_relaxed))
		return;
	pthread_mutex_lock(&vpmm_ls.lock);
	bool known = *find_locked(s) != NULL;
	pthread_mutex_unlock(&vpmm_ls.lock);
	if (!known)
		vpmm_ls_distrust("a stream made without the shim seeing it");
}

void vpmm_live_stream_destroying(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return;
	pthread_mutex_lock(&vpmm_ls.lock);
	struct live **l = find_locked(s);
	bool known = *l != NULL;
	if (known && (*l)->nonblocking && !vpmm_fence_dying_locked(*l))
		vpmm_ls_distrust("a non-blocking stream could not be waited for before its end");
	if (known)
		drop_locked(l);
	pthread_mutex_unlock(&vpmm_ls.lock);
	if (!known)
		vpmm_ls_distrust("a stream made without the shim seeing it");
}

/* The record owed on vpmm_ls.legacy[k] made, or no longer due. */
void vpmm_ls_settle_locked(unsigned k)
{
	if (vpmm_ls.legacy[k].owed) {
		vpmm_ls.legacy[k].owed = false;
		/* release: a malloc that reads the count without the lock and
		 * finds nothing owed sees the record made before */
		atomic_fetch_sub_explicit(&vpmm_ls_owed_count, 1, memory_order_release);
	}
}

/* The wait for the non-blocking streams owed on vpmm_ls.legacy[k] made, or no
 * longer due. */
void vpmm_ls_settle_nb_locked(unsigned k)
{
	if (vpmm_ls.legacy[k].nb_owed) {
		vpmm_ls.legacy[k].nb_owed = false;
		atomic_fetch_sub_explicit(&vpmm_ls_nb_owed_count, 1, memory_order_release);
	}
}

/* Forgets `ctx`'s streams and legacy event; their events died with it. */
void vpmm_ls_ctx_end_locked(CUcontext ctx)
{
	for (unsigned b = 0; b < BUCKETS; b++)
		for (struct live **l = &vpmm_ls.bucket[b]; *l;) {
			if ((*l)->ctx == ctx) {
				(*l)->ev = NULL;
				drop_locked(l);
			} else {
				l = &(*l)->next;
			}
		}
	for (unsigned i = 0; i < CTX_MAX; i++)
		if (vpmm_ls.legacy[i].ctx == ctx) {
			vpmm_ls_settle_locked(i);
			vpmm_ls_settle_nb_locked(i);
			vpmm_ls.legacy[i].ctx = NULL, vpmm_ls.legacy[i].ev = NULL;
			vpmm_ls.legacy[i].n_ended = 0; /* dead with the context */
		}
	/* What is left of its count is its legacy stream (ctx_made). */
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (vpmm_ls.ctxs[k].streams && vpmm_ls.ctxs[k].ctx == ctx) {
			vpmm_ls.ctxs[k].streams = 0;
			vpmm_ls.gen++;
		}
}

/* Compares ctx's id with the one it had when last seen: a new id means
 * the context was reset unannounced, and what the table holds of it is
 * dead. */
void vpmm_ls_check_id_locked(CUcontext ctx)
{
	unsigned long long id;
	unsigned k, none = CTX_MAX;
	if (!ctx || !vpmm_real.ctx_get_id || vpmm_real.ctx_get_id(ctx, &id) != CUDA_SUCCESS)
		return;
	for (k = 0; k < CTX_MAX && vpmm_ls.ids[k].ctx != ctx; k++)
		if (!vpmm_ls.ids[k].ctx && none == CTX_MAX)
			none = k;
	if (k < CTX_MAX) {
		if (vpmm_ls.ids[k].id != id)
			vpmm_ls_ctx_end_locked(ctx);
		vpmm_ls.ids[k].id = id;
	} else if (none < CTX_MAX) {
		vpmm_ls.ids[none].ctx = ctx;
		vpmm_ls.ids[none].id = id;
	}
}

void vpmm_live_streams_ctx_made(CUcontext ctx, int dev)
{
	pthread_mutex_lock(&vpmm_ls.lock);
	ctx_count_locked(ctx, dev, 1);
	pthread_mutex_unlock(&vpmm_ls.lock);
}

void vpmm_live_streams_ctx_end(CUcontext ctx)
{
	pthread_mutex_lock(&vpmm_ls.lock);
	vpmm_ls_ctx_end_locked(ctx);
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (vpmm_ls.ids[k].ctx == ctx)
			vpmm_ls.ids[k].ctx = NULL;
	pthread_mutex_unlock(&vpmm_ls.lock);
}

void vpmm_live_streams_device_reset(int dev)
{
	CUcontext seen = NULL;
	bool several = false;
	pthread_mutex_lock(&vpmm_ls.lock);
	for (unsigned b = 0; b < BUCKETS; b++)
		for (struct live **l = &vpmm_ls.bucket[b]; *l;) {
			if ((*l)->dev == dev) {
				several |= seen && seen != (*l)->ctx;
				seen = (*l)->ctx;
				(*l)->ev = NULL;
				drop_locked(l);
			} else {
				l = &(*l)->next;
			}
		}
	pthread_mutex_unlock(&vpmm_ls.lock);
	if (several)
		vpmm_ls_distrust("a device reset ended streams of several contexts");
}

void vpmm_live_streams_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	vpmm_ls.lock = fresh;
	memset(vpmm_ls.bucket, 0, sizeof vpmm_ls.bucket);
	memset(vpmm_ls.legacy, 0, sizeof vpmm_ls.legacy);
	memset(vpmm_ls.ctxs, 0, sizeof vpmm_ls.ctxs);
	memset(vpmm_ls.ids, 0, sizeof vpmm_ls.ids);
	vpmm_ls.ctx_overflow = false;
	vpmm_ls.nb = NULL;
	vpmm_ls.n_nb = vpmm_ls.cap_nb = 0;
	atomic_store(&vpmm_ls_nb_count, 0);
	atomic_store(&vpmm_ls_owed_count, 0);
	atomic_store(&vpmm_ls_nb_owed_count, 0);
	vpmm_ls.gen++;
	vpmm_fence_forget();
}
