/* place.h — placement (place.c): where in the free memory a request
 * strands the least. place.c calls region.c, handle.c, front.c and growth.c.
 */
#ifndef VPMM_PLACE_H
#define VPMM_PLACE_H

#include <stdbool.h>

#include "vpmm.h"

struct region;
struct stream;

/* Phase 1's choice: the cheapest place among the smallest free regions
 * usable by caller that fit `need`; NULL if none fits. */
struct region *vpi_place_locked(vpmm_pool *p, struct stream *caller, size_t need,
				CUdeviceptr *at, size_t *cost);
/* The free region usable by caller that holds [x, x + need), if any. */
struct region *vpi_place_at(vpmm_pool *p, struct stream *caller, size_t need,
			    CUdeviceptr x, bool *flushed);

#endif
