/* place.c — placement: of the free memory a request fits, the place that
 * strands the least (free memory in a handle that also holds live memory,
 * which no defragmentation can move), and the places a loop went before.
 * While the device has room, a free region's start is its only place, until
 * a loop's malloc finds none of its earlier places (take.c).
 *
 * Calls region.c, handle.c (the home map), growth.c (whether the device
 * has room: the device's free memory, read again at most once a second)
 * and front.c (a place may hold an allocation parked in the caller's
 * cache). Lock held; no other driver call.
 */
#include <stdint.h>

#include "front.h"
#include "growth.h"
#include "handle.h"
#include "place.h"
#include "pool.h"
#include "region.h"



/* What placing [x, x + need) inside free region r risks leaving stranded:
 * free memory in a handle that also holds live memory, which no
 * defragmentation can move (a handle moves only whole). Two parts:
 *
 * - Now: every wholly free handle it touches counts whole, since that handle
 *   becomes partly live. The handles r shares with its neighbours are pinned
 *   already; using their free part costs nothing. (This part less `need`
 *   is exactly the change in stranded bytes.)
 * - Later: a handle its start or its end falls inside (not on a handle
 *   boundary) counts once more. Whatever lies on the other side of that
 *   boundary, once one side is freed the other pins the handle. Half, where
 *   the request lies against r's neighbour: that boundary exists already
 *   (a neighbour that goes first leaves the handle pinned either way).
 *
 * O(1): r is wholly mapped, by the handles between s1 (over x) and s2 (over
 * its last byte). */
static size_t place_cost(const struct region *r, CUdeviceptr x, size_t need,
			 const struct mapping *s1, const struct mapping *s2)
{
	CUdeviceptr lo = s1->va, hi = s2->va + s2->handle->size, end = r->va + r->size;
	size_t cost = hi - lo;
	if (lo < r->va) /* shared with the left neighbour already */
		cost -= s1->handle->size;
	if (hi > end && (s2 != s1 || lo >= r->va)) /* with the right one */
		cost -= s2->handle->size;
	if (x > lo)
		cost += x == r->va ? s1->handle->size / 2 : s1->handle->size;
	if (x + need < hi)
		cost += x + need == end ? s2->handle->size / 2 : s2->handle->size;
	return cost;
}

/* The cheapest place for `need` bytes in r (need <= r->size) among those
 * where the cost can change: r's two ends, and the request's start or end
 * on the handle boundary nearest either end of r; r's start alone when
 * `start`. The home map finds the handle over any page of r. */
static CUdeviceptr place_in(vpmm_pool *p, const struct region *r, size_t need,
			    bool start, size_t *cost)
{
	CUdeviceptr a = r->va, b = r->va + r->size, best = a;
	struct mapping *head = vpi_home_at(p, r->chunk, a);
	struct mapping *first_end = vpi_home_at(p, r->chunk, a + need - 1);
	*cost = place_cost(r, a, need, head, first_end);
	if (need == r->size || start)
		return a;
	struct mapping *tail = vpi_home_at(p, r->chunk, b - 1);
	struct mapping *last_start = vpi_home_at(p, r->chunk, b - need);
	struct spot { /* a place; its end handles where known, else NULL */
		CUdeviceptr x;
		struct mapping *s1, *s2;
	} c[5];
	unsigned n = 0;
	c[n++] = (struct spot){b - need, last_start, tail};
	if (head->va < a) /* start on the first boundary */
		c[n++] = (struct spot){head->va + head->handle->size, NULL, NULL};
	/* end on the first boundary it can */
	c[n++] = (struct spot){first_end->va + first_end->handle->size - need, NULL, first_end};
	if (tail->va + tail->handle->size > b) /* end on the last boundary */
		c[n++] = (struct spot){tail->va - need, NULL, NULL};
	/* start on the last boundary it can */
	c[n++] = (struct spot){last_start->va, last_start, NULL};
	for (unsigned i = 0; i < n; i++) {
		size_t k;
		/* Within r; x - a wraps when x lies before a. */
		if (c[i].x - a > r->size - need || c[i].x == best)
			continue;
		k = place_cost(r, c[i].x, need,
			       c[i].s1 ? c[i].s1 : vpi_home_at(p, r->chunk, c[i].x),
			       c[i].s2 ? c[i].s2 : vpi_home_at(p, r->chunk, c[i].x + need - 1));
		if (k < *cost) {
			*cost = k;
			best = c[i].x;
		}
	}
	return best;
}

/* Free regions looked at per request, from the best fit up, the caller's
 * and the settled ones together. 8, 12 and 16 gave the same ratios in the
 * replays (docs/design.md); each region costs a few home map lookups. */
#define PLACE_SCAN 8

/* Phase 1's choice: of the free regions usable by caller that fit `need`,
 * the smallest few, and in each the cheapest place (place_cost); the
 * cheapest wins, the smaller region on a tie. NULL if none fits. No lock
 * but the pool's, and no driver call but vpi_growth_ample's read of the
 * device's free memory, at most once a second.
 *
 * While the device has room (vpi_growth_ample), each region is costed at
 * its start only: requests made one after another then lie side by side,
 * as they would in fresh memory, instead of each on the handle boundary
 * that suits it, with the gaps between them left too small for the next
 * (docs/policy.md, "Placement with room"). A defragmentation has little to
 * move then; past that room, the cost chooses the place inside a region
 * too, and keeps handles whole for the remaps to come. So it does, room or
 * not, once a malloc that repeats a loop found none of its earlier places
 * free and no region that fits (p->loop_missed): a step whose tensors
 * lie side by side drifts out of its places then, each tensor taking the
 * start where another went the step before, and remaps every step (the
 * PyTorch step: 0.13 to 1.03 defragmentations a step, none by cost). */
struct region *vpi_place_locked(vpmm_pool *p, struct stream *caller, size_t need,
				   CUdeviceptr *at, size_t *cost)
{
	/* The room read first: its once-a-second read goes on after a miss. */
	bool start = vpi_growth_ample(p) && !p->loop_missed;
	struct region probe = {.size = need}, *best = NULL;
	struct vpi_tnode *t[2] = {
		caller ? vpi_tree_ceil(&caller->free_by_size, &probe.by_size) : NULL,
		vpi_tree_ceil(&p->settled, &probe.by_size)};
	size_t best_cost = SIZE_MAX;
	/* Both indexes merged, smallest first. */
	for (unsigned seen = 0; seen < PLACE_SCAN && (t[0] || t[1]); seen++) {
		int i = !t[0] || (t[1] && vpi_region_by_size(t[1], t[0]) < 0);
		struct region *r = REG(t[i], by_size);
		size_t c;
		CUdeviceptr x = place_in(p, r, need, start, &c);
		t[i] = vpi_tree_next(t[i]);
		if (c < best_cost) { /* a tie keeps the smaller region */
			best = r;
			best_cost = c;
			*at = x;
		}
		if (best_cost <= need) /* nothing stranded now or later */
			break;
	}
	*cost = best_cost;
	return best;
}

/* The free region usable by caller that holds [x, x + need), if any. The
 * caller's own cache may hold the allocation that lies there, parked (in
 * another stream's cache it is not the caller's to give back): then
 * the whole cache goes back to the pool (once a request), so that the
 * mallocs after this one also go through the lock to their places of a
 * step before, instead of taking the newest parked allocation of their size.
 * Giving back only the one allocation let the step's placement drift: over
 * 20 settings of cache entries and loop growth, the PyTorch step's trace
 * still defragmented after 30 steps at 11 of them, against 4 (18 without
 * the places; docs/policy.md, "Loops"). */
struct region *vpi_place_at(vpmm_pool *p, struct stream *caller, size_t need,
			       CUdeviceptr x, bool *flushed)
{
	struct region *r = vpi_find_region(p, x);
	if (r && r->kind == R_LIVE && !r->small && vpi_claimed(r) &&
	    !*flushed && vpi_front_holds_locked(p, caller, r)) {
		*flushed = true;
		if (vpi_front_flush_stream_locked(p, caller))
			r = vpi_find_region(p, x);
	}
	if (!r || r->kind != R_FREE || (r->stream && r->stream != caller) ||
	    x + need > r->va + r->size)
		return NULL;
	return r;
}
