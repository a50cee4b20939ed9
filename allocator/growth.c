/* growth.c — how the pool grows: whether a request that finds no free range
 * is served by new memory alone or by a defragmentation, and how large the
 * new handles are, from the memory the device and VPMM_LIMIT leave
 * (docs/design.md, "Growth follows the headroom").
 *
 * Owns: the headroom estimate (the device's free bytes, read at most every
 * GROWTH_READ_NS on the growth path, less what the pool created since) and
 * the rules below. Calls nothing in allocator/ (the driver's mem_info
 * through its table). Called by take.c and defrag.c with the pool lock
 * held.
 *
 * Three regimes, by the headroom H left after the pool's own memory:
 *  - room: H is at least GROWTH_ROOM_RATIO times the request, and growing
 *    keeps the pool's free share under GROWTH_SPARE_PERMILLE: grow, no
 *    remapping;
 *  - shrinking (less room, or a pool already holding its share of free
 *    memory): defragment what the request lacks, as VPMM_REMAP=always does;
 *  - in both, new handles are at most H / GROWTH_HANDLE_RATIO (and
 *    VPMM_HANDLE_SIZE): what live allocations can strand in the handles
 *    made now stays small against what is left, so that they can still be
 *    served once the device is full;
 *  - the limit (cuMemCreate out of memory, or VPMM_LIMIT reached): the
 *    caller falls back to remapping only.
 */
#include <time.h>

#include "growth.h"
#include "pool.h"

/* The device's free bytes are read again once older than this. Other
 * processes change them; our own growths are subtracted as they happen,
 * and a failed cuMemCreate counts as none left until the next read. */
#define GROWTH_READ_NS 100000000ull /* 100 ms */

static uint64_t growth_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t vpi_growth_headroom(vpmm_pool *p)
{
	uint64_t now = growth_now_ns();
	if (!p->dev_read_ns || now - p->dev_read_ns >= GROWTH_READ_NS) {
		size_t fr = 0, total = 0;
		CUresult r = p->drv->mem_info(p->drv, &fr, &total);
		p->driver_calls[VPMM_OP_MEM_INFO]++;
		p->st.driver_calls++;
		p->dev_free = r == CUDA_SUCCESS ? fr : 0;
		p->dev_read_ns = now ? now : 1;
	}
	size_t room = p->dev_free;
	if (p->cfg.limit) {
		uint64_t used = p->st.mapped + p->inflight;
		size_t left = used < p->cfg.limit ? p->cfg.limit - (size_t)used : 0;
		if (left < room)
			room = left;
	}
	p->st.headroom = room;
	return room;
}

/* The largest power of two of pages within room / GROWTH_HANDLE_RATIO, at
 * most the configured handle size; one page at least. */
static size_t growth_cap(const vpmm_pool *p, size_t room)
{
	size_t h = p->page, most = p->cfg.handle_size ? p->cfg.handle_size : p->page;
	while (h * 2 <= room / GROWTH_HANDLE_RATIO && h * 2 <= most)
		h *= 2;
	return h;
}

size_t vpi_growth_room(vpmm_pool *p, size_t need)
{
	if (p->cfg.remap != VPMM_REMAP_PRESSURE)
		return 0;
	size_t room = vpi_growth_headroom(p);
	if (room / GROWTH_ROOM_RATIO < need)
		return 0;
	/* The free share once grown: at most the spare share of the pool.
	 * Past it, the free pages are put to use first. */
	__extension__ typedef unsigned __int128 wide;
	wide pool = (wide)p->st.mapped + need;
	if ((wide)p->st.reusable * 1000 > pool * GROWTH_SPARE_PERMILLE)
		return 0;
	return growth_cap(p, room);
}

size_t vpi_growth_handle_cap(vpmm_pool *p)
{
	if (p->cfg.remap != VPMM_REMAP_PRESSURE)
		return SIZE_MAX;
	return growth_cap(p, vpi_growth_headroom(p));
}

void vpi_growth_created(vpmm_pool *p, size_t bytes)
{
	p->dev_free = p->dev_free > bytes ? p->dev_free - bytes : 0;
}

void vpi_growth_refused(vpmm_pool *p)
{
	p->dev_free = 0;
	p->st.growth_refusals++;
}
