/* region.h — regions and their indexes (region.c): a chunk's VA cut into
 * live, free, hole, zombie and busy regions; the address tree, the free
 * indexes (per stream and settled), the holes and the zombie list; the
 * claim bit the lock-free free takes. Lowest room: region.c calls only the
 * tree.
 */
#ifndef VPMM_REGION_H
#define VPMM_REGION_H

#include <stdbool.h>
#include <stdint.h>

#include "tree.h"
#include "vpmm.h"

struct stream;
struct event;
struct handle;

/* R_BUSY: out of every index while the lock is dropped for driver work on
 * it (a defragmentation mapping into it, a zombie being unmapped); `was`
 * says what it counts as meanwhile. */
enum rkind { R_LIVE, R_FREE, R_HOLE, R_ZOMBIE, R_BUSY };

struct region {
	struct vpi_tnode by_va;   /* pool->regions: every region */
	struct vpi_tnode by_size; /* FREE: stream's or settled tree; HOLE: holes */
	struct region *prev, *next; /* pending FREE: stream fifo; ZOMBIE: zombie list */
	/* Its neighbours in pool->regions, by address (NULL at either end),
	 * linked where the tree is changed (vpi_region_new, _new_after and
	 * _delete): a neighbour in two loads, where the tree's walk climbed
	 * parent links. The release walk asks for both of every parked
	 * entry on most misses (front.c). */
	struct region *lower, *upper;
	CUdeviceptr va;
	size_t size;              /* > 0, multiple of the grain */
	enum rkind kind;
	enum rkind was;           /* BUSY: its kind before, and after a failure */
	unsigned chunk;           /* index into pool->chunks; never spans two */
	struct stream *stream;    /* pending FREE only; NULL = settled */
	uint64_t epoch;           /* pending FREE: its stream's epoch at the free */
	uint64_t seq;             /* FREE: pool-wide order of its (latest) free */
	struct event *ev;         /* ZOMBIE: unmap once done; NULL = at once */
	struct slab *small; /* LIVE only: carved into sub-grain blocks */
	/* Last: vpi_region_new() clears the fields above and keeps this one.
	 * Atomic. Bit 0 (VPMM_CLAIMED): a free owns the region, or none may
	 * take it; clear only on a plain live allocation that is neither
	 * parked in a stream's cache nor being freed. Every other region
	 * (free, hole, zombie, busy, a slab) has it set. The other bits count
	 * the times the struct became live, so that a lock-free free holding
	 * a pointer read before the struct was reused cannot claim it
	 * (front.c). */
	uint32_t claim;
};

#define VPMM_CLAIMED 1u

static inline bool vpi_claimed(const struct region *r)
{
	return __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE) & VPMM_CLAIMED;
}

/* Claims r for its free. `seen` is r->claim as read before the caller
 * checked that r is the allocation it frees: false if r was claimed, or
 * became live again, since. */
static inline bool vpi_claim(struct region *r, uint32_t seen)
{
	return !(seen & VPMM_CLAIMED) &&
	       __atomic_compare_exchange_n(&r->claim, &seen, seen | VPMM_CLAIMED, false,
					   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline void vpi_unclaim(struct region *r)
{
	__atomic_fetch_and(&r->claim, ~VPMM_CLAIMED, __ATOMIC_RELEASE);
}

#define REG(n, member) ((n) ? vpi_container_of(n, struct region, member) : NULL)

static inline struct region *vpi_region_next(struct region *r)
{
	return r->upper;
}

static inline struct region *vpi_region_prev(struct region *r)
{
	return r->lower;
}

int vpi_region_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b);
int vpi_region_by_size(const struct vpi_tnode *a, const struct vpi_tnode *b);
/* The region holding ptr (the last one at or below it), or NULL. */
struct region *vpi_find_region(vpmm_pool *p, CUdeviceptr ptr);
/* Region structs are taken from a cache that is filled before an operation
 * mutates anything, so a host allocation failure can never strike halfway. */
int vpi_reserve_regions(vpmm_pool *p, unsigned n);
struct region *vpi_region_new(vpmm_pool *p, enum rkind kind, CUdeviceptr va,
			      size_t size, unsigned chunk);
/* The same, for a region that lies right after `before` in its chunk:
 * no search of the address tree. */
struct region *vpi_region_new_after(vpmm_pool *p, struct region *before, enum rkind kind,
				       CUdeviceptr va, size_t size);
void vpi_region_delete(vpmm_pool *p, struct region *r);
/* A FREE region into (out of) its stream's index and fifo or the settled
 * index; no merging. */
void vpi_free_index(vpmm_pool *p, struct region *r);
void vpi_free_unindex(vpmm_pool *p, struct region *r);
/* r (FREE, in the regions tree, in no index) absorbs `other`, its neighbour. */
void vpi_free_absorb(vpmm_pool *p, struct region *r, struct region *other);
/* Index a FREE region, merging it with mergeable neighbours. */
struct region *vpi_free_insert(vpmm_pool *p, struct region *r);
void vpi_hole_insert(vpmm_pool *p, struct region *r);
void vpi_zombie_append(vpmm_pool *p, struct region *z);
struct region *vpi_split_off(vpmm_pool *p, struct region *r, CUdeviceptr at);
void vpi_busy_take(vpmm_pool *p, struct region *r);
void vpi_busy_return(vpmm_pool *p, struct region *r);
/* Whether free memory touches r, and not both memory that s may place in
 * and memory pending on another stream (given back, r would join them). */
bool vpi_region_beside_free_locked(struct region *r, const struct stream *s);

#endif
