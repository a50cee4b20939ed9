/* pool.c — the pool's public calls: creation and destruction, malloc and
 * free (the lock-free cache first, then the locked path: small_take.c for
 * sub-grain requests, take.c for the rest; give.c on free), and the calls
 * that poll, reclaim, trim, forget streams and report.
 *
 * Owns struct vpmm_pool (pool.h). Top room: may call every other room of
 * allocator/; nothing in allocator/ calls into it but snapshot.c
 * (vpi_stats_locked, vpmm_pool_stats). The checker and the region map: check.c.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "defrag.h"
#include "front.h"
#include "give.h"
#include "handle.h"
#include "options.h"
#include "pool.h"
#include "reclaim.h"
#include "region.h"
#include "reset.h"
#include "small.h"
#include "stream.h"
#include "take.h"

/* A public call on a thread that holds one of the pool's locks: a signal
 * handler that interrupted the pool (vpi.h). It would wait for itself. */
#define REFUSE_REENTRY()                                                      \
	do {                                                                  \
		if (__builtin_expect(vpi_tls_locks != 0, 0))                  \
			return -EDEADLK;                                      \
	} while (0)

int vpmm_pool_create(const struct vpmm_config *cfg, vpmm_driver *drv,
		     vpmm_pool **out)
{
	vpmm_pool *p;
	size_t gran;
	CUresult r;
	int rc;

	if (!cfg || !drv || !out)
		return -EINVAL;
	*out = NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->drv = drv;
	r = DRV(p, VPMM_OP_GRANULARITY, granularity, cfg->device, &gran);
	if (r != CUDA_SUCCESS) {
		rc = vpi_cu_errno(r);
		goto fail;
	}
	/* A page above the granularity may be more than the device holds
	 * (asked once, uncounted). */
	size_t dev_free, dev_total = 0;
	if (cfg->page_size > gran && drv->mem_info &&
	    drv->mem_info(drv, &dev_free, &dev_total) != CUDA_SUCCESS)
		dev_total = 0;
	rc = vpmm_config_check_device(cfg, gran, dev_total, NULL, 0);
	if (rc)
		goto fail;
	struct vpmm_units units;
	vpmm_config_units(cfg, gran, &units);
	p->page = units.page;
	p->grain = units.grain;
	p->grain_shift = (unsigned)__builtin_ctzll(units.grain);
	p->page_shift = units.page & (units.page - 1) ? 0 : (unsigned)__builtin_ctzll(units.page);
	p->cfg.page_size = units.page;
	p->cfg.handle_size = units.handle;
	p->cfg.grain = units.grain;
	p->cfg.va_size = vpi_whole_pages(p, p->cfg.va_size);
	p->st.page_size = p->page;
	if (p->cfg.front_entries > VPMM_FRONT_MAX)
		p->cfg.front_entries = VPMM_FRONT_MAX;
	if (p->cfg.loop_growth > VPMM_LOOP_GROWTH_MAX)
		p->cfg.loop_growth = VPMM_LOOP_GROWTH_MAX;
	p->access[0] = cfg->device;
	p->naccess = 1;
	p->chunks = calloc(VPMM_MAX_CHUNKS, sizeof(*p->chunks));
	if (!p->chunks) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = -ENOMEM;
	if (pthread_mutex_init(&p->lock, NULL))
		goto fail;
	vpi_front_pool_init(p);
	if (pthread_cond_init(&p->reclaim_cond, NULL)) {
		pthread_mutex_destroy(&p->lock);
		goto fail;
	}
	rc = 0;
	vpi_tree_init(&p->regions, vpi_region_by_va, 1);
	vpi_tree_init(&p->settled, vpi_region_by_size, 2);
	vpi_tree_init(&p->holes, vpi_region_by_size, 3);
	vpi_tree_init(&p->maps, vpi_mapping_by_va, 4);

	struct region *first;
	CUdeviceptr at;
	unsigned chunk;
	vpi_mutex_lock(&p->lock);
	rc = vpi_reserve_regions(p, 4);
	if (!rc)
		rc = vpi_small_init(p);
	if (!rc)
		rc = vpi_chunk_add(p, p->cfg.va_size, &chunk);
	if (!rc && cfg->initial_pages) {
		bool grow = false; /* vpmm_config_check() bounded the product */
		rc = vpi_defrag(p, NULL, cfg->initial_pages * p->page, &grow, false, &first, &at);
	}
	vpi_mutex_unlock(&p->lock);
	if (!rc && cfg->background &&
	    DRV(p, VPMM_OP_CTX_CURRENT, ctx_current, &p->ctx) != CUDA_SUCCESS)
		rc = -EIO;
	if (!rc) { /* the context's id now: a change later is its end */
		vpi_mutex_lock(&p->lock);
		vpi_ctx_check_locked(p);
		vpi_mutex_unlock(&p->lock);
	}
	if (!rc && cfg->background) {
		/* Every signal blocked: the program's signals are for its own
		 * threads (one that sigwait()s for SIGTERM, say), and this
		 * thread, created from whichever thread allocated first, would
		 * otherwise take them with their default action. */
		sigset_t all, old;
		sigfillset(&all);
		/* Faults are the thread's own: blocked, they kill the process
		 * without the program's crash handler. */
		sigdelset(&all, SIGSEGV);
		sigdelset(&all, SIGBUS);
		sigdelset(&all, SIGFPE);
		sigdelset(&all, SIGILL);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = -pthread_create(&p->reclaimer, NULL, vpi_reclaimer_main, p);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		p->reclaimer_running = !rc;
	}
	if (rc) {
		vpmm_pool_destroy(p);
		return rc;
	}
	*out = p;
	return 0;
fail:
	free(p->chunks);
	free(p);
	return rc;
}

void vpmm_pool_destroy(vpmm_pool *p)
{
	if (!p)
		return;
	struct vpi_tnode *n;
	if (p->reclaimer_running) {
		vpi_mutex_lock(&p->lock);
		p->stopping = true;
		pthread_cond_signal(&p->reclaim_cond);
		vpi_mutex_unlock(&p->lock);
		pthread_join(p->reclaimer, NULL);
	}
	vpi_small_fini(p);
	while ((n = vpi_tree_first(&p->maps))) {
		struct mapping *m = MAP(n);
		DRV(p, VPMM_OP_UNMAP, unmap, m->va, m->handle->size);
		vpi_mapping_forget(p, m);
	}
	for (unsigned i = 0; i < VPMM_MAX_CHUNKS; i++) {
		if (i < p->nchunks)
			DRV(p, VPMM_OP_VA_FREE, va_free, p->chunks[i].va, p->chunks[i].size);
		vpi_gmap_destroy(p, &p->chunks[i]);
		vpi_home_map_destroy(p, &p->chunks[i]);
	}
	while ((n = vpi_tree_first(&p->regions))) {
		struct region *r = REG(n, by_va);
		vpi_tree_remove(&p->regions, n);
		free(r);
	}
	while (p->region_cache) {
		struct region *r = p->region_cache;
		p->region_cache = r->next;
		free(r);
	}
	for (struct stream *s = p->streams, *next; s; s = next) { /* dead ones too */
		next = s->next;
		free(s->small_partial);
		vpi_loop_fini(&s->front.loop);
		pthread_mutex_destroy(&s->front.lock);
		free(s);
	}
	/* Zombies and deferred blocks may hold events no list has any more. */
	for (struct event *ev = p->events, *next; ev; ev = next) {
		next = ev->all_next;
		if (!ev->gone)
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
		free(ev);
	}
	free(p->stream_hash);
	free(p->chunks);
	vpi_loop_fini(&p->sync_front.loop);
	pthread_mutex_destroy(&p->sync_front.lock);
	pthread_cond_destroy(&p->reclaim_cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

int vpmm_pool_malloc(vpmm_pool *p, size_t size, CUstream stream, CUdeviceptr *out)
{
	struct stream *caller = NULL;
	struct region *r;
	int rc;

	if (!p || !out || !size)
		return -EINVAL;
	REFUSE_REENTRY();
	if (size > SIZE_MAX - 2 * p->page)
		return -ENOMEM;
	if (p->cfg.front_entries && vpi_front_malloc(p, size, stream, out) == 0)
		return 0;

	vpi_mutex_lock(&p->lock);
	vpi_ctx_check_locked(p);
	if (stream == VPMM_NO_STREAM)
		p->sync_takes = true;
	else if (!(caller = vpi_stream_get_locked(p, stream))) {
		rc = -ENOMEM;
		goto out;
	}
	/* The sequence of mallocs (loop.c), and where this one's like went
	 * a step or more before. */
	struct front *f = vpi_front_of(p, caller);
	CUdeviceptr hint[VPMM_LOOP_HINTS];
	unsigned nhint = 0;
	bool small = size <= vpi_small_max(p);
	vpi_mutex_lock(&f->lock);
	vpi_loop_init(&f->loop); /* without memory, no loop is seen */
	uint64_t seq = vpi_loop_note(&f->loop, size, 0);
	if (!small)
		nhint = vpi_loop_hints(&f->loop, hint);
	vpi_mutex_unlock(&f->lock);
	if (small) {
		rc = vpi_small_malloc_locked(p, caller, size, out);
	} else {
		rc = vpi_take_locked(p, caller, vpi_grains(p, size),
					   hint, nhint, &r);
		if (!rc) {
			*out = r->va;
			vpi_unclaim(r); /* the program's to free now */
		}
	}
	if (!rc) {
		vpi_mutex_lock(&f->lock);
		vpi_loop_placed(&f->loop, seq, *out);
		vpi_mutex_unlock(&f->lock);
		p->st.mallocs++;
	}
out:
	if (rc)
		p->st.failures++;
	vpi_mutex_unlock(&p->lock);
	return rc;
}

int vpmm_pool_free(vpmm_pool *p, CUdeviceptr ptr, CUstream stream)
{
	struct stream *s = NULL;
	struct region *r;
	int rc = -EINVAL;

	if (!p)
		return rc;
	REFUSE_REENTRY();
	if (p->cfg.front_entries && vpi_front_free(p, ptr, stream) == 0)
		return 0;
	vpi_mutex_lock(&p->lock);
	if (stream != VPMM_NO_STREAM) /* it may record on its stream */
		vpi_ctx_check_locked(p);
	r = vpi_find_region(p, ptr);
	if (!r || r->kind != R_LIVE || (r->va != ptr && !r->small))
		goto out;
	if (stream != VPMM_NO_STREAM && !(s = vpi_stream_get_locked(p, stream))) {
		rc = -ENOMEM;
		goto out;
	}
	/* Claimed, not just looked at: a lock-free free of the same pointer
	 * may have read r already, and only one of the two may win. A
	 * block's claim is its park bit (small.c). */
	if (!r->small && !vpi_claim(r, __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE)))
		goto out;
	if (r->small) {
		rc = vpi_small_free_locked(p, r, ptr, s, 0, false);
	} else {
		vpi_give_locked(p, r, s, 0);
		rc = 0;
	}
	if (!rc)
		p->st.frees++;
out:
	vpi_mutex_unlock(&p->lock);
	return rc;
}

int vpmm_pool_find(vpmm_pool *p, CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	int rc = -EINVAL;
	if (!p)
		return rc;
	REFUSE_REENTRY();
	vpi_mutex_lock(&p->lock);
	struct region *r = vpi_find_region(p, ptr);
	if (r && r->kind == R_LIVE && ptr < r->va + r->size &&
	    (r->small || !vpi_claimed(r))) {
		if (r->small) {
			rc = vpi_small_find_locked(p, r, ptr, base, size);
		} else {
			if (base)
				*base = r->va;
			if (size)
				*size = r->size;
			rc = 0;
		}
	}
	vpi_mutex_unlock(&p->lock);
	return rc;
}

/* Dead streams a destroy looks at (vpi_stream_reap_locked): more than the
 * one it adds, so that their records go as fast as the device completes
 * their last work. */
#define REAP_ON_GONE 4

int vpmm_pool_stream_gone(vpmm_pool *p, CUstream h)
{
	int rc = 0;
	if (!p || h == VPMM_NO_STREAM)
		return -EINVAL;
	REFUSE_REENTRY();
	vpi_mutex_lock(&p->lock);
	vpi_ctx_check_locked(p); /* an ended context's stream is forgotten */
	struct stream *s = NULL, **link = NULL;
	if (p->stream_hash_size)
		for (link = &p->stream_hash[vpi_stream_slot(p, h)]; *link; link = &(*link)->hash_next)
			if ((*link)->handle == h) {
				s = *link;
				break;
			}
	if (s) {
		/* Its parked frees join its pending ones; one last event, while
		 * the stream still exists, covers them all, and what it frees
		 * later: blocks of its slabs, freed by others once it is gone,
		 * are released in the epoch of that event (give_locked). Needed
		 * even with no free pending while it owns a slab, since its own
		 * frees of the slab's blocks may follow every event before it,
		 * and while a defragmentation for it is in the driver, since
		 * the waits it put on the stream come after them (defrag_commit
		 * gives its span that event's epoch); else only if a free is
		 * not covered yet. */
		vpi_front_flush_stream_locked(p, s);
		uint64_t open = s->epoch;
		if ((s->slabs || s->pins || !vpi_stream_covered(s)) &&
		    (rc = vpi_close_epoch_uncaptured(p, s)))
			/* No event will follow to cover an epoch a failed record
			 * closed: back to the last one recorded. */
			__atomic_store_n(&s->epoch, open, __ATOMIC_SEQ_CST);
		vpi_stream_forget_locked(p, s, link);
		vpi_front_release_owned_locked(p, s);
		vpi_small_stream_gone_locked(p, s);
	}
	vpi_stream_reap_locked(p, REAP_ON_GONE);
	vpi_event_cache_trim_locked(p);
	vpi_mutex_unlock(&p->lock);
	return rc;
}

/* Lock-free: chunks are a fixed array published by an atomic count, and
 * only the last one is ever given back (vpi_chunk_drop_if_unused). */
bool vpmm_pool_owns(vpmm_pool *p, CUdeviceptr ptr)
{
	if (!p)
		return false;
	unsigned n = __atomic_load_n(&p->nchunks, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n; i++)
		if (ptr >= p->chunks[i].va && ptr - p->chunks[i].va < p->chunks[i].size)
			return true;
	return false;
}

int vpmm_pool_reclaim(vpmm_pool *p)
{
	if (!p)
		return -EINVAL;
	REFUSE_REENTRY();
	vpi_mutex_lock(&p->lock);
	vpi_ctx_check_locked(p);
	for (struct stream *s = p->streams; s; s = s->next)
		vpi_poll_stream(p, s);
	vpi_small_drain_locked(p);
	int n = vpi_reserve_regions(p, 2) ? -ENOMEM : vpi_reclaim_zombies(p, false, NULL);
	vpi_stream_reap_locked(p, p->ndead);
	vpi_mutex_unlock(&p->lock);
	return n;
}

void vpmm_pool_drop_events(vpmm_pool *p, CUcontext rebind, bool synced)
{
	if (!p)
		return;
	vpi_mutex_lock(&p->lock);
	while (p->event_cache) {
		struct event *ev = p->event_cache;
		p->event_cache = ev->next;
		p->ncached--;
		p->cache_low = 0;
		vpi_event_forget(p, ev);
		DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
		p->nevents--;
		free(ev);
	}
	/* The completed events still held (by a zombie's old address, a
	 * deferred small block) die with the context too: left alive here,
	 * each went back to the cache once let go, and was recorded again,
	 * destroyed, in the next context. Their holders only read `done`.
	 * One still on its stream's list (it names its stream) may yet be
	 * waited on, and stays. */
	for (struct event *ev = p->events; ev; ev = ev->all_next)
		if (ev->done && !ev->gone && !ev->stream) {
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
			p->nevents--;
			ev->ev = NULL;
			ev->gone = true;
		}
	/* The context's streams end with it, with no cuStreamDestroy to tell,
	 * and their handles may come back for new streams: each is forgotten
	 * as a destroyed one is. The caller synchronised the context and
	 * polled, so what they freed has settled and no last event is due.
	 * The default streams' handles (0, CU_STREAM_LEGACY,
	 * CU_STREAM_PER_THREAD) stay: they name the current context's own
	 * default stream, in whichever context comes next. */
	struct stream *gone = NULL;
	for (unsigned i = 0; i < p->stream_hash_size; i++)
		for (struct stream **link = &p->stream_hash[i]; *link;) {
			struct stream *s = *link;
			if ((uintptr_t)s->handle <= (uintptr_t)CU_STREAM_PER_THREAD) {
				link = &s->hash_next;
				continue;
			}
			vpi_stream_forget_locked(p, s, link); /* *link is the next one */
			if (!gone)
				gone = s;
		}
	/* Every one of them dead and, where the caller synchronised, its work
	 * known done first: then the blocks of their slabs parked in any
	 * cache, theirs included, go back, and none needs a record on a
	 * stream of the ended context. Unsynchronised (a context adopted while
	 * another thread may have queued work on its streams), an entry no
	 * event covers stays parked. */
	for (struct stream *s = gone; synced && s; s = s->dead_next)
		vpi_stream_ended_locked(p, s);
	for (struct stream *s = gone; s; s = s->dead_next) {
		vpi_front_release_owned_locked(p, s);
		vpi_small_stream_gone_locked(p, s);
	}
	vpi_stream_reap_locked(p, p->ndead);
	/* The next id seen is the context's (made again) or the next one's. */
	p->ctx_id = 0;
	if (rebind != p->ctx) {
		p->ctx = rebind;
		pthread_cond_signal(&p->reclaim_cond);
	}
	vpi_mutex_unlock(&p->lock);
}

void vpmm_pool_pause(vpmm_pool *p, bool paused)
{
	if (!p)
		return;
	vpi_mutex_lock(&p->lock);
	p->paused = paused;
	if (!paused)
		pthread_cond_signal(&p->reclaim_cond);
	vpi_mutex_unlock(&p->lock);
}

void vpmm_pool_set_clock(vpmm_pool *p, uint64_t (*now_ns)(void *arg), void *arg)
{
	if (!p)
		return;
	vpi_mutex_lock(&p->lock);
	p->clock = now_ns;
	p->clock_arg = now_ns ? arg : NULL;
	vpi_mutex_unlock(&p->lock);
}

void vpmm_pool_context_ended(vpmm_pool *p)
{
	if (!p)
		return;
	vpi_mutex_lock(&p->lock);
	vpi_ctx_ended_locked(p);
	p->ctx_id = 0; /* the next context's (or the one made again) */
	vpi_mutex_unlock(&p->lock);
}

int vpmm_pool_poll(vpmm_pool *p, bool before_sync)
{
	if (!p)
		return -EINVAL;
	REFUSE_REENTRY();
	/* A pool only synchronous callers used has nothing to settle. */
	if (!__atomic_load_n(&p->nstreams, __ATOMIC_ACQUIRE))
		return 0;
	vpi_mutex_lock(&p->lock);
	vpi_ctx_check_locked(p);
	uint64_t settled = p->settled_count;
	if (before_sync) {
		/* Parked frees join their stream's pending ones, so that the
		 * events closing the open epochs cover them too. */
		for (struct stream *s = p->streams; s; s = s->next)
			vpi_front_flush_stream_locked(p, s);
		vpi_poll_others(p, NULL);
	} else {
		for (struct stream *s = p->streams; s; s = s->next) {
			vpi_poll_stream(p, s);
			vpi_stream_synced_locked(p, s);
		}
		vpi_small_drain_locked(p);
	}
	vpi_stream_reap_locked(p, p->ndead);
	int n = (int)(p->settled_count - settled);
	vpi_mutex_unlock(&p->lock);
	return n;
}

long long vpmm_pool_trim(vpmm_pool *p, size_t keep)
{
	if (!p)
		return -EINVAL;
	REFUSE_REENTRY();
	vpi_mutex_lock(&p->lock);
	vpi_ctx_check_locked(p);
	size_t got = vpi_trim_locked(p, keep);
	vpi_mutex_unlock(&p->lock);
	return (long long)got;
}

void vpmm_pool_reset_peaks(vpmm_pool *p, bool live, bool mapped)
{
	uint64_t parked, hits, parks;
	pthread_mutex_lock(&p->lock);
	/* Parked allocations are live to the gauge, free to the program. */
	vpi_front_counts_locked(p, &parked, &hits, &parks);
	if (live)
		p->st.live_peak = p->st.live - parked;
	if (mapped)
		p->st.mapped_peak = p->st.mapped;
	pthread_mutex_unlock(&p->lock);
}

size_t vpmm_pool_release_threshold(vpmm_pool *p, const size_t *set)
{
	pthread_mutex_lock(&p->lock);
	if (set) {
		p->cfg.release = *set != SIZE_MAX;
		p->cfg.release_threshold = p->cfg.release ? *set : 0;
		if (p->cfg.release && p->st.reusable > p->cfg.release_threshold)
			pthread_cond_signal(&p->reclaim_cond);
	}
	size_t now = p->cfg.release ? p->cfg.release_threshold : SIZE_MAX;
	pthread_mutex_unlock(&p->lock);
	return now;
}

size_t vpmm_pool_page_size(const vpmm_pool *p)
{
	return p->page;
}

CUresult vpmm_pool_last_result(vpmm_pool *p)
{
	vpi_mutex_lock(&p->lock);
	CUresult r = p->last_result;
	vpi_mutex_unlock(&p->lock);
	return r;
}

void vpmm_pool_stats(vpmm_pool *p, struct vpmm_stats *out)
{
	vpi_mutex_lock(&p->lock);
	vpi_stats_locked(p, out);
	vpi_mutex_unlock(&p->lock);
}

void vpi_stats_locked(vpmm_pool *p, struct vpmm_stats *out)
{
	uint64_t parked, hits, parks;
	*out = p->st;
	vpi_front_counts_locked(p, &parked, &hits, &parks);
	/* Parked allocations are live to the pool's structures, free to the
	 * program: report them as reusable. */
	out->live -= parked;
	out->reusable += parked;
	out->parked = parked;
	out->front_hits = hits;
	out->front_parks = parks;
	out->mallocs += hits;
	out->frees += parks;
	out->streams = p->nrecords;
	out->events = p->nevents;
}

