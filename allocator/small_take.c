/* small_take.c — the small blocks' malloc path: a block from a slab of the
 * caller's with room, else from a new slab taken from the pool (take.c).
 *
 * Above small.c, which frees blocks and gives empty slabs back and which the
 * take path itself calls (its last resort trims them): only this file takes
 * pages for slabs. Calls small.c, take.c and chunk.c (the grain map). Lock
 * held.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "pool.h"
#include "region.h"
#include "small.h"
#include "take.h"

static int slab_new(vpmm_pool *p, struct stream *owner, unsigned cls,
		    struct slab **out)
{
	struct small_state *s = vpi_small_st(p);
	size_t nblocks = s->slab_bytes[cls] / s->block[cls];
	size_t words = (nblocks + 63) / 64;
	/* Whole cache lines of its own: the front path sets bits of `parked`
	 * from any thread, and slabs of different streams side by side in the
	 * heap would make threads that share nothing wait on each other. */
	size_t bytes = (sizeof(struct slab) + 2 * words * sizeof(uint64_t) + 63) & ~(size_t)63;
	struct slab *sl = s->spare[cls];
	struct region *r;
	int rc;
	if (sl) {
		/* A stopped lock-free free may still read it: its class and
		 * sizes stay as they are, and its bitmaps are clear already
		 * (it was released empty). */
		s->spare[cls] = sl->next;
	} else {
		if (!(sl = aligned_alloc(64, bytes)))
			return -ENOMEM;
		memset(sl, 0, bytes);
		sl->cls = cls;
		sl->nblocks = (uint32_t)nblocks;
		sl->words = (uint32_t)words;
	}
	/* The region comes claimed, and stays so: its blocks are claimed
	 * one by one. */
	rc = vpi_take_locked(p, owner, s->slab_bytes[cls], NULL, 0, &r);
	if (rc) {
		sl->next = s->spare[cls]; /* never freed while the pool lives */
		s->spare[cls] = sl;
		return rc;
	}
	sl->r = r;
	sl->owner = owner;
	if (owner)
		owner->slabs++;
	sl->nfree = (uint32_t)nblocks;
	sl->hint = 0;
	sl->listed = false;
	sl->deferred = NULL;
	sl->prev = sl->next = NULL;
	__atomic_store_n(&r->small, sl, __ATOMIC_RELEASE);
	vpi_gmap_publish(p, r, true); /* now every page leads to the slab */
	s->slabs++;
	*out = sl;
	return 0;
}

int vpi_small_malloc_locked(vpmm_pool *p, struct stream *caller, size_t size,
			     CUdeviceptr *out)
{
	struct small_state *s = vpi_small_st(p);
	unsigned cls = vpi_small_class_of(s, size);
	struct slab **head = vpi_small_partial_list(p, caller, cls), *sl;
	int rc;
	if (!head)
		return -ENOMEM;
	for (sl = *head; sl; sl = sl->next) {
		if (!sl->nfree)
			vpi_small_drain_deferred(p, sl, false);
		if (sl->nfree)
			break;
	}
	if (!sl) {
		rc = slab_new(p, caller, cls, &sl);
		if (rc)
			return rc;
		vpi_small_list_add(head, sl);
	}
	uint32_t words = (sl->nblocks + 63) / 64, w = sl->hint;
	while (!~sl->used[w] || w * 64 + (uint32_t)__builtin_ctzll(~sl->used[w]) >= sl->nblocks)
		w = (w + 1) % words;
	uint32_t b = w * 64 + (uint32_t)__builtin_ctzll(~sl->used[w]);
	__atomic_fetch_or(&sl->used[w], 1ull << (b % 64), __ATOMIC_RELEASE);
	sl->hint = w;
	if (--sl->nfree == 0 && !sl->deferred)
		vpi_small_list_del(head, sl);
	*out = sl->r->va + (CUdeviceptr)b * s->block[cls];
	return 0;
}
