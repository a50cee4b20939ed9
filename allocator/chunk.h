/* chunk.h — the pool's VA reservations (chunk.c) and the maps each holds:
 * the grain map, which the lock-free free reads to find an allocation from
 * its pointer, and the home map (handle.c). chunk.c calls region.c and
 * handle.c.
 */
#ifndef VPMM_CHUNK_H
#define VPMM_CHUNK_H

#include "pool.h"

struct mapping;

struct chunk { /* one VA reservation */
	CUdeviceptr va;
	size_t size;          /* multiple of page_size */
	struct region **gmap; /* grain map (front.c): a live region's first grain,
			       * every grain of a slab; NULL elsewhere */
	struct mapping **home; /* home map, per page: the home mapping over it
				* where the page is live or free memory (and
				* busy regions taken from free memory); NULL over
				* holes, zombies and a span being mapped.
				* Pool lock. For placement (place.c) */
};

/* Reserve another VA chunk (lock dropped for the driver call) and add it as
 * one hole. */
int vpi_chunk_add(vpmm_pool *p, size_t min, unsigned *index);
/* Give back chunk `index` if it is the last one and nothing but a hole. */
void vpi_chunk_drop_if_unused(vpmm_pool *p, unsigned index);

int vpi_gmap_create(vpmm_pool *p, struct chunk *c);
void vpi_gmap_destroy(vpmm_pool *p, struct chunk *c);
void vpi_gmap_publish(vpmm_pool *p, struct region *r, bool publish);

/* The grain map's entry for va; NULL outside every chunk. Lock-free: chunks
 * are a fixed array published by an atomic count. */
static inline struct region **vpi_gmap_slot(vpmm_pool *p, CUdeviceptr va)
{
	unsigned n = __atomic_load_n(&p->nchunks, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n; i++) {
		struct chunk *c = &p->chunks[i];
		if (va >= c->va && va - c->va < c->size)
			return &c->gmap[(va - c->va) >> p->grain_shift];
	}
	return NULL;
}

#endif
