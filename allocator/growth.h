/* growth.h — whether and how the pool grows without remapping (growth.c),
 * from what the device's free memory and VPMM_LIMIT leave. Lock held.
 * growth.c calls nothing in allocator/.
 */
#ifndef VPMM_GROWTH_H
#define VPMM_GROWTH_H

#include <stdbool.h>
#include <stddef.h>

#include "vpmm.h"

#define GROWTH_ROOM_RATIO 16     /* room needed per byte grown without remapping */
#define GROWTH_HANDLE_RATIO 256  /* room needed per byte of a new handle, */
#define GROWTH_LIVE_RATIO 32     /* ... while fewer than 256 / 32 - 1 = 7
				  * are live: this for each live one and
				  * one more */
#define GROWTH_SPARE_PERMILLE 10 /* free share of the pool that stops growth */
#define GROWTH_COARSE_RATIO 4    /* room per byte of the pool for coarse handles */
#define GROWTH_START_RATIO 2     /* ... and for the placement at a free region's
				  * start (place.c) */
#define GROWTH_POOL_RATIO 64     /* pool bytes per byte of a defragmentation's
				  * coarse handle */
#define GROWTH_COARSE_MAX (64u << 20) /* largest coarse handle after the
				       * first growth, unless the split rule
				       * or the page makes it coarser */

/* What the device's free memory and VPMM_LIMIT leave the pool. */
size_t vpi_growth_headroom(vpmm_pool *p);
/* Whether the device has room for the start placement: the headroom last
 * read, less what the pool created since, is GROWTH_START_RATIO times the
 * pool. Reads the device's free memory again once the last read is a
 * second old; false until the growth path's first read and while the room
 * is unknown. */
bool vpi_growth_ample(vpmm_pool *p);
/* Whether `need` bytes grow the pool without remapping (else a
 * defragmentation serves them). */
bool vpi_growth_room(vpmm_pool *p, size_t need);
/* The size of the handles that create `shortfall` bytes for a request of
 * `need`, growing for room (`room`) or in a defragmentation. */
size_t vpi_growth_handle_size(vpmm_pool *p, size_t need, size_t shortfall, bool room);
/* Whether `bytes` of new handles may be created: false only when the
 * device's free memory, read again for it, is less (an unknown room: true,
 * the driver decides), counted as the driver's refusal would be. A request
 * the device cannot hold then fails at once, where it made handles until
 * cuMemCreate refused and released them all: minutes on a large simulated
 * device, and a calloc of a handle record each past what memory holds. */
bool vpi_growth_may_create(vpmm_pool *p, size_t bytes);
/* The pool created `bytes`; the driver refused a growth (out of memory). */
void vpi_growth_created(vpmm_pool *p, size_t bytes);
void vpi_growth_refused(vpmm_pool *p);

#endif
