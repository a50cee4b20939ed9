/* give.h — the free path's step under the lock (give.c): a live region
 * becomes free memory of a stream. give.c calls region.c, stream.c and
 * chunk.c (the grain map).
 */
#ifndef VPMM_GIVE_H
#define VPMM_GIVE_H

#include "vpmm.h"

struct region;
struct stream;

/* A live region becomes free on `s` (NULL: settled), freed in `epoch` of s
 * (0: now). Lock held. */
void vpi_give_locked(vpmm_pool *p, struct region *r, struct stream *s,
		     uint64_t epoch);

#endif
