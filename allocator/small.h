/* small.h — requests under a grain, carved in size classes from pool memory:
 * blocks, parks and frees (small.c), and the malloc path that takes a new
 * slab from the pool (small_take.c). small.c calls give.c and stream.c;
 * small_take.c calls small.c, take.c and chunk.c.
 */
#ifndef VPMM_SMALL_H
#define VPMM_SMALL_H

#include <stdbool.h>
#include <stdio.h>

#include "pool.h"
#include "vpmm.h"

struct region;
struct stream;

#define MIN_BLOCK 512u
#define MIN_BLOCKS_PER_SLAB 8u
#define MAX_CLASSES 96u

struct deferred { /* a block freed on a stream other than the slab's */
	uint32_t block;
	struct event *ev; /* NULL: complete */
	struct deferred *next;
};

struct slab {
	struct region *r;          /* the live region it carves */
	struct stream *owner;      /* NULL: synchronous callers */
	unsigned cls;
	uint32_t nblocks, nfree;   /* nfree counts bits clear in `used` */
	uint32_t hint;             /* a word of `used` that may have a clear bit */
	bool listed;               /* in its owner's partial list of cls, iff
				    * it has a free or a deferred block */
	struct deferred *deferred; /* blocks freed elsewhere, still marked used */
	struct slab *prev, *next; /* owner's partial list of cls */
	/* Two bitmaps of `words` words each: used (handed out, parked or
	 * deferred; written under the pool lock) then parked (freed but not yet
	 * free: in a stream's cache or deferred; atomic, front.c sets it). */
	uint32_t words;
	uint64_t used[];
};

struct small_state {
	size_t max;                   /* largest request served here */
	unsigned nclasses;
	size_t block[MAX_CLASSES];    /* class sizes, ascending */
	size_t slab_bytes[MAX_CLASSES];
	struct slab *sync_partial[MAX_CLASSES]; /* owner NULL */
	/* Released slabs' structs, for the next slab of their class: never
	 * freed while the pool lives, since a lock-free free may still hold
	 * one it read from its region (front.c). Chained by `next`. */
	struct slab *spare[MAX_CLASSES];
	/* The one slab of each class allowed to stay empty: NULL or a live
	 * slab of that class, which may have blocks out again since (its
	 * owner took one). Every slab of the class with no block out (none
	 * handed out, parked or deferred) is this one: vpmm_pool_check(). */
	struct slab *kept[MAX_CLASSES];
	size_t slabs;
	size_t deferred; /* blocks waiting for another stream's work */
};

static inline struct small_state *vpi_small_st(vpmm_pool *p)
{
	return p->small;
}

static inline void vpi_small_list_add(struct slab **head, struct slab *sl)
{
	sl->prev = NULL;
	sl->next = *head;
	if (*head)
		(*head)->prev = sl;
	*head = sl;
	sl->listed = true;
}

static inline void vpi_small_list_del(struct slab **head, struct slab *sl)
{
	if (sl->prev)
		sl->prev->next = sl->next;
	else
		*head = sl->next;
	if (sl->next)
		sl->next->prev = sl->prev;
	sl->prev = sl->next = NULL;
	sl->listed = false;
}

static inline unsigned vpi_small_class_of(const struct small_state *s, size_t size)
{
	unsigned lo = 0, hi = s->nclasses - 1;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		if (s->block[mid] >= size)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* small.c and small_take.c (vpi_small_malloc_locked): allocations of at
 * most vpi_small_max() bytes, carved from pool memory in size classes. Lock
 * held. */
size_t vpi_small_max(const vpmm_pool *p);
int vpi_small_init(vpmm_pool *p);
void vpi_small_fini(vpmm_pool *p);
int vpi_small_malloc_locked(vpmm_pool *p, struct stream *caller, size_t size,
			     CUdeviceptr *out);
/* `claimed`: the caller holds the block's park bit (a cache's entry),
 * and still holds it if the free fails (the event for s could not be
 * made); else the free claims it, and fails if another free has. */
int vpi_small_free_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   struct stream *s, uint64_t epoch, bool claimed);
int vpi_small_find_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   CUdeviceptr *base, size_t *size);
size_t vpi_small_check_locked(vpmm_pool *p, FILE *log);
/* The program destroyed s (dead already): its kept empty slabs go back,
 * since it can have no malloc again. */
void vpi_small_stream_gone_locked(vpmm_pool *p, struct stream *s);
/* Give every empty slab back to the pool (even the last of its class). */
size_t vpi_small_trim_locked(vpmm_pool *p);
/* Free deferred blocks whose stream completed; return surplus empty slabs. */
void vpi_small_drain_locked(vpmm_pool *p);
size_t vpi_small_deferred(const vpmm_pool *p);
size_t vpi_small_class_size(const vpmm_pool *p, size_t size);
/* Lock-free marks of a block freed but not yet free (front.c): the park
 * is the block's claim, as VPMM_CLAIMED is a whole allocation's. park: 0,
 * or -EINVAL if ptr is not a handed-out, unparked block of sl, the slab
 * the caller read from r (r->small may have changed since); *size = its
 * class. */
int vpi_small_park(vpmm_pool *p, struct slab *sl, struct region *r,
		    CUdeviceptr ptr, size_t *size);
void vpi_small_unpark(vpmm_pool *p, struct slab *sl, struct region *r,
		       CUdeviceptr ptr);
bool vpi_small_is_parked(vpmm_pool *p, struct region *r, CUdeviceptr ptr);
/* Lock-free, for the owner of the block at ptr before it frees it: 0 and
 * the block's class size, or -EINVAL if ptr is not a handed-out, unparked
 * block of sl (read from r, which may have changed since). */
int vpi_small_find_own(vpmm_pool *p, struct slab *sl, struct region *r, CUdeviceptr ptr,
		       size_t *size);

/* The list of owner's slabs of class cls with room; NULL without memory. */
struct slab **vpi_small_partial_list(vpmm_pool *p, struct stream *owner,
					   unsigned cls);
/* Deferred blocks of sl whose stream completed become free; `wait`: wait
 * on the CPU for each pending event. */
void vpi_small_drain_deferred(vpmm_pool *p, struct slab *sl, bool wait);

#endif
