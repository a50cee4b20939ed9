/* driver_host_stream.c — the host driver's events and streams: a stream is
 * a queue of records and waits that stays pending until a test (or
 * host_device.c) runs it; a wait blocks later entries of its stream until the
 * awaited record completes, as on the device.
 *
 * Owns: struct host_record, host_event, host_stream (driver_host_int.h) and
 * their lifetimes, those of an ended context included (kept, refused and
 * counted: vpmm_host_ctx_reset). Calls driver_host_base.c only. Misuse of events and
 * streams is answered with CUDA_ERROR_INVALID_HANDLE.
 */
#include "driver_host_int.h"

#include <stdlib.h>
#include <string.h>

static void rec_put(struct host_record *rec)
{
	if (rec && --rec->refs == 0)
		free(rec);
}

bool vpi_host_dead_use(struct host_driver *h, const void *handle)
{
	if (!handle || !vpi_host_ptr_find(h->dead, h->ndead, handle, NULL))
		return false;
	h->dead_calls++;
	return true;
}

static struct host_event *event_find(struct host_driver *h, CUevent ev)
{
	if (vpi_host_ptr_find(h->events, h->nevents, ev, NULL))
		return (struct host_event *)ev;
	vpi_host_dead_use(h, ev);
	return NULL;
}

/* Whether the context is destroyed and not made again: event and stream
 * work is refused (each handle of an ended context named still counts). */
static bool ctx_gone(struct host_driver *h, const void *ev, CUstream s)
{
	if (!h->ctx_destroyed)
		return false;
	vpi_host_dead_use(h, ev);
	if ((uintptr_t)s >= HOST_SPECIAL_STREAMS)
		vpi_host_dead_use(h, s);
	return true;
}

/* Event `e`, checked as every event call checks it: refused while the
 * context is destroyed (naming `st` too, where the call has a stream), or
 * unknown. */
static CUresult event_live(struct host_driver *h, CUevent e, CUstream st,
			   struct host_event **ev)
{
	*ev = NULL;
	if (ctx_gone(h, e, st))
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*ev = event_find(h, e);
	return *ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* The stream object behind `s`; the special streams are made on first use. */
CUresult vpi_host_stream_find(struct host_driver *h, CUstream s,
			    struct host_stream **out)
{
	uintptr_t v = (uintptr_t)s;
	if (v < HOST_SPECIAL_STREAMS) {
		if (!h->special[v]) {
			h->special[v] = calloc(1, sizeof *h->special[v]);
			if (!h->special[v])
				return CUDA_ERROR_OUT_OF_MEMORY;
		}
		*out = h->special[v];
		return CUDA_SUCCESS;
	}
	if (!vpi_host_ptr_find(h->streams, h->nstreams, s, NULL)) {
		vpi_host_dead_use(h, s);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	*out = (struct host_stream *)s;
	return CUDA_SUCCESS;
}

/* Room for one more entry at the tail of the queue. */
static bool queue_reserve(struct host_stream *s)
{
	if (s->len < s->cap)
		return true;
	if (s->head > 0) {
		memmove(s->q, s->q + s->head, (s->len - s->head) * sizeof *s->q);
		s->len -= s->head;
		s->head = 0;
		return true;
	}
	struct host_entry *q = vpi_host_grow(s->q, &s->cap, s->len + 1, sizeof *s->q);
	if (!q)
		return false;
	s->q = q;
	return true;
}

static void queue_push(struct host_stream *s, enum host_entry_kind kind,
		       struct host_record *rec, const void *event)
{
	s->q[s->len++] = (struct host_entry){ kind, rec, event };
}

static bool entry_blocked(const struct host_entry *e)
{
	return e->kind == ENTRY_WAIT && !e->rec->done;
}

/* Pops the front entry (which must not be blocked); returns 1 if it
 * completed an event. */
static unsigned entry_pop(struct host_stream *s)
{
	struct host_entry e = s->q[s->head++];
	if (s->head == s->len)
		s->head = s->len = 0;
	unsigned completed = 0;
	if (e.kind == ENTRY_RECORD) {
		e.rec->done = true;
		completed = e.rec->event != NULL;
	}
	rec_put(e.rec);
	return completed;
}

/* Runs `s` up to its first blocked wait. */
unsigned vpi_host_stream_run(struct host_stream *s, size_t *moved)
{
	unsigned completed = 0;
	while (s->head < s->len && !entry_blocked(&s->q[s->head])) {
		completed += entry_pop(s);
		(*moved)++;
	}
	return completed;
}

/* Runs `s` until `target` (queued on s) is done, first running whatever other
 * streams a wait on the way depends on — as a CPU waiting for the device
 * would see it. A wait always refers to a record queued before it, so the
 * dependencies form no cycle and each stream is entered at most once; `busy`
 * turns a broken queue into an error instead of endless recursion. */
static CUresult stream_run_until(struct host_stream *s,
				 const struct host_record *target)
{
	if (s->busy)
		return CUDA_ERROR_ILLEGAL_STATE;
	s->busy = true;
	CUresult r = CUDA_SUCCESS;
	while (!target->done) {
		if (s->head == s->len) {
			r = CUDA_ERROR_ILLEGAL_STATE;
			break;
		}
		struct host_entry *e = &s->q[s->head];
		if (entry_blocked(e)) {
			r = stream_run_until(e->rec->stream, e->rec);
			if (r != CUDA_SUCCESS)
				break;
		}
		entry_pop(s);
	}
	s->busy = false;
	return r;
}

static void stream_free(struct host_stream *s)
{
	if (!s)
		return;
	for (size_t i = s->head; i < s->len; i++)
		rec_put(s->q[i].rec);
	free(s->q);
	free(s);
}


/* ---- operations ---------------------------------------------------------------- */

static CUresult host_event_create(vpmm_driver *d, CUevent *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_CREATE);
	if (ctx_gone(h, NULL, NULL)) {
		r_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
		goto out;
	}
	struct host_event *ev;
	if (!out) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	ev = calloc(1, sizeof *ev);
	if (!ev || !vpi_host_ptr_insert(&h->events, &h->nevents, &h->capevents, ev)) {
		free(ev);
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*out = (CUevent)ev;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_record(vpmm_driver *d, CUevent e, CUstream st)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_RECORD);
	struct host_event *ev;
	struct host_stream *s;
	struct host_record *rec;
	if ((r_ = event_live(h, e, st, &ev)) != CUDA_SUCCESS ||
	    (r_ = vpi_host_stream_find(h, st, &s)) != CUDA_SUCCESS)
		goto out;
	if (!queue_reserve(s) || !(rec = calloc(1, sizeof *rec))) {
		r_ = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	rec->refs = 2; /* the event and the queue entry */
	rec->event = ev;
	rec->stream = s;
	queue_push(s, ENTRY_RECORD, rec, ev);
	if (ev->rec) {
		ev->rec->event = NULL;
		rec_put(ev->rec);
	}
	ev->rec = rec;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_query(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_QUERY);
	struct host_event *ev;
	if ((r_ = event_live(h, e, NULL, &ev)) == CUDA_SUCCESS && ev->rec && !ev->rec->done)
		r_ = CUDA_ERROR_NOT_READY;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_sync(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_SYNC);
	struct host_event *ev;
	if ((r_ = event_live(h, e, NULL, &ev)) == CUDA_SUCCESS && ev->rec && !ev->rec->done)
		r_ = stream_run_until(ev->rec->stream, ev->rec);
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_event_destroy(vpmm_driver *d, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_EVENT_DESTROY);
	if (ctx_gone(h, e, NULL)) {
		r_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
		goto out;
	}
	size_t pos;
	if (!vpi_host_ptr_find(h->events, h->nevents, e, &pos)) {
		vpi_host_dead_use(h, e);
		r_ = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	/* A pending record stays queued (the device still runs up to it);
	 * it just no longer completes an event. */
	struct host_event *ev = (struct host_event *)e;
	vpi_host_ptr_remove(h->events, &h->nevents, pos);
	if (ev->rec) {
		ev->rec->event = NULL;
		rec_put(ev->rec);
	}
	free(ev);
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_stream_wait(vpmm_driver *d, CUstream st, CUevent e)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_STREAM_WAIT);
	struct host_event *ev;
	struct host_stream *s;
	if ((r_ = event_live(h, e, st, &ev)) != CUDA_SUCCESS ||
	    (r_ = vpi_host_stream_find(h, st, &s)) != CUDA_SUCCESS)
		goto out;
	/* Waiting on a complete or never-recorded event is a no-op on the
	 * device: nothing to queue. */
	if (ev->rec && !ev->rec->done) {
		if (!queue_reserve(s)) {
			r_ = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		ev->rec->refs++;
		queue_push(s, ENTRY_WAIT, ev->rec, ev);
	}
	s->waits++;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_stream_capturing(vpmm_driver *d, CUstream st,
				      bool *capturing)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_STREAM_CAPTURING);
	if (ctx_gone(h, NULL, st)) {
		r_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
		goto out;
	}
	struct host_stream *s;
	if (!capturing) {
		r_ = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if ((r_ = vpi_host_stream_find(h, st, &s)) == CUDA_SUCCESS)
		*capturing = s->capturing;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

void vpi_host_stream_ops(vpmm_driver *base)
{
	base->event_create = host_event_create;
	base->event_record = host_event_record;
	base->event_query = host_event_query;
	base->event_sync = host_event_sync;
	base->event_destroy = host_event_destroy;
	base->stream_wait = host_stream_wait;
	base->stream_capturing = host_stream_capturing;
}

/* The work queued on s is dropped, undone. */
static void stream_drop_queue(struct host_stream *s)
{
	for (size_t i = s->head; i < s->len; i++)
		rec_put(s->q[i].rec);
	s->head = s->len = 0;
}

/* A handle of the ended context: refused and counted from now on, its
 * memory kept so that no new object gets its address. */
static void bury(struct host_driver *h, void *obj)
{
	if (!vpi_host_ptr_insert(&h->dead, &h->ndead, &h->capdead, obj))
		free(obj); /* no room to remember it: an unknown handle then */
}

void vpi_host_stream_reset(struct host_driver *h)
{
	for (size_t i = 0; i < h->nstreams; i++) {
		struct host_stream *s = h->streams[i];
		stream_drop_queue(s);
		free(s->q);
		s->q = NULL;
		s->cap = 0;
		bury(h, s);
	}
	h->nstreams = 0;
	while (h->draining) {
		struct host_stream *s = h->draining;
		h->draining = s->next_draining;
		stream_free(s);
	}
	for (size_t i = 0; i < HOST_SPECIAL_STREAMS; i++)
		if (h->special[i]) {
			stream_drop_queue(h->special[i]);
			h->special[i]->capturing = false;
		}
	for (size_t i = 0; i < h->nevents; i++) {
		struct host_event *ev = h->events[i];
		if (ev->rec) {
			ev->rec->event = NULL;
			rec_put(ev->rec);
			ev->rec = NULL;
		}
		bury(h, ev);
	}
	h->nevents = 0;
}

void vpi_host_stream_drained(struct host_driver *h)
{
	for (struct host_stream **l = &h->draining; *l;) {
		struct host_stream *s = *l;
		if (s->head < s->len) {
			l = &s->next_draining;
			continue;
		}
		*l = s->next_draining;
		stream_free(s);
	}
}

void vpi_host_stream_fini(struct host_driver *h)
{
	for (size_t i = 0; i < h->nstreams; i++)
		stream_free(h->streams[i]);
	for (size_t i = 0; i < HOST_SPECIAL_STREAMS; i++)
		stream_free(h->special[i]);
	while (h->draining) {
		struct host_stream *s = h->draining;
		h->draining = s->next_draining;
		stream_free(s);
	}
	for (size_t i = 0; i < h->nevents; i++) {
		struct host_event *ev = h->events[i];
		rec_put(ev->rec);
		free(ev);
	}
	for (size_t i = 0; i < h->ndead; i++)
		free(h->dead[i]); /* queues and records dropped at the reset */
	free(h->events);
	free(h->streams);
	free(h->dead);
}
