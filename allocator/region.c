/* region.c — regions and their indexes: the address tree of every region,
 * the free indexes (each stream's pending ones by size and in free order,
 * the settled ones by size), the holes, the zombie list, the region structs'
 * cache, and the moves between them (merging, splitting, busy and back).
 *
 * Owns struct region (region.h). Lowest room of the pool: calls only the
 * tree. Lock held throughout.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "region.h"

int vpi_region_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	return vpi_cmp_u64(vpi_container_of(a, struct region, by_va)->va,
		       vpi_container_of(b, struct region, by_va)->va);
}

int vpi_region_by_size(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	const struct region *x = vpi_container_of(a, struct region, by_size);
	const struct region *y = vpi_container_of(b, struct region, by_size);
	int c = vpi_cmp_u64(x->size, y->size);
	return c ? c : vpi_cmp_u64(x->va, y->va);
}

bool vpi_region_beside_free_locked(struct region *r, const struct stream *s)
{
	struct region *side[2] = {vpi_region_prev(r), vpi_region_next(r)};
	bool mine = false, other = false;
	for (int i = 0; i < 2; i++) {
		struct region *n = side[i];
		if (!n || n->kind != R_FREE || n->chunk != r->chunk ||
		    (i ? r->va + r->size != n->va : n->va + n->size != r->va))
			continue;
		if (n->stream && n->stream != s)
			other = true;
		else
			mine = true;
	}
	/* Between free memory s may place in and memory pending on another
	 * stream, r given back would join the two in that stream's order: s
	 * could lose the very place it was after (found by a review). Beside
	 * the other stream's alone, r joins it; on scratch_streams that
	 * packed better than keeping r (docs/design.md). */
	return (mine || other) && !(mine && other);
}


/* Region structs are taken from a cache that is filled before an operation
 * mutates anything, so a host allocation failure can never strike halfway.
 * The cache is the pool's, not the caller's: a reservation holds only while
 * the lock does. Whoever takes the lock while it is dropped (the reclaimer
 * splitting a zombie, a trim, another caller) may use the structs, so after
 * every drop (driver work, vpi_chunk_add, vpi_reclaim_zombies,
 * vpi_trim_locked, a wait) the caller reserves again before its next
 * vpi_region_new(). */
int vpi_reserve_regions(vpmm_pool *p, unsigned n)
{
	unsigned have = 0;
	for (struct region *r = p->region_cache; r && have < n; r = r->next)
		have++;
	for (; have < n; have++) {
		/* Cache lines of its own: front.c flips `claim` of live
		 * regions from any thread without the lock. */
		struct region *r = aligned_alloc(64, (sizeof(*r) + 63) & ~(size_t)63);
		if (!r)
			return -ENOMEM;
		r->claim = VPMM_CLAIMED;
		r->next = p->region_cache;
		p->region_cache = r;
	}
	return 0;
}

static struct region *region_take(vpmm_pool *p, enum rkind kind, CUdeviceptr va,
				  size_t size, unsigned chunk)
{
	struct region *r = p->region_cache; /* vpi_reserve_regions() guaranteed one */
	p->region_cache = r->next;
	/* The claim survives: a stale lock-free free may still read it. */
	memset(r, 0, offsetof(struct region, claim));
	__atomic_fetch_or(&r->claim, VPMM_CLAIMED, __ATOMIC_RELEASE);
	r->kind = kind;
	r->va = va;
	r->size = size;
	r->chunk = chunk;
	p->st.regions++;
	return r;
}

/* r, just put in the tree between lower and upper, joins their links. */
static struct region *link_between(struct region *r, struct region *lower,
				   struct region *upper)
{
	r->lower = lower;
	r->upper = upper;
	if (lower)
		lower->upper = r;
	if (upper)
		upper->lower = r;
	return r;
}

struct region *vpi_region_new(vpmm_pool *p, enum rkind kind, CUdeviceptr va,
				 size_t size, unsigned chunk)
{
	struct region *r = region_take(p, kind, va, size, chunk);
	vpi_tree_insert(&p->regions, &r->by_va);
	return link_between(r, REG(vpi_tree_prev(&r->by_va), by_va),
			    REG(vpi_tree_next(&r->by_va), by_va));
}

struct region *vpi_region_new_after(vpmm_pool *p, struct region *before, enum rkind kind,
				       CUdeviceptr va, size_t size)
{
	struct region *r = region_take(p, kind, va, size, before->chunk);
	vpi_tree_insert_after(&p->regions, &before->by_va, &r->by_va);
	return link_between(r, before, before->upper);
}

void vpi_region_delete(vpmm_pool *p, struct region *r)
{
	vpi_tree_remove(&p->regions, &r->by_va);
	if (r->lower)
		r->lower->upper = r->upper;
	if (r->upper)
		r->upper->lower = r->lower;
	p->st.regions--;
	r->next = p->region_cache;
	p->region_cache = r;
}


static void fifo_unlink(struct stream *s, struct region *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		s->fifo_head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		s->fifo_tail = r->prev;
	r->prev = r->next = NULL;
}

/* Keep the fifo sorted by epoch; new frees carry the largest epoch, so the
 * walk from the tail is O(1) in the common case. */
static void fifo_insert(struct stream *s, struct region *r)
{
	struct region *after = s->fifo_tail;
	while (after && after->epoch > r->epoch)
		after = after->prev;
	r->prev = after;
	r->next = after ? after->next : s->fifo_head;
	if (r->next)
		r->next->prev = r;
	else
		s->fifo_tail = r;
	if (after)
		after->next = r;
	else
		s->fifo_head = r;
}

void vpi_free_index(vpmm_pool *p, struct region *r)
{
	if (r->stream) {
		vpi_tree_insert(&r->stream->free_by_size, &r->by_size);
		fifo_insert(r->stream, r);
	} else {
		vpi_tree_insert(&p->settled, &r->by_size);
	}
}

void vpi_free_unindex(vpmm_pool *p, struct region *r)
{
	if (r->stream) {
		vpi_tree_remove(&r->stream->free_by_size, &r->by_size);
		fifo_unlink(r->stream, r);
	} else {
		vpi_tree_remove(&p->settled, &r->by_size);
	}
}

/* Free neighbours merge when one may absorb the other's stream order: same
 * stream, or one side settled (its memory has no pending work). */
static bool free_mergeable(const struct region *a, const struct region *b)
{
	return a && b && a->kind == R_FREE && b->kind == R_FREE &&
	       a->chunk == b->chunk && a->va + a->size == b->va &&
	       (a->stream == b->stream || !a->stream || !b->stream);
}

/* r (FREE, in the regions tree, in no index) absorbs `other`, its neighbour. */
void vpi_free_absorb(vpmm_pool *p, struct region *r, struct region *other)
{
	vpi_free_unindex(p, other);
	if (other->va < r->va)
		r->va = other->va; /* order in the tree is unchanged: other goes */
	r->size += other->size;
	if (other->stream) {
		if (!r->stream || other->epoch > r->epoch)
			r->epoch = other->epoch;
		r->stream = other->stream;
	}
	if (other->seq > r->seq)
		r->seq = other->seq;
	vpi_region_delete(p, other);
}

/* Index a FREE region, merging it with mergeable neighbours. Returns the
 * region that holds its memory afterwards. */
struct region *vpi_free_insert(vpmm_pool *p, struct region *r)
{
	struct region *n;
	/* A loop: after a defragmentation the left neighbour may itself have a
	 * free neighbour that waited for it (see vpi_defrag()). */
	while (free_mergeable(n = vpi_region_prev(r), r))
		vpi_free_absorb(p, r, n);
	while (free_mergeable(r, n = vpi_region_next(r)))
		vpi_free_absorb(p, r, n);
	vpi_free_index(p, r);
	return r;
}

static bool hole_mergeable(const struct region *a, const struct region *b)
{
	return a && b && a->kind == R_HOLE && b->kind == R_HOLE &&
	       a->chunk == b->chunk && a->va + a->size == b->va;
}

void vpi_hole_insert(vpmm_pool *p, struct region *r)
{
	struct region *n = vpi_region_prev(r);
	if (hole_mergeable(n, r)) {
		vpi_tree_remove(&p->holes, &n->by_size);
		r->va = n->va;
		r->size += n->size;
		vpi_region_delete(p, n);
	}
	n = vpi_region_next(r);
	if (hole_mergeable(r, n)) {
		vpi_tree_remove(&p->holes, &n->by_size);
		r->size += n->size;
		vpi_region_delete(p, n);
	}
	vpi_tree_insert(&p->holes, &r->by_size);
}


static void zombie_unlink(vpmm_pool *p, struct region *z)
{
	if (z->prev)
		z->prev->next = z->next;
	else
		p->zombie_head = z->next;
	if (z->next)
		z->next->prev = z->prev;
	else
		p->zombie_tail = z->prev;
	z->prev = z->next = NULL;
}

void vpi_zombie_append(vpmm_pool *p, struct region *z)
{
	z->next = NULL;
	z->prev = p->zombie_tail;
	if (p->zombie_tail)
		p->zombie_tail->next = z;
	else
		p->zombie_head = z;
	p->zombie_tail = z;
}

/* Split r at `at` (r->va < at < end): r keeps the front, a new region of the
 * same kind and class takes the back. r must be out of every index but the
 * address tree, whose order this keeps. Region structs must be reserved. */
struct region *vpi_split_off(vpmm_pool *p, struct region *r, CUdeviceptr at)
{
	struct region *n = vpi_region_new_after(p, r, r->kind, at, r->va + r->size - at);
	n->was = r->was;
	n->stream = r->stream;
	n->epoch = r->epoch;
	n->seq = r->seq;
	r->size = at - r->va;
	return n;
}

/* Take r out of circulation while the lock is dropped for driver work on it;
 * vpi_busy_return() puts it back as it was, merged with its neighbours. */
void vpi_busy_take(vpmm_pool *p, struct region *r)
{
	if (r->kind == R_FREE)
		vpi_free_unindex(p, r);
	else if (r->kind == R_HOLE)
		vpi_tree_remove(&p->holes, &r->by_size);
	else if (r->kind == R_ZOMBIE)
		zombie_unlink(p, r);
	r->was = r->kind;
	r->kind = R_BUSY;
	p->busy++;
}

/* A free region coming back: what completed meanwhile is settled. */
static struct region *free_restore(vpmm_pool *p, struct region *r)
{
	if (r->stream && r->epoch <= r->stream->done) {
		r->stream = NULL;
		r->epoch = 0;
	}
	return vpi_free_insert(p, r);
}

void vpi_busy_return(vpmm_pool *p, struct region *r)
{
	r->kind = r->was;
	p->busy--;
	if (r->kind == R_FREE)
		free_restore(p, r);
	else if (r->kind == R_HOLE)
		vpi_hole_insert(p, r);
	else if (r->kind == R_ZOMBIE)
		vpi_zombie_append(p, r);
}


struct region *vpi_find_region(vpmm_pool *p, CUdeviceptr ptr)
{
	struct region probe = {.va = ptr};
	return REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
}
