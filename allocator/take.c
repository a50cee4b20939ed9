/* take.c — the malloc path under the lock, in three phases: 0 reclaim
 * zombies, 1 place in free memory (the caller's, settled, then after
 * flushing caches and polling other streams), 2 defragment; then carve the
 * live region off the free one.
 *
 * Calls place.c, defrag.c, growth.c, reclaim.c, front.c, small.c, stream.c,
 * region.c, chunk.c and loop.c. Lock held.
 */
#include <errno.h>

#include "chunk.h"
#include "defrag.h"
#include "front.h"
#include "growth.h"
#include "loop.h"
#include "place.h"
#include "pool.h"
#include "reclaim.h"
#include "region.h"
#include "small.h"
#include "stream.h"
#include "take.h"

/* Split the front `need` bytes of free region r off as a live allocation,
 * still claimed: vpmm_pool_malloc() frees it for the program's free, a slab
 * keeps it. */
static struct region *carve_live(vpmm_pool *p, struct region *r, size_t need)
{
	vpi_free_unindex(p, r);
	if (r->size > need) {
		struct region *t = vpi_region_new_after(p, r, R_FREE, r->va + need,
						    r->size - need);
		t->stream = r->stream;
		t->epoch = r->epoch;
		vpi_free_index(p, t);
	}
	r->size = need;
	r->kind = R_LIVE;
	r->stream = NULL;
	r->epoch = 0;
	/* A new generation: a free that read r before cannot claim it. */
	__atomic_store_n(&r->claim, (r->claim | VPMM_CLAIMED) + 2, __ATOMIC_RELEASE);
	GAUGE_SUB(p, reusable, need);
	GAUGE_ADD(p, live, need);
	vpi_gmap_publish(p, r, true);
	return r;
}

/* The last resort before an allocation fails: wait on the CPU for every
 * stream's frees, so that free neighbours of different streams merge (a
 * handle lying across two of them can move only then). */
static void settle_all_waiting(vpmm_pool *p)
{
	for (struct stream *s = p->streams; s; s = s->next) {
		struct event *ev = NULL;
		if (!s->fifo_tail || vpi_cover_event(p, s, s->fifo_tail->epoch, &ev) || !ev)
			continue;
		vpi_event_wait_locked(p, ev);
	}
}

/* Whether this defragmentation for `need` bytes repeats caller's loop
 * (loop.c), and the pool may grow by what the request lacks instead of
 * remapping memory the loop scatters again by the next step (about 30 us a
 * handle every step, against once): only below the live peak (a request
 * that raises it needs memory the pool never had; growing layer by layer
 * in a loop repeats too) and within VPMM_LIMIT. Records the
 * defragmentation either way. */
static bool loop_repeats(vpmm_pool *p, struct stream *caller, size_t need)
{
	struct front *f = vpi_front_of(p, caller);
	vpi_mutex_lock(&f->lock);
	bool periodic = vpi_loop_repeats(&f->loop, need, p->grain);
	vpi_mutex_unlock(&f->lock);
	if (!periodic || !p->cfg.loop_growth || p->st.live + need > p->st.live_peak)
		return false;
	return !p->cfg.limit || p->st.mapped + p->inflight + need <= p->cfg.limit;
}

/* Phases 0-2 for `need` bytes (whole pages): a live region. Lock held. */
int vpi_take_locked(vpmm_pool *p, struct stream *caller, size_t need,
			  const CUdeviceptr *hint, unsigned nhint, struct region **out)
{
	struct region *r = NULL;
	CUdeviceptr at = 0;
	bool flushed = false;
	int rc = vpi_reserve_regions(p, 4);
	if (rc)
		return rc;
	if (p->zombie_head && !p->reclaimer_running)
		vpi_reclaim_zombies(p, false, NULL);
	for (unsigned i = 0; i < nhint && !r; i++)
		if ((r = vpi_place_at(p, caller, need, hint[i], &flushed))) {
			at = hint[i];
			p->st.loop_hints++;
		}
	size_t cost = 0;
	/* A place that strands memory, or none: the caller's parked
	 * allocations beside free memory join it, and the place is sought
	 * again. Parked, such an allocation keeps a free range from growing,
	 * and the next malloc of its size takes it back in place (docs/
	 * design.md, "Why a cache packs worse"). Only then: a miss that
	 * gave back every such entry emptied the cache of a program cycling
	 * through a few sizes, and the hot path went from 470 to 2 721
	 * instructions a pair (bench/callgrind.sh). Where the stream's last
	 * miss found only a place that strands, this one likely will too:
	 * while the device has room (vpi_growth_ample), the entries go back
	 * before the first place, which then is the only one (docs/
	 * design.md, "A miss places once"). */
	if (!r) {
		struct front *f = vpi_front_of(p, caller);
		bool walked = f->strands && p->cfg.front_entries && vpi_growth_ample(p);
		if (walked)
			vpi_front_release_beside_free_locked(p, caller);
		r = vpi_place_locked(p, caller, need, &at, &cost);
		f->strands = r && cost > need;
		if ((!r || cost > need) && !walked && vpi_front_release_beside_free_locked(p, caller))
			r = vpi_place_locked(p, caller, need, &at, &cost);
	}
	if (!r && vpi_front_flush_locked(p))
		r = vpi_place_locked(p, caller, need, &at, &cost);
	if (!r) {
		vpi_poll_others(p, caller);
		r = vpi_place_locked(p, caller, need, &at, &cost);
	}
	if (!r) {
		/* With room the pool grows (growth.c), and the loops, which
		 * trade remaps for growth, are not told: a growth is no
		 * defragmentation that repeats. */
		bool room = vpi_growth_room(p, need);
		bool grow = room || loop_repeats(p, caller, need);
		rc = vpi_defrag(p, caller, need, &grow, room, &r, &at);
		if (!rc && grow && room) {
			p->st.room_growths++;
		} else if (!rc && grow) {
			p->st.loop_growths++;
		} else if (rc == -ENOMEM && grow) {
			/* Past the limit or the device's memory: what the loop
			 * or the room would have grown, remapping still finds. */
			grow = false;
			rc = vpi_defrag(p, caller, need, &grow, false, &r, &at);
		}
		if (rc == -ENOMEM) {
			/* Last resort before failing: empty slabs go
			 * back, every stream is asked what completed, and if
			 * that freed anything the request is planned again. */
			uint64_t settled = p->settled_count;
			size_t trimmed = vpi_small_trim_locked(p);
			settle_all_waiting(p);
			if (trimmed || settled != p->settled_count) {
				r = vpi_place_locked(p, caller, need, &at, &cost);
				grow = false;
				rc = r ? 0 : vpi_defrag(p, caller, need, &grow, false, &r, &at);
			}
		}
		if (rc)
			return rc;
		p->st.defrags++;
		/* A loop's malloc that the start placement, in use while
		 * the device has room, could not keep in its places, once
		 * the loops had kept VPMM_LOOP_KEPT places (place.c). A loop
		 * whose first places miss is often none: sizes that repeat
		 * by chance while the pool fills. */
		if (nhint && p->st.loop_hints >= VPMM_LOOP_KEPT && vpi_growth_ample(p))
			p->loop_missed = true;
	}
	/* Phases 0-2 may have dropped the lock (zombies unmapped, a chunk
	 * reserved, a defragmentation's driver work): the structs reserved
	 * above may be gone (region.c). The two splits below need them;
	 * without them r stays free and the request fails as out of memory. */
	if (vpi_reserve_regions(p, 2))
		return -ENOMEM;
	if (at > r->va) {
		/* Start where the placement or the defragmentation put it. */
		vpi_free_unindex(p, r);
		struct region *t = vpi_split_off(p, r, at);
		vpi_free_index(p, r);
		vpi_free_index(p, t);
		r = t;
	}
	*out = carve_live(p, r, need);
	return 0;
}
