/* handle.h — the handle map (handle.c): every physical handle and where it
 * is mapped (struct mapping, in pool->maps by address), and the home map of
 * each chunk, which names for every page of live or free memory the home
 * mapping over it. handle.c calls the tree and the driver.
 */
#ifndef VPMM_HANDLE_H
#define VPMM_HANDLE_H

#include "chunk.h"
#include "pool.h"

/* A physical handle. Mapped whole: at exactly one "home" address inside a
 * live or free region, plus one address per zombie still holding it. */
struct handle {
	CUmemGenericAllocationHandle cu;
	size_t size;     /* multiple of page_size */
	unsigned nmaps;  /* mappings pointing here (home + zombies) */
	unsigned seen_maps, seen_homes; /* scratch of vpmm_pool_check() */
};

struct mapping { /* a home mapped at va; in pool->maps by va */
	struct vpi_tnode by_va;
	CUdeviceptr va;
	struct handle *handle;
};

#define MAP(n) ((n) ? vpi_container_of(n, struct mapping, by_va) : NULL)

int vpi_mapping_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b);

static inline struct mapping *vpi_mapping_ceil(vpmm_pool *p, CUdeviceptr va)
{
	struct mapping probe = {.va = va};
	return MAP(vpi_tree_ceil(&p->maps, &probe.by_va));
}

static inline struct mapping *vpi_mapping_next(struct mapping *m)
{
	return MAP(vpi_tree_next(&m->by_va));
}

/* The handle over va, which lies in live or free memory of `chunk`. */
static inline struct mapping *vpi_home_at(vpmm_pool *p, unsigned chunk, CUdeviceptr va)
{
	struct chunk *c = &p->chunks[chunk];
	return c->home[vpi_page_index(p, va - c->va)];
}

/* The first mapping at or after va, which lies in live, free or busy
 * memory of `chunk`: the home map gives the handle over it at once, where the
 * tree would take a dozen comparisons; a defragmentation asks for each
 * region it looks at and each piece it moves. One step past it is enough
 * because no mapping starts inside a home mapping. Over a page the map
 * leaves empty (holes, zombies) it asks the tree. */
static inline struct mapping *vpi_mapping_from(vpmm_pool *p, unsigned chunk, CUdeviceptr va)
{
	struct mapping *m = vpi_home_at(p, chunk, va);
	if (!m)
		return vpi_mapping_ceil(p, va);
	return m->va >= va ? m : vpi_mapping_next(m);
}

int vpi_home_map_create(vpmm_pool *p, struct chunk *c);
void vpi_home_map_destroy(vpmm_pool *p, struct chunk *c);
/* m becomes the home of its pages (home), or stops being it. */
void vpi_home_map_set(vpmm_pool *p, unsigned chunk, struct mapping *m, bool home);
/* Drop one mapping record; the handle goes with its last mapping. */
void vpi_mapping_forget(vpmm_pool *p, struct mapping *m);

#endif
