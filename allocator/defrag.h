/* defrag.h — defragmentation (defrag.c): gathering free handles into a hole
 * by remapping them, or creating what is lacking. defrag.c calls harvest.c,
 * region.c, handle.c, chunk.c, stream.c and growth.c.
 */
#ifndef VPMM_DEFRAG_H
#define VPMM_DEFRAG_H

#include <stdbool.h>

#include "vpmm.h"

struct region;
struct stream;

/* Phase 2: a FREE region of at least `need` bytes usable by caller. With
 * `room` (growth.c), what the request lacks is created and nothing is
 * remapped. */
int vpi_defrag(vpmm_pool *p, struct stream *caller, size_t need, bool *grow,
	       bool room, struct region **out, CUdeviceptr *at);

#endif
