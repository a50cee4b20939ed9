/* harvest.h — which free handles a defragmentation moves (the plan), and
 * the waits their pending work needs; for defrag.c. Lock held.
 * harvest.c calls stream.c and tree.c.
 */
#ifndef VPMM_HARVEST_H
#define VPMM_HARVEST_H

#include "pool.h"

struct harvest {
	struct region *r;     /* free region giving pages */
	CUdeviceptr a, b;     /* the whole handles taken: [a, b) inside r */
	struct event *ev;     /* what the old VA waits for; NULL = nothing */
	struct stream *pin;   /* r's stream while r is busy (stream.h, pins) */
};

struct plan {
	struct harvest *h;
	size_t n, cap;
	size_t taken;         /* bytes in h */
	size_t target;        /* stop at target bytes */
	size_t hole_size;     /* never beyond the hole */
};

/* Fills pl with whole free handles worth pl->target bytes at most, never
 * beyond pl->hole_size, skipping skip1 and skip2 (the span's lending
 * neighbours); by VPMM_DEFRAG's rule. 0 or -ENOMEM (pl->h may hold some:
 * the caller frees it). */
int vpi_plan_harvest(vpmm_pool *p, struct plan *pl, struct stream *caller,
		     const struct region *skip1, const struct region *skip2);
/* Orders `caller` (the CPU, for NULL) after the work pending on each
 * harvested region, taking a reference on the event each old VA waits
 * for (h->ev). 0, or an errno from the driver's answer. */
int vpi_plan_events(vpmm_pool *p, struct plan *pl, struct stream *caller);

#endif
