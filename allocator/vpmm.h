/* vpmm.h — the pool: one growing virtual address space, physical pages mapped
 * on demand, and defragmentation by remapping pages instead of copying.
 *
 * Errors: every function returning int returns 0 or a negative errno:
 *   -ENOMEM  the device (or the configured limit) has no memory for the request
 *   -EINVAL  a bad argument: a pointer the pool does not own, a zero size
 *   -EIO     the driver failed otherwise; vpmm_pool_last_result() tells how
 * After any error the pool is consistent and holds nothing the failed call made.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef VPMM_H
#define VPMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <cuda.h>

#include "driver.h"
#include "vpmm/stats.h"

typedef struct vpmm_pool vpmm_pool;

enum vpmm_defrag_policy {
	VPMM_DEFRAG_LACKING, /* remap only what the request lacks (default) */
	VPMM_DEFRAG_ALL,     /* remap every harvestable free page */
};

/* When a request that no free range fits is served by remapping free
 * pages rather than by new memory (VPMM_REMAP). */
enum vpmm_remap_policy {
	/* Under memory pressure only: new memory alone while the device and
	 * the limit leave room, defragmentation as that room runs out
	 * (default; growth.c). */
	VPMM_REMAP_PRESSURE,
	/* Always defragment first: the least memory at every moment. */
	VPMM_REMAP_ALWAYS,
};

#define VPMM_FRONT_ENTRIES_MAX 256 /* most entries of a stream's cache */
#define VPMM_LOOP_GROWTH_MAX 1000  /* percent */
#define VPMM_GROWTH_SPLIT_MAX 4096 /* finer is one page a handle anyway */
/* Rounds in a row the background thread leaves its unmaps for later while
 * callers map (counter reclaims_deferred), each until a caller's mapping
 * ends or VPMM_RECLAIM_DEFER_NS pass; then it unmaps regardless. */
#define VPMM_RECLAIM_DEFER_MAX 16
#define VPMM_RECLAIM_DEFER_NS 1000000

struct vpmm_config {
	size_t page_size;     /* physical unit; 0 = the driver's granularity */
	/* Rounding unit of allocations: a power of two from 512 up to the
	 * page, which it divides; 0 = the page. With a
	 * grain under the page, neighbouring allocations share a page's tail;
	 * such a page moves only once both sides are free. */
	size_t grain;
	size_t va_size;       /* bytes of one VA reservation chunk */
	size_t initial_pages; /* pages mapped at creation */
	size_t handle_size;   /* largest physical handle made when growing; 0 = page_size */
	/* A growth of S bytes, with M bytes mapped, is made of handles of the
	 * largest power of two of pages within S / k (at most handle_size),
	 * k = 1 + growth_split * M / (M + S): one handle in an empty pool,
	 * S / growth_split once the pool is much larger. 0 = every handle is
	 * handle_size. */
	unsigned growth_split;
	size_t limit;         /* most physical bytes the pool may hold; 0 = no limit */
	/* Requests of at most this many bytes (and under a page) are carved in
	 * size classes from shared pages; 0 = every request takes whole pages. */
	size_t small_max;
	int device;
	enum vpmm_defrag_policy defrag;
	enum vpmm_remap_policy remap;
	/* A free records an event on its stream only if the stream's last event
	 * is older than this; sooner frees join the open epoch. 0 = every free. */
	uint64_t event_interval_ns;
	/* A thread of the pool unmaps zombies once their events complete;
	 * otherwise the next malloc (or vpmm_pool_reclaim) does. */
	bool background;
	/* Free memory beyond release_threshold bytes is unmapped and released
	 * to the driver once its work completed (by the background thread, or
	 * by vpmm_pool_trim). Off: the pool keeps every page it made. */
	bool release;
	size_t release_threshold;
	/* Per-stream caches of freed allocations, reused by mallocs of the same
	 * rounded size on the same stream without the pool lock: up to
	 * front_entries (at most VPMM_FRONT_ENTRIES_MAX; 0 = off) and
	 * front_bytes per stream. */
	unsigned front_entries;
	size_t front_bytes;
	/* A defragmentation that repeats a loop exactly grows the pool instead,
	 * by up to this percentage of the rest of the pool in all (0: never). */
	uint64_t loop_growth;
};

/* The defaults the options table documents (no environment read). */
void vpmm_config_default(struct vpmm_config *cfg);

/* Create a pool over `drv` (which the pool does not own) and map
 * cfg->initial_pages pages. */
int vpmm_pool_create(const struct vpmm_config *cfg, vpmm_driver *drv,
		     vpmm_pool **out);
/* Unmap and release everything, free the VA. Live allocations are lost. */
void vpmm_pool_destroy(vpmm_pool *pool);

/* The stream of a caller with no stream order (cudaMalloc/cudaFree): a malloc
 * on it returns memory with no pending work, usable on every stream (it may
 * wait on the CPU for that); a free on it promises that no work that may touch
 * the memory is pending (the caller synchronized), so the memory is settled at
 * once. */
#define VPMM_NO_STREAM ((CUstream)(uintptr_t)-1)

/* Allocate `size` bytes (rounded up to pages) for use on `stream`. */
int vpmm_pool_malloc(vpmm_pool *pool, size_t size, CUstream stream,
		     CUdeviceptr *out);
/* Free an allocation; its memory is reusable at once on `stream` and on other
 * streams once the stream's work issued before this call completed. */
int vpmm_pool_free(vpmm_pool *pool, CUdeviceptr ptr, CUstream stream);
/* malloc, free, find, stream_gone, reclaim, poll and trim answer -EDEADLK,
 * and do nothing, on a thread that holds one of the pool's locks: a signal
 * handler that interrupted the pool, which would otherwise wait for itself
 * for ever. */

/* Phase 0 on demand: unmap the zombies whose events completed (they become
 * holes). Returns how many ranges were reclaimed, or a negative errno. */
int vpmm_pool_reclaim(vpmm_pool *pool);
/* The program is about to destroy `stream`: its pending frees are covered
 * by one last event recorded now, and the pool never uses the handle again
 * (a new stream with the same handle is a new stream). Call it before the
 * real destroy. Returns 0 or a negative errno (the stream is retired all the
 * same). */
int vpmm_pool_stream_gone(vpmm_pool *pool, CUstream stream);
/* Around a synchronisation of the device (cudaFree's): called with
 * before_sync before it, every stream's pending and cached frees get an
 * event (their open epochs close); called without once it succeeded, every
 * event that completed settles its frees, so that memory freed on any
 * stream is reusable by all and merges with its free neighbours, and so do
 * the frees of a destroyed stream whose last event could not be recorded.
 * Returns how many free regions settled, or a negative errno. */
int vpmm_pool_poll(vpmm_pool *pool, bool before_sync);
/* The context the pool's events were made in is about to end (the program
 * destroys or resets it; call it current, after its work completed and
 * vpmm_pool_poll settled what that work held): the recycled events are
 * destroyed while the driver still knows them. `rebind` is the context the
 * pool lives in from now on (its background thread's): the same one after
 * a reset (the handle stays), NULL while it has none (until the shim gives
 * it the next context that allocates). A reset nothing announced the pool
 * learns of by the context's id (cuCtxGetId) on its own. */
/* `synced`: the context's work is known complete (it was synchronised
 * since the last work was queued); then the streams it takes with it close
 * their open epochs without a record. Without it (a context adopted, a
 * synchronisation that failed) what they freed waits for their events. */
void vpmm_pool_drop_events(vpmm_pool *pool, CUcontext rebind, bool synced);
/* While `paused`, the pool's background thread makes no driver call (it
 * waits, between two of its passes): the program is destroying the context
 * the pool's events live in, and an event queried meanwhile may die in the
 * query. */
void vpmm_pool_pause(vpmm_pool *pool, bool paused);
/* The clock of the pool's rules that follow time (how often a free records
 * an event, how often the device's free memory is read): now_ns(arg), in
 * nanoseconds that never go back. NULL restores CLOCK_MONOTONIC. For
 * replays on a log's own time (vpmm-replay): set it before the pool is
 * used, on a pool without the background thread (cfg.background false),
 * and call the pool only from the thread that moves the clock. */
void vpmm_pool_set_clock(vpmm_pool *pool, uint64_t (*now_ns)(void *arg), void *arg);
/* The context the pool's events and streams lived in has ended (after the
 * program's cuCtxDestroy or reset returned): whatever vpmm_pool_poll could
 * not settle before it (a synchronisation that failed on a sticky error) is
 * settled now, and the events still held are dropped without a driver call.
 * Live memory stays live. */
void vpmm_pool_context_ended(vpmm_pool *pool);
/* Unmap and release free pages whose work completed until at most `keep`
 * reusable bytes remain. Returns the bytes released, or a negative errno. */
long long vpmm_pool_trim(vpmm_pool *pool, size_t keep);
/* The peaks of live and/or mapped bytes start again from their current
 * values. */
void vpmm_pool_reset_peaks(vpmm_pool *pool, bool live, bool mapped);
/* The free bytes kept mapped (cfg->release_threshold; SIZE_MAX: release
 * off, every page kept), first set to *set when set is not NULL. */
size_t vpmm_pool_release_threshold(vpmm_pool *pool, const size_t *set);
/* The live allocation containing `ptr`: its base and its (rounded) size.
 * -EINVAL if none. */
int vpmm_pool_find(vpmm_pool *pool, CUdeviceptr ptr, CUdeviceptr *base,
		   size_t *size);
/* The same without the pool lock, for the owner of the live allocation
 * (or sub-grain block) that starts at `ptr`, before it frees it: -EINVAL
 * where the grain map cannot tell (a pointer inside an allocation, one
 * parked or being freed), and vpmm_pool_find then answers. For any other
 * caller the answer may already be stale. */
int vpmm_pool_find_own(vpmm_pool *pool, CUdeviceptr ptr, CUdeviceptr *base,
		       size_t *size);
/* Whether `ptr` lies in VA this pool reserved (live or not). */
bool vpmm_pool_owns(vpmm_pool *pool, CUdeviceptr ptr);

/* ---- sharing (share.c) ---------------------------------------------------- */

/* Grant `device` read/write access to every page the pool maps, now and
 * from now on (pages mapped later, remapped pages): what peer access means
 * for pool memory. Idempotent. -EINVAL: a bad device or too many; -EIO or
 * -ENOMEM: the driver refused (vpmm_pool_last_result tells how; the pool is
 * unchanged for later mappings); -EAGAIN: driver work of other threads
 * kept the pool busy for seconds. */
int vpmm_pool_grant(vpmm_pool *pool, int device);
/* The devices with access (the pool's own first); returns how many. */
size_t vpmm_pool_access(vpmm_pool *pool, int *out, size_t cap);

/* One physical handle under an allocation, mapped whole. */
struct vpmm_piece {
	CUmemGenericAllocationHandle handle;
	size_t size;
};
struct vpmm_extent {
	CUdeviceptr base; /* the allocation holding the pointer */
	size_t size;
	size_t offset;    /* of base inside the first piece */
	size_t npieces;   /* pieces under [base, base + size) */
};
/* The handles under the live allocation holding `ptr`, in address order:
 * pieces first .. first+cap-1 into out, the allocation into *ext. Returns
 * how many were copied, or -EINVAL when ptr is in no live allocation. The
 * handles stay valid while the allocation stays live. */
int vpmm_pool_pieces(vpmm_pool *pool, CUdeviceptr ptr, size_t first,
		     struct vpmm_piece *out, size_t cap, struct vpmm_extent *ext);

size_t vpmm_pool_page_size(const vpmm_pool *pool);
/* The CUresult behind the last -EIO or -ENOMEM (CUDA_SUCCESS if none). */
CUresult vpmm_pool_last_result(vpmm_pool *pool);

/* Walks every structure and returns the number of broken invariants, each
 * written to `log` (may be NULL). Runs in release builds too. */
size_t vpmm_pool_check(vpmm_pool *pool, FILE *log);

/* ---- stats ---------------------------------------------------------------- */

/* struct vpmm_stats and its fields: vpmm/stats.h. */

void vpmm_pool_stats(vpmm_pool *pool, struct vpmm_stats *out);
/* Text (one "name value" line each) or one JSON object. */
void vpmm_stats_print(const struct vpmm_stats *s, FILE *f, bool json);

/* ---- the region map -------------------------------------------------------- */

enum vpmm_region_kind {
	VPMM_REGION_LIVE,   /* [X]  */
	VPMM_REGION_FREE,   /* [-X] */
	VPMM_REGION_HOLE,   /* [*X] */
	VPMM_REGION_ZOMBIE, /* [~X] */
};

struct vpmm_region_info {
	CUdeviceptr va;
	size_t size;
	enum vpmm_region_kind kind;
	CUstream stream; /* free: the stream that freed it; 0 with settled */
	bool settled;    /* free: no pending work, any stream may take it */
	unsigned chunk;  /* index of the VA reservation */
};

/* Copies up to `cap` regions in ascending VA order into `out`; returns how
 * many regions there are (may exceed cap). */
size_t vpmm_pool_regions(vpmm_pool *pool, struct vpmm_region_info *out,
			 size_t cap);
/* The region map in vpmm-dump's notation (docs/vpmm-dump.md), sizes in multiples of `unit` (or with a
 * K/M/G/T suffix when unit is 0), e.g. "[4][*6][1][-11]". Chunks are
 * separated by " | ". Returns the length it needed (snprintf-like). */
size_t vpmm_pool_layout(vpmm_pool *pool, char *buf, size_t n, size_t unit);

/* ---- options (options.c) --------------------------------------------------- */

/* Parses "123", "64K", "2M", "8G", "1T" (powers of 1024, optional B/iB
 * suffix). Returns 0 or -EINVAL / -ERANGE. */
int vpmm_parse_size(const char *s, size_t *out);
/* Fills cfg from the VPMM_* variables of `getenv_fn` (getenv if NULL) over the
 * defaults. On a bad value returns -EINVAL and writes one line naming the
 * variable into err. */
int vpmm_config_from_env(struct vpmm_config *cfg,
			 const char *(*getenv_fn)(const char *name),
			 char *err, size_t errlen);
/* The checks between options that need the driver's granularity (bytes),
 * the ones vpmm_pool_create() makes: 0, or -EINVAL with one line in err
 * (may be NULL) naming the VPMM_* variables at fault. */
int vpmm_config_check(const struct vpmm_config *cfg, size_t granularity, char *err,
		      size_t errlen);
/* Calls `report` for each variable in `environ` that looks like a VPMM_*
 * option misspelled (in another case, or one letter or underscore added,
 * missing, changed or swapped) with the option meant; returns how many. */
size_t vpmm_options_misspelled(char *const *environ,
			       void (*report)(const char *given, const char *meant, void *arg),
			       void *arg);

#endif
