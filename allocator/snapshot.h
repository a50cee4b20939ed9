/* snapshot.h — a consistent copy of one pool's state (configuration, stats,
 * VA chunks and every region) taken under a single hold of the pool's lock,
 * for readers that format it later without the lock (the vpmm-dump server,
 * the shim's out-of-memory reports, vpmm-replay's first refusal).
 *
 * vpmm_pool_stats() and vpmm_pool_regions() each copy under the lock, but two
 * calls may straddle an allocation; a snapshot never does. It also shows
 * what the program sees rather than the pool's bookkeeping: an allocation
 * parked in a stream's cache (freed, kept for a quick reuse) is a free region
 * of that stream, as vpmm_pool_stats() counts it reusable. So the regions of
 * each kind sum to the gauges of the stats (live, reusable, holes, zombies),
 * except for sub-grain blocks parked in a cache: those count as reusable
 * while their slab, a region carved into blocks, stays live.
 *
 * It also says where the free memory lies (struct vpmm_free_split), the
 * answer to "out of memory with this much free": a defragmentation moves
 * only handles wholly free.
 */
#ifndef VPMM_SNAPSHOT_H
#define VPMM_SNAPSHOT_H

#include "vpmm.h"

struct vpmm_chunk_info { /* one VA reservation */
	CUdeviceptr va;
	size_t size;
};

struct vpmm_snap_region {
	CUdeviceptr va;
	size_t size;
	enum vpmm_region_kind kind;
	CUstream stream; /* free: the stream that freed it (0 when settled) */
	bool settled;    /* free: no pending work, any stream may take it */
	bool parked;     /* free: held in the stream's cache of recent frees */
	bool small;      /* live: a slab carved into sub-grain blocks */
	unsigned chunk;  /* index of the VA reservation */
};

/* The free regions of a snapshot (parked allocations among them) by the
 * handles under them. A handle wholly free can be remapped anywhere, once
 * the frees pending on it have completed (a defragmentation moves a handle
 * lying inside one free region; one under the pending frees of two streams
 * waits for them to settle and merge). The free bytes of a handle that
 * also holds live memory are stranded: they serve only a request placed
 * where they lie. Every free byte lies in one handle, so whole + stranded
 * is the free regions' sum. */
struct vpmm_free_split {
	uint64_t whole;            /* bytes in handles wholly free */
	uint64_t whole_handles;
	uint64_t stranded;         /* free bytes in handles holding live memory too */
	uint64_t stranded_handles;
	uint64_t largest;          /* the largest free region */
};

struct vpmm_snapshot {
	struct vpmm_config cfg;  /* as the pool runs it (page_size resolved) */
	struct vpmm_stats stats; /* as vpmm_pool_stats() reports them */
	struct vpmm_free_split free_split;
	struct vpmm_chunk_info *chunks; /* by index (= region.chunk) */
	size_t nchunks;
	struct vpmm_snap_region *regions; /* ascending VA */
	size_t nregions;
};

/* Fills *out (the arrays are malloc'd; release with vpmm_snapshot_free).
 * Allocates outside the lock and retries if the pool grew meanwhile.
 * 0, or -ENOMEM (then *out holds nothing). */
int vpmm_pool_snapshot(vpmm_pool *pool, struct vpmm_snapshot *out);
void vpmm_snapshot_free(struct vpmm_snapshot *s);

/* The configuration and stats alone (cheap: no region walk). */
void vpmm_pool_summary(vpmm_pool *pool, struct vpmm_config *cfg,
		       struct vpmm_stats *stats);

/* "live", "free", "hole", "zombie" — the names of the JSON documents. */
const char *vpmm_region_kind_name(enum vpmm_region_kind kind);

#endif
