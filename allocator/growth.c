/* growth.c — how the pool grows: whether a request that finds no free range
 * is served by new memory alone or by a defragmentation, and how large the
 * new handles are, from the memory the device and VPMM_LIMIT leave
 * (docs/policy.md, "Growth follows the headroom").
 *
 * Owns: the headroom estimate (the device's free bytes, read at most every
 * GROWTH_READ_NS on the growth path and every GROWTH_AMPLE_NS on the
 * placement path, less what the pool created since) and the rules below.
 * Calls nothing in allocator/ (the driver's mem_info through its table).
 * Called by take.c, defrag.c and place.c with the pool lock held.
 *
 * Three regimes, by the headroom H left after the pool's own memory:
 *  - room: H is at least GROWTH_ROOM_RATIO times the request, and growing
 *    keeps the pool's free share under GROWTH_SPARE_PERMILLE: grow, no
 *    remapping;
 *  - shrinking (less room, or a pool already holding its share of free
 *    memory): defragment what the request lacks, as VPMM_REMAP=always does;
 *  - in both, new handles are at most H / GROWTH_HANDLE_RATIO (and
 *    VPMM_HANDLE_SIZE), or coarser while few allocations are live
 *    (handle_ratio): what live allocations can strand in the handles
 *    made now stays small against what is left, so that they can still be
 *    served once the device is full. While H is GROWTH_COARSE_RATIO times
 *    the pool, new handles are up to GROWTH_COARSE_MAX, a
 *    defragmentation's up to 1/GROWTH_POOL_RATIO of the pool too, and the
 *    first growth of an empty pool is one handle (or as the split rule
 *    makes them, where that is coarser); past that, the split rule
 *    (VPMM_GROWTH_SPLIT) sizes them. While H is GROWTH_START_RATIO times
 *    the pool (vpi_growth_ample), placement takes a free region's start
 *    until a loop misses its places (place.c): the start placement needs
 *    less room than the coarse handles, which can strand more once the
 *    device is full (docs/policy.md, "Placement with room");
 *  - the limit (cuMemCreate out of memory, or VPMM_LIMIT reached): the
 *    caller falls back to remapping only.
 */
#include "growth.h"
#include "pool.h"
#include "vpi.h"

/* The device's free bytes are read again once older than this. Other
 * processes change them; our own growths are subtracted as they happen,
 * and a failed cuMemCreate counts as none left until the next read. A
 * failed read (no context, an error) leaves the room unknown until the
 * next: growth then follows VPMM_REMAP=always's policy. */
#define GROWTH_READ_NS 100000000ull /* 100 ms */
/* ... and on the placement path once older than this: a pool that only
 * reuses memory reads no room on the growth path, and another process may
 * have filled the device meanwhile. */
#define GROWTH_AMPLE_NS 1000000000ull /* 1 s */

/* The device's free bytes as last read (less what the pool created since),
 * within VPMM_LIMIT. */
static size_t room_left(const vpmm_pool *p)
{
	size_t room = p->dev_free;
	if (p->cfg.limit) {
		uint64_t used = p->st.mapped + p->inflight;
		size_t left = used < p->cfg.limit ? p->cfg.limit - (size_t)used : 0;
		if (left < room)
			room = left;
	}
	return room;
}

size_t vpi_growth_headroom(vpmm_pool *p)
{
	uint64_t now = vpi_clock_ns(p);
	if (!p->dev_read_ns || now - p->dev_read_ns >= GROWTH_READ_NS) {
		size_t fr = 0, total = 0;
		CUresult r = DRV(p, VPMM_OP_MEM_INFO, mem_info, &fr, &total);
		p->dev_unknown = r != CUDA_SUCCESS;
		p->dev_free = r == CUDA_SUCCESS ? fr : 0;
		p->dev_read_ns = now;
	}
	size_t room = room_left(p);
	p->st.headroom = room;
	return room;
}

/* Whether `room` is `times` times the pool: GROWTH_START_RATIO for the
 * start placement, GROWTH_COARSE_RATIO for coarse handles. */
static bool room_for_pool(const vpmm_pool *p, size_t room, size_t times)
{
	return room / times >= p->st.mapped;
}

bool vpi_growth_ample(vpmm_pool *p)
{
	if (p->cfg.remap != VPMM_REMAP_PRESSURE || !p->dev_read_ns)
		return false;
	if (vpi_clock_ns(p) - p->dev_read_ns >= GROWTH_AMPLE_NS)
		vpi_growth_headroom(p); /* older than GROWTH_READ_NS too: reads */
	if (p->dev_unknown)
		return false;
	return room_for_pool(p, room_left(p), GROWTH_START_RATIO);
}

/* The largest power of two of pages within `bytes`, at most `most`; one
 * page at least. */
static size_t pages_within(const vpmm_pool *p, size_t bytes, size_t most)
{
	size_t h = p->page;
	while (h <= bytes / 2 && h <= most / 2)
		h *= 2;
	return h;
}

bool vpi_growth_room(vpmm_pool *p, size_t need)
{
	if (p->cfg.remap != VPMM_REMAP_PRESSURE)
		return false;
	size_t room = vpi_growth_headroom(p);
	if (p->dev_unknown || room / GROWTH_ROOM_RATIO < need)
		return false;
	/* The free share once grown: at most the spare share of the pool.
	 * Past it, the free pages are put to use first. */
	__extension__ typedef unsigned __int128 wide;
	wide pool = (wide)p->st.mapped + need;
	return (wide)p->st.reusable * 1000 <= pool * GROWTH_SPARE_PERMILLE;
}

/* The split rule: the largest power of two of pages within shortfall / k,
 * at most `most`. Each handle costs about as much as a whole cudaMalloc
 * (cuMemSetAccess is per handle), but only whole handles can move: see
 * docs/design.md.
 *
 * k is growth_split once the pool holds much more than the growth, and
 * falls to 1 as the growth outweighs what the pool holds:
 * k = 1 + split * mapped / (mapped + shortfall). A large handle strands
 * memory only once it holds live and free bytes side by side, and what it
 * can strand is measured against the whole pool: in an empty pool the
 * first growth (model weights, a preallocated cache) costs one handle, as
 * cudaMalloc would, and later growths split finer as the pool grows. */
static size_t split_size(const vpmm_pool *p, size_t shortfall, size_t most)
{
	size_t k = p->cfg.growth_split;
	uint64_t mapped = p->st.mapped;
	if (!k)
		return most;
	/* 128 bits: split * mapped may pass 64; the quotient is below split. */
	__extension__ typedef unsigned __int128 wide;
	k = 1 + (size_t)((wide)k * mapped / ((wide)mapped + shortfall));
	if (k > p->cfg.growth_split)
		k = p->cfg.growth_split;
	return pages_within(p, shortfall / k, most);
}

/* Room needed per byte of a new handle: GROWTH_LIVE_RATIO x (n + 1) with
 * n allocations live, at most GROWTH_HANDLE_RATIO. An allocation leaves at
 * most two handles partly live, one at each end, so the n + 1 allocations
 * live once this request is served strand at most 2 / GROWTH_LIVE_RATIO
 * of the room in the handles made now; a pool of a few large allocations
 * (the laboratory cases, model weights) grows in coarse handles, one of
 * many in handles of 1/256 of the room. Handles made while few were live
 * stay as coarse as they were when more come: replays, not this bound,
 * showed that capacity holds (docs/policy.md, "Handles under the limit").
 * Parked allocations count as live until a cache gives them back
 * (front_given), packed ones (small.c) one each: never coarser than their
 * number allows. */
static size_t handle_ratio(const vpmm_pool *p)
{
	uint64_t ended = p->st.frees + p->front_given;
	uint64_t live = p->st.mallocs > ended ? p->st.mallocs - ended : 0;
	if (live >= GROWTH_HANDLE_RATIO / GROWTH_LIVE_RATIO)
		return GROWTH_HANDLE_RATIO;
	return GROWTH_LIVE_RATIO * ((size_t)live + 1); /* at most the above */
}

size_t vpi_growth_handle_size(vpmm_pool *p, size_t need, size_t shortfall, bool room)
{
	size_t most = p->cfg.handle_size;
	if (!shortfall)
		return p->page;
	if (p->cfg.remap != VPMM_REMAP_PRESSURE)
		return split_size(p, shortfall, most);
	size_t left = vpi_growth_headroom(p), cap = pages_within(p, left / handle_ratio(p), most);
	/* The room unknown is no room of none: handles as VPMM_REMAP=always
	 * makes them, not one a page until the next read. */
	if (p->dev_unknown)
		return split_size(p, shortfall, most);
	/* A device mostly empty, and room for the request: coarse handles of
	 * up to GROWTH_COARSE_MAX, and at most 1/64 of the pool in a
	 * defragmentation's (whose pool is fragmented already). Never finer
	 * than the split rule, which keeps a growth that outweighs the pool
	 * (model weights into an empty one, VPMM_PAGES mapped up front, a
	 * large request on a small pool) one handle, as cudaMalloc would make
	 * it: one handle a page costs a driver call or three each. Past 64 MiB
	 * a handle strands what a request placed at its start leaves of it
	 * (place.c), and the CUDA pool grows in 32 MiB steps (docs/policy.md,
	 * "Placement with room").
	 * The device filling: the split rule, at most 1/256 of the room (or
	 * coarser while few allocations are live: handle_ratio), so that what
	 * live memory strands in the handles made now stays small against
	 * what is left once the device is full. */
	if (room_for_pool(p, left, GROWTH_COARSE_RATIO) && left / GROWTH_ROOM_RATIO >= need) {
		size_t split = split_size(p, shortfall, cap);
		size_t coarse = p->st.mapped ? pages_within(p, GROWTH_COARSE_MAX, cap) : cap;
		if (coarse < split)
			coarse = split;
		if (!room) {
			size_t share = pages_within(p, (size_t)p->st.mapped / GROWTH_POOL_RATIO, cap);
			if (share < split)
				share = split;
			if (share < coarse)
				coarse = share;
		}
		return shortfall < coarse ? shortfall : coarse;
	}
	return split_size(p, shortfall, cap);
}

/* A growth refused for want of memory: the room none until the next read. */
static void refuse(vpmm_pool *p)
{
	p->dev_free = 0;
	p->st.growth_refusals++;
}

bool vpi_growth_may_create(vpmm_pool *p, size_t bytes)
{
	/* A failed read stands until GROWTH_READ_NS has passed, as for the
	 * handles' sizes. */
	if (p->dev_read_ns && (p->dev_unknown || bytes <= p->dev_free))
		return true;
	/* More than the estimate left (or none read yet): the device's own
	 * answer, asked at most every GROWTH_READ_NS (less what the pool
	 * created since) and kept apart from the estimate, so that a growth
	 * that fits decides as before. One that does not is refused as the
	 * driver would have. A failed question: the driver decides. */
	uint64_t now = vpi_clock_ns(p);
	if (!p->ask_ns || now - p->ask_ns >= GROWTH_READ_NS) {
		size_t fr = 0, total = 0;
		bool ok = DRV(p, VPMM_OP_MEM_INFO, mem_info, &fr, &total) == CUDA_SUCCESS;
		p->ask_free = ok ? fr : SIZE_MAX;
		p->ask_ns = now ? now : 1;
	}
	if (bytes <= p->ask_free)
		return true;
	refuse(p);
	return false;
}

void vpi_growth_created(vpmm_pool *p, size_t bytes)
{
	p->dev_free = p->dev_free > bytes ? p->dev_free - bytes : 0;
	if (p->ask_free != SIZE_MAX)
		p->ask_free = p->ask_free > bytes ? p->ask_free - bytes : 0;
}

void vpi_growth_refused(vpmm_pool *p)
{
	refuse(p);
	p->ask_ns = 0; /* the driver's refusal is news: asked again next time */
}
