/* snapshot.c — vpmm_pool_snapshot(): configuration, stats, chunks and regions
 * copied under one hold of the pool's lock (see snapshot.h), and where the
 * free memory lies by the handles under it (the snapshot's free_split).
 * The lock is held only for the copy: no allocation, no I/O, no formatting
 * inside it. The streams' caches (front.c) are read under their own locks,
 * taken after the pool's, as vpmm_pool_stats() does.
 *
 * Calls pool.c (vpi_stats_locked, vpmm_pool_stats),
 * the handle map (handle.h's inline walk) and the tree.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "front.h"
#include "handle.h"
#include "pool.h"
#include "region.h"
#include "snapshot.h"

#define REGION(n) vpi_container_of(n, struct region, by_va)

struct parked { /* a whole allocation in a stream's cache */
	const struct region *r;
	CUstream stream; /* 0 for the cache of VPMM_NO_STREAM frees */
	bool settled;    /* in that cache: no pending work */
};

/* A busy region (the lock dropped for driver work on it) counts as what it
 * was, as everywhere else in the pool. */
static enum vpmm_region_kind public_kind(const struct region *r)
{
	switch (r->kind == R_BUSY ? r->was : r->kind) {
	case R_LIVE:
		return VPMM_REGION_LIVE;
	case R_FREE:
		return VPMM_REGION_FREE;
	case R_HOLE:
		return VPMM_REGION_HOLE;
	case R_ZOMBIE:
	case R_BUSY:
		break;
	}
	return VPMM_REGION_ZOMBIE;
}

const char *vpmm_region_kind_name(enum vpmm_region_kind kind)
{
	switch (kind) {
	case VPMM_REGION_LIVE:
		return "live";
	case VPMM_REGION_FREE:
		return "free";
	case VPMM_REGION_HOLE:
		return "hole";
	case VPMM_REGION_ZOMBIE:
		return "zombie";
	}
	return "unknown";
}

static int by_region(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)((const struct parked *)a)->r;
	uintptr_t y = (uintptr_t)((const struct parked *)b)->r;
	return x < y ? -1 : x > y;
}

/* Reads every stream's cache (pool lock held): the whole allocations parked
 * there (up to cap; *total says how many there are). */
static size_t collect_parked(vpmm_pool *p, struct parked *out, size_t cap, size_t *total)
{
	size_t n = 0;
	struct front *f = &p->sync_front;
	struct stream *owner = NULL, *next = p->streams;
	*total = 0;
	for (;;) {
		struct fentry *e;
		vpi_mutex_lock(&f->lock);
		VPMM_FRONT_FOR_EACH(f, e) {
			if (e->r->small)
				continue; /* a block inside a live slab */
			if (n < cap)
				out[n++] = (struct parked){ e->r, owner ? owner->handle : 0,
							    !owner };
			(*total)++;
		}
		vpi_mutex_unlock(&f->lock);
		if (!next)
			break;
		owner = next;
		f = &next->front;
		next = next->next;
	}
	return n;
}

/* The free split of the regions copied into s: each home mapping against
 * the free regions over it, both in address order. A zombie's mappings lie
 * under no free region and count nowhere. */
static void split_locked(vpmm_pool *p, struct vpmm_snapshot *s)
{
	struct vpmm_free_split fs = {0};
	size_t j = 0;
	for (size_t i = 0; i < s->nregions; i++)
		if (s->regions[i].kind == VPMM_REGION_FREE && s->regions[i].size > fs.largest)
			fs.largest = s->regions[i].size;
	for (struct vpi_tnode *t = vpi_tree_first(&p->maps); t; t = vpi_tree_next(t)) {
		const struct mapping *m = MAP(t);
		CUdeviceptr a = m->va, b = a + m->handle->size;
		while (j < s->nregions && s->regions[j].va + s->regions[j].size <= a)
			j++;
		uint64_t fr = 0;
		for (size_t k = j; k < s->nregions && s->regions[k].va < b; k++) {
			const struct vpmm_snap_region *r = &s->regions[k];
			if (r->kind != VPMM_REGION_FREE)
				continue;
			CUdeviceptr lo = r->va > a ? r->va : a;
			CUdeviceptr hi = r->va + r->size < b ? r->va + r->size : b;
			fr += hi - lo;
		}
		if (fr == m->handle->size) {
			fs.whole += fr;
			fs.whole_handles++;
		} else if (fr) {
			fs.stranded += fr;
			fs.stranded_handles++;
		}
	}
	s->free_split = fs;
}

/* Copies into `s` if its arrays are large enough; returns false (copying
 * nothing) otherwise, with the sizes needed in need[0..2] (chunks, regions,
 * parked allocations). */
static bool copy_locked(vpmm_pool *p, struct vpmm_snapshot *s, struct parked *pk,
			const size_t cap[3], size_t need[3])
{
	size_t npk = collect_parked(p, pk, cap[2], &need[2]);
	need[0] = p->nchunks;
	need[1] = p->regions.count;
	if (need[0] > cap[0] || need[1] > cap[1] || need[2] > cap[2])
		return false;
	qsort(pk, npk, sizeof(*pk), by_region);

	s->cfg = p->cfg;
	s->cfg.page_size = p->page;
	vpi_stats_locked(p, &s->stats); /* exactly as vpmm_pool_stats() */

	for (unsigned i = 0; i < p->nchunks; i++)
		s->chunks[i] = (struct vpmm_chunk_info){ p->chunks[i].va, p->chunks[i].size };
	size_t n = 0;
	for (struct vpi_tnode *t = vpi_tree_first(&p->regions); t && n < cap[1];
	     t = vpi_tree_next(t), n++) {
		const struct region *r = REGION(t);
		struct vpmm_snap_region *o = &s->regions[n];
		*o = (struct vpmm_snap_region){
			.va = r->va,
			.size = r->size,
			.kind = public_kind(r),
			.stream = r->stream ? r->stream->handle : 0,
			.settled = r->kind == R_FREE && !r->stream,
			.small = r->kind == R_LIVE && r->small,
			.chunk = r->chunk,
		};
		struct parked key = { .r = r };
		const struct parked *hit =
			r->kind == R_LIVE && !r->small && npk
				? bsearch(&key, pk, npk, sizeof(*pk), by_region)
				: NULL;
		if (hit) { /* freed by the program, kept in a cache */
			o->kind = VPMM_REGION_FREE;
			o->stream = hit->stream;
			o->settled = hit->settled;
			o->parked = true;
		}
	}
	s->nchunks = p->nchunks;
	s->nregions = n;
	split_locked(p, s);
	return true;
}

int vpmm_pool_snapshot(vpmm_pool *p, struct vpmm_snapshot *out)
{
	size_t need[3];
	memset(out, 0, sizeof(*out));
	vpi_mutex_lock(&p->lock);
	need[0] = p->nchunks;
	need[1] = p->regions.count;
	need[2] = (p->nhashed + 1) * p->cfg.front_entries; /* at most parked */
	vpi_mutex_unlock(&p->lock);

	/* The pool may change between the two holds: leave room for growth and
	 * retry with the sizes seen if it outgrew even that. */
	for (int attempt = 0; attempt < 16; attempt++) {
		size_t cap[3] = { need[0] + 4, need[1] + need[1] / 8 + 64,
				  need[2] + 4 * VPMM_FRONT_MAX };
		struct vpmm_chunk_info *chunks = calloc(cap[0], sizeof(*chunks));
		struct vpmm_snap_region *regions = calloc(cap[1], sizeof(*regions));
		struct parked *pk = calloc(cap[2], sizeof(*pk));
		if (!chunks || !regions || !pk) {
			free(chunks);
			free(regions);
			free(pk);
			return -ENOMEM;
		}
		out->chunks = chunks;
		out->regions = regions;
		vpi_mutex_lock(&p->lock);
		bool ok = copy_locked(p, out, pk, cap, need);
		vpi_mutex_unlock(&p->lock);
		free(pk);
		if (ok)
			return 0;
		free(chunks);
		free(regions);
		memset(out, 0, sizeof(*out));
	}
	return -ENOMEM; /* a pool growing faster than we can copy: give up */
}

void vpmm_pool_summary(vpmm_pool *p, struct vpmm_config *cfg, struct vpmm_stats *stats)
{
	struct vpmm_config c;
	vpi_mutex_lock(&p->lock);
	c = p->cfg;
	c.page_size = p->page;
	vpi_mutex_unlock(&p->lock);
	*cfg = c;
	vpmm_pool_stats(p, stats); /* its own hold: the config does not change */
}

void vpmm_snapshot_free(struct vpmm_snapshot *s)
{
	free(s->chunks);
	free(s->regions);
	memset(s, 0, sizeof(*s));
}
