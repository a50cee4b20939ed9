/* take.h — the malloc path under the lock (take.c): phases 0-2 that find
 * or make free memory for a request and carve it live. take.c calls
 * place.c, defrag.c, growth.c, reclaim.c, front.c, small.c, stream.c,
 * region.c, chunk.c and loop.c.
 */
#ifndef VPMM_TAKE_H
#define VPMM_TAKE_H

#include "vpmm.h"

struct region;
struct stream;

/* Phases 0-2 for `need` bytes (whole grains): a live region, still
 * claimed. `hint`: places the caller's loop went before. Lock held. */
int vpi_take_locked(vpmm_pool *p, struct stream *caller, size_t need,
		    const CUdeviceptr *hint, unsigned nhint, struct region **out);

#endif
