/* reset.c — a context that ended under the pool: learned of by its id (the
 * primary context's reset keeps the handle and changes the id; the CUDA 13
 * runtime's cudaDeviceReset reaches the driver where no hook of the shim
 * sees it), and what the pool lets go of then.
 *
 * Calls stream.c (events and streams), front.c (parked frees join their
 * streams) and small.c (slabs of forgotten streams, deferred blocks). Lock
 * held throughout; no driver call but the id's.
 */
#include "front.h"
#include "pool.h"
#include "reset.h"
#include "small.h"
#include "stream.h"

bool vpi_ctx_check_locked(vpmm_pool *p)
{
	unsigned long long id = 0;
	if (!p->drv->ctx_id || p->no_ctx_id)
		return false;
	/* With its thread, the pool names its context (the thread's); none
	 * while it has lost one: the calling thread's would be any context. */
	if (p->cfg.background && !p->ctx)
		return false;
	CUresult r = DRV(p, VPMM_OP_CTX_ID, ctx_id, p->ctx, &id);
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		p->no_ctx_id = true;
		return false;
	}
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
		return false; /* no context to ask (none current): nothing known */
	/* Destroyed and not made again: 0 until it is, whose id is then the
	 * first one seen. */
	if (r != CUDA_SUCCESS)
		id = 0;
	bool ended = p->ctx_id && id != p->ctx_id;
	p->ctx_id = id;
	if (ended)
		vpi_ctx_ended_locked(p);
	return ended;
}

void vpi_ctx_ended_locked(vpmm_pool *p)
{
	p->ctx_resets++;
	/* Events first: from here on no stream has one to record or query,
	 * and every stream's frees so far are settled. */
	vpi_events_lost_locked(p);
	/* The context's streams end with it, with no cuStreamDestroy to tell,
	 * and their handles may come back for new streams: each is forgotten
	 * as a destroyed one is (dead: nothing is recorded on it again). The
	 * default streams' handles stay: they name the next context's. */
	for (unsigned i = 0; i < p->stream_hash_size; i++)
		for (struct stream **link = &p->stream_hash[i]; *link;) {
			struct stream *s = *link;
			if ((uintptr_t)s->handle <= (uintptr_t)CU_STREAM_PER_THREAD) {
				/* No record on it before its next free of its own:
				 * the frees parked now settle without one. */
				s->last_record_ns = vpi_clock_ns(p);
				link = &s->hash_next;
				continue;
			}
			vpi_stream_forget_locked(p, s, link); /* *link is the next one */
		}
	/* Parked frees join their streams in epochs now known complete: they
	 * settle, and a dead stream's free records nothing. */
	vpi_front_flush_locked(p);
	for (struct stream *s = p->streams; s; s = s->next)
		if (s->dead)
			vpi_small_stream_gone_locked(p, s);
	vpi_small_drain_locked(p);
	vpi_stream_reap_locked(p, p->ndead);
}
