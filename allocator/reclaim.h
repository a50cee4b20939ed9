/* reclaim.h — giving memory back (reclaim.c): unmapping zombies, trimming
 * settled free handles, and the background thread that does both. reclaim.c
 * calls region.c, handle.c, stream.c, front.c, small.c and reset.c.
 */
#ifndef VPMM_RECLAIM_H
#define VPMM_RECLAIM_H

#include <stdbool.h>

#include "vpmm.h"

/* How often the background thread looks while a release threshold is set;
 * also the longest a sole taker's frees wait for an event (give.c): a trim
 * past the release threshold looks no more often. */
#define RELEASE_POLL_NS 10000000
#define SOLE_RECORD_NS RELEASE_POLL_NS

/* Phase 0: unmap the zombies whose events completed; returns how many. */
int vpi_reclaim_zombies(vpmm_pool *p, bool wait, bool *gave_way);
/* Unmap and release settled free handles until at most `keep` reusable
 * bytes remain; returns the bytes given back. */
size_t vpi_trim_locked(vpmm_pool *p, size_t keep);
/* The background reclaimer thread's body (arg: the pool). */
void *vpi_reclaimer_main(void *arg);

#endif
