/* fence.c — the fences that let a synchronous free keep cudaFree's
 * promise without stopping the host, on the table of live streams
 * (live_streams.c).
 *
 * Owns: the per-context event the fences record on the legacy default
 * stream, what synchronous frees owe it (a record, a wait for the
 * non-blocking streams), the events of ended non-blocking streams,
 * the count of what the malloc fence must cover,
 * the ranges freed since, the pool's handles not yet mapped, and the
 * wrappers on the pool's driver calls (records and waits on the legacy
 * stream, handles made, mapped and released).
 *
 * Decisions, and why:
 *  - cudaFree promises that no work issued before it, on any stream of the
 *    context, touches the memory once someone else owns it. Synchronising
 *    the context keeps it but stops the host. The legacy default stream
 *    does most of that on the device: work queued on it waits for the work
 *    queued before on every blocking stream of its context (the per-thread
 *    default streams included), and work queued later on a blocking stream
 *    waits for it. Only non-blocking streams escape both directions. So a
 *    synchronous free becomes a free on the legacy stream that owes it two
 *    things, made once for a run of frees: a wait for each non-blocking
 *    stream (an event recorded there, one per stream, reused: a wait
 *    captures the record it sees, so re-recording later is harmless),
 *    made before anything records on the legacy stream or reuses the
 *    memory in its order; and an event record (the blocking streams order
 *    against the legacy stream only through its actions: without one
 *    between the free and the malloc, two blocking streams would not be
 *    ordered), which the next malloc on the legacy stream makes (a
 *    synchronous one only if what it hands out may be pending, as
 *    below: memory freed before the last record is ordered by it). A
 *    synchronous malloc is a malloc on the legacy stream after which each
 *    non-blocking stream waits for it, if what it hands out may be pending
 *    there: freed since they last did (the freed ranges below), or an
 *    obligation came (a free that named no range, a wait of the pool's on
 *    the legacy stream, pages the pool moved); none either once that
 *    record is found complete (every old owner's work has run). Programs
 *    without
 *    non-blocking streams (PyTorch without side streams) pay at most one
 *    event record for each run of frees, and reuse memory at once in stream
 *    order, as through the pluggable allocator. With them, each stream
 *    costs about 0.6 us a run of frees and 0.35 us a malloc after one
 *    (two driver calls and one; an H200): PyTorch's 32 pool streams had
 *    cost 64 calls a free and 32 a malloc.
 *  - That holds only while every non-blocking stream is known: while the
 *    table can be trusted (live_streams.c says when it cannot), else
 *    synchronous frees synchronise.
 *  - A stream of another context on the pool's device can reach pool
 *    memory without passing the legacy stream of the pool's context: such
 *    a device synchronises (vpmm_fence_possible).
 *  - A capturing stream gets no event (it would become a graph node): the
 *    fence is refused and the caller synchronises, as before; what frees
 *    owe is made before a capture begins (vpmm_fence_capture_begins), in
 *    every context that owes it.
 *  - A non-blocking stream destroyed: its last work is recorded on its
 *    event, in its own context, owed or not (work queued after the last
 *    wait for it would be waited for by no later fence), and the event is
 *    kept with its context's legacy stream: the next wait for the
 *    non-blocking streams (before a record there that a free owes) waits
 *    for it too, then destroys it. The legacy stream waits at once only
 *    where ENDED_MAX such events are kept already (it waits for those
 *    too).
 *    Until a free needs it, nothing orders the legacy stream after the
 *    ended stream's work, as without the shim.
 * May call: live_streams_int.h, resolve.h, devices.h and process.h (is
 * there a pool, is the shim on), the log and the hook counters (shim.h).
 */
#include <stdint.h>
#include <stdlib.h>

#include "devices.h"
#include "live_streams.h"
#include "live_streams_int.h"
#include "process.h"
#include "resolve.h"

/* What can leave memory that a synchronous malloc hands out pending on
 * the legacy stream, counted, where no range says where: a free through
 * the shim that vpmm_fence_freed_range does not record (vpmm_fence_freeing),
 * every wait the pool gives the legacy stream (wait_for_pool), every
 * mapping of the pool's but a new handle's first (map_for_pool: pages
 * that moved may bring pending work to a new address). While it stands
 * still, the last fence (the non-blocking streams' wait for the legacy
 * stream, or without them its record) covers whatever a synchronous
 * malloc hands out outside the ranges freed since, and the
 * malloc makes no new one. */
static atomic_ulong obligations;

/* The ranges freed on the legacy stream (vpmm_fence_freed_range), the
 * last FREED_MAX of them, in order: entry n is freed[n % FREED_MAX], for
 * n < freed_count. Under vpmm_ls.lock. A synchronous malloc whose memory
 * overlaps none of those since the last fence, and that no obligation
 * came before, hands out memory whose old owners' work the non-blocking
 * streams already wait for, and the legacy stream's last record already
 * orders the blocking ones after (or new memory): in a PyTorch step
 * beside 32 idle pool streams, each fence costs 32-64 us; without them,
 * a record (283 ns, H200) on most mallocs where frees and mallocs
 * alternate: half as many on the benchmark's moe log. */
#define FREED_MAX 256
static struct {
	CUdeviceptr va;
	size_t size;
} freed[FREED_MAX];
static unsigned long freed_count;
/* Captures about to begin (vpmm_fence_capture_begins to _began): a
 * synchronous free meanwhile makes its waits at once, since one owed
 * could not be paid while the capture runs. */
static atomic_int beginning;

static int legacy_slot_locked(CUcontext ctx);

/* The slot in vpmm_ls.legacy of `ctx`, -1 if it has none (yet). */
static int slot_of_locked(CUcontext ctx)
{
	for (unsigned k = 0; k < CTX_MAX; k++)
		if (vpmm_ls.legacy[k].ctx == ctx)
			return (int)k;
	return -1;
}

/* Whether [va, va + size) overlaps a range freed since entry `since`;
 * true when entries since then were overwritten. */
static bool freed_since_locked(unsigned long since, CUdeviceptr va, size_t size)
{
	if (freed_count - since > FREED_MAX)
		return true;
	for (unsigned long n = since; n < freed_count; n++) {
		CUdeviceptr v = freed[n % FREED_MAX].va;
		if (v < va + size && va < v + freed[n % FREED_MAX].size)
			return true;
	}
	return false;
}

/* Whether `ctx` has a non-blocking stream. */
static bool has_nb_locked(CUcontext ctx)
{
	for (unsigned i = 0; i < vpmm_ls.n_nb; i++)
		if (vpmm_ls.nb[i]->ctx == ctx)
			return true;
	return false;
}

/* Whether the frees of `ctx` (slot k, -1: none) must have its legacy
 * stream wait before the next record there: for a non-blocking stream,
 * or an ended one's event. */
static bool owes_nb_locked(CUcontext ctx, int k)
{
	return (k >= 0 && vpmm_ls.legacy[k].n_ended) || has_nb_locked(ctx);
}

/* The legacy stream of slot k's context (current) waits for every ended
 * event, which is then destroyed (the wait keeps the record it saw). */
static CUresult wait_ended_locked(unsigned k)
{
	CUresult r = CUDA_SUCCESS;
	while (r == CUDA_SUCCESS && vpmm_ls.legacy[k].n_ended) {
		CUevent ev = vpmm_ls.legacy[k].ended[vpmm_ls.legacy[k].n_ended - 1];
		r = vpmm_real.stream_wait_event(CU_STREAM_LEGACY, ev, 0);
		if (r == CUDA_SUCCESS) {
			vpmm_real.event_destroy(ev);
			vpmm_ls.legacy[k].n_ended--;
		}
	}
	return r;
}

static bool capturing(CUstream s)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	return vpmm_real.stream_is_capturing(s, &cs) != CUDA_SUCCESS ||
	       cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

static bool have_event_calls(void)
{
	return vpmm_real.event_create && vpmm_real.event_record && vpmm_real.event_destroy &&
	       vpmm_real.stream_wait_event && vpmm_real.stream_is_capturing;
}

/* What the table says of a fence of `ctx` on `dev`: no non-blocking stream
 * of another context on the device, at most VPMM_FENCE_STREAMS_MAX of its
 * own, and no blocking stream of another context on the device either (none
 * of them waits for this context's legacy stream). Worked out once per
 * change of the table. */
static bool table_verdict_locked(CUcontext ctx, int dev)
{
	if (vpmm_ls.verdict.gen == vpmm_ls.gen && vpmm_ls.verdict.ctx == ctx && vpmm_ls.verdict.dev == dev)
		return vpmm_ls.verdict.ok;
	bool ok = !vpmm_ls.ctx_overflow;
	unsigned n = 0;
	for (unsigned i = 0; ok && i < vpmm_ls.n_nb; i++) {
		struct live *e = vpmm_ls.nb[i];
		if (e->ctx == ctx)
			ok = ++n <= VPMM_FENCE_STREAMS_MAX;
		else if (e->dev == dev)
			ok = false;
	}
	for (unsigned k = 0; ok && k < CTX_MAX; k++)
		ok = !vpmm_ls.ctxs[k].streams || vpmm_ls.ctxs[k].dev != dev || vpmm_ls.ctxs[k].ctx == ctx;
	vpmm_ls.verdict.gen = vpmm_ls.gen;
	vpmm_ls.verdict.ctx = ctx;
	vpmm_ls.verdict.dev = dev;
	vpmm_ls.verdict.ok = ok;
	return ok;
}

bool vpmm_fence_possible(CUcontext ctx, int dev)
{
	if (atomic_load_explicit(&vpmm_ls_untrusted, memory_order_relaxed) || !ctx || !have_event_calls())
		return false;
	if (capturing(CU_STREAM_LEGACY))
		return false;
	pthread_mutex_lock(&vpmm_ls.lock);
	vpmm_ls_check_id_locked(ctx);
	bool ok = table_verdict_locked(ctx, dev);
	for (unsigned i = 0; ok && i < vpmm_ls.n_nb; i++)
		ok = vpmm_ls.nb[i]->ctx != ctx || !capturing(vpmm_ls.nb[i]->s);
	pthread_mutex_unlock(&vpmm_ls.lock);
	return ok;
}

/* The work queued so far on non-blocking stream e, recorded on its
 * event, made on first use and reused (a wait captures the record it
 * sees, so re-recording later is harmless). */
static CUresult record_last_locked(struct live *e)
{
	CUresult r = CUDA_SUCCESS;
	if (!e->ev)
		r = vpmm_real.event_create(&e->ev, CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.event_record(e->ev, e->s);
	return r;
}

/* The legacy stream waits for the work queued so far on e. */
static CUresult nb_wait_locked(struct live *e)
{
	CUresult r = record_last_locked(e);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.stream_wait_event(CU_STREAM_LEGACY, e->ev, 0);
	return r;
}

/* Ending non-blocking stream e's last work recorded on its event, kept
 * with its context's legacy stream (e's context current): the next wait
 * for the non-blocking streams waits for it. With ENDED_MAX kept, the
 * legacy stream waits now, for those and for this one. */
static CUresult keep_ended_locked(struct live *e)
{
	int k = legacy_slot_locked(e->ctx);
	if (k < 0 || vpmm_ls.legacy[k].n_ended == ENDED_MAX) {
		CUresult r = k < 0 ? CUDA_SUCCESS : wait_ended_locked((unsigned)k);
		return r == CUDA_SUCCESS ? nb_wait_locked(e) : r;
	}
	CUresult r = record_last_locked(e);
	if (r == CUDA_SUCCESS) {
		vpmm_ls.legacy[k].ended[vpmm_ls.legacy[k].n_ended++] = e->ev;
		e->ev = NULL; /* the slot's now */
	}
	return r;
}

/* A non-blocking stream ending, with a pool on its device: the wait for
 * it is prepared now, while the stream is there to record on (its last
 * work may still touch memory that frees, made or to come, give back). */
bool vpmm_fence_dying_locked(struct live *e)
{
	/* Nothing to order: no pool on its device (its work cannot touch
	 * pool memory), or frees that synchronise (the shim off, the device
	 * mode, a table not trusted). */
	if (!vpmm_active() || vpmm_process_sync_device() ||
	    atomic_load_explicit(&vpmm_ls_untrusted, memory_order_relaxed) || !have_event_calls() ||
	    e->dev < 0 || !vpmm_device_pool(e->dev, NULL))
		return true;
	/* Whether or not a wait is owed now: work queued on it since the
	 * last one would otherwise be waited for by no later fence (a free
	 * after its end pays the streams still there and the ended ones).
	 * In the stream's context: its event and the legacy slot it is
	 * is kept in are that context's, and cuStreamDestroy needs none
	 * current. */
	CUcontext cur = NULL, popped;
	bool pushed = vpmm_real.ctx_get_current(&cur) == CUDA_SUCCESS && cur != e->ctx &&
		      vpmm_real.ctx_push(e->ctx) == CUDA_SUCCESS;
	CUresult r = CUDA_ERROR_INVALID_CONTEXT;
	if (cur == e->ctx || pushed)
		r = capturing(e->s) || capturing(CU_STREAM_LEGACY)
			    ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
			    : keep_ended_locked(e);
	if (pushed)
		vpmm_real.ctx_pop(&popped);
	/* Else its work is waited for on the host: what it touched is then
	 * done whoever reuses it. Under the table's lock, on purpose: a fence
	 * taking the lock meanwhile would find the stream neither known nor
	 * kept, and could hand out memory its work still touches. A capture
	 * in progress, a failed record or a context that cannot be made
	 * current leads here, rarely. */
	return r == CUDA_SUCCESS || vpmm_real.stream_synchronize(e->s) == CUDA_SUCCESS;
}

/* The wait for every non-blocking stream of vpmm_ls.legacy[k]'s context that its
 * frees owe, made on the legacy stream before anything records there: a
 * record after it then stands for the work of every stream before the
 * frees, and a reuse in the legacy stream's order comes after it. */
static CUresult pay_nb_locked(unsigned k)
{
	CUresult r = CUDA_SUCCESS;
	if (!vpmm_ls.legacy[k].nb_owed)
		return CUDA_SUCCESS;
	for (unsigned i = 0; r == CUDA_SUCCESS && i < vpmm_ls.n_nb; i++) {
		struct live *e = vpmm_ls.nb[i];
		if (e->ctx != vpmm_ls.legacy[k].ctx)
			continue;
		/* A capture begun since the frees: a record would join its
		 * graph (vpmm_fence_capture_begins pays before one begins;
		 * this is a capture it did not see). The caller synchronises,
		 * or fails as the capture makes it. */
		if (capturing(e->s))
			return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		/* Not skipped when idle: in the PyTorch step under pressure
		 * cuStreamQuery on each of 32 idle streams cost more than the
		 * record and the wait it saved (docs/design.md, "Tried"). */
		r = nb_wait_locked(e);
	}
	if (r == CUDA_SUCCESS)
		r = wait_ended_locked(k);
	if (r == CUDA_SUCCESS)
		vpmm_ls_settle_nb_locked(k);
	return r;
}

/* Puts [va, va + size) at the end of freed[]. */
static void freed_add_locked(CUdeviceptr va, size_t size)
{
	freed[freed_count % FREED_MAX].va = va;
	freed[freed_count % FREED_MAX].size = size;
	freed_count++;
}

CUresult vpmm_fence_free(CUcontext ctx, CUdeviceptr va, size_t size)
{
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&vpmm_ls.lock);
	/* The wait for the non-blocking streams (and the ended ones' kept
	 * events) is left owed (pay_nb_locked: before any record on the
	 * legacy stream, a capture's begin), so that a run of frees makes it
	 * once.
	 *
	 * And one action on the legacy stream before the memory is handed out
	 * again: the blocking streams order against it only through its
	 * actions. Work on two blocking streams, one before the free and one
	 * after the malloc, with nothing queued on the legacy stream between,
	 * would run unordered. The next malloc on the legacy stream records
	 * it (vpmm_fence_owed; a synchronous one, vpmm_fence_malloc, only if
	 * it may hand out memory freed since the last fence), once for every
	 * free made since: a record every free cost a PyTorch step about one in three
	 * of them (frees come in runs). Any other reuse, by another stream or
	 * settled, waits for an event the pool records on the legacy stream
	 * after the free: an action too. The event is made here, so that the
	 * malloc does not fail for want of one. */
	int k = legacy_slot_locked(ctx);
	if (k < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		bool nb = owes_nb_locked(ctx, k);
		if (nb && !vpmm_ls.legacy[k].nb_owed) {
			vpmm_ls.legacy[k].nb_owed = true;
			atomic_fetch_add_explicit(&vpmm_ls_nb_owed_count, 1, memory_order_release);
		}
		if (nb && atomic_load_explicit(&beginning, memory_order_acquire))
			r = pay_nb_locked((unsigned)k);
		if (!vpmm_ls.legacy[k].owed) {
			vpmm_ls.legacy[k].owed = true;
			atomic_fetch_add_explicit(&vpmm_ls_owed_count, 1, memory_order_release);
		}
	}
	/* What it frees, under the lock taken anyway: a free's second lock
	 * cost more than the records the ranges spare (docs/design.md). */
	if (r == CUDA_SUCCESS && size)
		freed_add_locked(va, size);
	else if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&obligations, 1, memory_order_release);
	pthread_mutex_unlock(&vpmm_ls.lock);
	return r;
}

/* The slot in vpmm_ls.legacy of `ctx`, its event made on first use; -1: none. */
static int legacy_slot_locked(CUcontext ctx)
{
	unsigned k, none = CTX_MAX;
	for (k = 0; k < CTX_MAX && vpmm_ls.legacy[k].ctx != ctx; k++)
		if (!vpmm_ls.legacy[k].ctx && none == CTX_MAX)
			none = k;
	if (k < CTX_MAX)
		return (int)k;
	if (none == CTX_MAX ||
	    vpmm_real.event_create(&vpmm_ls.legacy[none].ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		return -1;
	vpmm_ls.legacy[none].ctx = ctx;
	vpmm_ls.legacy[none].owed = vpmm_ls.legacy[none].nb_owed = false;
	vpmm_ls.legacy[none].fenced = ~0ul; /* the first malloc fences */
	vpmm_ls.legacy[none].fenced_freed = freed_count;
	return (int)none;
}

/* Records on the legacy stream of `ctx` (the current context), which pays
 * what the frees before owed it; *ev (may be NULL): the event recorded. */
static CUresult legacy_record_locked(CUcontext ctx, CUevent *ev)
{
	int k = legacy_slot_locked(ctx);
	if (k < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pay_nb_locked((unsigned)k);
	if (r == CUDA_SUCCESS)
		r = vpmm_real.event_record(vpmm_ls.legacy[k].ev, CU_STREAM_LEGACY);
	if (r == CUDA_SUCCESS && vpmm_ls.legacy[k].owed) {
		vpmm_count(VPMM_HOOK_fence_owed);
		vpmm_ls_settle_locked((unsigned)k);
	}
	if (ev)
		*ev = vpmm_ls.legacy[k].ev;
	return r;
}

/* Whether the frees of `ctx` owe its legacy stream a record. */
static bool owed_locked(CUcontext ctx)
{
	int k = slot_of_locked(ctx);
	return k >= 0 && vpmm_ls.legacy[k].owed;
}

void vpmm_fence_new_stream(CUstream s)
{
	CUcontext ctx = NULL;
	if (atomic_load_explicit(&vpmm_ls_untrusted, memory_order_relaxed) || !have_event_calls() ||
	    vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
		return;
	if (capturing(CU_STREAM_LEGACY)) {
		vpmm_ls_distrust("a non-blocking stream made during a capture");
		return;
	}
	pthread_mutex_lock(&vpmm_ls.lock);
	vpmm_ls_check_id_locked(ctx);
	CUevent ev;
	bool ok = legacy_record_locked(ctx, &ev) == CUDA_SUCCESS &&
		  vpmm_real.stream_wait_event(s, ev, 0) == CUDA_SUCCESS;
	pthread_mutex_unlock(&vpmm_ls.lock);
	if (!ok)
		vpmm_ls_distrust("a new non-blocking stream could not wait for the legacy stream");
}

/* Whether [va, va + size) may be pending on the legacy stream of slot k
 * since the slot's last fence: a free of part of it, or an obligation, came
 * since. */
static bool pending_since_fence_locked(unsigned k, unsigned long now, CUdeviceptr va,
				       size_t size)
{
	return vpmm_ls.legacy[k].fenced != now ||
	       freed_since_locked(vpmm_ls.legacy[k].fenced_freed, va, size);
}

/* Slot k's fence made, after `now` obligations and `freed_now` ranges. */
static void fence_made_locked(unsigned k, unsigned long now, unsigned long freed_now)
{
	vpmm_ls.legacy[k].fenced = now;
	vpmm_ls.legacy[k].fenced_freed = freed_now;
}

CUresult vpmm_fence_malloc(CUcontext ctx, CUdeviceptr va, size_t size)
{
	CUresult r = CUDA_SUCCESS;
	bool nb, wait, record;
	CUevent ev;
	if (!atomic_load_explicit(&vpmm_ls_nb_count, memory_order_acquire) &&
	    !atomic_load_explicit(&vpmm_ls_owed_count, memory_order_acquire))
		return CUDA_SUCCESS;
	/* Read before the record: what comes after, the next malloc sees. */
	unsigned long now = atomic_load_explicit(&obligations, memory_order_acquire);
	pthread_mutex_lock(&vpmm_ls.lock);
	nb = has_nb_locked(ctx);
	int k = nb ? legacy_slot_locked(ctx) : -1;
	/* The non-blocking streams wait again only if something since their
	 * last wait can have left this memory pending on the legacy stream:
	 * a free of part of it, or an obligation (a free with no range, a
	 * wait the pool gave the legacy stream for another stream's free,
	 * pages the pool moved). Otherwise whatever this malloc handed out
	 * was pending there before that wait, or not at all (new memory, or
	 * settled). The record the frees since owe waits too, then: it
	 * orders the blocking streams around their memory, not this. */
	wait = nb && (k < 0 || pending_since_fence_locked((unsigned)k, now, va, size));
	/* Without them, the record the frees owe orders the blocking streams
	 * around the memory they freed: a malloc outside it, with no
	 * obligation since the last record, hands out memory whose old
	 * owners' work that record (after their frees) already stands
	 * between, and leaves the record owed to the next malloc that may
	 * reuse it. [va, va + size) is what the program may touch, less than
	 * the pool handed out where it rounded up. */
	if (!nb && owed_locked(ctx)) {
		k = slot_of_locked(ctx);
		record = pending_since_fence_locked((unsigned)k, now, va, size);
		if (!record)
			vpmm_count(VPMM_HOOK_fence_spared);
	} else {
		record = wait;
	}
	if (nb && !wait)
		vpmm_count(VPMM_HOOK_fence_clean);
	unsigned long freed_now = freed_count;
	if (record && (r = legacy_record_locked(ctx, &ev)) == CUDA_SUCCESS && !nb)
		fence_made_locked((unsigned)k, now, freed_now);
	if (r == CUDA_SUCCESS && wait) {
		/* The legacy stream already past the record: the work of every
		 * old owner completed (the record came after the legacy
		 * stream's wait for every non-blocking stream), and later work
		 * needs no wait for it. In the PyTorch step under pressure 4 to
		 * 8 in 10 fenced mallocs found it so, and spared 32 waits for
		 * one query. */
		if (vpmm_real.event_query && vpmm_real.event_query(ev) == CUDA_SUCCESS)
			vpmm_count(VPMM_HOOK_fence_done);
		else
			for (unsigned i = 0; r == CUDA_SUCCESS && i < vpmm_ls.n_nb; i++)
				if (vpmm_ls.nb[i]->ctx == ctx)
					r = vpmm_real.stream_wait_event(vpmm_ls.nb[i]->s, ev, 0);
		if (r == CUDA_SUCCESS && k >= 0)
			fence_made_locked((unsigned)k, now, freed_now);
	}
	pthread_mutex_unlock(&vpmm_ls.lock);
	return r;
}

void vpmm_fence_capture_begins(void)
{
	CUcontext cur = NULL, popped;
	/* Counted first: a free that meets the count until the capture has
	 * begun makes its waits at once, as before they were owed. */
	atomic_fetch_add_explicit(&beginning, 1, memory_order_acq_rel);
	if (!atomic_load_explicit(&vpmm_ls_nb_owed_count, memory_order_acquire) ||
	    vpmm_real.ctx_get_current(&cur) != CUDA_SUCCESS)
		return;
	pthread_mutex_lock(&vpmm_ls.lock);
	/* Every context that owes the wait, not only the current one: the
	 * stream captured may be another context's. In its own context, as
	 * the legacy stream that waits is the current context's. A wait that
	 * cannot be made stays owed (a later pay refuses while the capture
	 * runs: the caller synchronises or fails, as the capture lets it). */
	for (unsigned k = 0; k < CTX_MAX; k++) {
		CUcontext ctx = vpmm_ls.legacy[k].ctx;
		if (!ctx || !vpmm_ls.legacy[k].nb_owed)
			continue;
		bool pushed = ctx != cur && vpmm_real.ctx_push(ctx) == CUDA_SUCCESS;
		if (ctx == cur || pushed) {
			vpmm_ls_check_id_locked(ctx);
			if (vpmm_ls.legacy[k].ctx == ctx)
				pay_nb_locked(k);
		}
		if (pushed)
			vpmm_real.ctx_pop(&popped);
	}
	pthread_mutex_unlock(&vpmm_ls.lock);
}

void vpmm_fence_capture_began(void)
{
	atomic_fetch_sub_explicit(&beginning, 1, memory_order_acq_rel);
}

void vpmm_fence_freeing(void)
{
	atomic_fetch_add_explicit(&obligations, 1, memory_order_release);
}

bool vpmm_fence_wants_ranges(void)
{
	return atomic_load_explicit(&vpmm_ls_nb_count, memory_order_acquire) != 0;
}

void vpmm_fence_freed_range(CUdeviceptr va, size_t size)
{
	pthread_mutex_lock(&vpmm_ls.lock);
	freed_add_locked(va, size);
	pthread_mutex_unlock(&vpmm_ls.lock);
}

/* ---- the pool's own calls on the legacy stream ------------------------------------ */

/* The driver's calls the wrappers below stand in front of. */
static CUresult (*pool_record)(vpmm_driver *d, CUevent ev, CUstream s);
static CUresult (*pool_wait)(vpmm_driver *d, CUstream s, CUevent ev);
static CUresult (*pool_create)(vpmm_driver *d, int device, size_t size,
			       CUmemGenericAllocationHandle *out);
static CUresult (*pool_map)(vpmm_driver *d, CUdeviceptr va, size_t size,
			    CUmemGenericAllocationHandle h);
static CUresult (*pool_release)(vpmm_driver *d, CUmemGenericAllocationHandle h);

static bool is_legacy(CUstream s)
{
	return !s || s == CU_STREAM_LEGACY;
}

/* A record of the pool's on the legacy stream (a free's event, one a
 * reuse by another stream waits for) stands for the frees before it: the
 * legacy stream waits first for the non-blocking streams, if those frees
 * still owe that. A wait that cannot be made: the context synchronised,
 * which ends the same work. */
static CUresult record_for_pool(vpmm_driver *d, CUevent ev, CUstream s)
{
	CUcontext ctx = NULL;
	if (is_legacy(s) && atomic_load_explicit(&vpmm_ls_nb_owed_count, memory_order_acquire) &&
	    vpmm_real.ctx_get_current(&ctx) == CUDA_SUCCESS && ctx) {
		CUresult r = CUDA_SUCCESS;
		pthread_mutex_lock(&vpmm_ls.lock);
		/* A reset the shim did not see ended what was owed (and the
		 * streams' events with it). */
		vpmm_ls_check_id_locked(ctx);
		int k = slot_of_locked(ctx);
		if (k >= 0 && (r = pay_nb_locked((unsigned)k)) != CUDA_SUCCESS &&
		    (r = vpmm_real.ctx_synchronize()) == CUDA_SUCCESS)
			vpmm_ls_settle_nb_locked((unsigned)k);
		pthread_mutex_unlock(&vpmm_ls.lock);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return pool_record(d, ev, s);
}

/* A wait of the legacy stream for another stream's event: memory pending
 * there may be handed out on the legacy stream after it, which the
 * non-blocking streams have not waited for (vpmm_fence_malloc). */
static CUresult wait_for_pool(vpmm_driver *d, CUstream s, CUevent ev)
{
	CUresult r = pool_wait(d, s, ev);
	/* After the wait is queued: a fence that read the count before
	 * this comes again; one that read it after records behind the wait. */
	if (is_legacy(s))
		atomic_fetch_add_explicit(&obligations, 1, memory_order_release);
	return r;
}

/* The pool's handles made and not mapped yet: a first mapping brings no
 * one's work with it. At most FRESH_MAX at a time (a defragmentation makes
 * a few, then maps them); one not kept here counts as moved. */
#define FRESH_MAX 64
static pthread_mutex_t fresh_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmemGenericAllocationHandle fresh[FRESH_MAX];
static unsigned n_fresh;

/* Takes h out of fresh[]; whether it was there. */
static bool fresh_take(CUmemGenericAllocationHandle h)
{
	bool found = false;
	pthread_mutex_lock(&fresh_lock);
	for (unsigned i = 0; i < n_fresh; i++)
		if (fresh[i] == h) {
			fresh[i] = fresh[--n_fresh];
			found = true;
			break;
		}
	pthread_mutex_unlock(&fresh_lock);
	return found;
}

static CUresult create_for_pool(vpmm_driver *d, int device, size_t size,
				CUmemGenericAllocationHandle *out)
{
	CUresult r = pool_create(d, device, size, out);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&fresh_lock);
		if (n_fresh < FRESH_MAX)
			fresh[n_fresh++] = *out;
		pthread_mutex_unlock(&fresh_lock);
	}
	return r;
}

/* A mapping of pages that were mapped elsewhere before: a free's pending
 * work may come with them to addresses no free named. Counted before the
 * mapping, so before the memory can be handed out. */
static CUresult map_for_pool(vpmm_driver *d, CUdeviceptr va, size_t size,
			     CUmemGenericAllocationHandle h)
{
	if (!fresh_take(h))
		atomic_fetch_add_explicit(&obligations, 1, memory_order_acq_rel);
	return pool_map(d, va, size, h);
}

/* A released handle's value may come back for another. */
static CUresult release_for_pool(vpmm_driver *d, CUmemGenericAllocationHandle h)
{
	fresh_take(h);
	return pool_release(d, h);
}

void vpmm_fence_wrap_driver(vpmm_driver *d)
{
	/* Once a table: a forked child's process state makes a new one. */
	if (!d || d->event_record == record_for_pool)
		return;
	pool_record = d->event_record;
	pool_wait = d->stream_wait;
	pool_create = d->mem_create;
	pool_map = d->map;
	pool_release = d->mem_release;
	d->event_record = record_for_pool;
	d->stream_wait = wait_for_pool;
	d->mem_create = create_for_pool;
	d->map = map_for_pool;
	d->mem_release = release_for_pool;
}

CUresult vpmm_fence_owed(CUcontext ctx)
{
	CUresult r = CUDA_SUCCESS;
	if (!atomic_load_explicit(&vpmm_ls_owed_count, memory_order_acquire))
		return CUDA_SUCCESS;
	if (!ctx && vpmm_real.ctx_get_current(&ctx) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&vpmm_ls.lock);
	/* A context reset since the frees ended their work and its events:
	 * nothing is owed then, and the old event must not be recorded (its
	 * handle may be another event's by now). The synchronous paths check
	 * the id in vpmm_fence_possible. */
	vpmm_ls_check_id_locked(ctx);
	if (ctx && owed_locked(ctx))
		r = legacy_record_locked(ctx, NULL);
	/* Reset and not yet made again (the runtime remakes it at its next
	 * call, after this one): its work ended with it, nothing is owed. */
	if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
		vpmm_ls_ctx_end_locked(ctx);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&vpmm_ls.lock);
	return r;
}

void vpmm_fence_forget(void)
{
	pthread_mutex_t fresh_mutex = PTHREAD_MUTEX_INITIALIZER;
	fresh_lock = fresh_mutex;
	n_fresh = 0;
	atomic_store(&beginning, 0);
}
