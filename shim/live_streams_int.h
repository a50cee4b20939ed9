/* live_streams_int.h — the table of live streams, shared by
 * live_streams.c (which keeps it) and fence.c (the fences built on it).
 * Every field under vpmm_ls.lock unless said otherwise. Includes shim.h
 * only; not for other files.
 */
#ifndef VPMM_LIVE_STREAMS_INT_H
#define VPMM_LIVE_STREAMS_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "shim.h"

#define BUCKETS 1024
#define CTX_MAX 64
/* Ended non-blocking streams' events a context's legacy stream has not
 * waited for yet (fence.c, keep_ended_locked). */
#define ENDED_MAX 8

struct live {
	CUstream s;
	CUcontext ctx;
	int dev;
	bool nonblocking;
	CUevent ev;      /* the fence's record on it; NULL until needed */
	unsigned nb_idx; /* index in nb[] when non-blocking */
	struct live *next;
};

struct vpmm_ls_table {
	pthread_mutex_t lock;
	struct live *bucket[BUCKETS];
	/* The non-blocking streams, dense, every context's. */
	struct live **nb;
	unsigned n_nb, cap_nb;
	/* The legacy stream's event of each context, for the fences. owed:
	 * a synchronous free was made on the legacy stream since the last
	 * record there (the record the next malloc on it makes). nb_owed:
	 * and the legacy stream has not waited for the non-blocking streams
	 * since (pay_nb_locked, before any record there). fenced: the
	 * count of obligations when the non-blocking streams last waited for
	 * the legacy stream (vpmm_fence_malloc), or found the record they
	 * would have waited for complete, or, with none, when a synchronous
	 * malloc last made the record the frees owed; fenced_freed the count
	 * of ranges freed then (fence.c). ended: events recorded on non-blocking
	 * streams of the context as they ended, the last of their work; the
	 * next wait for the non-blocking streams waits for these too, and
	 * destroys them. */
	struct {
		CUcontext ctx;
		CUevent ev;
		CUevent ended[ENDED_MAX];
		unsigned n_ended;
		bool owed, nb_owed;
		unsigned long fenced, fenced_freed;
	} legacy[CTX_MAX];
	/* The contexts with streams in the table, their devices and counts;
	 * overflow: more contexts than that (each device then synchronises). */
	struct {
		CUcontext ctx;
		int dev;
		unsigned streams;
	} ctxs[CTX_MAX];
	bool ctx_overflow;
	/* The id (cuCtxGetId) each context had when last seen. */
	struct {
		CUcontext ctx;
		unsigned long long id;
	} ids[CTX_MAX];
	/* Counts every change of the streams above (ctx_count_locked), so
	 * that the table's verdict on a fence (no stream another context has
	 * on the device, not too many non-blocking streams) is worked out once
	 * a change rather than on every synchronous call: 64 contexts' slots
	 * were read twice a malloc+free pair, 28 % of the pair's instructions
	 * on the host driver. */
	unsigned long gen;
	struct {
		unsigned long gen; /* vpmm_ls.gen it was worked out at; 0: none */
		CUcontext ctx;
		int dev;
		bool ok;
	} verdict;
};

extern struct vpmm_ls_table vpmm_ls;

/* Set once the table cannot be trusted to hold every stream. */
extern atomic_bool vpmm_ls_untrusted;
/* vpmm_ls.n_nb, read without the lock by the malloc fence, which has
 * nothing to do without non-blocking streams (PyTorch without side
 * streams). A stream made meanwhile waits for the legacy stream by itself
 * (vpmm_fence_new_stream). */
extern atomic_uint vpmm_ls_nb_count;
/* How many vpmm_ls.legacy[] are owed a record; read without the lock, as
 * vpmm_ls_nb_count, by the mallocs on the legacy stream. */
extern atomic_uint vpmm_ls_owed_count;
/* How many vpmm_ls.legacy[] are owed the wait for the non-blocking
 * streams; read without the lock by the pool's records on the legacy
 * stream (record_for_pool). */
extern atomic_uint vpmm_ls_nb_owed_count;

/* live_streams.c */
/* From now on synchronous frees synchronise (logged once, with why). */
void vpmm_ls_distrust(const char *why);
/* Compares ctx's id with the one it had when last seen; a new one ends
 * what the table holds of the context. */
void vpmm_ls_check_id_locked(CUcontext ctx);
/* Forgets ctx's streams and legacy event; their events died with it. */
void vpmm_ls_ctx_end_locked(CUcontext ctx);
/* The record, and the wait for the non-blocking streams, owed on
 * vpmm_ls.legacy[k]: made, or no longer due. */
void vpmm_ls_settle_locked(unsigned k);
void vpmm_ls_settle_nb_locked(unsigned k);

/* fence.c */
/* Non-blocking stream e is about to end: its last work is recorded and
 * kept for the next wait its context's legacy stream owes (or waited
 * for now, past ENDED_MAX). False: neither that nor a host wait could be
 * made. */
bool vpmm_fence_dying_locked(struct live *e);

#endif
