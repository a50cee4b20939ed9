/* test_placement.c — where a request goes when handles are larger than a
 * page: free memory in a handle that also holds live memory cannot move
 * (a handle moves only whole), so the pool avoids leaving any. In place,
 * on a device filling up, the request goes where it pins the fewest wholly
 * free handles and puts its ends on handle boundaries or in handles shared
 * already (with room, at a free region's start until a loop misses its
 * places: the last four tests); a defragmentation moves only the slabs
 * that fit what the request lacks, and a free region beside the hole lends
 * its bytes from either side. */
#include <time.h>

#include "loop.h"
#include "pool_test.h"

/* Handles of up to 4 pages, a growth of n pages made of as few as that
 * allows (split 1): 12 pages are 3 handles of 4. VPMM_REMAP=always: the
 * placement of a device filling up, where the cost chooses the place
 * inside a free region too (with room, a region's start is its only
 * place: with_room_requests_lie_side_by_side below). */
static void open_handles(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .handle_pages = 4, .growth_split = 1,
			      .remap = VPMM_REMAP_ALWAYS};
	pt_open(t, &su);
}

static CUdeviceptr chunk_base(struct pt *t)
{
	struct vpmm_region_info r;
	cr_assert_geq(vpmm_pool_regions(t->pool, &r, 1), 1);
	return r.va;
}

/* [A 4][-4 .. |][C 3] over handles [0,4) [4,8) [8,12): the free region
 * [4,9) holds the whole handle [4,8) and one page of [8,12), whose rest C
 * holds. One page goes next to C, into the handle C pins already, not at
 * the start of the free region, which would pin [4,8) for one page. */
Test(placement, a_request_does_not_pin_a_free_handle)
{
	struct pt t;
	open_handles(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr w = PT_MALLOC(&t, 12, s);
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_eq(s0.handles_created, 3, "12 pages made %llu handles",
		     (unsigned long long)s0.handles_created);
	PT_FREE(&t, w, s);
	PT_MALLOC(&t, 4, s);
	CUdeviceptr b = PT_MALLOC(&t, 5, s);
	PT_MALLOC(&t, 3, s);
	PT_LAYOUT_IS(&t, "[4][5][3][*52]");
	PT_FREE(&t, b, s);
	CUdeviceptr d = PT_MALLOC(&t, 1, s);
	cr_assert_eq(d, chunk_base(&t) + 8 * t.page, "1 page at +%llu pages, not +8",
		     (unsigned long long)((d - chunk_base(&t)) / t.page));
	PT_LAYOUT_IS(&t, "[4][-4][1][3][*52]");
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.mapped, s0.mapped);
	cr_assert_eq(s1.defrags, s0.defrags);
	pt_close(&t);
}

/* Free slabs of 4, 4 and 2 pages, each between live pages; +6 needs all
 * of it moved. It moves 4 + 2, not 4 + 4: a slab moved beyond the lack
 * would stay free behind the allocation, in a handle it pins. */
Test(placement, a_defragmentation_moves_what_fits_the_lack)
{
	struct pt t;
	open_handles(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a1 = PT_MALLOC(&t, 4, s);
	PT_MALLOC(&t, 1, s);
	CUdeviceptr a2 = PT_MALLOC(&t, 4, s);
	PT_MALLOC(&t, 1, s);
	CUdeviceptr a3 = PT_MALLOC(&t, 2, s);
	PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a1, s);
	PT_FREE(&t, a2, s);
	PT_FREE(&t, a3, s);
	PT_LAYOUT_IS(&t, "[-4][1][-4][1][-2][1][*51]");
	struct vpmm_stats s0 = pt_stats(&t);
	PT_MALLOC(&t, 6, s);
	struct vpmm_stats s1 = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[~4][1][-4][1][~2][1][6][*45]");
	cr_assert_eq(s1.handles_remapped - s0.handles_remapped, 2);
	cr_assert_eq(s1.handles_created, s0.handles_created);
	cr_assert_eq(s1.mapped, s0.mapped);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*4][1][-4][1][*2][1][6][*45]");
	pt_close(&t);
}

/* [*2][-2][1][3]: the free region after the hole lends its 2 pages, the
 * request ends in it, and only the other 2 are created into the end of
 * the hole. Nothing moves. */
Test(placement, a_free_region_after_the_hole_lends)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s);
	CUdeviceptr b = PT_MALLOC(&t, 2, s);
	PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a, s);
	PT_MALLOC(&t, 3, s);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*2][2][1][3][*56]");
	PT_FREE(&t, b, s);
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr p = PT_MALLOC(&t, 4, s);
	struct vpmm_stats s1 = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[4][1][3][*56]");
	cr_assert_eq(p, a, "+4 does not end in the lending region");
	cr_assert_eq(s1.pages_created - s0.pages_created, 2);
	cr_assert_eq(s1.pages_remapped, s0.pages_remapped);
	pt_close(&t);
}

/* The same with a hole larger than the rest: the end of the hole is
 * mapped, its front stays a hole. */
Test(placement, only_the_end_of_a_larger_hole_is_mapped)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 3, s);
	CUdeviceptr b = PT_MALLOC(&t, 2, s);
	PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a, s);
	PT_MALLOC(&t, 4, s);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*3][2][1][4][*54]");
	PT_FREE(&t, b, s);
	CUdeviceptr p = PT_MALLOC(&t, 3, s);
	PT_LAYOUT_IS(&t, "[*2][3][1][4][*54]");
	cr_assert_eq(p, a + 2 * t.page);
	pt_close(&t);
}

/* A PyTorch process starts with a small tensor, carved from a page of its
 * own. A free region in that page, next to the first hole, spares a large
 * request no page: it must not lend, or the request starts inside that
 * page, every later one is shifted off the handle boundaries, and the
 * +10 +1 -10 +4 +11 case (here in units of 16 pages) ended half a
 * handle above its live bytes. */
static void lab_case_after_a_small_tensor(unsigned split)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096, .handle_pages = 64, .growth_split = split,
			      .grain = 4 * PT_KiB, .small_max = 32 * PT_KiB,
			      .remap = VPMM_REMAP_ALWAYS};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	const size_t u = 16;
	PT_MALLOC_BYTES(&t, 512, s);
	CUdeviceptr a = PT_MALLOC(&t, 10 * u, s);
	PT_MALLOC(&t, 1 * u, s);
	PT_FREE(&t, a, s);
	PT_MALLOC(&t, 4 * u, s);
	PT_MALLOC(&t, 11 * u, s);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.mapped_peak, (16 * u + 1) * t.page,
		     "split %u: mapped peak %zu pages for %zu live and the small tensor's one",
		     split, (size_t)(st.mapped_peak / t.page), 16 * u);
	pt_close(&t);
}

Test(placement, a_small_first_tensor_strands_nothing)
{
	lab_case_after_a_small_tensor(16);
	lab_case_after_a_small_tensor(4);
	lab_case_after_a_small_tensor(1);
}

/* How many handles a defragmentation's growth makes, at split 16 with
 * handles of up to 64 pages: one for the first growth of an empty pool
 * (nothing yet to strand against), then finer as the pool outgrows the
 * request: k = 1 + 16 * mapped / (mapped + shortfall), handles the largest
 * power of two of pages within shortfall / k. VPMM_REMAP=always, so that
 * every growth is a defragmentation's (with room, VPMM_REMAP=pressure
 * grows in handles sized by the room: test_growth.c). */
Test(placement, growth_splits_finer_as_the_pool_grows)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096, .handle_pages = 64, .growth_split = 16,
			      .remap = VPMM_REMAP_ALWAYS};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	struct vpmm_stats s0 = pt_stats(&t), s1, s2, s3;
	PT_MALLOC(&t, 64, s); /* empty: k = 1, one handle of 64 */
	s1 = pt_stats(&t);
	cr_assert_eq(s1.handles_created - s0.handles_created, 1, "first growth: %llu handles",
		     (unsigned long long)(s1.handles_created - s0.handles_created));
	PT_MALLOC(&t, 128, s); /* k = 1 + 16 * 64 / 192 = 6: 128 / 6 -> 16 pages */
	s2 = pt_stats(&t);
	cr_assert_eq(s2.handles_created - s1.handles_created, 8, "second growth: %llu handles",
		     (unsigned long long)(s2.handles_created - s1.handles_created));
	PT_MALLOC(&t, 64, s); /* k = 1 + 16 * 192 / 256 = 13: 64 / 13 -> 4 pages */
	s1 = pt_stats(&t);
	cr_assert_eq(s1.handles_created - s2.handles_created, 16, "third growth: %llu handles",
		     (unsigned long long)(s1.handles_created - s2.handles_created));
	for (int i = 0; i < 12; i++)
		PT_MALLOC(&t, 64, s);
	s2 = pt_stats(&t);
	PT_MALLOC(&t, 32, s); /* 1024 mapped: k = 1 + 16 * 1024 / 1056 = 16: 2 pages */
	s3 = pt_stats(&t);
	cr_assert_eq(s3.handles_created - s2.handles_created, 16, "growth in a large pool: %llu",
		     (unsigned long long)(s3.handles_created - s2.handles_created));
	pt_close(&t);
}

/* Requests made one after another into free memory, as a training step's
 * activations come after the last step's were freed: handles of 4 pages
 * [0,4) [4,8) [8,12) [12,13), 2 pages live at the start. Near the limit
 * (here VPMM_REMAP=always) the cost puts 4 pages on the handle [4,8) they
 * fill exactly and leaves [2,4) between, too small for the next request
 * of 6, which needs more memory. With room, each request starts where the
 * free region does: 2 + 4 + 6 pages fit the 13 mapped. */
Test(placement, with_room_requests_lie_side_by_side)
{
	for (int room = 0; room < 2; room++) {
		struct pt t;
		struct pt_setup su = {.va_pages = 64, .handle_pages = 4, .growth_split = 1,
				      .remap = room ? VPMM_REMAP_PRESSURE : VPMM_REMAP_ALWAYS};
		pt_open(&t, &su);
		CUstream s = vpmm_host_stream_create(t.drv);
		PT_FREE(&t, PT_MALLOC(&t, 13, s), s);
		PT_MALLOC(&t, 2, s);
		PT_MALLOC(&t, 4, s);
		PT_LAYOUT_IS(&t, room ? "[2][4][-7][*51]" : "[2][-2][4][-5][*51]");
		PT_MALLOC(&t, 6, s);
		struct vpmm_stats st = pt_stats(&t);
		if (room)
			cr_expect_eq(st.mapped_peak, 13 * t.page, "room: %zu pages mapped for 12 live",
				     (size_t)(st.mapped_peak / t.page));
		else
			cr_expect_gt(st.mapped_peak, 13 * t.page, "always: 12 live in the 13 mapped");
		pt_close(&t);
	}
}

/* The placement reads the device's free memory again once the last read
 * is a second old. */
static const struct timespec read_again = {.tv_sec = 1, .tv_nsec = 100 * 1000 * 1000};

/* 13 pages freed on a stream, returned, in handles of 4 pages [0,4) [4,8)
 * [8,12) [12,13) (with_room_requests_lie_side_by_side's), on a device of
 * 4096 pages that another process then fills but for `left` pages; once
 * the placement has read that again. */
static CUstream thirteen_pages_and_room(struct pt *t, size_t left)
{
	struct pt_setup su = {.va_pages = 64, .handle_pages = 4, .growth_split = 1,
			      .capacity = 4096 * 64 * PT_KiB};
	pt_open(t, &su);
	CUstream s = vpmm_host_stream_create(t->drv);
	PT_FREE(t, PT_MALLOC(t, 13, s), s);
	vpmm_host_set_tenant(t->drv, (4096 - 13 - left) * t->page);
	nanosleep(&read_again, NULL);
	return s;
}

/* Another process fills the device while the pool only reuses memory, so
 * no growth reads the room: the placement reads it again once the last
 * read is a second old, and places by cost from then on. The layout of
 * with_room_requests_lie_side_by_side's VPMM_REMAP=always case. */
Test(placement, a_device_filled_since_the_last_read_places_by_cost)
{
	struct pt t;
	/* 8 pages left beside the pool's 13: no room for twice the pool. */
	CUstream s = thirteen_pages_and_room(&t, 8);
	PT_MALLOC(&t, 2, s);
	PT_MALLOC(&t, 4, s);
	PT_LAYOUT_IS(&t, "[2][-2][4][-5][*51]");
	vpmm_host_set_tenant(t.drv, 0);
	pt_close(&t);
}

/* The start placement needs less room than the coarse handles: with twice
 * the pool left (GROWTH_START_RATIO; the coarse handles need
 * GROWTH_COARSE_RATIO, 4 times) requests still lie side by side, as in
 * with_room_requests_lie_side_by_side; a page less, by cost. */
Test(placement, with_room_for_twice_the_pool_requests_lie_side_by_side)
{
	for (size_t left = 25; left <= 26; left++) {
		struct pt t;
		CUstream s = thirteen_pages_and_room(&t, left);
		PT_MALLOC(&t, 2, s);
		cr_assert_eq(pt_stats(&t).headroom, left * t.page, "the room read: %zu pages",
			     (size_t)(pt_stats(&t).headroom / t.page));
		PT_MALLOC(&t, 4, s);
		PT_LAYOUT_IS(&t, left == 26 ? "[2][4][-7][*51]" : "[2][-2][4][-5][*51]");
		vpmm_host_set_tenant(t.drv, 0);
		pt_close(&t);
	}
}

/* One step of a training loop on s: 24 single pages, every other one
 * freed, then 12 pages, which no free range fits (test_loop.c's step). */
static void loop_step(struct pt *t, CUstream s)
{
	CUdeviceptr x[24], y;
	for (int i = 0; i < 24; i++)
		x[i] = PT_MALLOC(t, 1, s);
	for (int i = 1; i < 24; i += 2)
		PT_FREE(t, x[i], s);
	y = PT_MALLOC(t, 12, s);
	for (int i = 0; i < 24; i += 2)
		PT_FREE(t, x[i], s);
	PT_FREE(t, y, s);
}

/* Takes every free region on stream o, each by a request of its size. */
static void take_all_free(struct pt *t, CUstream o)
{
	struct vpmm_region_info r[512];
	size_t n = vpmm_pool_regions(t->pool, r, 512);
	cr_assert_leq(n, 512);
	for (size_t i = 0; i < n; i++)
		if (r[i].kind == VPMM_REGION_FREE)
			PT_MALLOC_BYTES(t, r[i].size, o);
	n = vpmm_pool_regions(t->pool, r, 512);
	for (size_t i = 0; i < n; i++)
		cr_assert_neq(r[i].kind, VPMM_REGION_FREE, "free left: %s", pt_layout(t));
}

/* With room, the start placement holds until a malloc that repeats a loop
 * finds none of its earlier places free, once the loops had kept
 * VPMM_LOOP_KEPT (16) places: then the pool places by cost, as the PyTorch
 * step needs (docs/policy.md, "Placement with room"). A loop settles on
 * stream s beside 13 pages held on stream o, in handles of 4 pages; in its
 * fourth step it keeps its 25 places, and then:
 *  0. it keeps them again, and o grows the pool: a growth out of any loop;
 *  1. the place of its 12 pages is taken by o's 24: a miss;
 *  2. (instead of the fourth step) o takes every place first, and the
 *     loop keeps only one or two in the step after: misses before the
 *     loops kept VPMM_LOOP_KEPT places, as sizes that repeat by chance
 *     while a pool fills make them, which do not count;
 *  3. as 1, but another process leaves the pool only its own size again:
 *     a miss while the placement is by cost anyway, which does not count
 *     once the device is free again.
 * Then o takes all free memory but the 13 pages, and 2 and 4 pages there:
 * with_room_requests_lie_side_by_side's layouts, side by side (0, 2, 3) or
 * by cost (1). */
Test(placement, a_loop_that_misses_its_places_places_by_cost)
{
	for (int mode = 0; mode < 4; mode++) {
		struct pt t;
		struct pt_setup su = {.va_pages = 4096, .handle_pages = 4, .growth_split = 1,
				      .capacity = 4096 * 64 * PT_KiB};
		pt_open(&t, &su);
		CUstream s = vpmm_host_stream_create(t.drv), o = vpmm_host_stream_create(t.drv);
		CUdeviceptr h = PT_MALLOC(&t, 13, o);
		PT_MALLOC(&t, 64, s);
		for (int i = 0; i < 3; i++)
			loop_step(&t, s);
		struct vpmm_stats s0 = pt_stats(&t);
		cr_assert_eq(s0.loop_hints, 0, "places kept before the fourth step: the test shows nothing");
		if (mode == 2) {
			take_all_free(&t, o);
			loop_step(&t, s);
			struct vpmm_stats s1 = pt_stats(&t);
			cr_assert_gt(s1.defrags, s0.defrags, "no miss");
			cr_assert_eq(s1.loop_hints, 0, "a place was kept");
			loop_step(&t, s);
			struct vpmm_stats s2 = pt_stats(&t);
			cr_assert_gt(s2.defrags, s1.defrags, "no miss in the fifth step");
			cr_assert(s2.loop_hints > 0 && s2.loop_hints < VPMM_LOOP_KEPT,
				  "%llu places kept: the test shows nothing",
				  (unsigned long long)s2.loop_hints);
		} else {
			loop_step(&t, s);
			uint64_t kept = pt_stats(&t).loop_hints;
			cr_assert(kept >= VPMM_LOOP_KEPT && kept < 2 * VPMM_LOOP_KEPT,
				  "%llu places kept: the test shows too little", (unsigned long long)kept);
			if (mode == 3) {
				size_t mapped = pt_stats(&t).mapped;
				vpmm_host_set_tenant(t.drv, 4096 * t.page - 2 * mapped);
				nanosleep(&read_again, NULL);
			}
			uint64_t defrags = pt_stats(&t).defrags;
			if (mode & 1)
				PT_MALLOC(&t, 24, o);
			loop_step(&t, s);
			defrags = pt_stats(&t).defrags - defrags;
			if (mode & 1) {
				cr_assert_gt(defrags, 0, "o's 24 pages left the loop its places");
				if (mode == 3) {
					cr_assert_eq(pt_stats(&t).growth_refusals, 0);
					vpmm_host_set_tenant(t.drv, 0);
					nanosleep(&read_again, NULL);
				}
			} else {
				cr_assert_eq(defrags, 0, "the loop did not keep its places");
				take_all_free(&t, o);
				uint64_t before = pt_stats(&t).defrags;
				PT_MALLOC(&t, 8, o);
				cr_assert_gt(pt_stats(&t).defrags, before, "o's 8 pages did not grow the pool");
			}
		}
		pt_settle(&t);
		take_all_free(&t, o);
		PT_FREE(&t, h, o);
		pt_settle(&t);
		CUdeviceptr a = PT_MALLOC(&t, 2, o), b = PT_MALLOC(&t, 4, o);
		cr_assert_eq(a, h, "the 2 pages not at the 13's start: %s", pt_layout(&t));
		cr_assert_eq(b, h + (mode == 1 ? 4 : 2) * t.page, "case %d: the 4 pages at page %lld: %s",
			     mode, (long long)((b - h) / t.page), pt_layout(&t));
		pt_close(&t);
	}
}
