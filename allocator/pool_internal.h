/* pool_internal.h — the pool's data structures and the invariants that
 * vpmm_pool_check() verifies. Shared by pool.c (operations), check.c (the
 * checker and the region map) and nothing else.
 */
#ifndef VPMM_POOL_INTERNAL_H
#define VPMM_POOL_INTERNAL_H

#include <pthread.h>
#include "vpmm.h"
#include "tree.h"

/* R_BUSY: out of every index while the lock is dropped for driver work on
 * it (a defragmentation mapping into it, a zombie being unmapped); `was`
 * says what it counts as meanwhile. */
enum rkind { R_LIVE, R_FREE, R_HOLE, R_ZOMBIE, R_BUSY };

#define VPMM_MAX_CHUNKS 1024 /* fixed: the fast path reads chunks unlocked */
#define VPMM_FRONT_MAX VPMM_FRONT_ENTRIES_MAX /* entries of a stream's cache */
#define VPMM_FRONT_BUCKET_BITS 6 /* its chains by rounded size (front.c) */
#define VPMM_FRONT_BUCKETS (1u << VPMM_FRONT_BUCKET_BITS)
#define VPMM_MAX_ACCESS 32   /* devices that may access the pool's memory */
#define VPMM_LOOP_SLOT_BITS 6 /* request sizes remembered by vpi_loop_repeats() */
#define VPMM_LOOP_SLOTS (1u << VPMM_LOOP_SLOT_BITS)
#define VPMM_LOOP_HISTORY 8  /* defragmentations remembered per size */
#define VPMM_LOOP_RING 8192  /* mallocs whose prefix hashes are kept, at first */
#define VPMM_LOOP_RING_MAX 262144 /* ... and at most (loop.c): a step under 65 536
				   * mallocs, 4 MiB of rings */
#define VPMM_LOOP_TIMES 3    /* stretches of a period that must repeat exactly */
#define VPMM_LOOP_HINTS 2    /* steps back a malloc's place is looked up (loop.c) */
#define VPMM_LOOP_BASE 0x100000001b3ull /* the sequence's hash (loop.c); odd:
					 * multiplying by it loses nothing mod 2^64 */

/* A point on a lock-free path where a test makes another thread act
 * (test/pool/test_racing.c). Only in the core the tests build with
 * -DVPMM_TEST_HOOKS; nothing in libvpmm.so. */
#ifdef VPMM_TEST_HOOKS
extern void (*vpi_test_hook)(const char *point);
#define VPMM_TEST_POINT(point)                                                \
	do {                                                                  \
		if (vpi_test_hook)                                           \
			vpi_test_hook(point);                                \
	} while (0)
#else
#define VPMM_TEST_POINT(point) ((void)0)
#endif

/* The top `bits` bits of x times 2^64 / phi: one index into a table of
 * 2^bits for keys that differ in any bits (streams, sizes). 0 < bits < 64. */
static inline unsigned vpi_hash_bits(uint64_t x, unsigned bits)
{
	return (unsigned)((x * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

struct chunk { /* one VA reservation */
	CUdeviceptr va;
	size_t size;          /* multiple of page_size */
	struct region **pmap; /* grain map (front.c): a live region's first grain,
			       * every grain of a slab; NULL elsewhere */
	struct mapping **smap; /* slab map, per page: the home mapping over it
				* where the page is live or free memory (and
				* busy regions taken from free memory); NULL over
				* holes, zombies and a span being mapped.
				* Pool lock. For placement (pool.c) */
};

struct fentry { /* an allocation parked in a stream's cache */
	CUdeviceptr ptr;
	size_t size;    /* rounded: the region's size or the block's class */
	uint64_t epoch; /* its stream's epoch when it was freed */
	struct region *r;
	uint16_t next;  /* slot + 1 of the next entry of its chain, or of the
			 * next unused slot; 0 ends either list */
};

/* One stream's sequence of mallocs (loop.c), every one counted: those the
 * cache serves and those through the pool lock. Guarded by the lock of the
 * front that holds it. */
struct loop {
	uint64_t n;       /* mallocs noted */
	uint64_t period;  /* the period places are offered for: the longest a
			   * defragmentation found repeating (vpi_loop_repeats); 0: none */
	uint64_t start;   /* the oldest malloc the rings hold a hash for */
	uint64_t retry;   /* n from which the rings are asked for again after
			   * the host had no memory for them */
	uint64_t ring;    /* entries of the rings: a power of two */
	uint64_t *prefix; /* [i % ring]: hash of sizes 0..i-1, for i in
			   * [max(start, n + 1 - ring), n]; NULL until the
			   * stream's first malloc through the lock */
	CUdeviceptr *at;  /* [i % ring]: where malloc i went; 0: unknown */
	struct loop_slot {
		size_t size;
		uint64_t at[VPMM_LOOP_HISTORY]; /* mallocs noted when this size
						 * defragmented, newest first; 0: unused */
		uint64_t hash[VPMM_LOOP_HISTORY]; /* the prefix hash at each:
						   * compares stretches the
						   * ring no longer holds */
	} slot[VPMM_LOOP_SLOTS];
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
	uint16_t unused;      /* slot + 1 of the first slot freed by a hit */
	uint16_t touched;     /* slots [0, touched) were used since the flush */
	struct fentry e[VPMM_FRONT_MAX];
	struct loop loop;
};

/* Every entry `ep` of front `f`, chain by chain (front lock held). Slots
 * outside the chains hold stale entries: never read them any other way. */
#define VPMM_FRONT_FOR_EACH(f, ep)                                            \
	for (unsigned fb_ = 0; fb_ < VPMM_FRONT_BUCKETS; fb_++)               \
		for (uint16_t fs_ = (f)->head[fb_];                           \
		     fs_ && ((ep) = &(f)->e[fs_ - 1], 1); fs_ = (ep)->next)

/* A physical handle. Mapped whole: at exactly one "home" address inside a
 * live or free region, plus one address per zombie still holding it. */
struct slab {
	CUmemGenericAllocationHandle handle;
	size_t size;     /* multiple of page_size */
	unsigned nmaps;  /* mappings pointing here (home + zombies) */
	unsigned seen_maps, seen_homes; /* scratch of vpmm_pool_check() */
};

struct mapping { /* a slab mapped at va; in pool->maps by va */
	struct vpi_tnode by_va;
	CUdeviceptr va;
	struct slab *slab;
};

/* An event recorded on a stream closes that stream's epoch: it completes once
 * every free tagged with an epoch <= ev->epoch can be reused by anyone. */
struct event {
	CUevent ev;
	struct stream *stream;
	uint64_t epoch;
	unsigned refs;      /* the stream's pending list + zombies waiting on it */
	bool done;
	/* Its context ended (vpmm_pool_drop_events): the driver event is
	 * destroyed, and the struct is freed, not cached, once unreferenced. */
	bool gone;
	struct event *next; /* stream's pending list (epoch ascending) or cache */
	struct event *all_next; /* pool->events: every event, for destroy */
};

struct stream {
	CUstream handle;
	unsigned id;              /* creation order: "oldest stream first" */
	uint64_t epoch;           /* open epoch: frees now are tagged with it
				   * (atomic: read by front.c without the lock) */
	uint64_t done;            /* every epoch <= done has completed; < epoch */
	uint64_t last_record_ns;
	struct event *ev_head, *ev_tail; /* recorded, not known complete */
	/* Pending free regions of this stream: by (size, va) and, in fifo,
	 * by epoch ascending. Each has done < region->epoch <= epoch. */
	struct vpi_tree free_by_size;
	struct region *fifo_head, *fifo_tail;
	struct small_slab **small_partial; /* small.c: per class, slabs with room */
	struct front front;
	/* The program destroyed it: nothing is recorded on it any more; its
	 * last event covers every free it had (vpmm_pool_stream_gone). */
	bool dead;
	struct stream *hash_next;
	struct stream *next; /* pool->streams, creation order */
};

struct region {
	struct vpi_tnode by_va;   /* pool->regions: every region */
	struct vpi_tnode by_size; /* FREE: stream's or settled tree; HOLE: holes */
	struct region *prev, *next; /* pending FREE: stream fifo; ZOMBIE: zombie list */
	CUdeviceptr va;
	size_t size;              /* > 0, multiple of the grain */
	enum rkind kind;
	enum rkind was;           /* BUSY: its kind before, and after a failure */
	unsigned chunk;           /* index into pool->chunks; never spans two */
	struct stream *stream;    /* pending FREE only; NULL = settled */
	uint64_t epoch;           /* pending FREE: its stream's epoch at the free */
	uint64_t seq;             /* FREE: pool-wide order of its (latest) free */
	struct event *ev;         /* ZOMBIE: unmap once done; NULL = at once */
	struct small_slab *small; /* LIVE only: carved into sub-page blocks */
	/* Last: region_new() clears the fields above and keeps this one.
	 * Atomic. Bit 0 (VPMM_CLAIMED): a free owns the region, or none may
	 * take it; clear only on a plain live allocation that is neither
	 * parked in a stream's cache nor being freed. Every other region
	 * (free, hole, zombie, busy, a slab) has it set. The other bits count
	 * the times the struct became live, so that a lock-free free holding
	 * a pointer read before the struct was reused cannot claim it
	 * (front.c). */
	uint32_t claim;
};

#define VPMM_CLAIMED 1u

static inline bool vpi_claimed(const struct region *r)
{
	return __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE) & VPMM_CLAIMED;
}

/* Claims r for its free. `seen` is r->claim as read before the caller
 * checked that r is the allocation it frees: false if r was claimed, or
 * became live again, since. */
static inline bool vpi_claim(struct region *r, uint32_t seen)
{
	return !(seen & VPMM_CLAIMED) &&
	       __atomic_compare_exchange_n(&r->claim, &seen, seen | VPMM_CLAIMED, false,
					   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline void vpi_unclaim(struct region *r)
{
	__atomic_fetch_and(&r->claim, ~VPMM_CLAIMED, __ATOMIC_RELEASE);
}

struct vpmm_pool {
	pthread_mutex_t lock; /* guards everything below; dropped only around
			       * driver work on busy regions (pool.c) */
	pthread_cond_t reclaim_cond; /* zombies appeared, or stop */
	pthread_t reclaimer;
	bool reclaimer_running, stopping;
	CUcontext ctx; /* current where the pool was created; the reclaimer's */
	struct vpmm_config cfg;
	vpmm_driver *drv;
	size_t page;  /* the unit of physical memory: slabs are whole pages */
	size_t grain; /* the unit of allocation: regions are whole grains; holes,
		       * slabs and zombies whole pages */

	struct chunk *chunks; /* VPMM_MAX_CHUNKS of them */
	unsigned nchunks;     /* written under the lock, read atomically */

	struct vpi_tree regions; /* by va: partitions every chunk */
	struct vpi_tree settled; /* settled FREE by (size, va) */
	struct vpi_tree holes;   /* HOLE by (size, va) */
	struct vpi_tree maps;    /* struct mapping by va */
	struct region *zombie_head, *zombie_tail;

	struct stream *streams;   /* every stream seen, creation order */
	struct stream **stream_hash;
	unsigned stream_hash_size, nstreams;
	/* A VPMM_NO_STREAM malloc came through the lock: synchronous callers
	 * take only settled memory. Never cleared. Without it and a second
	 * stream, frees close epochs only every SOLE_RECORD_NS
	 * (vpi_give_locked). */
	bool sync_takes;
	struct stream *last_stream; /* one-entry cache for the hot path */

	struct region *region_cache; /* recycled region structs (via next) */
	struct event *event_cache;   /* recycled events, CUevent kept */
	struct event *events;        /* every event created */

	struct small_state *small;
	struct front sync_front; /* parked frees of VPMM_NO_STREAM */
	uint64_t gen;            /* tells pools apart in thread-local caches */
	uint64_t stream_gen;     /* bumped when a stream dies (atomic): stale
				  * thread-local stream lookups miss */
	size_t busy;     /* regions in R_BUSY */
	uint64_t free_seq; /* counter behind region->seq */
	uint64_t settled_count; /* free regions settled so far */
	size_t inflight; /* bytes being created by defragmentations, for the limit */
	unsigned mappers; /* callers inside defrag()'s driver work (atomic,
			   * read without the lock): the background thread
			   * leaves its unmaps for later meanwhile (pool.c,
			   * defer_to_mappers) */
	unsigned reclaim_deferrals; /* rounds in a row it did so; written by
				     * the thread only, under the lock */
	uint64_t loop_grown; /* bytes created instead of remapping, for the cap */

	/* Devices granted access to every mapped page: [0] is cfg.device, then
	 * peers (vpmm_pool_grant). A defragmentation copies the list before
	 * dropping the lock; a grant waits until no region is busy, so no
	 * mapping in flight can miss a device. */
	int access[VPMM_MAX_ACCESS];
	unsigned naccess;

	CUresult last_result;
	struct vpmm_stats st;
	uint64_t driver_calls[VPMM_OP_COUNT];
};

struct small_state; /* small.c */

size_t vpi_check_locked(vpmm_pool *pool, FILE *log);
/* vpmm_pool_stats() with the lock held (snapshot.c shares it). */
void vpi_stats_locked(vpmm_pool *p, struct vpmm_stats *out);

/* pool.c, for small.c: whole pages in and out, events; lock held. */
int vpi_take_locked(vpmm_pool *p, struct stream *caller, size_t need,
			  const CUdeviceptr *hint, unsigned nhint, struct region **out);
void vpi_give_locked(vpmm_pool *p, struct region *r, struct stream *s,
			   uint64_t epoch);
int vpi_cover_locked(vpmm_pool *p, struct stream *s, uint64_t epoch,
			   struct event **out);
bool vpi_event_done_locked(vpmm_pool *p, struct event *ev);
/* Wait on the CPU for ev; true once it completed. */
bool vpi_event_wait_locked(vpmm_pool *p, struct event *ev);
void vpi_event_unref_locked(vpmm_pool *p, struct event *ev);

struct stream *vpi_stream_get_locked(vpmm_pool *p, CUstream h);

/* front.c */
int vpi_gmap_create(vpmm_pool *p, struct chunk *c);
void vpi_gmap_destroy(vpmm_pool *p, struct chunk *c);
void vpi_gmap_publish(vpmm_pool *p, struct region *r, bool publish);
/* `size` rounded up to whole grains: what a request above the size classes
 * takes, and a slab's size (small.c). */
static inline size_t vpi_grains(const vpmm_pool *p, size_t size)
{
	return (size + p->grain - 1) / p->grain * p->grain;
}
void vpi_front_pool_init(vpmm_pool *p);
/* 0, or -EAGAIN: take the locked path. */
int vpi_front_malloc(vpmm_pool *p, size_t size, CUstream s, CUdeviceptr *out);
int vpi_front_free(vpmm_pool *p, CUdeviceptr ptr, CUstream s);
size_t vpi_front_flush_locked(vpmm_pool *p);
/* s's cache, or the synchronous callers' for s NULL. */
static inline struct front *vpi_front_of(vpmm_pool *p, struct stream *s)
{
	return s ? &s->front : &p->sync_front;
}
/* Gives back every entry of s's cache (NULL: the synchronous callers'). */
size_t vpi_front_flush_stream_locked(vpmm_pool *p, struct stream *s);
/* Gives back the entries of s's cache that have a free neighbour (front.c). */
size_t vpi_front_release_beside_free_locked(vpmm_pool *p, struct stream *s);
/* Whether free memory touches r, and not both memory that s may place in
 * and memory pending on another stream (given back, r would join them). */
bool vpi_region_beside_free_locked(struct region *r, const struct stream *s);
/* Whether s's cache (NULL: the synchronous callers') holds r parked. */
bool vpi_front_holds_locked(vpmm_pool *p, struct stream *s, const struct region *r);
void vpi_front_counts_locked(vpmm_pool *p, uint64_t *parked_bytes,
			      uint64_t *hits, uint64_t *parks);
size_t vpi_front_check_locked(vpmm_pool *p, FILE *log);

/* loop.c: a stream's sequence of mallocs; the front's lock held. */
int vpi_loop_init(struct loop *l);
void vpi_loop_fini(struct loop *l);
/* Count one malloc of `size` (as requested) that went to `at` (0: not yet
 * known); returns its index for vpi_loop_placed(). */
uint64_t vpi_loop_note(struct loop *l, size_t size, CUdeviceptr at);
void vpi_loop_placed(struct loop *l, uint64_t i, CUdeviceptr at);
/* Where the malloc noted last went one, ... VPMM_LOOP_HINTS periods
 * before, while the sequence repeats; returns how many. */
unsigned vpi_loop_hints(const struct loop *l, CUdeviceptr *at);
/* Records that `need` bytes needed a defragmentation now; whether the same
 * size did one period ago and the sequence repeats that period. */
bool vpi_loop_repeats(struct loop *l, size_t need, size_t grain);

/* small.c: allocations of at most vpi_small_max() bytes, carved from pool
 * pages in size classes. Lock held. */
size_t vpi_small_max(const vpmm_pool *p);
int vpi_small_init(vpmm_pool *p);
void vpi_small_fini(vpmm_pool *p);
int vpi_small_malloc_locked(vpmm_pool *p, struct stream *caller, size_t size,
			     CUdeviceptr *out);
/* `claimed`: the caller holds the block's park bit (a cache's entry);
 * else the free claims it, and fails if another free has. */
int vpi_small_free_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   struct stream *s, uint64_t epoch, bool claimed);
int vpi_small_find_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   CUdeviceptr *base, size_t *size);
size_t vpi_small_check_locked(vpmm_pool *p, FILE *log);
/* Give every empty slab back to the pool (even the last of its class). */
size_t vpi_small_trim_locked(vpmm_pool *p);
/* Free deferred blocks whose stream completed; return surplus empty slabs. */
void vpi_small_drain_locked(vpmm_pool *p);
size_t vpi_small_deferred(const vpmm_pool *p);
size_t vpi_small_class_size(const vpmm_pool *p, size_t size);
/* Lock-free marks of a block freed but not yet free (front.c): the park
 * is the block's claim, as VPMM_CLAIMED is a whole allocation's. park: 0,
 * or -EINVAL if ptr is not a handed-out, unparked block of sl, the slab
 * the caller read from r (r->small may have changed since); *size = its
 * class. */
int vpi_small_park(vpmm_pool *p, struct small_slab *sl, struct region *r,
		    CUdeviceptr ptr, size_t *size);
void vpi_small_unpark(vpmm_pool *p, struct small_slab *sl, struct region *r,
		       CUdeviceptr ptr);
bool vpi_small_is_parked(vpmm_pool *p, struct region *r, CUdeviceptr ptr);

#endif
