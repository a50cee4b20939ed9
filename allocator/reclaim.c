/* reclaim.c — giving memory back: unmapping zombies once their events
 * completed (they become holes), trimming settled free handles down to a
 * threshold, and the background thread that does both off the callers'
 * threads.
 *
 * Calls region.c, handle.c, stream.c, front.c (a trim flushes the caches),
 * small.c (deferred blocks) and reset.c (each pass of the thread first
 * checks that the pool's context did not end). Lock held, dropped around the driver's
 * unmaps.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "front.h"
#include "handle.h"
#include "pool.h"
#include "reclaim.h"
#include "region.h"
#include "reset.h"
#include "small.h"
#include "stream.h"


static bool zombie_ready(vpmm_pool *p, struct region *z, bool wait)
{
	struct event *ev = z->ev;
	if (!ev || ev->done)
		return true;
	/* The lock may have been dropped since the pass checked the context
	 * (the unmaps): a reset unseen meanwhile ended this event with it. */
	if (vpi_ctx_check_locked(p) || ev->done)
		return true;
	vpi_poll_stream(p, ev->stream);
	if (!ev->done && wait) {
		CUresult r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, ev->ev);
		if (r == CUDA_SUCCESS)
			ev->done = true;
		else
			p->last_result = r;
	}
	return ev->done;
}

struct unmap_job {
	struct region *z;
	struct mapping *m;
	CUdeviceptr va;
	size_t size;
	CUresult r;
	bool tried;
};

/* Whether the background thread should leave its unmaps for later: a caller
 * is mapping, and the driver serialises the two (H100, replays: a caller's
 * cuMemMap 1.2-1.7 us alone, 5-6 us beside the thread's unmaps; cuMemCreate
 * 10-12 against 19-26). After VPMM_RECLAIM_DEFER_MAX rounds in a row
 * (VPMM_RECLAIM_DEFER_NS each at most) it unmaps anyway, so that callers
 * mapping back to back cannot starve it. Only the thread writes
 * reclaim_deferrals. */
static bool defer_to_mappers(vpmm_pool *p)
{
	return p->reclaim_deferrals < VPMM_RECLAIM_DEFER_MAX &&
	       __atomic_load_n(&p->mappers, __ATOMIC_RELAXED);
}

/* Phase 0: unmap the zombies whose events completed (all of them, waiting
 * on the CPU, when `wait`); they become holes. The unmapping runs with the
 * lock dropped. With `gave_way` (the background thread), it stops before
 * any unmap while a caller maps, leaves the rest zombies for the next round
 * and says so there. Returns how many ranges were reclaimed. */
int vpi_reclaim_zombies(vpmm_pool *p, bool wait, bool *gave_way)
{
	struct region *batch = NULL, **tail = &batch;
	struct unmap_job *job;
	size_t njobs = 0, k = 0;
	int n = 0;
	bool defer = gave_way != NULL;

	/* Not even a look at the events while a caller maps: queries too
	 * meet its maps in the driver. */
	if (defer && defer_to_mappers(p)) {
		*gave_way = true;
		p->st.reclaims_deferred++;
		return 0;
	}
	for (struct region *z = p->zombie_head, *next; z; z = next) {
		next = z->next;
		if (!zombie_ready(p, z, wait))
			continue;
		vpi_busy_take(p, z);
		*tail = z;
		tail = &z->next;
		for (struct mapping *m = vpi_mapping_ceil(p, z->va);
		     m && m->va < z->va + z->size; m = vpi_mapping_next(m))
			njobs++;
	}
	*tail = NULL;
	if (!batch)
		return 0;
	job = calloc(njobs ? njobs : 1, sizeof(*job));
	if (!job) { /* no room to plan: give them back for the next try */
		for (struct region *z = batch, *next; z; z = next) {
			next = z->next;
			vpi_busy_return(p, z);
		}
		return -ENOMEM;
	}
	for (struct region *z = batch; z; z = z->next)
		for (struct mapping *m = vpi_mapping_ceil(p, z->va);
		     m && m->va < z->va + z->size; m = vpi_mapping_next(m))
			job[k++] = (struct unmap_job){.z = z, .m = m, .va = m->va,
						      .size = m->handle->size};

	/* A zombie stops at its first failed unmap: what is unmapped stays a
	 * prefix, which becomes a hole; the rest remains a zombie. */
	vpi_mutex_unlock(&p->lock);
	bool deferred = false;
	for (k = 0; k < njobs; k++) {
		if (k && job[k - 1].z == job[k].z && job[k - 1].r != CUDA_SUCCESS) {
			job[k].r = job[k - 1].r;
			continue;
		}
		/* mappers is read without the lock: a stale answer costs one
		 * unmap's wait or one round's delay, nothing else. */
		if (defer && (deferred || defer_to_mappers(p))) {
			deferred = true;
			job[k].r = CUDA_ERROR_NOT_READY; /* untried: not an error */
			continue;
		}
		job[k].r = p->drv->unmap(p->drv, job[k].va, job[k].size);
		job[k].tried = true;
	}
	vpi_mutex_lock(&p->lock);
	p->st.reclaims_deferred += deferred;
	if (defer)
		*gave_way = deferred;

	k = 0;
	for (struct region *z = batch, *next; z; z = next) {
		CUdeviceptr ok_to = z->va;
		bool failed = false;
		next = z->next;
		for (; k < njobs && job[k].z == z; k++) {
			p->st.driver_calls += job[k].tried;
			p->driver_calls[VPMM_OP_UNMAP] += job[k].tried;
			if (job[k].r != CUDA_SUCCESS) {
				if (job[k].tried)
					p->last_result = job[k].r;
				failed = true;
			} else if (!failed) {
				ok_to = job[k].va + job[k].size;
			}
			if (job[k].r == CUDA_SUCCESS)
				vpi_mapping_forget(p, job[k].m);
		}
		if (failed) {
			/* A failed or deferred unmap keeps the rest a zombie,
			 * ready for the next try (its event completed: no part
			 * needs it); what is unmapped before it becomes a hole. */
			struct region *rest = z;
			vpi_event_unref(p, z->ev);
			z->ev = NULL;
			if (ok_to > z->va && vpi_reserve_regions(p, 1) == 0) {
				rest = vpi_split_off(p, z, ok_to);
				GAUGE_SUB(p, zombies, z->size);
				GAUGE_ADD(p, holes, z->size);
				z->kind = R_HOLE;
				p->busy--;
				p->st.zombies_reclaimed++;
				vpi_hole_insert(p, z);
				p->busy++; /* rest is busy too */
			}
			vpi_busy_return(p, rest);
			continue;
		}
		vpi_event_unref(p, z->ev);
		z->ev = NULL;
		z->kind = R_HOLE;
		p->busy--;
		GAUGE_SUB(p, zombies, z->size);
		GAUGE_ADD(p, holes, z->size);
		p->st.zombies_reclaimed++;
		vpi_hole_insert(p, z);
		n++;
	}
	free(job);
	return n;
}


struct release_job {
	struct region *r;   /* busy piece holding exactly this handle */
	struct mapping *m;
	CUresult r_unmap;
};

/* Unmap and release settled free handles until at most `keep` reusable bytes
 * remain. Only handles wholly inside a settled region with no zombie mapping
 * qualify: nothing can still touch them. Lock held; dropped for the driver
 * work. Returns the bytes given back. */
size_t vpi_trim_locked(vpmm_pool *p, size_t keep)
{
	struct release_job *job = NULL;
	size_t n = 0, cap = 0, want, got = 0;

	vpi_front_flush_locked(p);
	vpi_poll_others(p, NULL); /* closes open epochs: completion shows next time */
	if (p->st.reusable <= keep)
		return 0;
	want = p->st.reusable - keep;
	/* Largest settled regions first: they are the least likely to be
	 * reused soon, and free whole handles. */
	for (struct vpi_tnode *t = vpi_tree_last(&p->settled); t && got < want;) {
		struct region *r = REG(t, by_size);
		struct mapping *m = vpi_mapping_ceil(p, r->va);
		t = vpi_tree_prev(t);
		/* The first handle wholly inside r that no zombie still maps. */
		while (m && m->va < r->va + r->size &&
		       (m->handle->nmaps != 1 || m->va + m->handle->size > r->va + r->size))
			m = vpi_mapping_next(m);
		if (!m || m->va >= r->va + r->size)
			continue;
		if (vpi_reserve_regions(p, 2))
			break;
		if (n == cap) {
			size_t c = cap ? cap * 2 : 16;
			struct release_job *j = realloc(job, c * sizeof(*j));
			if (!j)
				break;
			job = j;
			cap = c;
		}
		/* Split that handle's range off and take it. */
		vpi_free_unindex(p, r);
		if (m->va > r->va) {
			struct region *mid = vpi_split_off(p, r, m->va);
			vpi_free_index(p, r);
			r = mid;
		}
		if (m->handle->size < r->size)
			vpi_free_index(p, vpi_split_off(p, r, m->va + m->handle->size));
		r->was = R_FREE;
		r->kind = R_BUSY;
		p->busy++;
		job[n++] = (struct release_job){.r = r, .m = m};
		got += m->handle->size;
		t = vpi_tree_last(&p->settled); /* indexes changed: start over */
	}
	if (!n) {
		free(job);
		return 0;
	}
	vpi_mutex_unlock(&p->lock);
	for (size_t i = 0; i < n; i++)
		job[i].r_unmap = p->drv->unmap(p->drv, job[i].m->va, job[i].m->handle->size);
	vpi_mutex_lock(&p->lock);
	got = 0;
	for (size_t i = 0; i < n; i++) {
		struct region *r = job[i].r;
		p->st.driver_calls++;
		p->driver_calls[VPMM_OP_UNMAP]++;
		if (job[i].r_unmap != CUDA_SUCCESS) {
			p->last_result = job[i].r_unmap;
			vpi_busy_return(p, r);
			continue;
		}
		got += r->size;
		vpi_home_map_set(p, r->chunk, job[i].m, false);
		vpi_mapping_forget(p, job[i].m); /* releases the handle: last mapping */
		p->busy--;
		r->kind = R_HOLE;
		r->stream = NULL;
		GAUGE_SUB(p, reusable, r->size);
		GAUGE_SUB(p, mapped, r->size);
		if (p->loop_grown > p->st.mapped) /* which pages went is not known */
			p->loop_grown = p->st.mapped;
		GAUGE_ADD(p, holes, r->size);
		p->st.pages_released += r->size / p->page;
		vpi_hole_insert(p, r);
	}
	free(job);
	return got;
}

/* The background reclaimer: unmaps zombies off the callers' threads. While
 * some are pending it polls their events every RECLAIM_POLL_NS, and while a
 * caller maps it gives way (defer_to_mappers); otherwise it sleeps until a
 * defragmentation makes new ones. */
#define RECLAIM_POLL_NS 100000

static void timed_wait(vpmm_pool *p, long ns)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += ns;
	while (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&p->reclaim_cond, &p->lock, &ts);
}

void *vpi_reclaimer_main(void *arg)
{
	vpmm_pool *p = arg;
	/* Driver calls need the pool's context current on this thread too. */
	CUcontext bound = p->ctx;
	p->drv->ctx_bind(p->drv, bound);
	vpi_mutex_lock(&p->lock);
	while (!p->stopping) {
		bool gave_way = false;
		if (p->ctx != bound) { /* vpmm_pool_drop_events moved the pool */
			bound = p->ctx;
			p->drv->ctx_bind(p->drv, bound);
		}
		if (p->paused) { /* the program is ending the pool's context */
			pthread_cond_wait(&p->reclaim_cond, &p->lock);
			continue;
		}
		/* A context that ended unannounced: its events are not queried. */
		vpi_ctx_check_locked(p);
		if (p->zombie_head && vpi_reserve_regions(p, 2) == 0) {
			vpi_reclaim_zombies(p, false, &gave_way);
			/* The unmaps may have had the lock dropped: a context
			 * ended unannounced meanwhile is seen before the
			 * queries below (the slabs' drain, the trim's poll). */
			vpi_ctx_check_locked(p);
		}
		if (p->paused) /* came while the unmaps had the lock dropped */
			continue;
		if (vpi_small_deferred(p))
			vpi_small_drain_locked(p);
		uint64_t parked = 0, hits, parks;
		if (p->cfg.release)
			vpi_front_counts_locked(p, &parked, &hits, &parks);
		if (p->cfg.release && p->st.reusable + parked > p->cfg.release_threshold) {
			/* A trim unmaps too: it waits for a caller's maps as
			 * the zombies do. */
			if (!gave_way && defer_to_mappers(p)) {
				gave_way = true;
				p->st.reclaims_deferred++;
			} else if (!gave_way) {
				vpi_trim_locked(p, p->cfg.release_threshold);
			}
		}
		p->reclaim_deferrals = gave_way ? p->reclaim_deferrals + 1 : 0;
		if (p->stopping)
			break;
		if (p->reclaim_deferrals &&
		    __atomic_load_n(&p->mappers, __ATOMIC_RELAXED)) {
			/* A caller is mapping; its defragmentation wakes us
			 * when it is done. Polling meanwhile would query
			 * events in the driver beside its maps. */
			timed_wait(p, VPMM_RECLAIM_DEFER_NS);
			continue;
		}
		if (p->cfg.release && !p->zombie_head && !vpi_small_deferred(p)) {
			/* Lock-free frees wake nobody: with a release threshold
			 * look again every RELEASE_POLL_NS. */
			timed_wait(p, RELEASE_POLL_NS);
			continue;
		}
		/* Poll while zombies, deferred blocks or free memory beyond the
		 * threshold wait for work to complete. */
		if (p->zombie_head || vpi_small_deferred(p) ||
		    (p->cfg.release && p->st.reusable > p->cfg.release_threshold)) {
			timed_wait(p, RECLAIM_POLL_NS);
		} else {
			pthread_cond_wait(&p->reclaim_cond, &p->lock);
		}
	}
	vpi_mutex_unlock(&p->lock);
	return NULL;
}
