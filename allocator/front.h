/* front.h — the streams' caches of parked allocations (front.c): struct
 * front and its entries, the lock-free fast path and the pool's side.
 * front.c calls give.c, small.c, stream.c, region.c, loop.c and the grain
 * map; never the take path.
 */
#ifndef VPMM_FRONT_H
#define VPMM_FRONT_H

#include <pthread.h>
#include <stdio.h>

#include "loop.h"
#include "vpmm.h"

struct region;
struct stream;

#define VPMM_FRONT_MAX VPMM_FRONT_ENTRIES_MAX /* entries of a stream's cache */
#define VPMM_FRONT_BUCKET_BITS 6 /* its chains by rounded size (front.c) */
#define VPMM_FRONT_BUCKETS (1u << VPMM_FRONT_BUCKET_BITS)
_Static_assert(VPMM_FRONT_BUCKETS == 64, "struct front's `used` has a bit a chain");

struct fentry { /* an allocation parked in a stream's cache */
	CUdeviceptr ptr;
	size_t size;    /* rounded: the region's size or the block's class */
	uint64_t epoch; /* its stream's epoch when it was freed */
	struct region *r;
	uint16_t next;  /* slot + 1 of the next entry of its chain, or of the
			 * next unused slot; 0 ends either list */
};

/* A stream's cache of parked allocations (front.c). Entries of one rounded
 * size sit in one chain, newest first, so a lookup reads a chain of a few
 * entries whatever the cache holds. Zeroed memory is an empty cache. */
struct front {
	pthread_mutex_t lock; /* guards this struct; taken after the pool lock */
	unsigned n;           /* entries in the chains */
	size_t bytes;         /* their sizes' sum */
	uint64_t hits, parks;
	uint16_t head[VPMM_FRONT_BUCKETS]; /* slot + 1 of each chain's newest */
	uint64_t used;        /* bit b set iff head[b] != 0: walks skip empty chains */
	uint16_t unused;      /* slot + 1 of the first slot freed by a hit */
	uint16_t touched;     /* slots [0, touched) were used since the flush */
	bool strands;         /* pool lock: this stream's last miss found a
			       * place, and it strands (a miss that finds
			       * none, a growth, clears it; take.c) */
	struct fentry e[VPMM_FRONT_MAX];
	struct loop loop;
};

/* Every entry `ep` of front `f`, chain by chain (front lock held). Slots
 * outside the chains hold stale entries: never read them any other way.
 * The chains in use are read once: the body may not park. */
#define VPMM_FRONT_FOR_EACH(f, ep)                                            \
	for (uint64_t fm_ = (f)->used; fm_; fm_ &= fm_ - 1)                   \
		for (uint16_t fs_ = (f)->head[__builtin_ctzll(fm_)];          \
		     fs_ && ((ep) = &(f)->e[fs_ - 1], 1); fs_ = (ep)->next)

void vpi_front_pool_init(vpmm_pool *p);
/* 0, or -EAGAIN: take the locked path. */
int vpi_front_malloc(vpmm_pool *p, size_t size, CUstream s, CUdeviceptr *out);
int vpi_front_free(vpmm_pool *p, CUdeviceptr ptr, CUstream s);
size_t vpi_front_flush_locked(vpmm_pool *p);
/* Gives back every entry of s's cache (NULL: the synchronous callers'). */
size_t vpi_front_flush_stream_locked(vpmm_pool *p, struct stream *s);
/* Gives back the entries of s's cache that have a free neighbour (front.c). */
size_t vpi_front_release_beside_free_locked(vpmm_pool *p, struct stream *s);
/* Gives back the blocks of owner's slabs parked in the other caches: owner
 * is gone, and each would keep its slab, and owner's record, until that
 * cache was flushed. */
size_t vpi_front_release_owned_locked(vpmm_pool *p, const struct stream *owner);
/* Whether s's cache (NULL: the synchronous callers') holds r parked. */
bool vpi_front_holds_locked(vpmm_pool *p, struct stream *s, const struct region *r);
void vpi_front_counts_locked(vpmm_pool *p, uint64_t *parked_bytes,
			      uint64_t *hits, uint64_t *parks);
size_t vpi_front_check_locked(vpmm_pool *p, FILE *log);

#endif
