/* defrag.c — defragmentation: makes a free region for a request by
 * remapping whole free handles into a hole (and creating what is lacking):
 * where to map, taking the handles harvest.c chose out of circulation,
 * mapping with the lock dropped, and undoing or committing.
 *
 * Calls harvest.c (what to move), region.c, handle.c, chunk.c, stream.c and
 * growth.c. Lock held, dropped around the driver work.
 */
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "defrag.h"
#include "growth.h"
#include "handle.h"
#include "harvest.h"
#include "pool.h"
#include "region.h"
#include "stream.h"


/* New handles one defragmentation may make: 2^24, 32 TiB of 2 MiB pages. */
#define DEFRAG_MOST_HANDLES ((size_t)1 << 24)

struct fresh { /* a range mapped by this defragmentation */
	CUdeviceptr va;
	struct handle *handle;
	bool created;
	struct mapping *rec; /* preallocated record */
};

/* Largest first; ties in harvest order, the new handles last. */
static int fresh_by_size(const void *a, const void *b)
{
	const struct fresh *x = *(struct fresh *const *)a;
	const struct fresh *y = *(struct fresh *const *)b;
	if (x->handle->size != y->handle->size)
		return x->handle->size < y->handle->size ? 1 : -1;
	return x < y ? -1 : x > y;
}

static void fresh_free(struct fresh *fr, size_t n, size_t nmove)
{
	if (!fr)
		return;
	for (size_t i = 0; i < n; i++)
		free(fr[i].rec);
	for (size_t i = nmove; i < n; i++)
		free(fr[i].handle);
	free(fr);
}

/* Whether `have` free bytes beside the span spare it a page. When they do
 * not, the request would only start (or end) inside a handle that stays
 * partly live, and leave as much free at the span's far end: no byte saved
 * and one more handle pinned. The first allocation of a PyTorch process (a
 * small tensor in a page of its own) made every later large one straddle
 * that page this way. */
static bool lends_a_page(const vpmm_pool *p, size_t have, size_t need)
{
	return (need - have + p->page - 1) / p->page < (need + p->page - 1) / p->page;
}

static bool lender_ok(const vpmm_pool *p, const struct region *f,
		      const struct region *hole, struct stream *caller, size_t need)
{
	return f && f->kind == R_FREE && f->chunk == hole->chunk && f->size < need &&
	       (!f->stream || f->stream == caller) && lends_a_page(p, f->size, need);
}

/* A free region usable by caller beside a hole lends its bytes: only the
 * rest of `need` is remapped or created, and the partly live handle at its
 * far end gets used instead of left behind (a harvest leaves such pieces
 * beside the hole it makes). The region may lie before the hole (the
 * request starts in it, *after = false) or after it (the request ends in
 * it), and the hole must hold the rest. The largest such region wins;
 * NULL if there is none. */
static struct region *find_lender(vpmm_pool *p, struct stream *caller, size_t need,
				  struct region **hole, bool *after)
{
	struct vpi_tree *idx[2] = {caller ? &caller->free_by_size : NULL, &p->settled};
	struct region *best = NULL;
	for (int i = 0; i < 2; i++) {
		struct vpi_tnode *t = idx[i] ? vpi_tree_last(idx[i]) : NULL;
		for (; t; t = vpi_tree_prev(t)) {
			struct region *f = REG(t, by_size), *h;
			if (best && f->size <= best->size)
				break; /* smaller from here on */
			if (f->size >= need)
				continue;
			if (!lends_a_page(p, f->size, need))
				break; /* nor will any smaller one */
			h = vpi_region_next(f);
			if (!(h && h->kind == R_HOLE && h->chunk == f->chunk &&
			      h->size >= need - f->size)) {
				h = vpi_region_prev(f);
				if (!(h && h->kind == R_HOLE && h->chunk == f->chunk &&
				      h->size >= need - f->size))
					continue;
			}
			best = f;
			*hole = h;
			*after = h->va < f->va;
			break;
		}
	}
	return best;
}

/* Whether growing `bytes` more for loops keeps within the cap. The cap is
 * against the rest of the pool, not the live peak: parked allocations count
 * as live until a flush, and in a loop that no longer defragments they stay
 * parked (the step's live peak read 1694 MiB for 1476 of tensors). It
 * counts what the growth creates, not the request: a request that a free
 * neighbour half lends costs the cap half. */
static bool loop_cap_allows(const vpmm_pool *p, size_t bytes)
{
	uint64_t rest = p->st.mapped > p->loop_grown ? p->st.mapped - p->loop_grown : 0;
	return p->loop_grown + bytes <= rest / 100 * p->cfg.loop_growth;
}

/* Phase 2. Makes a FREE region of at least `need` bytes usable by `caller`
 * (NULL: by anyone) and returns it.
 *
 * Under the lock it plans, records the events the plan needs and takes every
 * region it touches out of circulation (busy); it drops the lock for the
 * driver work (create, map, set access: tens of microseconds a handle) and
 * takes it again to commit. On failure every busy region goes back as it
 * was; only events recorded and waits inserted remain, which order work
 * conservatively and nothing more. */
/* One defragmentation's state, from the choice to the commit. */
struct defrag {
	struct stream *caller;
	size_t need;
	struct plan pl;
	struct fresh *fr, **order; /* the ranges to map; in span order */
	size_t nfr, nmove, nmapped; /* ranges; harvested ones first; mapped */
	size_t shortfall, hsize;  /* bytes to create, in handles of hsize */
	bool room;                /* growing for room: nothing remapped */
	bool refused;             /* the driver refused to create: out of memory */
	struct region *hole, *adj, *adj2; /* the span; the lending neighbour */
	struct stream *adj_pin, *adj2_pin; /* their streams while busy */
	struct stream *caller_pin; /* the caller, while the lock is dropped */
	unsigned new_chunk;       /* a chunk added for it, or UINT32_MAX */
	CUdeviceptr base, off;    /* the span mapped: [base, off) */
	size_t created;           /* bytes of new handles, once committed */
	int acc[VPMM_MAX_ACCESS]; /* devices granted access, copied */
	unsigned nacc;
};

/* Choosing: where to map (beside a free region that lends its bytes, else
 * the smallest hole that fits), which handles to harvest and how much to
 * create; every struct the commit needs, and the events the plan waits
 * for, before the first driver call. */
static int defrag_choose(vpmm_pool *p, struct defrag *d, bool *grow)
{
	size_t lack, have = 0, k;
	int rc;

	/* Where to map: beside a free region that lends its bytes (see
	 * find_lender()), else the smallest hole that fits, after a free
	 * region that lends what it has. */
	struct region probe = {.size = d->need}, *lender = NULL;
	bool after = false;
	if (p->cfg.defrag != VPMM_DEFRAG_ALL)
		lender = find_lender(p, d->caller, d->need, &d->hole, &after);
	if (lender) {
		d->adj = after ? NULL : lender;
		d->adj2 = after ? lender : NULL;
	} else {
		while (!(d->hole = REG(vpi_tree_ceil(&p->holes, &probe.by_size), by_size))) {
			rc = vpi_chunk_add(p, d->need, &d->new_chunk);
			if (rc) {
				/* Nothing to undo; a chunk added by an earlier turn stays. */
				d->new_chunk = UINT32_MAX;
				return rc;
			}
		}
		d->adj = vpi_region_prev(d->hole);
		if (!lender_ok(p, d->adj, d->hole, d->caller, d->need))
			d->adj = NULL;
	}
	have = d->adj ? d->adj->size : d->adj2 ? d->adj2->size : 0;
	lack = d->need - have;
	if (*grow && !d->room && !loop_cap_allows(p, vpi_whole_pages(p, lack)))
		*grow = false;

	d->pl.hole_size = d->hole->size;
	d->pl.target = *grow ? 0 : p->cfg.defrag == VPMM_DEFRAG_ALL ? SIZE_MAX : lack;
	rc = vpi_plan_harvest(p, &d->pl, d->caller, d->adj, d->adj2);
	if (rc)
		return rc;
	d->shortfall = d->pl.taken >= lack ? 0 : lack - d->pl.taken;
	d->shortfall = vpi_whole_pages(p, d->shortfall); /* mapped whole */
	if (d->shortfall && ((p->cfg.limit &&
	     p->st.mapped + p->inflight + d->shortfall > p->cfg.limit) ||
	    !vpi_growth_may_create(p, d->shortfall))) {
		p->last_result = CUDA_ERROR_OUT_OF_MEMORY;
		rc = -ENOMEM;
		return rc;
	}
	/* Every struct the commit needs, before the first driver call. */
	d->hsize = vpi_growth_handle_size(p, d->need, d->shortfall, d->room);
	size_t nnew = (d->shortfall + d->hsize - 1) / d->hsize;
	/* Past what any device holds (the room unknown let it through):
	 * refused before a record is allocated for each handle. */
	if (nnew > DEFRAG_MOST_HANDLES) {
		p->last_result = CUDA_ERROR_OUT_OF_MEMORY;
		return -ENOMEM;
	}
	for (size_t i = 0; i < d->pl.n; i++)
		for (struct mapping *m = vpi_mapping_from(p, d->pl.h[i].r->chunk, d->pl.h[i].a);
		     m && m->va < d->pl.h[i].b; m = vpi_mapping_next(m))
			d->nmove++;
	d->nfr = d->nmove + nnew;
	rc = vpi_reserve_regions(p, (unsigned)(2 * d->pl.n + 2));
	d->fr = rc ? NULL : calloc(d->nfr, sizeof(*d->fr));
	d->order = d->fr ? malloc(d->nfr * sizeof(*d->order)) : NULL;
	if (!d->order) {
		rc = -ENOMEM;
		return rc;
	}
	for (k = 0; k < d->nfr; k++) {
		d->fr[k].rec = malloc(sizeof(*d->fr[k].rec));
		if (!d->fr[k].rec || (k >= d->nmove && !(d->fr[k].handle = calloc(1, sizeof(struct handle))))) {
			rc = -ENOMEM;
			return rc;
		}
	}
	rc = vpi_plan_events(p, &d->pl, d->caller);
	if (rc)
		return rc;
	return 0;
}

/* While the lock is dropped, a busy region names its stream in no list of
 * the stream's, and the caller may be destroyed: their records stay until
 * unpinned (defrag_release). */
static struct stream *pin(struct stream *s)
{
	if (s)
		s->pins++;
	return s;
}

static void unpin(struct stream *s)
{
	if (s)
		s->pins--;
}

/* Harvesting: the harvested pieces, the lending neighbour and the span of
 * the hole to map go out of circulation (busy), and each range gets its
 * address in the span. */
static void defrag_harvest(vpmm_pool *p, struct defrag *d)
{
	size_t k;

	/* Out of circulation: the harvested pieces, the lending neighbour and
	 * the part of the hole that will be mapped (its end when the request
	 * ends in adj2). */
	k = 0;
	for (size_t i = 0; i < d->pl.n; i++) {
		struct harvest *h = &d->pl.h[i];
		struct region *src = h->r;
		vpi_free_unindex(p, src);
		if (h->b < src->va + src->size)
			vpi_free_index(p, vpi_split_off(p, src, h->b));
		if (src->va < h->a) {
			struct region *mid = vpi_split_off(p, src, h->a);
			vpi_free_index(p, src);
			src = mid;
		}
		src->was = R_FREE; /* busy; unindexed above */
		src->kind = R_BUSY;
		p->busy++;
		h->r = src;
		h->pin = pin(src->stream);
		for (struct mapping *m = vpi_mapping_from(p, src->chunk, h->a); m && m->va < h->b;
		     m = vpi_mapping_next(m))
			d->fr[k++].handle = m->handle;
	}
	for (size_t left = d->shortfall; k < d->nfr; k++) {
		d->fr[k].handle->size = left < d->hsize ? left : d->hsize;
		left -= d->fr[k].handle->size;
	}
	/* Largest handle first in the span, from where the request starts (from
	 * where it ends, when it ends in adj2): what it leaves free at its other
	 * end lies in the smallest handles, wholly free ones among them (they can
	 * move again), rather than in part of a large one. */
	for (k = 0; k < d->nfr; k++)
		d->order[k] = &d->fr[k];
	qsort(d->order, d->nfr, sizeof(*d->order), fresh_by_size);
	d->caller_pin = pin(d->caller); /* it may be destroyed meanwhile */
	if (d->adj) {
		vpi_busy_take(p, d->adj);
		d->adj_pin = pin(d->adj->stream);
	}
	if (d->adj2) {
		vpi_busy_take(p, d->adj2);
		d->adj2_pin = pin(d->adj2->stream);
	}
	vpi_tree_remove(&p->holes, &d->hole->by_size);
	if (d->hole->size > d->pl.taken + d->shortfall && d->adj2) {
		/* The request ends in adj2: map the end of the hole. */
		struct region *back = vpi_split_off(p, d->hole, d->hole->va + d->hole->size - d->pl.taken - d->shortfall);
		vpi_tree_insert(&p->holes, &d->hole->by_size);
		d->hole = back;
	} else if (d->hole->size > d->pl.taken + d->shortfall) {
		vpi_tree_insert(&p->holes,
				 &vpi_split_off(p, d->hole, d->hole->va + d->pl.taken + d->shortfall)->by_size);
	}
	d->off = d->hole->va;
	for (k = 0; k < d->nfr; k++) {
		struct fresh *f = d->order[d->adj2 ? d->nfr - 1 - k : k];
		f->va = d->off;
		d->off += f->handle->size;
	}
	d->hole->was = R_HOLE;
	d->hole->kind = R_BUSY;
	p->busy++;
	p->inflight += d->shortfall;
	d->base = d->hole->va;
	d->nacc = p->naccess;
	memcpy(d->acc, p->access, d->nacc * sizeof d->acc[0]);
}

/* Mapping, with the lock dropped: create the shortfall, map harvested
 * handles and new ones, grant access; on failure undo the driver's part. */
static CUresult defrag_map(vpmm_pool *p, struct defrag *d)
{
	size_t calls_create = 0, calls_map = 0, calls_access = 0, k;
	CUresult r = CUDA_SUCCESS;

	__atomic_fetch_add(&p->mappers, 1, __ATOMIC_RELAXED);
	vpi_mutex_unlock(&p->lock);
	/* Create the shortfall; map harvested handles first, new ones after. */
	for (k = d->nmove; k < d->nfr; k++) {
		r = p->drv->mem_create(p->drv, p->cfg.device, d->fr[k].handle->size,
				       &d->fr[k].handle->cu);
		calls_create++;
		if (r != CUDA_SUCCESS) {
			d->refused = r == CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		d->fr[k].created = true;
	}
	for (k = 0; r == CUDA_SUCCESS && k < d->nfr; k++) {
		r = p->drv->map(p->drv, d->fr[k].va, d->fr[k].handle->size, d->fr[k].handle->cu);
		calls_map++;
		d->nmapped += r == CUDA_SUCCESS;
	}
	if (r == CUDA_SUCCESS) {
		r = p->drv->set_access(p->drv, d->base, d->off - d->base, d->acc, (int)d->nacc);
		calls_access++;
	}
	if (r != CUDA_SUCCESS) {
		for (k = d->nmapped; k-- > 0;)
			p->drv->unmap(p->drv, d->fr[k].va, d->fr[k].handle->size);
		for (k = d->nmove; k < d->nfr; k++)
			if (d->fr[k].created)
				p->drv->mem_release(p->drv, d->fr[k].handle->cu);
	}
	__atomic_fetch_sub(&p->mappers, 1, __ATOMIC_RELAXED);
	vpi_mutex_lock(&p->lock);
	if (p->reclaim_deferrals) /* the background thread waits for us */
		pthread_cond_signal(&p->reclaim_cond);
	p->inflight -= d->shortfall;
	p->st.driver_calls += calls_create + calls_map + calls_access;
	p->driver_calls[VPMM_OP_MEM_CREATE] += calls_create;
	p->driver_calls[VPMM_OP_MAP] += calls_map;
	p->driver_calls[VPMM_OP_SET_ACCESS] += calls_access;
	if (r != CUDA_SUCCESS) { /* the undo calls above */
		p->st.driver_calls += d->nmapped;
		p->driver_calls[VPMM_OP_UNMAP] += d->nmapped;
		for (k = d->nmove; k < d->nfr; k++)
			if (d->fr[k].created) {
				p->st.driver_calls++;
				p->driver_calls[VPMM_OP_MEM_RELEASE]++;
			}
	}
	return r;
}

/* Undoing: every busy region goes back as it was. */
static void defrag_undo(vpmm_pool *p, struct defrag *d)
{
	for (size_t i = 0; i < d->pl.n; i++)
		vpi_busy_return(p, d->pl.h[i].r);
	if (d->adj)
		vpi_busy_return(p, d->adj);
	if (d->adj2)
		vpi_busy_return(p, d->adj2);
	vpi_busy_return(p, d->hole);
}

/* Committing (nothing can fail): the new mappings, the harvested ranges
 * become zombies, and the span a free region; returns it. */
static struct region *defrag_commit(vpmm_pool *p, struct defrag *d, CUdeviceptr *at)
{
	size_t k;

	/* Commit: nothing below can fail. */
	size_t mapped_len = d->off - d->base, created = 0;
	bool pending = false;
	p->st.handles_remapped += d->nmove;
	for (k = 0; k < d->nfr; k++) {
		d->fr[k].rec->va = d->fr[k].va;
		d->fr[k].rec->handle = d->fr[k].handle;
		d->fr[k].handle->nmaps++;
		vpi_tree_insert(&p->maps, &d->fr[k].rec->by_va);
		vpi_home_map_set(p, d->hole->chunk, d->fr[k].rec, true);
		d->fr[k].rec = NULL;
		if (d->fr[k].created) {
			created += d->fr[k].handle->size;
			p->st.handles_created++;
			d->fr[k].handle = NULL; /* owned by the pool now */
		}
	}
	for (size_t i = 0; i < d->pl.n; i++) {
		struct region *z = d->pl.h[i].r;
		pending |= z->stream != NULL;
		p->busy--;
		z->kind = R_ZOMBIE;
		z->stream = NULL;
		z->epoch = 0;
		z->ev = d->pl.h[i].ev; /* vpi_plan_events' reference */
		d->pl.h[i].ev = NULL;
		vpi_zombie_append(p, z);
		for (struct mapping *m = vpi_mapping_from(p, z->chunk, z->va);
		     m && m->va < z->va + z->size; m = vpi_mapping_next(m))
			vpi_home_map_set(p, z->chunk, m, false);
		GAUGE_SUB(p, reusable, z->size);
		GAUGE_ADD(p, zombies, z->size);
		p->st.pages_remapped += z->size / p->page;
	}
	if (d->pl.n)
		pthread_cond_signal(&p->reclaim_cond);
	/* The allocation starts at the lending neighbour, or ends with the one
	 * after the span, else starts at the span (a handle boundary), whatever
	 * the merges below make of them. */
	*at = d->adj ? d->adj->va : d->adj2 ? d->adj2->va - (d->need - d->adj2->size) : d->base;
	if (d->adj2) { /* absorbed by the span below, before any other merge */
		p->busy--;
		d->adj2->kind = R_FREE;
		if (d->adj2->stream && d->adj2->epoch <= d->adj2->stream->done) {
			d->adj2->stream = NULL;
			d->adj2->epoch = 0;
		}
		vpi_free_index(p, d->adj2);
	}
	if (d->adj) {
		/* Indexed alone: it must join the new span first (the request
		 * starts in it); vpi_free_insert() below then also merges the span
		 * with a left neighbour freed while the lock was dropped. */
		p->busy--;
		d->adj->kind = R_FREE;
		if (d->adj->stream && d->adj->epoch <= d->adj->stream->done) {
			d->adj->stream = NULL;
			d->adj->epoch = 0;
		}
		vpi_free_index(p, d->adj);
	}
	p->busy--;
	d->hole->kind = R_FREE;
	d->hole->stream = d->caller && pending ? d->caller : NULL;
	d->hole->epoch = d->caller && pending ? d->caller->epoch : 0;
	if (d->hole->stream && d->caller->dead) {
		/* Destroyed while the lock was dropped: its last event,
		 * recorded meanwhile, covers the waits vpi_plan_events() inserted;
		 * no later epoch ever will be (as in vpi_give_locked). */
		d->hole->epoch = d->caller->epoch - 1;
		if (d->hole->epoch <= d->caller->done) {
			d->hole->stream = NULL;
			d->hole->epoch = 0;
		}
	}
	GAUGE_SUB(p, holes, mapped_len);
	GAUGE_ADD(p, mapped, created);
	GAUGE_ADD(p, reusable, mapped_len);
	p->st.pages_created += created / p->page;
	d->created = created;
	/* The request ends in adj2: the span takes it in first. A left
	 * neighbour of another stream that the span merges with afterwards
	 * would give it that stream, and adj2 (the caller's) could not join. */
	if (d->adj2)
		vpi_free_absorb(p, d->hole, d->adj2);
	return vpi_free_insert(p, d->hole);
}

/* What the plan held, whatever happened. */
static void defrag_release(vpmm_pool *p, struct defrag *d)
{
	for (size_t i = 0; i < d->pl.n; i++) {
		vpi_event_unref(p, d->pl.h[i].ev);
		unpin(d->pl.h[i].pin);
	}
	unpin(d->adj_pin);
	unpin(d->adj2_pin);
	unpin(d->caller_pin);
	fresh_free(d->fr, d->nfr, d->nmove);
	free(d->order);
	free(d->pl.h);
	if (d->new_chunk != UINT32_MAX)
		vpi_chunk_drop_if_unused(p, d->new_chunk);
}

/* With *grow (a loop repeats, loop_repeats()), what the request lacks is
 * created rather than harvested, if the loops' cap allows it; *grow then
 * says whether it was. With `room` (the device has room, growth.c), *grow
 * is set and what the request lacks is created regardless of that cap.
 * New handles are as large as growth.c says. */
int vpi_defrag(vpmm_pool *p, struct stream *caller, size_t need, bool *grow,
	       bool room, struct region **out, CUdeviceptr *at)
{
	struct defrag d = {.caller = caller, .need = need, .room = room,
			   .new_chunk = UINT32_MAX};
	int rc = defrag_choose(p, &d, grow);
	if (!rc) {
		defrag_harvest(p, &d);
		CUresult r = defrag_map(p, &d);
		if (r != CUDA_SUCCESS) {
			p->last_result = r;
			rc = vpi_cu_errno(r);
			if (d.refused)
				vpi_growth_refused(p); /* the device is full, for now */
			defrag_undo(p, &d);
		} else {
			*out = defrag_commit(p, &d, at);
			d.new_chunk = UINT32_MAX;
			/* What this one created: other threads' growths commit
			 * while the lock is dropped, and are theirs to count. */
			vpi_growth_created(p, d.created);
			if (*grow && !room)
				p->loop_grown += d.created;
		}
	}
	defrag_release(p, &d);
	return rc;
}
