/* harvest.c — a defragmentation's plan: which free handles it moves into
 * the hole (all of them, or by size for what the request lacks: VPMM_DEFRAG),
 * and the waits for the work still pending on them.
 *
 * Owns struct harvest and struct plan (harvest.h). Calls stream.c (events,
 * waits) and tree.c (the free indexes); reads the regions and their
 * mappings (region.h, handle.h). Lock held; no driver call but the waits.
 */
#include <errno.h>
#include <stdlib.h>

#include "handle.h"
#include "harvest.h"
#include "region.h"
#include "stream.h"

static int plan_push(struct plan *pl, struct harvest h)
{
	if (pl->n == pl->cap) {
		size_t cap = pl->cap ? pl->cap * 2 : 8;
		struct harvest *n = realloc(pl->h, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		pl->h = n;
		pl->cap = cap;
	}
	pl->h[pl->n++] = h;
	return 0;
}

/* Take the handles lying wholly inside r, lowest address first. A handle that
 * crosses r's edge (part of it live) cannot move: a handle maps whole. */
static int plan_region(vpmm_pool *p, struct plan *pl, struct region *r)
{
	CUdeviceptr end = r->va + r->size, a = 0, b = 0;
	for (struct mapping *m = vpi_mapping_from(p, r->chunk, r->va);
	     m && m->va < end && pl->taken < pl->target; m = vpi_mapping_next(m)) {
		size_t sz = m->handle->size;
		if (m->va + sz > end || pl->taken + sz > pl->hole_size)
			break;
		if (!b)
			a = m->va;
		b = m->va + sz;
		pl->taken += sz;
	}
	return b ? plan_push(pl, (struct harvest){.r = r, .a = a, .b = b}) : 0;
}

/* Visits the free regions a defragmentation may take from, in the order it
 * prefers them: the caller's (in free order), the settled ones (smallest
 * first), then other streams' (`others`), oldest free first across all of
 * them: each fifo is in free order already, so their heads are merged; past
 * 64 streams the rest go each in turn, before the merge. visit() answers 0
 * to go on; anything else stops the visit, which answers it. */
static int each_free_region(vpmm_pool *p, struct stream *caller,
			    int (*visit)(vpmm_pool *p, struct region *r, bool others, void *arg),
			    void *arg)
{
	int rc = 0;
	if (caller)
		for (struct region *r = caller->fifo_head; r && !rc; r = r->next)
			rc = visit(p, r, false, arg);
	for (struct vpi_tnode *t = vpi_tree_first(&p->settled); t && !rc; t = vpi_tree_next(t))
		rc = visit(p, REG(t, by_size), false, arg);
	struct region *cur[64];
	unsigned ns = 0;
	for (struct stream *s = p->streams; s && !rc; s = s->next) {
		if (s == caller || !s->fifo_head)
			continue;
		if (ns == 64) { /* more streams than the merge holds: in turn */
			for (struct region *r = s->fifo_head; r && !rc; r = r->next)
				rc = visit(p, r, true, arg);
			continue;
		}
		cur[ns++] = s->fifo_head;
	}
	while (!rc) {
		unsigned best = ns;
		for (unsigned j = 0; j < ns; j++)
			if (cur[j] && (best == ns || cur[j]->seq < cur[best]->seq))
				best = j;
		if (best == ns)
			break;
		rc = visit(p, cur[best], true, arg);
		cur[best] = cur[best]->next;
	}
	return rc;
}

struct all_visit {
	struct plan *pl;
	const struct region *skip, *skip2;
};

static int all_region(vpmm_pool *p, struct region *r, bool others, void *arg)
{
	struct all_visit *v = arg;
	(void)others;
	if (v->pl->taken >= v->pl->target)
		return 1; /* enough */
	return r == v->skip || r == v->skip2 ? 0 : plan_region(p, v->pl, r);
}

/* VPMM_DEFRAG_ALL: every free handle that fits the hole, in the order of
 * each_free_region(); within a region, lowest address first. */
static int plan_harvest_all(vpmm_pool *p, struct plan *pl, struct stream *caller,
			    const struct region *skip, const struct region *skip2)
{
	struct all_visit v = {pl, skip, skip2};
	int rc = each_free_region(p, caller, all_region, &v);
	return rc > 0 ? 0 : rc;
}

struct handle_cand { /* a handle a defragmentation may move */
	struct region *r;   /* the free region it lies wholly inside */
	struct mapping *m;
	size_t order;       /* r's rank (harvest order), then address */
	bool others;        /* r is pending on another stream: costs a wait */
	bool take;
};

/* Largest first; the caller's and settled memory before other streams'. */
static int cand_by_size(const void *a, const void *b)
{
	const struct handle_cand *x = *(struct handle_cand *const *)a;
	const struct handle_cand *y = *(struct handle_cand *const *)b;
	if (x->others != y->others)
		return x->others ? 1 : -1;
	if (x->m->handle->size != y->m->handle->size)
		return x->m->handle->size < y->m->handle->size ? 1 : -1;
	return vpi_cmp_u64(x->order, y->order);
}

static int cand_push(struct handle_cand **c, size_t *n, size_t *cap, struct region *r,
		     struct mapping *m, bool others)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct handle_cand *t = realloc(*c, nc * sizeof(*t));
		if (!t)
			return -ENOMEM;
		*c = t;
		*cap = nc;
	}
	(*c)[*n] = (struct handle_cand){.r = r, .m = m, .order = *n, .others = others};
	(*n)++;
	return 0;
}

struct cand_visit {
	struct handle_cand *c;
	size_t n, cap;
	const struct region *skip, *skip2;
};

/* Every handle lying wholly inside r becomes a candidate. */
static int cand_region(vpmm_pool *p, struct region *r, bool others, void *arg)
{
	struct cand_visit *v = arg;
	CUdeviceptr end = r->va + r->size;
	int rc = 0;
	if (r == v->skip || r == v->skip2)
		return 0;
	for (struct mapping *m = vpi_mapping_from(p, r->chunk, r->va);
	     m && m->va + m->handle->size <= end && !rc; m = vpi_mapping_next(m))
		rc = cand_push(&v->c, &v->n, &v->cap, r, m, others);
	return rc;
}

/* VPMM_DEFRAG_LACKING: which free handles supply `target` bytes. A handle moved
 * beyond the lack stays free in the new span, behind the allocation and in
 * the same handle as its end: a piece no defragmentation can move again.
 * So the handles are chosen by size, largest first (fewest handles to remap)
 * among those that still fit the lack; the rest, if any, is covered by the
 * smallest single handle that covers it, before anything is created (a
 * creation grows the pool for good, an overshoot only until the allocation
 * is freed). The caller's and settled memory come before other streams'. */
int vpi_plan_harvest(vpmm_pool *p, struct plan *pl, struct stream *caller,
		     const struct region *skip1, const struct region *skip2)
{
	struct cand_visit v = {.skip = skip1, .skip2 = skip2};
	struct handle_cand *c, **by = NULL;
	size_t n, lim, i;
	int rc;

	if (p->cfg.defrag == VPMM_DEFRAG_ALL)
		return plan_harvest_all(p, pl, caller, skip1, skip2);
	/* a wait on each other stream is the same price: oldest first */
	rc = each_free_region(p, caller, cand_region, &v);
	c = v.c;
	n = v.n;
	if (!rc && n && !(by = malloc(n * sizeof(*by))))
		rc = -ENOMEM;
	if (rc || !n)
		goto out;
	for (i = 0; i < n; i++)
		by[i] = &c[i];
	qsort(by, n, sizeof(*by), cand_by_size);

	lim = pl->target / p->page * p->page;
	if (lim < pl->target) /* the lack is mapped in whole pages anyway */
		lim += p->page;
	if (lim > pl->hole_size)
		lim = pl->hole_size;
	for (i = 0; i < n && pl->taken < pl->target; i++)
		if (pl->taken + by[i]->m->handle->size <= lim) {
			by[i]->take = true;
			pl->taken += by[i]->m->handle->size;
		}
	if (pl->taken < pl->target) {
		struct handle_cand *best = NULL;
		size_t rest = pl->target - pl->taken;
		for (i = 0; i < n; i++) {
			struct handle_cand *x = by[i];
			if (x->take || x->m->handle->size < rest ||
			    pl->taken + x->m->handle->size > pl->hole_size)
				continue;
			if (!best || x->others < best->others ||
			    (x->others == best->others && x->m->handle->size < best->m->handle->size))
				best = x;
		}
		if (best) {
			best->take = true;
			pl->taken += best->m->handle->size;
		}
	}
	/* One harvest per run of adjacent chosen handles. Within a region the
	 * runs go highest address first: vpi_defrag() splits each off the end of
	 * what is left of the region. */
	for (i = n; i-- > 0 && !rc;) {
		size_t j = i;
		if (!c[i].take)
			continue;
		while (j > 0 && c[j - 1].take && c[j - 1].r == c[i].r &&
		       c[j - 1].m->va + c[j - 1].m->handle->size == c[j].m->va)
			j--;
		rc = plan_push(pl, (struct harvest){.r = c[i].r, .a = c[j].m->va,
						    .b = c[i].m->va + c[i].m->handle->size});
		i = j;
	}
out:
	free(by);
	free(c);
	return rc;
}

/* Order the device (or the CPU, for a caller without a stream) after the
 * work pending on each harvested region; find what each old VA waits for. */
int vpi_plan_events(vpmm_pool *p, struct plan *pl, struct stream *caller)
{
	struct event *waited = NULL;
	for (size_t i = 0; i < pl->n; i++) {
		struct harvest *h = &pl->h[i];
		struct stream *s = h->r->stream;
		int rc;
		if (!s)
			continue;
		rc = vpi_cover_event(p, s, h->r->epoch, &h->ev);
		if (rc)
			return rc;
		/* Held across the unlocked driver work, handed to the zombie. */
		if (h->ev)
			h->ev->refs++;
		if (!h->ev || s == caller || h->ev == waited)
			continue;
		CUresult r;
		if (caller) {
			r = DRV(p, VPMM_OP_STREAM_WAIT, stream_wait, caller->handle,
				h->ev->ev);
			p->st.stream_waits += r == CUDA_SUCCESS;
		} else {
			r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, h->ev->ev);
			if (r == CUDA_SUCCESS)
				h->ev->done = true;
		}
		if (r != CUDA_SUCCESS) {
			p->last_result = r;
			return vpi_cu_errno(r);
		}
		waited = h->ev;
	}
	return 0;
}
