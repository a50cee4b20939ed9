/* capture.c — stream capture (CUDA graphs) and the pool.
 *
 * Owns: the captures in progress that the shim saw begin (stream, capture
 * id, mode, thread), the driver's capture entry points under the shim
 * (cuStreamBeginCapture and its _v2, _ptsz and ToGraph forms,
 * cuStreamEndCapture), and the frees of pool memory deferred until the
 * capture that forbade them ended.
 *
 * Decisions, and why:
 *  - A free of pool memory cannot happen inside a capture: the pool would
 *    have to order its reuse after a graph launch it never sees, and a
 *    synchronous free, during a capture, synchronises the context, which
 *    the capture forbids (the driver then refuses the call and
 *    invalidates the capture). So
 *    such a free is deferred, not refused: it succeeds at once for the
 *    program and is made, as the free it was, once the capture ended. A
 *    stream-ordered free on a captured stream then becomes a free on that
 *    stream, ordered after the work the stream had before the capture (the
 *    captured work never runs on it); a synchronous one is made as
 *    synchronous frees are (alloc.c). The memory is reused only after that: within the
 *    capture, nothing else gets it. A free the pool would refuse (no live
 *    allocation's start, or one already waiting) is refused at the call.
 *  - Which frees wait: one on a stream being captured (its capture's id
 *    keys it), one on the legacy stream while a blocking stream is
 *    captured (the driver refuses the query there, and it waits until the
 *    query succeeds again), and a synchronous one while a capture forbids
 *    this thread to synchronise: its own capture not begun relaxed, or, in
 *    the global interaction mode, another thread's capture begun global
 *    (vpmm_capture_forbids_sync); that kind waits until no capture forbids
 *    the flushing thread to synchronise.
 *  - When they are made: after the real cuStreamEndCapture (whatever it
 *    answered: an invalidated capture ends too), after a stream's destroy
 *    (its frees become synchronous ones: the stream is gone), and at the
 *    next malloc or free through the shim (vpmm_capture_poll), which asks
 *    the driver whether each waiting free's capture is over. The poll is
 *    what serves the pluggable allocator loaded without the preload, where
 *    the capture calls never reach the shim. A capture that never ends
 *    keeps its frees until exit, where the memory goes with the process.
 *  - The shim's own knowledge of captures (the list below) only decides
 *    about synchronous calls; a stream's state is always the driver's
 *    answer. A capture begun before the shim was loaded, or through an
 *    entry point it does not wrap, is missed there: a synchronous free
 *    during it synchronises, as without the shim.
 *  - Begins and the flush exclude each other (begin_lock): a flush that
 *    synchronises, or records an event on a stream, cannot then race a
 *    capture another thread begins.
 *  - A graph launched after its capture ended still uses the memory it
 *    captured: freeing memory inside a capture that a later launch of the
 *    graph reads is the program's error, as it is without the pool.
 * May call: alloc.h (the deferred free, made later), streams.h, resolve.h,
 * process.h, live_streams.h (what frees owe is paid before a capture
 * begins), the log.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "alloc.h"
#include "capture.h"
#include "live_streams.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "streams.h"

struct capture {
	CUstream s; /* as tracked: the per-thread default stream by its handle */
	cuuint64_t id;
	CUstreamCaptureMode mode;
	pthread_t thread;
	struct capture *next;
};

struct deferred {
	CUdeviceptr ptr;
	CUstream s; /* to free on; VPMM_NO_STREAM: a synchronous free */
	enum vpmm_via via;
	bool has_id;
	cuuint64_t id;    /* of the capture it waits for, when known */
	pthread_t thread; /* whose per-thread default stream s is */
	struct deferred *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the two lists */
static pthread_mutex_t begin_lock = PTHREAD_MUTEX_INITIALIZER;
static struct capture *captures;
static struct deferred *waiting;
static atomic_int n_strict;  /* captures in the list not begun relaxed */
static atomic_int n_waiting; /* deferred frees */
static __thread bool tls_flushing;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A forked child starts with nothing in progress (CUDA is unusable there);
 * the parent's lists are left alone, their locks may be held. */
static void forked_child(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	lock = fresh;
	begin_lock = fresh;
	captures = NULL;
	waiting = NULL;
	atomic_store(&n_strict, 0);
	atomic_store(&n_waiting, 0);
}

static void watch_fork(void)
{
	pthread_atfork(NULL, NULL, forked_child);
}

/* ---- the driver's answers ------------------------------------------------------- */

/* The capture status of s and, while active, its capture's id. */
static CUresult capture_info(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
	*st = CU_STREAM_CAPTURE_STATUS_NONE;
	*id = 0;
	if (vpmm_real.capture_info_v3)
		return vpmm_real.capture_info_v3(s, st, id, NULL, NULL, NULL, NULL);
	if (vpmm_real.capture_info_v2)
		return vpmm_real.capture_info_v2(s, st, id, NULL, NULL, NULL);
	if (vpmm_real.capture_info_v1)
		return vpmm_real.capture_info_v1(s, st, id);
	if (vpmm_real.stream_is_capturing)
		return vpmm_real.stream_is_capturing(s, st);
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* This thread's capture interaction mode (global when it cannot be read). */
static CUstreamCaptureMode thread_mode(void)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED, back;
	if (!vpmm_real.exchange_capture_mode || vpmm_real.exchange_capture_mode(&m) != CUDA_SUCCESS)
		return CU_STREAM_CAPTURE_MODE_GLOBAL;
	back = m;
	vpmm_real.exchange_capture_mode(&back);
	return m;
}

bool vpmm_capture_forbids_sync(void)
{
	CUstreamCaptureMode mode;
	pthread_t self = pthread_self();
	bool forbids = false;
	if (!atomic_load_explicit(&n_strict, memory_order_acquire))
		return false;
	mode = thread_mode();
	if (mode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return false;
	pthread_mutex_lock(&lock);
	for (struct capture *c = captures; c && !forbids; c = c->next) {
		if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
			continue;
		forbids = pthread_equal(c->thread, self) ||
			  (mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
			   c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
	}
	pthread_mutex_unlock(&lock);
	return forbids;
}

/* ---- deferring and flushing -------------------------------------------------------- */

bool vpmm_capture_defer(CUdeviceptr ptr, CUstream stream, enum vpmm_via via, CUresult *res)
{
	struct deferred d = {.ptr = ptr, .via = via, .thread = pthread_self()};
	CUstreamCaptureStatus st;
	CUresult r;

	vpmm_capture_poll();
	d.s = vpmm_pool_stream(stream, via);
	if (d.s == VPMM_NO_STREAM) {
		if (!vpmm_capture_forbids_sync())
			return false;
	} else {
		/* The query every stream-ordered free made before: the id
		 * only for a stream that is captured. */
		r = vpmm_real.stream_is_capturing ? vpmm_real.stream_is_capturing(d.s, &st)
						  : capture_info(d.s, &st, &d.id);
		if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE)
			r = capture_info(d.s, &st, &d.id);
		if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
			/* The legacy stream, while a blocking stream is
			 * captured: work on it would wait for the capture. It
			 * waits until the driver answers for the stream again. */
		} else if (r != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE) {
			return false; /* a bad stream: the free's own path says so */
		} else {
			d.has_id = st == CU_STREAM_CAPTURE_STATUS_ACTIVE;
		}
	}
	/* What the free would refuse now it refuses now: a pointer that is no
	 * live allocation's start, or one already waiting (a double free). */
	CUdeviceptr base = 0;
	size_t size;
	bool bad = vpmm_find_live(ptr, &base, &size) != VPMM_POOL_LIVE || base != ptr;
	pthread_mutex_lock(&lock);
	for (struct deferred *w = waiting; w && !bad; w = w->next)
		bad = w->ptr == ptr;
	pthread_mutex_unlock(&lock);
	if (bad) {
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	struct deferred *n = malloc(sizeof *n);
	if (!n) {
		*res = CUDA_ERROR_OUT_OF_MEMORY; /* the memory stays the program's */
		return true;
	}
	*n = d;
	pthread_once(&fork_once, watch_fork);
	pthread_mutex_lock(&lock);
	n->next = waiting;
	waiting = n;
	atomic_fetch_add_explicit(&n_waiting, 1, memory_order_release);
	pthread_mutex_unlock(&lock);
	vpmm_count(VPMM_HOOK_capture_deferred);
	VPMM_LOGF(VPMM_LOG_DEBUG, "free of 0x%llx deferred until its capture ends",
		  (unsigned long long)ptr);
	*res = CUDA_SUCCESS;
	return true;
}

/* Whether deferred free d may be made now; turns it into a synchronous one
 * when its stream is gone. Under `lock`. */
static bool ready(struct deferred *d, bool sync_ok, pthread_t self)
{
	CUstreamCaptureStatus st;
	cuuint64_t id;
	CUresult r;
	if (d->s == VPMM_NO_STREAM)
		return sync_ok;
	if (d->s == CU_STREAM_PER_THREAD && !pthread_equal(d->thread, self))
		return false; /* another thread's stream: its own calls flush it */
	r = capture_info(d->s, &st, &id);
	if (!d->s) /* the legacy stream: usable once a query succeeds */
		return r == CUDA_SUCCESS;
	if (r == CUDA_SUCCESS)
		return st == CU_STREAM_CAPTURE_STATUS_NONE ||
		       (st == CU_STREAM_CAPTURE_STATUS_ACTIVE && d->has_id && id != d->id);
	if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
		return false;
	d->s = VPMM_NO_STREAM; /* the stream is gone */
	d->via = VPMM_VIA_DRIVER;
	return sync_ok;
}

static void flush(void)
{
	struct deferred *go = NULL, **l;
	pthread_t self = pthread_self();
	CUresult r;

	tls_flushing = true;
	pthread_mutex_lock(&begin_lock);
	bool sync_ok = !vpmm_capture_forbids_sync();
	pthread_mutex_lock(&lock);
	for (l = &waiting; *l;) {
		struct deferred *d = *l;
		if (ready(d, sync_ok, self)) {
			*l = d->next;
			d->next = go;
			go = d;
			atomic_fetch_sub_explicit(&n_waiting, 1, memory_order_relaxed);
		} else {
			l = &d->next;
		}
	}
	pthread_mutex_unlock(&lock);
	while (go) {
		struct deferred *d = go;
		go = d->next;
		/* As the free it was; a stream that began a new capture since
		 * defers it again. */
		if (!vpmm_do_free(d->ptr, d->s, d->via, &r))
			r = CUDA_ERROR_INVALID_VALUE;
		if (r != CUDA_SUCCESS)
			vpmm_log(VPMM_LOG_WARN,
				 "the free of 0x%llx deferred by a capture failed (CUresult %d)",
				 (unsigned long long)d->ptr, (int)r);
		else
			vpmm_count(VPMM_HOOK_capture_flushed);
		free(d);
	}
	pthread_mutex_unlock(&begin_lock);
	tls_flushing = false;
}

void vpmm_capture_poll(void)
{
	if (!atomic_load_explicit(&n_waiting, memory_order_acquire) || tls_flushing)
		return;
	flush();
}

/* Removes the capture tracked on s (this thread's, for the per-thread
 * default stream), if any. Under `lock`. */
static void forget_capture(CUstream s)
{
	pthread_t self = pthread_self();
	for (struct capture **l = &captures; *l; l = &(*l)->next) {
		struct capture *c = *l;
		if (c->s != s || (s == CU_STREAM_PER_THREAD && !pthread_equal(c->thread, self)))
			continue;
		*l = c->next;
		if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED)
			atomic_fetch_sub_explicit(&n_strict, 1, memory_order_release);
		free(c);
		return;
	}
}

void vpmm_capture_stream_destroyed(CUstream s, CUresult r)
{
	if (r != CUDA_SUCCESS || !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return;
	pthread_mutex_lock(&lock);
	forget_capture(s);
	for (struct deferred *d = waiting; d; d = d->next)
		if (d->s == s) {
			d->s = VPMM_NO_STREAM;
			d->via = VPMM_VIA_DRIVER;
		}
	pthread_mutex_unlock(&lock);
	vpmm_capture_poll();
}

/* ---- the entry points ---------------------------------------------------------------- */

/* After a begin (begin_lock held): the capture joins the list. */
static CUresult began(CUresult r, CUstream s, bool ptsz, CUstreamCaptureMode mode)
{
	CUstreamCaptureStatus st;
	struct capture *c;
	if (r == CUDA_SUCCESS && vpmm_active() && (c = calloc(1, sizeof *c))) {
		c->s = ptsz && !s ? CU_STREAM_PER_THREAD : s;
		c->mode = mode;
		c->thread = pthread_self();
		capture_info(c->s, &st, &c->id);
		pthread_once(&fork_once, watch_fork);
		pthread_mutex_lock(&lock);
		c->next = captures;
		captures = c;
		if (mode != CU_STREAM_CAPTURE_MODE_RELAXED)
			atomic_fetch_add_explicit(&n_strict, 1, memory_order_release);
		pthread_mutex_unlock(&lock);
	}
	vpmm_fence_capture_began();
	pthread_mutex_unlock(&begin_lock);
	return r;
}

#define BEGIN(field, s, ptsz, mode, ...)                                      \
	do {                                                                  \
		vpmm_count(VPMM_HOOK_cuStreamBeginCapture);                   \
		vpmm_resolve();                                               \
		if (!vpmm_real.field)                                         \
			return CUDA_ERROR_NOT_INITIALIZED;                    \
		pthread_mutex_lock(&begin_lock);                              \
		vpmm_fence_capture_begins();                                  \
		return began(vpmm_real.field(__VA_ARGS__), s, ptsz, mode);    \
	} while (0)

/* The first form took no mode: its captures behave as global ones. */
CUresult vpmm_cuStreamBeginCapture(CUstream s)
{
	BEGIN(begin_capture, s, false, CU_STREAM_CAPTURE_MODE_GLOBAL, s);
}

CUresult vpmm_cuStreamBeginCapture_ptsz(CUstream s)
{
	BEGIN(begin_capture_ptsz, s, true, CU_STREAM_CAPTURE_MODE_GLOBAL, s);
}

CUresult vpmm_cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	BEGIN(begin_capture_v2, s, false, mode, s, mode);
}

CUresult vpmm_cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
	BEGIN(begin_capture_v2_ptsz, s, true, mode, s, mode);
}

CUresult vpmm_cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
					  const vpmm_edge_data *data, size_t n,
					  CUstreamCaptureMode mode)
{
	BEGIN(begin_to_graph, s, false, mode, s, g, deps, data, n, mode);
}

CUresult vpmm_cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					       const vpmm_edge_data *data, size_t n,
					       CUstreamCaptureMode mode)
{
	BEGIN(begin_to_graph_ptsz, s, true, mode, s, g, deps, data, n, mode);
}

/* After the real end, whatever it answered: the capture is over unless
 * the stream still captures the same sequence (the wrong thread ended a
 * capture not begun relaxed, which the driver refuses). */
static CUresult ended(CUresult r, CUstream s, bool ptsz)
{
	CUstreamCaptureStatus st;
	cuuint64_t id;
	CUstream ts = ptsz && !s ? CU_STREAM_PER_THREAD : s;
	if (!vpmm_active())
		return r;
	CUresult q = capture_info(ts, &st, &id);
	if (r == CUDA_SUCCESS || q != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE) {
		pthread_mutex_lock(&lock);
		forget_capture(ts);
		pthread_mutex_unlock(&lock);
	}
	vpmm_capture_poll();
	return r;
}

CUresult vpmm_cuStreamEndCapture(CUstream s, CUgraph *g)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuStreamEndCapture);
	VPMM_REAL_CALL(r, end_capture, s, g);
	return ended(r, s, false);
}

CUresult vpmm_cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuStreamEndCapture);
	VPMM_REAL_CALL(r, end_capture_ptsz, s, g);
	return ended(r, s, true);
}
