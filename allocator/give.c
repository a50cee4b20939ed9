/* give.c — the free path under the lock: a live region becomes free
 * memory, pending on its stream until its work completes, merged with its
 * free neighbours; now and then its stream's epoch is closed.
 *
 * Calls region.c, stream.c and chunk.c (the grain map). Lock held.
 */
#include "chunk.h"
#include "give.h"
#include "pool.h"
#include "reclaim.h"
#include "region.h"
#include "stream.h"

/* A live region becomes free on `s` (NULL: settled), freed in `epoch` of s
 * (0: now). Lock held. */
void vpi_give_locked(vpmm_pool *p, struct region *r, struct stream *s,
			   uint64_t epoch)
{
	vpi_gmap_publish(p, r, false);
	r->kind = R_FREE;
	__atomic_store_n(&r->small, NULL, __ATOMIC_RELEASE);
	if (s && s->dead && (!epoch || epoch >= s->epoch))
		epoch = s->epoch - 1; /* no work after its last event */
	if (s && epoch && epoch <= s->done)
		s = NULL; /* parked while its work completed: settled */
	r->stream = s;
	r->epoch = s ? (epoch ? epoch : s->epoch) : 0;
	r->seq = ++p->free_seq;
	GAUGE_SUB(p, live, r->size);
	GAUGE_ADD(p, reusable, r->size);
	vpi_free_insert(p, r);
	/* Close the epoch now and then, so other streams can learn of
	 * completion without a record of their own; never on every free.
	 * A stream takes its own frees in its order: while it is the only
	 * taker, only a trim (giving memory back) and a taker yet to come
	 * would learn anything, and SOLE_RECORD_NS is soon enough for both.
	 * The 50 us interval there cost a training step 55 driver calls a
	 * step, 0.2-0.3 ms on an H100 (docs/design.md). */
	uint64_t every = p->cfg.event_interval_ns;
	if (every && every < SOLE_RECORD_NS && p->nstreams <= 1 && !p->sync_takes)
		every = SOLE_RECORD_NS;
	if (s && !s->dead &&
	    (!every || !s->last_record_ns || vpi_clock_ns(p) - s->last_record_ns >= every))
		vpi_close_epoch(p, s, NULL);
	if (p->cfg.release && p->st.reusable > p->cfg.release_threshold)
		pthread_cond_signal(&p->reclaim_cond);
}
