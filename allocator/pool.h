/* pool.h — struct vpmm_pool, the state every room of the pool shares, with
 * its invariants beside the fields, and the few helpers that need it whole.
 * pool.c owns it: creation, destruction and the public vpmm_pool_* calls.
 */
#ifndef VPMM_POOL_H
#define VPMM_POOL_H

#include <pthread.h>
#include <stdio.h>

#include "front.h"
#include "stream.h"
#include "tree.h"
#include "vpi.h"
#include "vpmm.h"

#define VPMM_MAX_CHUNKS 1024 /* fixed: the fast path reads chunks unlocked */
#define VPMM_MAX_ACCESS 32   /* devices that may access the pool's memory */

struct chunk;
struct region;
struct stream;
struct event;
struct small_state; /* small.c */

struct vpmm_pool {
	pthread_mutex_t lock; /* guards everything below; dropped only around
			       * driver work on busy regions (pool.c) */
	pthread_cond_t reclaim_cond; /* zombies appeared, or stop */
	pthread_t reclaimer;
	bool reclaimer_running, stopping;
	CUcontext ctx; /* current where the pool was created; the reclaimer's */
	/* ctx's id when last looked at (reset.c); 0: not known. A change
	 * means the context ended under the pool. */
	unsigned long long ctx_id;
	bool no_ctx_id;        /* the driver has no ids: no check */
	unsigned ctx_resets;   /* ends of the context learned by its id */
	/* The program is destroying the pool's context (vpmm_pool_pause):
	 * the background thread makes no driver call until it is over. */
	bool paused;
	struct vpmm_config cfg;
	vpmm_driver *drv;
	size_t page;  /* the unit of physical memory: slabs are whole pages */
	size_t grain; /* the unit of allocation: regions are whole grains; holes,
		       * slabs and zombies whole pages */
	/* log2 of each: the home map, the grain map and the rounding of
	 * every request shift where they divided (a 64-bit division takes
	 * tens of cycles; placement looks up a dozen handles a miss). The
	 * grain is a power of two (options.c); the page is where the driver's
	 * granularity is, as CUDA's always is, and VPMM_PAGE_SIZE must be, but
	 * through the API any multiple of the granularity is: then page_shift
	 * is 0 and they divide (test grain::a_page_of_three_grains). */
	unsigned page_shift, grain_shift;

	struct chunk *chunks; /* VPMM_MAX_CHUNKS of them */
	unsigned nchunks;     /* written under the lock, read atomically */

	struct vpi_tree regions; /* by va: partitions every chunk */
	struct vpi_tree settled; /* settled FREE by (size, va) */
	struct vpi_tree holes;   /* HOLE by (size, va) */
	struct vpi_tree maps;    /* struct mapping by va */
	struct region *zombie_head, *zombie_tail;

	/* Stream records, creation order: every stream the program has not
	 * destroyed, and those it destroyed while something refers to them.
	 * The hash holds the first kind by handle; `dead` the second. */
	struct stream *streams, *streams_tail;
	size_t nrecords;
	/* The cache counts of stream records freed (stream.c), so that the
	 * mallocs and frees they served stay in the stats. */
	uint64_t gone_hits, gone_parks;
	/* Parked allocations the caches gave back to the pool (front.c):
	 * frees that st.frees does not count. st.mallocs - st.frees -
	 * front_given allocations are live or parked (growth.c). A park
	 * ends in a hit, a give-back, or an unpark when a flush's free of a
	 * block fails (front_unparked): the caches' parks equal their hits,
	 * their entries, front_given and front_unparked (vpmm_pool_check). */
	uint64_t front_given, front_unparked;
	struct stream **stream_hash;
	unsigned stream_hash_size;
	size_t nhashed;
	struct stream *dead, *dead_tail;
	size_t ndead;
	/* Dead streams the lock-free paths owe a reap: they make stream
	 * records without reaping (vpi_stream_get_unchecked_locked). */
	size_t reaps_owed;
	unsigned nstreams;        /* streams ever seen: the next one's id */
	/* A VPMM_NO_STREAM malloc came through the lock: synchronous callers
	 * take only settled memory. Never cleared. Without it and a second
	 * stream, frees close epochs only every SOLE_RECORD_NS
	 * (vpi_give_locked). */
	bool sync_takes;
	struct stream *last_stream; /* one-entry cache for the hot path */

	struct region *region_cache; /* recycled region structs (via next) */
	struct event *event_cache;   /* recycled events, CUevent kept */
	size_t ncached;
	size_t cache_low;            /* the fewest cached since the last trim */
	struct event *events;        /* every event created, not yet freed */
	size_t nevents;              /* their driver events still alive */

	struct small_state *small;
	struct front sync_front; /* parked frees of VPMM_NO_STREAM */
	uint64_t gen;            /* tells pools apart in thread-local caches */
	uint64_t stream_gen;     /* bumped when a stream dies (atomic): stale
				  * thread-local stream lookups miss */
	size_t busy;     /* regions in R_BUSY */
	uint64_t free_seq; /* counter behind region->seq */
	uint64_t settled_count; /* free regions settled so far */
	size_t inflight; /* bytes being created by defragmentations, for the limit */
	unsigned mappers; /* callers inside vpi_defrag()'s driver work (atomic,
			   * read without the lock): the background thread
			   * leaves its unmaps for later meanwhile
			   * (reclaim.c, defer_to_mappers) */
	unsigned reclaim_deferrals; /* rounds in a row it did so; written by
				     * the thread only, under the lock */
	uint64_t loop_grown; /* bytes created instead of remapping, for the cap */
	size_t dev_free;      /* the device's free bytes at dev_read_ns, less
			       * what the pool created since (growth.c) */
	uint64_t dev_read_ns; /* when they were read (vpi_clock_ns); 0: never */
	size_t ask_free;      /* the device's free bytes when a growth past the
			       * estimate asked (vpi_growth_may_create), less
			       * what the pool created since; SIZE_MAX: the
			       * question failed */
	uint64_t ask_ns;      /* when; 0: to be asked */
	uint64_t (*clock)(void *arg); /* the rules' clock (vpmm_pool_set_clock);
				       * NULL: vpi_now_ns */
	void *clock_arg;
	bool dev_unknown;     /* that read failed: VPMM_REMAP=always's policy
			       * until the next (growth.c) */
	bool loop_missed;     /* while the device had room, a malloc that
			       * repeats a loop found none of its earlier
			       * places free and no free region that fits,
			       * after the loops had kept VPMM_LOOP_KEPT
			       * places (take.c): placement by cost for the
			       * pool's life, room or not (place.c) */

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

/* vpmm_pool_stats() with the lock held (snapshot.c shares it). */
void vpi_stats_locked(vpmm_pool *p, struct vpmm_stats *out);

/* Now, on the clock of the pool's rules that follow time: the event
 * interval, the reads of the device's free memory. Never 0, which the
 * times it sets read as never. */
static inline uint64_t vpi_clock_ns(const vpmm_pool *p)
{
	uint64_t now = p->clock ? p->clock(p->clock_arg) : vpi_now_ns();
	return now ? now : 1;
}

/* `size` rounded up to whole grains: what a request above the size classes
 * takes, and a slab's size (small.c). */
static inline size_t vpi_grains(const vpmm_pool *p, size_t size)
{
	return (size + p->grain - 1) & ~(p->grain - 1);
}

/* The page `off` bytes into a chunk lies in. */
static inline size_t vpi_page_index(const vpmm_pool *p, uint64_t off)
{
	return p->page_shift ? (size_t)(off >> p->page_shift) : (size_t)(off / p->page);
}

/* `bytes` rounded up to whole pages: what the driver maps. */
static inline size_t vpi_whole_pages(const vpmm_pool *p, size_t bytes)
{
	return vpi_page_index(p, bytes + p->page - 1) * p->page;
}

/* s's cache, or the synchronous callers' for s NULL. */
static inline struct front *vpi_front_of(vpmm_pool *p, struct stream *s)
{
	return s ? &s->front : &p->sync_front;
}

#endif
