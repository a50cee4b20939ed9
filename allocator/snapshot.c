/* snapshot.c — vpmm_pool_snapshot(): configuration, stats, chunks and regions
 * copied under one hold of the pool's lock (see snapshot.h). The lock is held
 * only for the copy: no allocation, no I/O, no formatting inside it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"
#include "snapshot.h"

#define REGION(n) vpmm_container_of(n, struct region, by_va)

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

/* Copies into `s` if its arrays are large enough; returns false (copying
 * nothing) otherwise, with the sizes needed in *nchunks / *nregions. */
static bool copy_locked(vpmm_pool *p, struct vpmm_snapshot *s, size_t chunk_cap,
			size_t region_cap, size_t *nchunks, size_t *nregions)
{
	*nchunks = p->nchunks;
	*nregions = p->regions.count;
	if (*nchunks > chunk_cap || *nregions > region_cap)
		return false;
	s->cfg = p->cfg;
	s->cfg.page_size = p->page;
	s->stats = p->st;
	for (unsigned i = 0; i < p->nchunks; i++)
		s->chunks[i] = (struct vpmm_chunk_info){ p->chunks[i].va, p->chunks[i].size };
	size_t n = 0;
	for (struct vpmm_tnode *t = vpmm_tree_first(&p->regions); t && n < region_cap;
	     t = vpmm_tree_next(t), n++) {
		const struct region *r = REGION(t);
		s->regions[n] = (struct vpmm_region_info){
			.va = r->va,
			.size = r->size,
			.kind = public_kind(r),
			.stream = r->stream ? r->stream->handle : 0,
			.settled = r->kind == R_FREE && !r->stream,
			.chunk = r->chunk,
		};
	}
	s->nchunks = p->nchunks;
	s->nregions = n;
	return true;
}

int vpmm_pool_snapshot(vpmm_pool *p, struct vpmm_snapshot *out)
{
	size_t need_chunks, need_regions;
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&p->lock);
	need_chunks = p->nchunks;
	need_regions = p->regions.count;
	pthread_mutex_unlock(&p->lock);

	/* The pool may change between the two holds: leave room for growth and
	 * retry with the sizes seen if it outgrew even that. */
	for (int attempt = 0; attempt < 16; attempt++) {
		size_t ccap = need_chunks + 4, rcap = need_regions + need_regions / 8 + 64;
		struct vpmm_chunk_info *chunks = calloc(ccap, sizeof(*chunks));
		struct vpmm_region_info *regions = calloc(rcap, sizeof(*regions));
		if (!chunks || !regions) {
			free(chunks);
			free(regions);
			return -ENOMEM;
		}
		out->chunks = chunks;
		out->regions = regions;
		pthread_mutex_lock(&p->lock);
		bool ok = copy_locked(p, out, ccap, rcap, &need_chunks, &need_regions);
		pthread_mutex_unlock(&p->lock);
		if (ok)
			return 0;
		free(chunks);
		free(regions);
		memset(out, 0, sizeof(*out));
	}
	return -ENOMEM; /* a pool growing faster than we can copy: give up */
}

void vpmm_pool_summary(vpmm_pool *p, struct vpmm_config *cfg,
		       struct vpmm_stats *stats)
{
	pthread_mutex_lock(&p->lock);
	*cfg = p->cfg;
	cfg->page_size = p->page;
	*stats = p->st;
	pthread_mutex_unlock(&p->lock);
}

void vpmm_snapshot_free(struct vpmm_snapshot *s)
{
	free(s->chunks);
	free(s->regions);
	memset(s, 0, sizeof(*s));
}
