/* live_streams.c — every stream the program made, and the fences that let
 * a synchronous free keep cudaFree's promise without stopping the host.
 *
 * Owns: the table of live streams (context, device, blocking or not, the
 * event a fence records on it), whether the table can be trusted to hold
 * every stream, and the per-context event the malloc fence records on the
 * legacy default stream.
 *
 * Decisions, and why:
 *  - cudaFree promises that no work issued before it, on any stream of the
 *    context, touches the memory once someone else owns it. Synchronising
 *    the context keeps it but stops the host. The legacy default stream
 *    does most of that on the device: work queued on it waits for the work
 *    queued before on every blocking stream of its context (the per-thread
 *    default streams included), and work queued later on a blocking stream
 *    waits for it. Only non-blocking streams escape both directions. So a
 *    synchronous free becomes a free on the legacy stream that owes it two
 *    things, made once for a run of frees: a wait for each non-blocking
 *    stream (an event recorded there, one per stream, reused: a wait
 *    captures the record it sees, so re-recording later is harmless),
 *    made before anything records on the legacy stream or reuses the
 *    memory in its order; and an event record (the blocking streams order
 *    against the legacy stream only through its actions: without one
 *    between the free and the malloc, two blocking streams would not be
 *    ordered), which the next malloc on the legacy stream makes. A
 *    synchronous malloc is a malloc on the legacy stream after which each
 *    non-blocking stream waits for it, if a free (or a wait of the pool's
 *    on the legacy stream) came since they last did. Programs without
 *    non-blocking streams (PyTorch without side streams) pay one event
 *    record for each run of frees, and reuse memory at once in stream
 *    order, as through the pluggable allocator. With them, each stream
 *    costs about 0.6 us a run of frees and 0.35 us a malloc after one
 *    (two driver calls and one; an H200): PyTorch's 32 pool streams had
 *    cost 64 calls a free and 32 a malloc.
 *  - That holds only while every non-blocking stream is known. The table is
 *    trusted only if the shim was interposed before CUDA was initialised
 *    (checked once at load); a stream a hook meets that the table never saw
 *    made, or a green context's stream, withdraws the trust for good, and
 *    synchronous frees synchronise again.
 *  - A stream of another context on the pool's device can reach pool
 *    memory without passing the legacy stream of the pool's context: such
 *    a device synchronises (vpmm_fence_possible).
 *  - A capturing stream gets no event (it would become a graph node): the
 *    fence is refused and the caller synchronises, as before.
 *  - A stream destroyed after a fence: the legacy stream's wait already
 *    holds the record; its event is destroyed with it, which the driver
 *    defers until the recorded work completed.
 *  - A context reset that no hook sees (cudaDeviceReset goes through the
 *    runtime's private table) keeps the context's handle but changes its
 *    id (cuCtxGetId), and ends its streams and events. The id is compared
 *    whenever a stream is made or a fence is asked for; a new one drops the
 *    context's entries without destroying their dead events.
 * May call: resolve.h, the log and the hook counters (shim.h).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "live_streams.h"
#include "resolve.h"
#include "shim.h"

#define BUCKETS 1024
#define CTX_MAX 64

struct live {
	CUstream s;
	CUcontext ctx;
	int dev;
	bool nonblocking;
	CUevent ev;      /* the fence's record on it; NULL until needed */
	unsigned nb_idx; /* index in nb[] when non-blocking */
	struct live *next;
};

static struct {
	pthread_mutex_t lock;
	struct live *bucket[BUCKETS];
	/* The non-blocking streams, dense, every context's. */
	struct live **nb;
	unsigned n_nb, cap_nb;
	/* The legacy stream's event of each context, for the fences. owed:
	 * a synchronous free was made on the legacy stream since the last
	 * record there (the record the next malloc on it makes). nb_owed:
	 * and the legacy stream has not waited for the non-blocking streams
	 * since (pay_nb_locked, before any record there). fenced: the
	 * count of obligations when the non-blocking streams last waited for
	 * the legacy stream (vpmm_fence_malloc). */
	struct {
		CUcontext ctx;
		CUevent ev;
		bool owed, nb_owed;
		unsigned long fenced;
	} legacy[CTX_MAX];
	/* The contexts with streams in the table, their devices and counts;
	 * overflow: more contexts than that (each device then synchronises). */
	struct {
		CUcontext ctx;
		int dev;
		unsigned streams;
	} ctxs[CTX_MAX];
	bool ctx_overflow;
	/* The id (cuCtxGetId) each context had when last seen. */
	struct {
		CUcontext ctx;
		unsigned long long id;
	} ids[CTX_MAX];
	/* Counts every change of the streams above (ctx_count_locked), so
	 * that the table's verdict on a fence (no stream another context has
	 * on the device, not too many non-blocking streams) is worked out once
	 * a change rather than on every synchronous call: 64 contexts' slots
	 * were read twice a malloc+free pair, 28 % of the pair's instructions
	 * on the host driver. */
	unsigned long gen;
	struct {
		unsigned long gen; /* T.gen it was worked out at; 0: none */
		CUcontext ctx;
		int dev;
		bool ok;
	} verdict;
} T = {.lock = PTHREAD_MUTEX_INITIALIZER, .gen = 1};

/* Set once the table cannot be trusted to hold every stream. */
static atomic_bool untrusted;
/* T.n_nb, read without the lock by the malloc fence, which has nothing to
 * do without non-blocking streams (PyTorch without side streams). A stream
 * made meanwhile waits for the legacy stream by itself
 * (vpmm_fence_new_stream). */
static atomic_uint nb_count;
/* How many T.legacy[] are owed a record; read without the lock, as
 * nb_count, by the mallocs on the legacy stream. */
static atomic_uint owed_count;
/* How many T.legacy[] are owed the wait for the non-blocking streams;
 * read without the lock by the pool's records on the legacy stream
 * (record_for_pool). */
static atomic_uint nb_owed_count;
/* What can leave memory that a synchronous malloc hands out pending on
 * the legacy stream, counted: every free through the shim
 * (vpmm_fence_freeing), every wait the pool gives the legacy stream
 * (vpmm_fence_legacy_wait). While it stands still, the non-blocking
 * streams' last wait for the legacy stream covers whatever a malloc
 * hands out, and the malloc makes no new one. */
static atomic_ulong obligations;

static unsigned hash(CUstream s)
{
	uintptr_t v = (uintptr_t)s;
	v ^= v >> 17;
	v *= 0x9e3779b97f4a7c15ull;
	return (unsigned)(v >> 40) % BUCKETS;
}

static struct live **find_locked(CUstream s)
{
	struct live **l = &T.bucket[hash(s)];
	while (*l && (*l)->s != s)
		l = &(*l)->next;
	return l;
}

static void nb_remove_locked(struct live *e)
{
	struct live *last = T.nb[--T.n_nb];
	atomic_store_explicit(&nb_count, T.n_nb, memory_order_release);
	T.nb[e->nb_idx] = last;
	last->nb_idx = e->nb_idx;
}

static void ctx_count_locked(CUcontext ctx, int dev, int delta)
{
	unsigned k, none = CTX_MAX;
	T.gen++;
	for (k = 0; k < CTX_MAX; k++) {
		if (T.ctxs[k].streams && T.ctxs[k].ctx == ctx && T.ctxs[k].dev == dev)
			break;
		if (!T.ctxs[k].streams && none == CTX_MAX)
			none = k;
	}
	if (k == CTX_MAX) {
		if (delta < 0)
			return;
		if (none == CTX_MAX) {
			T.ctx_overflow = true;
			return;
		}
		k = none;
		T.ctxs[k].ctx = ctx;
		T.ctxs[k].dev = dev;
	}
	T.ctxs[k].streams += (unsigned)delta;
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

static void check_id_locked(CUcontext ctx);

static void distrust(const char *why)
{
	if (!atomic_exchange(&untrusted, true))
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
		atomic_store(&untrusted, true);
		return;
	}
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!cu)
		return; /* no CUDA yet: every stream is made through us */
	CUresult (*cur)(CUcontext *) =
		VPMM_PTR_TO_FN(CUresult(*)(CUcontext *), vpmm_real_dlsym_fn(cu, "cuCtxGetCurrent"));
	CUcontext c = NULL;
	if (cur && cur(&c) != CUDA_ERROR_NOT_INITIALIZED)
		atomic_store(&untrusted, true);
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
		distrust("a stream of unknown context");
		return;
	}
	struct live *e = calloc(1, sizeof *e);
	pthread_mutex_lock(&T.lock);
	check_id_locked(ctx);
	struct live **l = find_locked(s);
	if (*l) /* a handle the driver reused: the old stream died unseen */
		drop_locked(l);
	bool nb = flags & CU_STREAM_NON_BLOCKING;
	if (e && nb && T.n_nb == T.cap_nb) {
		unsigned cap = T.cap_nb ? 2 * T.cap_nb : 64;
		struct live **n = realloc(T.nb, cap * sizeof *n);
		if (n) {
			T.nb = n;
			T.cap_nb = cap;
		} else {
			free(e);
			e = NULL;
		}
	}
	if (e) {
		*e = (struct live){.s = s, .ctx = ctx, .dev = (int)dev, .nonblocking = nb};
		if (nb) {
			e->nb_idx = T.n_nb;
			T.nb[T.n_nb++] = e;
			atomic_store_explicit(&nb_count, T.n_nb, memory_order_release);
		}
		e->next = T.bucket[hash(s)];
		T.bucket[hash(s)] = e;
		ctx_count_locked(ctx, (int)dev, 1);
	}
	pthread_mutex_unlock(&T.lock);
	if (!e)
		distrust("no memory to track a stream");
}

void vpmm_live_streams_untrackable(const char *why)
{
	distrust(why);
}

void vpmm_live_stream_seen(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
	    atomic_load_explicit(&untrusted, memory_order_relaxed))
		return;
	pthread_mutex_lock(&T.lock);
	bool known = *find_locked(s) != NULL;
	pthread_mutex_unlock(&T.lock);
	if (!known)
		distrust("a stream made without the shim seeing it");
}

static int legacy_slot_locked(CUcontext ctx);
static CUresult nb_wait_locked(struct live *e);

/* A non-blocking stream of a context whose frees still owe the legacy
 * stream its wait for the non-blocking streams: the wait for this one is
 * made now, while the stream is there to record on (its last work may
 * still touch memory those frees gave back). */
static bool wait_for_dying_locked(struct live *e)
{
	unsigned k;
	for (k = 0; k < CTX_MAX && !(T.legacy[k].ctx == e->ctx && T.legacy[k].nb_owed); k++)
		;
	if (k == CTX_MAX)
		return true;
	/* In the stream's context: the legacy stream that waits is the
	 * current context's, and cuStreamDestroy needs none current. */
	CUcontext cur = NULL, popped;
	bool pushed = vpmm_real.ctx_get_current(&cur) == CUDA_SUCCESS && cur != e->ctx &&
		      vpmm_real.ctx_push(e->ctx) == CUDA_SUCCESS;
	CUresult r = (cur == e->ctx || pushed) ? nb_wait_locked(e) : CUDA_ERROR_INVALID_CONTEXT;
	if (pushed)
		vpmm_real.ctx_pop(&popped);
	/* Else its work is waited for on the host: what it touched is then
	 * done whoever reuses it. */
	return r == CUDA_SUCCESS || vpmm_real.stream_synchronize(e->s) == CUDA_SUCCESS;
}

void vpmm_live_stream_destroying(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return;
	pthread_mutex_lock(&T.lock);
	struct live **l = find_locked(s);
	bool known = *l != NULL;
	if (known && (*l)->nonblocking && !wait_for_dying_locked(*l))
		distrust("a non-blocking stream could not be waited for before its end");
	if (known)
		drop_locked(l);
	pthread_mutex_unlock(&T.lock);
	if (!known)
		distrust("a stream made without the shim seeing it");
}

/* The record owed on T.legacy[k] made, or no longer due. */
static void settle_locked(unsigned k)
{
	if (T.legacy[k].owed) {
		T.legacy[k].owed = false;
		/* release: a malloc that reads the count without the lock and
		 * finds nothing owed sees the record made before */
		atomic_fetch_sub_explicit(&owed_count, 1, memory_order_release);
	}
}

/* The wait for the non-blocking streams owed on T.legacy[k] made, or no
 * longer due. */
static void settle_nb_locked(unsigned k)
{
	if (T.legacy[k].nb_owed) {
		T.legacy[k].nb_owed = false;
		atomic_fetch_sub_explicit(&nb_owed_count, 1, memory_order_release);
	}
}

/* Forgets `ctx`'s streams and legacy event; their events died with it. */
static void ctx_end_locked(CUcontext ctx)
{
	for (unsigned b = 0; b < BUCKETS; b++)
		for (struct live **l = &T.bucket[b]; *l;) {
			if ((*l)->ctx == ctx) {
				(*l)->ev = NULL;
				drop_locked(l);
			} else {
				l = &(*l)->next;
			}
		}
	for (unsigned i = 0; i < CTX_MAX; i++)
		if (T.legacy[i].ctx == ctx) {
			settle_locked(i);
			settle_nb_locked(i);
			T.legacy[i].ctx = NULL, T.legacy[i].ev = NULL;
		}
}

/* Compares ctx's id with the one it had when last seen: a new id means
 * the context was reset unannounced, and what the table holds of it is
 * dead. */
static void check_id_locked(CUcontext ctx)
{
	unsigned long long id;
	unsigned k, none = CTX_MAX;
	if (!ctx || !vpmm_real.ctx_get_id || vpmm_real.ctx_get_id(ctx, &id) != CUDA_SUCCESS)
		return;
	for (k = 0; k < CTX_MAX && T.ids[k].ctx != ctx; k++)
		if (!T.ids[k].ctx && none == CTX_MAX)
			none = k;
	if (k < CTX_MAX) {
		if (T.ids[k].id != id)
			ctx_end_locked(ctx);
		T.ids[k].id = id;
	} else if (none < CTX_MAX) {
		T.ids[none].ctx = ctx;
		T.ids[none].id = id;
	}
}

void vpmm_live_streams_ctx_end(CUcontext ctx)
{
	pthread_mutex_lock(&T.lock);
	ctx_end_locked(ctx);
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (T.ids[k].ctx == ctx)
			T.ids[k].ctx = NULL;
	pthread_mutex_unlock(&T.lock);
}

void vpmm_live_streams_device_reset(int dev)
{
	CUcontext seen = NULL;
	bool several = false;
	pthread_mutex_lock(&T.lock);
	for (unsigned b = 0; b < BUCKETS; b++)
		for (struct live **l = &T.bucket[b]; *l;) {
			if ((*l)->dev == dev) {
				several |= seen && seen != (*l)->ctx;
				seen = (*l)->ctx;
				(*l)->ev = NULL;
				drop_locked(l);
			} else {
				l = &(*l)->next;
			}
		}
	pthread_mutex_unlock(&T.lock);
	if (several)
		distrust("a device reset ended streams of several contexts");
}

void vpmm_live_streams_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	T.lock = fresh;
	memset(T.bucket, 0, sizeof T.bucket);
	memset(T.legacy, 0, sizeof T.legacy);
	memset(T.ctxs, 0, sizeof T.ctxs);
	memset(T.ids, 0, sizeof T.ids);
	T.ctx_overflow = false;
	T.nb = NULL;
	T.n_nb = T.cap_nb = 0;
	atomic_store(&nb_count, 0);
	atomic_store(&owed_count, 0);
	atomic_store(&nb_owed_count, 0);
	T.gen++;
}

/* ---- the fences ----------------------------------------------------------------- */

static bool capturing(CUstream s)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	return vpmm_real.stream_is_capturing(s, &cs) != CUDA_SUCCESS ||
	       cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

static bool have_event_calls(void)
{
	return vpmm_real.event_create && vpmm_real.event_record && vpmm_real.event_destroy &&
	       vpmm_real.stream_wait_event && vpmm_real.stream_is_capturing;
}

/* What the table says of a fence of `ctx` on `dev`: no non-blocking stream
 * of another context on the device, at most VPMM_FENCE_STREAMS_MAX of its
 * own, and no blocking stream of another context on the device either (none
 * of them waits for this context's legacy stream). Worked out once per
 * change of the table. */
static bool table_verdict_locked(CUcontext ctx, int dev)
{
	if (T.verdict.gen == T.gen && T.verdict.ctx == ctx && T.verdict.dev == dev)
		return T.verdict.ok;
	bool ok = !T.ctx_overflow;
	unsigned n = 0;
	for (unsigned i = 0; ok && i < T.n_nb; i++) {
		struct live *e = T.nb[i];
		if (e->ctx == ctx)
			ok = ++n <= VPMM_FENCE_STREAMS_MAX;
		else if (e->dev == dev)
			ok = false;
	}
	for (unsigned k = 0; ok && k < CTX_MAX; k++)
		ok = !T.ctxs[k].streams || T.ctxs[k].dev != dev || T.ctxs[k].ctx == ctx;
	T.verdict.gen = T.gen;
	T.verdict.ctx = ctx;
	T.verdict.dev = dev;
	T.verdict.ok = ok;
	return ok;
}

bool vpmm_fence_possible(CUcontext ctx, int dev)
{
	if (atomic_load_explicit(&untrusted, memory_order_relaxed) || !ctx || !have_event_calls())
		return false;
	if (capturing(CU_STREAM_LEGACY))
		return false;
	pthread_mutex_lock(&T.lock);
	check_id_locked(ctx);
	bool ok = table_verdict_locked(ctx, dev);
	for (unsigned i = 0; ok && i < T.n_nb; i++)
		ok = T.nb[i]->ctx != ctx || !capturing(T.nb[i]->s);
	pthread_mutex_unlock(&T.lock);
	return ok;
}

/* The legacy stream waits for the work queued so far on non-blocking
 * stream e: an event recorded there, made on first use and reused (a wait
 * captures the record it sees, so re-recording later is harmless). */
static CUresult nb_wait_locked(struct live *e)
{
	CUresult r = CUDA_SUCCESS;
	if (!e->ev)
		r = vpmm_real.event_create(&e->ev, CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.event_record(e->ev, e->s);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.stream_wait_event(CU_STREAM_LEGACY, e->ev, 0);
	return r;
}

/* The wait for every non-blocking stream of T.legacy[k]'s context that its
 * frees owe, made on the legacy stream before anything records there: a
 * record after it then stands for the work of every stream before the
 * frees, and a reuse in the legacy stream's order comes after it. */
static CUresult pay_nb_locked(unsigned k)
{
	CUresult r = CUDA_SUCCESS;
	if (!T.legacy[k].nb_owed)
		return CUDA_SUCCESS;
	for (unsigned i = 0; r == CUDA_SUCCESS && i < T.n_nb; i++) {
		struct live *e = T.nb[i];
		if (e->ctx != T.legacy[k].ctx)
			continue;
		/* A capture begun since the frees: a record would join its
		 * graph (vpmm_fence_capture_begins pays before one begins;
		 * this is a capture it did not see). The caller synchronises,
		 * or fails as the capture makes it. */
		if (capturing(e->s))
			return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		/* Not skipped when idle: cuStreamQuery costs what the record
		 * does (0.3 us on an H200), and a stream the program leaves
		 * idle still holds the malloc fence's last wait for the legacy
		 * stream, pending while the device is behind. */
		r = nb_wait_locked(e);
	}
	if (r == CUDA_SUCCESS)
		settle_nb_locked(k);
	return r;
}

CUresult vpmm_fence_free(CUcontext ctx)
{
	CUresult r = CUDA_SUCCESS;
	bool nb = false;
	pthread_mutex_lock(&T.lock);
	/* The wait for the non-blocking streams is left owed (pay_nb_locked:
	 * before any record on the legacy stream, a capture's begin, a
	 * non-blocking stream's end), so that a run of frees makes it once.
	 *
	 * And one action on the legacy stream before the memory is handed out
	 * again: the blocking streams order against it only through its
	 * actions. Work on two blocking streams, one before the free and one
	 * after the malloc, with nothing queued on the legacy stream between,
	 * would run unordered. The next malloc on the legacy stream records
	 * it (vpmm_fence_malloc, vpmm_fence_owed), once for every free made
	 * since: a record every free cost a PyTorch step about one in three
	 * of them (frees come in runs). Any other reuse, by another stream or
	 * settled, waits for an event the pool records on the legacy stream
	 * after the free: an action too. The event is made here, so that the
	 * malloc does not fail for want of one. */
	int k = legacy_slot_locked(ctx);
	if (k < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		for (unsigned i = 0; !nb && i < T.n_nb; i++)
			nb = T.nb[i]->ctx == ctx;
		if (nb && !T.legacy[k].nb_owed) {
			T.legacy[k].nb_owed = true;
			atomic_fetch_add_explicit(&nb_owed_count, 1, memory_order_release);
		}
		if (!T.legacy[k].owed) {
			T.legacy[k].owed = true;
			atomic_fetch_add_explicit(&owed_count, 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&T.lock);
	return r;
}

/* The slot in T.legacy of `ctx`, its event made on first use; -1: none. */
static int legacy_slot_locked(CUcontext ctx)
{
	unsigned k, none = CTX_MAX;
	for (k = 0; k < CTX_MAX && T.legacy[k].ctx != ctx; k++)
		if (!T.legacy[k].ctx && none == CTX_MAX)
			none = k;
	if (k < CTX_MAX)
		return (int)k;
	if (none == CTX_MAX ||
	    vpmm_real.event_create(&T.legacy[none].ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		return -1;
	T.legacy[none].ctx = ctx;
	T.legacy[none].owed = T.legacy[none].nb_owed = false;
	T.legacy[none].fenced = ~0ul; /* the first malloc fences */
	return (int)none;
}

/* Records on the legacy stream of `ctx` (the current context), which pays
 * what the frees before owed it; *ev (may be NULL): the event recorded. */
static CUresult legacy_record_locked(CUcontext ctx, CUevent *ev)
{
	int k = legacy_slot_locked(ctx);
	if (k < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pay_nb_locked((unsigned)k);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.event_record(T.legacy[k].ev, CU_STREAM_LEGACY);
	if (r == CUDA_SUCCESS && T.legacy[k].owed) {
		vpmm_count(VPMM_HOOK_fence_owed);
		settle_locked((unsigned)k);
	}
	if (ev)
		*ev = T.legacy[k].ev;
	return r;
}

/* Whether the frees of `ctx` owe its legacy stream a record. */
static bool owed_locked(CUcontext ctx)
{
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (T.legacy[k].ctx == ctx)
			return T.legacy[k].owed;
	return false;
}

void vpmm_fence_new_stream(CUstream s)
{
	CUcontext ctx = NULL;
	if (atomic_load_explicit(&untrusted, memory_order_relaxed) || !have_event_calls() ||
	    vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
		return;
	if (capturing(CU_STREAM_LEGACY)) {
		distrust("a non-blocking stream made during a capture");
		return;
	}
	pthread_mutex_lock(&T.lock);
	check_id_locked(ctx);
	CUevent ev;
	bool ok = legacy_record_locked(ctx, &ev) == CUDA_SUCCESS &&
		  vpmm_real.stream_wait_event(s, ev, 0) == CUDA_SUCCESS;
	pthread_mutex_unlock(&T.lock);
	if (!ok)
		distrust("a new non-blocking stream could not wait for the legacy stream");
}

CUresult vpmm_fence_malloc(CUcontext ctx)
{
	CUresult r = CUDA_SUCCESS;
	bool nb = false, wait;
	CUevent ev;
	if (!atomic_load_explicit(&nb_count, memory_order_acquire) &&
	    !atomic_load_explicit(&owed_count, memory_order_acquire))
		return CUDA_SUCCESS;
	/* Read before the record: what comes after, the next malloc sees. */
	unsigned long now = atomic_load_explicit(&obligations, memory_order_acquire);
	pthread_mutex_lock(&T.lock);
	for (unsigned i = 0; !nb && i < T.n_nb; i++)
		nb = T.nb[i]->ctx == ctx;
	int k = nb ? legacy_slot_locked(ctx) : -1;
	/* The non-blocking streams wait again only if something since their
	 * last wait can have left the memory pending on the legacy stream: a
	 * free, or a wait the pool gave the legacy stream for another
	 * stream's free. Otherwise whatever this malloc handed out was
	 * pending there before that wait, or not at all (new memory, or
	 * settled). */
	wait = nb && (k < 0 || T.legacy[k].fenced != now);
	if (owed_locked(ctx) || wait)
		r = legacy_record_locked(ctx, &ev);
	if (r == CUDA_SUCCESS && wait) {
		for (unsigned i = 0; r == CUDA_SUCCESS && i < T.n_nb; i++)
			if (T.nb[i]->ctx == ctx)
				r = vpmm_real.stream_wait_event(T.nb[i]->s, ev, 0);
		if (r == CUDA_SUCCESS && k >= 0)
			T.legacy[k].fenced = now;
	}
	pthread_mutex_unlock(&T.lock);
	return r;
}

void vpmm_fence_capture_begins(void)
{
	CUcontext ctx = NULL;
	if (!atomic_load_explicit(&nb_owed_count, memory_order_acquire) ||
	    vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
		return;
	pthread_mutex_lock(&T.lock);
	check_id_locked(ctx);
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (T.legacy[k].ctx == ctx && pay_nb_locked(k) != CUDA_SUCCESS &&
		    vpmm_real.ctx_synchronize() == CUDA_SUCCESS)
			settle_nb_locked(k);
	pthread_mutex_unlock(&T.lock);
}

void vpmm_fence_freeing(void)
{
	atomic_fetch_add_explicit(&obligations, 1, memory_order_release);
}

/* ---- the pool's own calls on the legacy stream ------------------------------------ */

/* The driver's calls the wrappers below stand in front of. */
static CUresult (*pool_record)(vpmm_driver *d, CUevent ev, CUstream s);
static CUresult (*pool_wait)(vpmm_driver *d, CUstream s, CUevent ev);

static bool is_legacy(CUstream s)
{
	return !s || s == CU_STREAM_LEGACY;
}

/* A record of the pool's on the legacy stream (a free's event, one a
 * reuse by another stream waits for) stands for the frees before it: the
 * legacy stream waits first for the non-blocking streams, if those frees
 * still owe that. A wait that cannot be made: the context synchronised,
 * which ends the same work. */
static CUresult record_for_pool(vpmm_driver *d, CUevent ev, CUstream s)
{
	CUcontext ctx = NULL;
	if (is_legacy(s) && atomic_load_explicit(&nb_owed_count, memory_order_acquire) &&
	    vpmm_real.ctx_get_current(&ctx) == CUDA_SUCCESS && ctx) {
		CUresult r = CUDA_SUCCESS;
		pthread_mutex_lock(&T.lock);
		/* A reset the shim did not see ended what was owed (and the
		 * streams' events with it). */
		check_id_locked(ctx);
		for (unsigned k = 0; k < CTX_MAX; k++)
			if (T.legacy[k].ctx == ctx && T.legacy[k].nb_owed &&
			    (r = pay_nb_locked(k)) != CUDA_SUCCESS &&
			    (r = vpmm_real.ctx_synchronize()) == CUDA_SUCCESS)
				settle_nb_locked(k);
		pthread_mutex_unlock(&T.lock);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return pool_record(d, ev, s);
}

/* A wait of the legacy stream for another stream's event: memory pending
 * there may be handed out on the legacy stream after it, which the
 * non-blocking streams have not waited for (vpmm_fence_malloc). */
static CUresult wait_for_pool(vpmm_driver *d, CUstream s, CUevent ev)
{
	CUresult r = pool_wait(d, s, ev);
	/* After the wait is queued: a fence that read the count before
	 * this comes again; one that read it after records behind the wait. */
	if (is_legacy(s))
		atomic_fetch_add_explicit(&obligations, 1, memory_order_release);
	return r;
}

void vpmm_fence_wrap_driver(vpmm_driver *d)
{
	/* Once a table: a forked child's process state makes a new one. */
	if (!d || d->event_record == record_for_pool)
		return;
	pool_record = d->event_record;
	pool_wait = d->stream_wait;
	d->event_record = record_for_pool;
	d->stream_wait = wait_for_pool;
}

CUresult vpmm_fence_owed(CUcontext ctx)
{
	CUresult r = CUDA_SUCCESS;
	if (!atomic_load_explicit(&owed_count, memory_order_acquire))
		return CUDA_SUCCESS;
	if (!ctx && vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&T.lock);
	/* A context reset since the frees ended their work and its events:
	 * nothing is owed then, and the old event must not be recorded (its
	 * handle may be another event's by now). The synchronous paths check
	 * the id in vpmm_fence_possible. */
	check_id_locked(ctx);
	if (ctx && owed_locked(ctx))
		r = legacy_record_locked(ctx, NULL);
	/* Reset and not yet made again (the runtime remakes it at its next
	 * call, after this one): its work ended with it, nothing is owed. */
	if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
		ctx_end_locked(ctx);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&T.lock);
	return r;
}
