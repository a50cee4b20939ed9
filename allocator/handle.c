/* handle.c — the handle map: the tree of mappings by address (a physical
 * handle mapped at an address) and each chunk's home map (per page, the home
 * mapping over it).
 *
 * Owns struct handle and struct mapping (handle.h). Calls the tree and the
 * driver. Lock held throughout.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "handle.h"

int vpi_mapping_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	return vpi_cmp_u64(vpi_container_of(a, struct mapping, by_va)->va,
		       vpi_container_of(b, struct mapping, by_va)->va);
}


/* Placement asks, for a page of free memory, which handle lies over it; the
 * map answers in O(1) where the tree of mappings takes O(log n) (a dozen
 * lookups per region looked at). Reserved like the grain map: untouched
 * pages of it cost nothing. */
int vpi_home_map_create(vpmm_pool *p, struct chunk *c)
{
	size_t bytes = c->size / p->page * sizeof(struct mapping *);
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	c->home = m;
	return 0;
}

void vpi_home_map_destroy(vpmm_pool *p, struct chunk *c)
{
	if (c->home)
		munmap(c->home, c->size / p->page * sizeof(struct mapping *));
	c->home = NULL;
}

/* m becomes the home of its pages (home), or stops being it. */
void vpi_home_map_set(vpmm_pool *p, unsigned chunk, struct mapping *m, bool home)
{
	struct chunk *c = &p->chunks[chunk];
	struct mapping **e = &c->home[(m->va - c->va) / p->page];
	for (size_t i = 0; i < m->handle->size / p->page; i++)
		e[i] = home ? m : NULL;
}

/* Drop one mapping record; the handle goes with its last mapping. */
void vpi_mapping_forget(vpmm_pool *p, struct mapping *m)
{
	vpi_tree_remove(&p->maps, &m->by_va);
	if (--m->handle->nmaps == 0) {
		DRV(p, VPMM_OP_MEM_RELEASE, mem_release, m->handle->cu);
		free(m->handle);
	}
	free(m);
}
