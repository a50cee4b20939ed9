/* fakecuda_stream.c — the fake's streams and events: each belongs to the
 * context current when it was made and dies with it; stream capture: the
 * captures begun (or set by a test, fakecuda_set_capturing: relaxed ones),
 * their ids, modes and threads, the thread's interaction mode, and the
 * calls they forbid (fake_capture_check); on demand (fakecuda_set_implicit), the legacy default stream's implicit
 * order: an action on it waits for every blocking stream's last action,
 * and an action on a blocking stream waits for its last action.
 *
 * Owns: the streams' and events' contexts, the thread's capture mode. Calls
 * fakecuda_ctx.c, fakecuda.c and the host driver.
 */
#include "fakecuda.h"

#include <stdbool.h>
#include <stdlib.h>

/* The context an event or a stream was made in, and its generation then:
 * handles of a context that was since reset or destroyed are dead. */
struct owned {
	void *handle;
	struct fake_ctx *ctx;
	unsigned gen;
	struct owned *next;
};

struct stream_ctx {
	CUstream s;
	struct fake_ctx *ctx;
	unsigned gen;
	bool blocking;
	CUevent marker; /* recorded after each action (implicit order) */
	struct stream_ctx *next;
};

/* A capture sequence: on stream s (the per-thread default stream by its
 * handle, with its thread), begun by `thread`. */
struct capture {
	CUstream s;
	cuuint64_t id;
	CUstreamCaptureMode mode;
	pthread_t thread;
	bool invalidated;
	bool blocking; /* s orders with the legacy stream */
	struct capture *next;
};

static bool implicit_on;
static void eager_run(void);
static void implicit_before(CUstream s);
static void implicit_after(CUstream s);
/* The legacy stream's and the per-thread stream's markers. */
static CUevent legacy_marker, ptds_marker;

static struct stream_ctx *stream_ctxs;
static bool event_alive(CUevent ev, struct fake_ctx **ctx);
static struct fake_ctx *stream_ctx_of(CUstream s);
static struct capture **capture_of(CUstream s);
static struct owned *events_owned;
static __thread CUstreamCaptureMode capture_mode;
static struct capture *captures;
static cuuint64_t last_capture_id;

/* ---- streams and events ---------------------------------------------------------------- */

static CUstream ptds(CUstream s)
{
	return s ? s : CU_STREAM_PER_THREAD;
}

/* CU_STREAM_LEGACY names the stream NULL names in the plain entry points. */
static CUstream plain(CUstream s)
{
	return s == CU_STREAM_LEGACY ? NULL : s;
}

/* One body for every creator: a call from inside the fake to its own
 * exported name would reach the shim's hook instead. */
static CUresult stream_create(CUstream *s, unsigned int flags)
{
	struct stream_ctx *sc;
	CUresult r = fake_ctx_state();

	if (r != CUDA_SUCCESS)
		return r;
	if (!s || !(sc = calloc(1, sizeof *sc)))
		return CUDA_ERROR_INVALID_VALUE;
	*s = vpmm_host_stream_create(fake_drv);
	if (!*s) {
		free(sc);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	sc->s = *s;
	sc->ctx = fake_current();
	sc->gen = sc->ctx->gen;
	sc->blocking = !(flags & CU_STREAM_NON_BLOCKING);
	pthread_mutex_lock(&fake_lock);
	sc->next = stream_ctxs;
	stream_ctxs = sc;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	return stream_create(s, flags);
}

CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority)
{
	(void)priority;
	return stream_create(s, flags);
}

/* Test control: a stream made without passing any hook, as a stream made
 * before the shim was there would be. */
CUresult fakecuda_stream_create_unseen(CUstream *s, unsigned int flags)
{
	return stream_create(s, flags);
}

/* The device finishes the stream's work (as fast as it does everything
 * here: see cuStreamSynchronize) and the handle may come back. */
CUresult cuStreamDestroy_v2(CUstream s)
{
	NEED_INIT();
	pthread_mutex_lock(&fake_lock);
	for (struct stream_ctx **l = &stream_ctxs; *l; l = &(*l)->next)
		if ((*l)->s == s) {
			struct stream_ctx *dead = *l;
			*l = dead->next;
			free(dead);
			break;
		}
	for (struct capture **c = &captures; *c; c = &(*c)->next)
		if ((*c)->s == s) { /* its capture ends with it */
			struct capture *dead = *c;
			*c = dead->next;
			free(dead);
			break;
		}
	pthread_mutex_unlock(&fake_lock);
	vpmm_host_stream_complete(fake_drv, s);
	vpmm_host_stream_destroy(fake_drv, s);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s)
{
	NEED_INIT();
	fake_count("cuStreamSynchronize");
	vpmm_host_stream_complete(fake_drv, plain(s));
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	return cuStreamSynchronize(ptds(s));
}

static CUresult capture_info(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id);

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	NEED_INIT();
	return capture_info(s, st, NULL);
}

CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st)
{
	return cuStreamIsCapturing(ptds(s), st);
}

CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
		*pctx = (CUcontext)fake_current();
		return fake_current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
	}
	pthread_mutex_lock(&fake_lock);
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s) {
			*pctx = (CUcontext)sc->ctx;
			pthread_mutex_unlock(&fake_lock);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&fake_lock);
	return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *pctx)
{
	return cuStreamGetCtx(ptds(s), pctx);
}

/* Events and stream work need a current context, as on the real driver. */
CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
	CUresult r = fake_ctx_state();
	fake_count("cuStreamWaitEvent");
	fake_note_context();
	(void)flags;
	if (r == CUDA_SUCCESS && (!event_alive(ev, NULL) ||
				  ((uintptr_t)s > (uintptr_t)CU_STREAM_PER_THREAD && !stream_ctx_of(s))))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r != CUDA_SUCCESS)
		return r;
	s = plain(s);
	implicit_before(s);
	r = fake_drv->stream_wait(fake_drv, s, ev);
	implicit_after(s);
	eager_run();
	return r;
}

CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags)
{
	return cuStreamWaitEvent(ptds(s), ev, flags);
}

/* Whether `ev` is an event of a context that still exists, and which. */
static bool event_alive(CUevent ev, struct fake_ctx **ctx)
{
	bool alive = false;
	pthread_mutex_lock(&fake_lock);
	for (struct owned *o = events_owned; o; o = o->next)
		if (o->handle == (void *)ev) {
			alive = !o->ctx->destroyed && o->ctx->gen == o->gen;
			if (ctx)
				*ctx = o->ctx;
			if (!alive)
				fake_dead_use(o->ctx, o->gen);
			break;
		}
	pthread_mutex_unlock(&fake_lock);
	return alive;
}

/* The context of stream `s` (the current one for the default streams);
 * NULL when it is dead or unknown. */
static struct fake_ctx *stream_ctx_of(CUstream s)
{
	struct fake_ctx *c = NULL;
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return fake_current();
	pthread_mutex_lock(&fake_lock);
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s) {
			if (!sc->ctx->destroyed && sc->ctx->gen == sc->gen)
				c = sc->ctx;
			else
				fake_dead_use(sc->ctx, sc->gen);
			break;
		}
	pthread_mutex_unlock(&fake_lock);
	return c;
}

CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
	CUresult r = fake_ctx_state();
	struct owned *o;
	fake_note_context();
	(void)flags;
	if (r != CUDA_SUCCESS)
		return r;
	if (!(o = calloc(1, sizeof *o)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = fake_drv->event_create(fake_drv, ev);
	if (r != CUDA_SUCCESS) {
		free(o);
		return r;
	}
	o->handle = (void *)*ev;
	o->ctx = fake_current();
	o->gen = o->ctx->gen;
	pthread_mutex_lock(&fake_lock);
	o->next = events_owned;
	events_owned = o;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

/* As on the real driver, an event is recorded only on a stream of its own
 * context, and a context's events die with it. */
/* Implicit order (fakecuda_set_implicit): what an action on `s` waits for
 * first. */
#define MARKS_MAX 4096
static void implicit_before(CUstream s)
{
	static CUevent marks[MARKS_MAX];
	size_t n = 0;
	if (!implicit_on)
		return;
	pthread_mutex_lock(&fake_lock);
	if (!s) {
		for (struct stream_ctx *sc = stream_ctxs; sc && n < MARKS_MAX; sc = sc->next)
			if (sc->blocking && sc->marker)
				marks[n++] = sc->marker;
		if (ptds_marker)
			marks[n++] = ptds_marker;
		pthread_mutex_unlock(&fake_lock);
		for (size_t i = 0; i < n; i++)
			fake_drv->stream_wait(fake_drv, NULL, marks[i]);
		return;
	}
	bool blocking = s == CU_STREAM_PER_THREAD;
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s)
			blocking = sc->blocking;
	CUevent l = legacy_marker;
	pthread_mutex_unlock(&fake_lock);
	if (blocking && l)
		fake_drv->stream_wait(fake_drv, s, l);
}

/* ... and the mark it leaves. */
static void implicit_after(CUstream s)
{
	CUevent *m = NULL;
	if (!implicit_on)
		return;
	pthread_mutex_lock(&fake_lock);
	if (!s)
		m = &legacy_marker;
	else if (s == CU_STREAM_PER_THREAD)
		m = &ptds_marker;
	for (struct stream_ctx *sc = stream_ctxs; s && !m && sc; sc = sc->next)
		if (sc->s == s && sc->blocking)
			m = &sc->marker;
	if (m && !*m && fake_drv->event_create(fake_drv, m) != CUDA_SUCCESS)
		*m = NULL;
	CUevent ev = m ? *m : NULL;
	pthread_mutex_unlock(&fake_lock);
	if (ev)
		fake_drv->event_record(fake_drv, ev, s);
}

void fakecuda_set_implicit(int on)
{
	implicit_on = on != 0;
}

/* A device that keeps up (fakecuda_set_eager): every queue runs as far as
 * it can after each record and wait. */
static bool eager_on;

void fakecuda_set_eager(int on)
{
	eager_on = on != 0;
}

static void eager_run(void)
{
	if (eager_on)
		vpmm_host_complete_all(fake_drv);
}

CUresult cuEventRecord(CUevent ev, CUstream s)
{
	CUresult r = fake_ctx_state();
	struct fake_ctx *ec = NULL;
	fake_note_context();
	fake_count("cuEventRecord");
	if (r != CUDA_SUCCESS)
		return r;
	if (!event_alive(ev, &ec) || stream_ctx_of(s) != ec) {
		fake_count("record_refused");
		return CUDA_ERROR_INVALID_HANDLE;
	}
	s = plain(s);
	pthread_mutex_lock(&fake_lock);
	bool captured = *capture_of(s) != NULL;
	pthread_mutex_unlock(&fake_lock);
	if (captured) /* joins the graph on a device: the tests want none */
		fake_count("record_capturing");
	implicit_before(s);
	r = fake_drv->event_record(fake_drv, ev, s);
	implicit_after(s);
	eager_run();
	return r;
}

CUresult cuEventRecord_ptsz(CUevent ev, CUstream s)
{
	return cuEventRecord(ev, ptds(s));
}

CUresult cuEventQuery(CUevent ev)
{
	fake_note_context();
	NEED_INIT();
	if (!event_alive(ev, NULL))
		return CUDA_ERROR_INVALID_HANDLE;
	return fake_drv->event_query(fake_drv, ev);
}

CUresult cuEventSynchronize(CUevent ev)
{
	fake_note_context();
	NEED_INIT();
	if (!event_alive(ev, NULL))
		return CUDA_ERROR_INVALID_HANDLE;
	return fake_drv->event_sync(fake_drv, ev);
}

CUresult cuEventDestroy_v2(CUevent ev)
{
	fake_note_context();
	NEED_INIT();
	pthread_mutex_lock(&fake_lock);
	for (struct owned **o = &events_owned; *o; o = &(*o)->next)
		if ((*o)->handle == (void *)ev) {
			struct owned *dead = *o;
			if (dead->ctx->destroyed || dead->ctx->gen != dead->gen)
				fake_dead_use(dead->ctx, dead->gen);
			*o = dead->next;
			free(dead);
			break;
		}
	pthread_mutex_unlock(&fake_lock);
	return fake_drv->event_destroy(fake_drv, ev);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old = capture_mode;
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* ---- stream capture ------------------------------------------------------------------------ */

/* The capture of stream s as the calling thread names it; under fake_lock. */
static struct capture **capture_of(CUstream s)
{
	pthread_t self = pthread_self();
	struct capture **c;
	for (c = &captures; *c; c = &(*c)->next)
		if ((*c)->s == s && (s != CU_STREAM_PER_THREAD || pthread_equal((*c)->thread, self)))
			break;
	return c;
}

static bool stream_blocking(CUstream s)
{
	if (s == CU_STREAM_PER_THREAD)
		return false;
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s)
			return sc->blocking;
	return true;
}

/* The legacy stream cannot be queried while a blocking stream is captured. */
static CUresult capture_info(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
	CUresult r = CUDA_SUCCESS;
	bool known;
	if (!st)
		return CUDA_ERROR_INVALID_VALUE;
	*st = CU_STREAM_CAPTURE_STATUS_NONE;
	if (s && s != CU_STREAM_LEGACY &&
	    (r = fake_drv->stream_capturing(fake_drv, s, &known)) != CUDA_SUCCESS)
		return r; /* no such stream */
	pthread_mutex_lock(&fake_lock);
	if (!s || s == CU_STREAM_LEGACY) {
		for (struct capture *c = captures; c; c = c->next)
			if (c->blocking)
				r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
	} else {
		struct capture *c = *capture_of(s);
		if (c) {
			*st = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
					     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
			if (id)
				*id = c->id;
		}
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
	NEED_INIT();
	return capture_info(s, st, id);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
				   CUgraph *g, const CUgraphNode **deps, size_t *n)
{
	NEED_INIT();
	if (g)
		*g = NULL;
	if (deps)
		*deps = NULL;
	if (n)
		*n = 0;
	return capture_info(s, st, id);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
				   CUgraph *g, const CUgraphNode **deps,
				   const CUgraphEdgeData **data, size_t *n)
{
	if (data)
		*data = NULL;
	return cuStreamGetCaptureInfo_v2(s, st, id, g, deps, n);
}

static CUresult begin(CUstream s, CUstreamCaptureMode mode)
{
	struct capture *c, **at;
	CUresult r = fake_ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	if (!s || s == CU_STREAM_LEGACY)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	at = capture_of(s);
	if (*at || !(c = calloc(1, sizeof *c))) {
		pthread_mutex_unlock(&fake_lock);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	c->s = s;
	c->id = ++last_capture_id;
	c->mode = mode;
	c->thread = pthread_self();
	c->blocking = stream_blocking(s);
	c->next = captures;
	captures = c;
	pthread_mutex_unlock(&fake_lock);
	if (s != CU_STREAM_PER_THREAD)
		vpmm_host_set_capturing(fake_drv, s, true);
	return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream s)
{
	return begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return begin(ptds(s), CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	return begin(s, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
	return begin(ptds(s), mode);
}

CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
				     const CUgraphEdgeData *data, size_t n,
				     CUstreamCaptureMode mode)
{
	(void)deps;
	(void)data;
	if (!g || n)
		return CUDA_ERROR_INVALID_VALUE;
	return begin(s, mode);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					  const CUgraphEdgeData *data, size_t n,
					  CUstreamCaptureMode mode)
{
	return cuStreamBeginCaptureToGraph(ptds(s), g, deps, data, n, mode);
}

/* The graph is a token: nothing of the fake reads it. */
CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	struct capture *c, **at;
	bool invalidated;
	NEED_INIT();
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	at = capture_of(s);
	c = *at;
	if (!c) {
		pthread_mutex_unlock(&fake_lock);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
		pthread_mutex_unlock(&fake_lock);
		return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
	}
	*at = c->next;
	invalidated = c->invalidated;
	*g = invalidated ? NULL : (CUgraph)(uintptr_t)(0x1000 + c->id);
	pthread_mutex_unlock(&fake_lock);
	free(c);
	if (s != CU_STREAM_PER_THREAD)
		vpmm_host_set_capturing(fake_drv, s, false);
	return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	return cuStreamEndCapture(ptds(s), g);
}

/* As the real driver: this thread's own capture not begun relaxed forbids
 * it, and so, in the global mode, does another thread's global capture. */
CUresult fake_capture_check(void)
{
	pthread_t self = pthread_self();
	bool forbidden = false;
	if (capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&fake_lock);
	for (struct capture *c = captures; c; c = c->next) {
		if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
			continue;
		if (pthread_equal(c->thread, self) ||
		    (capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
		     c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
			c->invalidated = true;
			forbidden = true;
		}
	}
	pthread_mutex_unlock(&fake_lock);
	if (!forbidden)
		return CUDA_SUCCESS;
	fake_count("capture_violation");
	return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* Test control: s captured (a relaxed capture, which forbids nothing) or
 * not, without the begin and end calls. */
void fakecuda_set_capturing(CUstream s, int on)
{
	pthread_mutex_lock(&fake_lock);
	struct capture **at = capture_of(s), *c = *at;
	if (on && !c && (c = calloc(1, sizeof *c))) {
		c->s = s;
		c->id = ++last_capture_id;
		c->mode = CU_STREAM_CAPTURE_MODE_RELAXED;
		c->thread = pthread_self();
		c->blocking = stream_blocking(s);
		c->next = captures;
		captures = c;
	} else if (!on && c) {
		*at = c->next;
		free(c);
	}
	pthread_mutex_unlock(&fake_lock);
	vpmm_host_set_capturing(fake_drv, s, on != 0);
}
