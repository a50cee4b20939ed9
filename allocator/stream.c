/* stream.c — streams and events: the stream records and their hash, the
 * events that close a stream's epochs, and learning that work completed
 * (what completed settles: any stream may take it without waiting). A
 * stream the program destroyed keeps its record until nothing refers to it
 * (reaped from the dead list); completed events are cached for reuse.
 *
 * Stream order without an event per free: a free is tagged with its
 * stream's open epoch; an event is recorded only to close an epoch (on the
 * free path now and then, give.c; or when another stream, a trim or a
 * defragmentation needs to know).
 *
 * Owns struct stream and struct event (stream.h). Calls region.c (settled
 * regions change index) and loop.c. Lock held throughout.
 */
#include <stdlib.h>

#include "pool.h"
#include "region.h"
#include "stream.h"


unsigned vpi_stream_slot(const vpmm_pool *p, CUstream h)
{
	return vpi_hash_bits((uint64_t)(uintptr_t)h, (unsigned)__builtin_ctz(p->stream_hash_size));
}

/* Twice the slots; the streams in the hash move over. */
static int stream_hash_grow(vpmm_pool *p)
{
	unsigned old = p->stream_hash_size, n = old ? old * 2 : 16;
	struct stream **t = calloc(n, sizeof(*t)), **was = p->stream_hash;
	if (!t)
		return -ENOMEM;
	p->stream_hash = t;
	p->stream_hash_size = n;
	for (unsigned i = 0; i < old; i++)
		for (struct stream *s = was[i], *next; s; s = next) {
			unsigned j = vpi_stream_slot(p, s->handle);
			next = s->hash_next;
			s->hash_next = t[j];
			t[j] = s;
		}
	free(was);
	return 0;
}

/* Dead streams a new record looks at first (vpi_stream_reap_locked), so
 * that destroyed streams' records go where no destroy follows. */
#define REAP_ON_NEW 4

static struct stream *stream_find_locked(vpmm_pool *p, CUstream h)
{
	struct stream *s = p->last_stream;
	if (s && s->handle == h)
		return s;
	if (p->stream_hash_size)
		for (s = p->stream_hash[vpi_stream_slot(p, h)]; s; s = s->hash_next)
			if (s->handle == h)
				return p->last_stream = s;
	return NULL;
}

static struct stream *stream_get_locked(vpmm_pool *p, CUstream h, bool may_reap)
{
	struct stream *s = stream_find_locked(p, h);
	if (s && !(may_reap && p->reaps_owed))
		return s;
	if (!may_reap) {
		p->reaps_owed += REAP_ON_NEW;
	} else {
		size_t n = (s ? 0 : REAP_ON_NEW) + p->reaps_owed;
		p->reaps_owed = 0;
		if (p->ndead)
			vpi_stream_reap_locked(p, n);
		if (s)
			return s;
	}
	if (p->nhashed + 1 > p->stream_hash_size / 2 && stream_hash_grow(p))
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->handle = h;
	if (pthread_mutex_init(&s->front.lock, NULL)) {
		free(s);
		return NULL;
	}
	s->id = __atomic_fetch_add(&p->nstreams, 1, __ATOMIC_RELEASE);
	s->epoch = 1;
	vpi_tree_init(&s->free_by_size, vpi_region_by_size, s->id + 1);
	s->prev = p->streams_tail;
	if (s->prev)
		s->prev->next = s;
	else
		p->streams = s;
	p->streams_tail = s;
	p->nrecords++;
	unsigned i = vpi_stream_slot(p, h);
	s->hash_next = p->stream_hash[i];
	p->stream_hash[i] = s;
	p->nhashed++;
	return p->last_stream = s;
}

struct stream *vpi_stream_get_locked(vpmm_pool *p, CUstream h)
{
	return stream_get_locked(p, h, true);
}

struct stream *vpi_stream_get_unchecked_locked(vpmm_pool *p, CUstream h)
{
	return stream_get_locked(p, h, false);
}

/* Unlinks ev from p->events (it is being destroyed). */
void vpi_event_forget(vpmm_pool *p, struct event *ev)
{
	if (ev->all_prev)
		ev->all_prev->all_next = ev->all_next;
	else
		p->events = ev->all_next;
	if (ev->all_next)
		ev->all_next->all_prev = ev->all_prev;
	ev->all_prev = ev->all_next = NULL;
}

/* A completed event no one holds: kept for reuse. */
static void event_cache_put(vpmm_pool *p, struct event *ev)
{
	ev->stream = NULL;
	ev->next = p->event_cache;
	p->event_cache = ev;
	p->ncached++;
}

void vpi_event_cache_trim_locked(vpmm_pool *p)
{
	size_t n = p->ncached > VPMM_EVENT_CACHE_MAX ? p->ncached - VPMM_EVENT_CACHE_MAX : 0;
	if (n > p->cache_low)
		n = p->cache_low; /* the others were taken since: still needed */
	for (; n; n--) { /* events are alike: any n of them */
		struct event *ev = p->event_cache;
		p->event_cache = ev->next;
		p->ncached--;
		vpi_event_forget(p, ev);
		DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
		p->nevents--;
		free(ev);
	}
	p->cache_low = p->ncached;
}

void vpi_event_unref(vpmm_pool *p, struct event *ev)
{
	if (ev && --ev->refs == 0) {
		if (ev->gone) { /* its driver event died with its context */
			vpi_event_forget(p, ev);
			free(ev);
			return;
		}
		event_cache_put(p, ev);
	}
}

/* Record an event on s that closes its open epoch. */
int vpi_close_epoch(vpmm_pool *p, struct stream *s, struct event **out)
{
	struct event *ev = p->event_cache;
	bool fresh = !ev;
	CUresult r;
	if (ev) {
		p->event_cache = ev->next;
		if (--p->ncached < p->cache_low)
			p->cache_low = p->ncached;
	} else {
		ev = calloc(1, sizeof(*ev));
		if (!ev)
			return -ENOMEM;
		r = DRV(p, VPMM_OP_EVENT_CREATE, event_create, &ev->ev);
		if (r != CUDA_SUCCESS) {
			free(ev);
			p->last_result = r;
			return vpi_cu_errno(r);
		}
	}
	/* The epoch moves before the record: a lock-free free that reads the
	 * old epoch did so before this record was issued, so the event covers
	 * its work (front.c). If the record fails, the next event covers both. */
	uint64_t e = __atomic_fetch_add(&s->epoch, 1, __ATOMIC_SEQ_CST);
	r = DRV(p, VPMM_OP_EVENT_RECORD, event_record, ev->ev, s->handle);
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		if (fresh) {
			/* It may be what failed (made in a context the stream is
			 * not of): not cached, so it cannot fail every record. */
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
			free(ev);
		} else {
			event_cache_put(p, ev);
		}
		return vpi_cu_errno(r);
	}
	if (fresh) {
		ev->all_prev = NULL;
		ev->all_next = p->events;
		if (p->events)
			p->events->all_prev = ev;
		p->events = ev;
		p->nevents++;
	}
	ev->stream = s;
	ev->epoch = e;
	ev->refs = 1;
	ev->done = false;
	ev->next = NULL;
	if (s->ev_tail)
		s->ev_tail->next = ev;
	else
		s->ev_head = ev;
	s->ev_tail = ev;
	if (p->cfg.event_interval_ns)
		s->last_record_ns = vpi_clock_ns(p);
	p->st.events_recorded++;
	if (out)
		*out = ev;
	return 0;
}

/* vpi_close_epoch(), unless another thread is capturing s: our event would join
 * its graph. -EBUSY then, and the epoch stays open. */
int vpi_close_epoch_uncaptured(vpmm_pool *p, struct stream *s)
{
	bool capturing = false;
	DRV(p, VPMM_OP_STREAM_CAPTURING, stream_capturing, s->handle, &capturing);
	return capturing ? -EBUSY : vpi_close_epoch(p, s, NULL);
}

/* The first event of s that completes after every free of `epoch`; NULL when
 * that epoch is already known complete. Records one if none covers it yet. */
int vpi_cover_event(vpmm_pool *p, struct stream *s, uint64_t epoch,
		       struct event **out)
{
	*out = NULL;
	if (epoch <= s->done)
		return 0;
	for (struct event *ev = s->ev_head; ev; ev = ev->next)
		if (ev->epoch >= epoch) {
			*out = ev;
			return 0;
		}
	if (s->dead) /* its last record failed: nothing can cover this */
		return -EIO;
	return vpi_close_epoch(p, s, out);
}


static void settle_stream(vpmm_pool *p, struct stream *s)
{
	while (s->fifo_head && s->fifo_head->epoch <= s->done) {
		struct region *r = s->fifo_head;
		vpi_free_unindex(p, r);
		p->settled_count++;
		r->stream = NULL;
		r->epoch = 0;
		vpi_free_insert(p, r);
	}
}

/* Query s's events oldest first; what completed settles. */
void vpi_poll_stream(vpmm_pool *p, struct stream *s)
{
	bool moved = false;
	while (s->ev_head) {
		struct event *ev = s->ev_head;
		CUresult r = ev->done ? CUDA_SUCCESS
				      : DRV(p, VPMM_OP_EVENT_QUERY, event_query, ev->ev);
		if (r != CUDA_SUCCESS) {
			if (r != CUDA_ERROR_NOT_READY)
				p->last_result = r;
			break;
		}
		s->ev_head = ev->next;
		if (!s->ev_head)
			s->ev_tail = NULL;
		s->done = ev->epoch;
		ev->done = true;
		ev->stream = NULL; /* its holders only read `done` from now on */
		vpi_event_unref(p, ev);
		moved = true;
	}
	if (moved)
		settle_stream(p, s);
}

/* Phase 1, other streams: close their open epochs so completion can be seen,
 * then let what completed settle. */
void vpi_poll_others(vpmm_pool *p, struct stream *caller)
{
	for (struct stream *s = p->streams; s; s = s->next) {
		if (s == caller || !s->fifo_head)
			continue;
		if (!s->dead && s->fifo_tail->epoch == s->epoch)
			vpi_close_epoch_uncaptured(p, s);
		vpi_poll_stream(p, s);
	}
}

bool vpi_event_done_locked(vpmm_pool *p, struct event *ev)
{
	if (!ev || ev->done)
		return true;
	vpi_poll_stream(p, ev->stream);
	return ev->done;
}

bool vpi_event_wait_locked(vpmm_pool *p, struct event *ev)
{
	if (!ev || ev->done)
		return true;
	CUresult r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, ev->ev);
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		return false;
	}
	vpi_poll_stream(p, ev->stream);
	return ev->done;
}

/* s's work is known done (its context's was synchronised, or lost): its
 * open epoch closes without a record, the next one opens, and what it
 * freed settles. */
static void close_open_epoch(vpmm_pool *p, struct stream *s)
{
	uint64_t open = __atomic_fetch_add(&s->epoch, 1, __ATOMIC_SEQ_CST);
	s->done = open;
	settle_stream(p, s);
}

void vpi_events_lost_locked(vpmm_pool *p)
{
	/* Every driver event died with the context: none is destroyed (its
	 * handle is gone), none goes back to the cache, and a holder (a
	 * zombie, a deferred block) sees it complete and frees the struct
	 * when it lets go (vpi_event_unref). */
	for (struct event *ev = p->events; ev; ev = ev->all_next)
		if (!ev->gone) {
			ev->gone = true;
			ev->done = true;
			ev->ev = NULL;
			p->nevents--;
		}
	while (p->event_cache) {
		struct event *ev = p->event_cache;
		p->event_cache = ev->next;
		vpi_event_forget(p, ev);
		free(ev);
	}
	p->ncached = p->cache_low = 0;
	/* Every stream's work is gone with it: what it freed settles, and its
	 * open epoch closes without a record (the next one opens). */
	for (struct stream *s = p->streams; s; s = s->next) {
		while (s->ev_head) {
			struct event *ev = s->ev_head;
			s->ev_head = ev->next;
			ev->stream = NULL;
			vpi_event_unref(p, ev);
		}
		s->ev_tail = NULL;
		close_open_epoch(p, s);
	}
}

void vpi_stream_synced_locked(vpmm_pool *p, struct stream *s)
{
	if (!s->dead || s->ev_head || !s->fifo_head)
		return;
	/* Its last record failed (vpmm_pool_stream_gone): no event covers
	 * its open epoch, and none ever will. The context's synchronisation
	 * completed that work too: the epoch closes without a record. */
	close_open_epoch(p, s);
}

void vpi_stream_ended_locked(vpmm_pool *p, struct stream *s)
{
	vpi_poll_stream(p, s);
	if (s->ev_head) /* an event the driver did not answer: it decides */
		return;
	close_open_epoch(p, s);
}

/* Puts the dead stream s at the end of the records waiting to be freed. */
static void dead_append(vpmm_pool *p, struct stream *s)
{
	s->dead_next = NULL;
	if (p->dead_tail)
		p->dead_tail->dead_next = s;
	else
		p->dead = s;
	p->dead_tail = s;
	p->ndead++;
}

/* The stream `s`, at *link in its hash chain, is gone: no malloc will name
 * it again, and a new stream may come with its handle. Its record waits on
 * p->dead until nothing refers to it. */
void vpi_stream_forget_locked(vpmm_pool *p, struct stream *s, struct stream **link)
{
	__atomic_store_n(&s->dead, true, __ATOMIC_RELEASE); /* front.c reads it unlocked */
	vpi_mutex_lock(&s->front.lock);
	vpi_loop_fini(&s->front.loop);
	vpi_mutex_unlock(&s->front.lock);
	*link = s->hash_next;
	s->hash_next = NULL;
	p->nhashed--;
	if (p->last_stream == s)
		p->last_stream = NULL;
	/* Thread-local lookups (front.c) that name s miss from now on, so
	 * none can reach the record once it is freed. */
	__atomic_fetch_add(&p->stream_gen, 1, __ATOMIC_RELEASE);
	dead_append(p, s);
}

bool vpi_stream_covered(const struct stream *s)
{
	uint64_t last = s->ev_tail ? s->ev_tail->epoch : s->done;
	return last + 1 == s->epoch && !(s->fifo_tail && s->fifo_tail->epoch == s->epoch);
}

/* Whether anything refers to the dead stream s. */
static bool stream_held(const struct stream *s)
{
	return s->fifo_head || s->ev_head || s->slabs || s->front.n || s->pins;
}

static void stream_free(vpmm_pool *p, struct stream *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		p->streams = s->next;
	if (s->next)
		s->next->prev = s->prev;
	else
		p->streams_tail = s->prev;
	p->nrecords--;
	p->gone_hits += s->front.hits;
	p->gone_parks += s->front.parks;
	free(s->small_partial);
	vpi_loop_fini(&s->front.loop);
	pthread_mutex_destroy(&s->front.lock);
	free(s);
}

void vpi_stream_reap_locked(vpmm_pool *p, size_t max)
{
	for (size_t i = 0; i < max && p->dead; i++) {
		struct stream *s = p->dead;
		p->dead = s->dead_next;
		if (!p->dead)
			p->dead_tail = NULL;
		p->ndead--;
		if (s->ev_head)
			vpi_poll_stream(p, s);
		if (!stream_held(s)) {
			stream_free(p, s);
			continue;
		}
		dead_append(p, s);
	}
}
