/* chunk.c — the pool's VA reservations: adding a chunk as one hole, giving
 * back an unused last one, and each chunk's grain map (the per-grain
 * pointer to the live region there, which the lock-free free reads).
 *
 * Owns struct chunk (chunk.h). Calls region.c and handle.c (the home map).
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "chunk.h"
#include "handle.h"
#include "region.h"


/* Reserve another VA chunk (lock dropped for the driver call) and add it as
 * one hole. */
int vpi_chunk_add(vpmm_pool *p, size_t min, unsigned *index)
{
	min = vpi_whole_pages(p, min);
	size_t size = p->cfg.va_size > min ? p->cfg.va_size : min;
	CUdeviceptr va;
	CUresult r;
	int rc;

	if (p->nchunks == VPMM_MAX_CHUNKS)
		return -ENOMEM;
	vpi_mutex_unlock(&p->lock);
	r = p->drv->va_reserve(p->drv, size, &va);
	vpi_mutex_lock(&p->lock);
	p->st.driver_calls++;
	p->driver_calls[VPMM_OP_VA_RESERVE]++;
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		return vpi_cu_errno(r);
	}
	if (p->nchunks == VPMM_MAX_CHUNKS) { /* other threads took the last slots */
		DRV(p, VPMM_OP_VA_FREE, va_free, va, size);
		return -ENOMEM;
	}
	struct chunk *c = &p->chunks[p->nchunks];
	vpi_gmap_destroy(p, c); /* left by vpi_chunk_drop_if_unused() */
	vpi_home_map_destroy(p, c);
	*c = (struct chunk){.va = va, .size = size};
	rc = vpi_reserve_regions(p, 1);
	if (!rc)
		rc = vpi_gmap_create(p, c);
	if (!rc && (rc = vpi_home_map_create(p, c)))
		vpi_gmap_destroy(p, c);
	if (rc) {
		DRV(p, VPMM_OP_VA_FREE, va_free, va, size);
		return rc;
	}
	struct region *hole = vpi_region_new(p, R_HOLE, va, size, p->nchunks);
	*index = p->nchunks;
	__atomic_store_n(&p->nchunks, p->nchunks + 1, __ATOMIC_RELEASE);
	vpi_tree_insert(&p->holes, &hole->by_size);
	GAUGE_ADD(p, reserved, size);
	GAUGE_ADD(p, holes, size);
	return 0;
}

/* Give back chunk `index` if it is the last one and nothing but a hole: a
 * failed request leaves no VA behind. */
void vpi_chunk_drop_if_unused(vpmm_pool *p, unsigned index)
{
	struct chunk *c = &p->chunks[index];
	struct region probe = {.va = c->va}, *hole;
	if (index + 1 != p->nchunks)
		return;
	hole = REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
	if (!hole || hole->kind != R_HOLE || hole->va != c->va || hole->size != c->size)
		return;
	vpi_tree_remove(&p->holes, &hole->by_size);
	vpi_region_delete(p, hole);
	__atomic_store_n(&p->nchunks, p->nchunks - 1, __ATOMIC_RELEASE);
	/* Its grain map stays until the slot is reused or the pool goes: a
	 * lock-free lookup may still be reading it. */
	DRV(p, VPMM_OP_VA_FREE, va_free, c->va, c->size);
	GAUGE_SUB(p, reserved, c->size);
	GAUGE_SUB(p, holes, c->size);
}

int vpi_gmap_create(vpmm_pool *p, struct chunk *c)
{
	size_t bytes = c->size / p->grain * sizeof(struct region *);
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	c->gmap = m;
	return 0;
}

void vpi_gmap_destroy(vpmm_pool *p, struct chunk *c)
{
	if (c->gmap)
		munmap(c->gmap, c->size / p->grain * sizeof(struct region *));
	c->gmap = NULL;
}

/* Every grain of a slab, else the first grain of the allocation. */
void vpi_gmap_publish(vpmm_pool *p, struct region *r, bool publish)
{
	size_t n = r->small ? r->size / p->grain : 1;
	struct region **slot = vpi_gmap_slot(p, r->va);
	for (size_t i = 0; slot && i < n; i++)
		__atomic_store_n(&slot[i], publish ? r : NULL, __ATOMIC_RELEASE);
}
