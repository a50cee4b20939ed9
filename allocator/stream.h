/* stream.h — streams and events (stream.c): a stream's epochs, the events
 * that close them, and settling what completed. stream.c calls region.c
 * (a settled region moves index) and loop.c.
 */
#ifndef VPMM_STREAM_H
#define VPMM_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "front.h"
#include "tree.h"
#include "vpmm.h"

struct region;
struct slab;

/* Completed events kept for reuse whatever happens; beyond these, those
 * the cache held unused from one destroyed stream to the next are destroyed
 * (vpi_event_cache_trim_locked). */
#define VPMM_EVENT_CACHE_MAX 64

/* An event recorded on a stream closes that stream's epoch: it completes once
 * every free tagged with an epoch <= ev->epoch can be reused by anyone. */
struct event {
	CUevent ev;
	struct stream *stream; /* while on its stream's list; NULL once off it
				* (completed), as the stream may be freed */
	uint64_t epoch;
	unsigned refs;      /* the stream's pending list + zombies waiting on it */
	bool done;
	/* Its context ended (vpmm_pool_drop_events): the driver event is
	 * destroyed, and the struct is freed, not cached, once unreferenced. */
	bool gone;
	struct event *next; /* stream's pending list (epoch ascending) or cache */
	struct event *all_prev, *all_next; /* pool->events: every event */
};

struct stream {
	CUstream handle;
	unsigned id;              /* creation order: "oldest stream first" */
	uint64_t epoch;           /* open epoch: frees now are tagged with it
				   * (atomic: read by front.c without the lock) */
	uint64_t done;            /* every epoch <= done has completed; < epoch */
	uint64_t last_record_ns;  /* when an event was last recorded on it,
				   * by vpi_clock_ns; 0: never */
	struct event *ev_head, *ev_tail; /* recorded, not known complete */
	/* Pending free regions of this stream: by (size, va) and, in fifo,
	 * by epoch ascending. Each has done < region->epoch <= epoch. */
	struct vpi_tree free_by_size;
	struct region *fifo_head, *fifo_tail;
	struct slab **small_partial; /* small.c: per class, slabs with room */
	unsigned slabs;              /* small.c: live slabs it owns */
	unsigned pins;               /* defrag.c: defragmentations in the driver
				      * for it, and regions naming it that they
				      * hold busy (in no list of its) */
	struct front front;
	/* The program destroyed it: nothing is recorded on it any more; its
	 * last event covers every free it had (vpmm_pool_stream_gone). Out
	 * of the hash, on pool->dead until nothing refers to it any more
	 * (vpi_stream_reap_locked). Set atomically: a lock-free free reads
	 * it (front.c). */
	bool dead;
	struct stream *hash_next;
	struct stream *prev, *next; /* pool->streams, creation order */
	struct stream *dead_next;   /* pool->dead */
};

/* The stream record of `h`, created on first sight; NULL if the host is out
 * of memory. VPMM_NO_STREAM has no record (callers pass NULL). */
struct stream *vpi_stream_get_locked(vpmm_pool *p, CUstream h);
/* The same for the lock-free paths, which have not checked that the
 * context still stands (reset.c): no reap (it queries dead streams'
 * events); what a new record would have reaped is owed to the next
 * vpi_stream_get_locked. */
struct stream *vpi_stream_get_unchecked_locked(vpmm_pool *p, CUstream h);
/* The slot of h in p->stream_hash. */
unsigned vpi_stream_slot(const vpmm_pool *p, CUstream h);
/* The stream `s`, at *link in its hash chain, is gone: no malloc will name
 * it again, and a new stream may come with its handle. Its record waits on
 * pool->dead until nothing refers to it. */
void vpi_stream_forget_locked(vpmm_pool *p, struct stream *s, struct stream **link);
/* Whether every free of s so far is covered by an event already recorded or
 * known complete: no free in its open epoch, no epoch closed by a record
 * that failed. */
bool vpi_stream_covered(const struct stream *s);
/* Looks at up to `max` dead streams, oldest first: what completed on each
 * settles, and the record of one that nothing refers to any more (no
 * pending free, no event not known complete, no slab, no cache entry, no
 * pin) is freed; the others go to the back. Only where no caller holds a
 * stream pointer: at the top of a public call or of a new stream's
 * record. */
void vpi_stream_reap_locked(vpmm_pool *p, size_t max);
/* Record an event on s that closes its open epoch. */
int vpi_close_epoch(vpmm_pool *p, struct stream *s, struct event **out);
/* vpi_close_epoch(), unless another thread is capturing s: -EBUSY then. */
int vpi_close_epoch_uncaptured(vpmm_pool *p, struct stream *s);
/* The first event of s that completes after every free of `epoch`; NULL when
 * that epoch is already known complete. Records one if none covers it yet. */
int vpi_cover_event(vpmm_pool *p, struct stream *s, uint64_t epoch,
		    struct event **out);
/* Unlinks ev from p->events (it is being destroyed). */
void vpi_event_forget(vpmm_pool *p, struct event *ev);
/* A stream was destroyed: the cached events no one took since the last
 * destroy, beyond VPMM_EVENT_CACHE_MAX, are destroyed. A program's events in
 * flight come back to the cache whatever their number (a stream that frees
 * without a poll piles up thousands, and needs them again); a burst of
 * streams that ended leaves no more than this. */
void vpi_event_cache_trim_locked(vpmm_pool *p);
void vpi_event_unref(vpmm_pool *p, struct event *ev);
/* Query s's events oldest first; what completed settles. */
void vpi_poll_stream(vpmm_pool *p, struct stream *s);
/* Other streams than caller: close their open epochs so completion can be
 * seen, then let what completed settle. */
void vpi_poll_others(vpmm_pool *p, struct stream *caller);
bool vpi_event_done_locked(vpmm_pool *p, struct event *ev);
/* The context the events and streams live in ended without a word to the
 * pool (a reset it learned of afterwards): every event is dropped without
 * a driver call, and every stream's frees so far settle. */
void vpi_events_lost_locked(vpmm_pool *p);
/* The context was synchronised and s's events polled: if s is dead with
 * frees no event covers (its last record failed), they settle. */
void vpi_stream_synced_locked(vpmm_pool *p, struct stream *s);
/* s ended with its context, whose work completed (vpmm_pool_drop_events):
 * its events retire, and its open epoch closes without a record, so that
 * what was freed on it, parked in its cache included, needs none. */
void vpi_stream_ended_locked(vpmm_pool *p, struct stream *s);
/* Wait on the CPU for ev; true once it completed. */
bool vpi_event_wait_locked(vpmm_pool *p, struct event *ev);

#endif
