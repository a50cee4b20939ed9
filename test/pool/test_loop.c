/* Loops (pool.c, loop_repeats()): a step that repeats exactly and needs a
 * defragmentation every time grows the pool instead once it has repeated
 * three times, by at most VPMM_LOOP_GROWTH (15) percent of the rest of the
 * pool; a sequence that does not repeat, or a request that raises the live
 * peak, still remaps. */
#include "pool_test.h"

#define PAGES 24 /* single pages a step holds, every other one freed */

/* One step: n (at most PAGES) single pages, the odd ones freed (scattered
 * free pages), one request of n / 2 pages (no free range fits it), and
 * `extra` pages more (0: every step the same), then everything freed. */
static void step_of(struct pt *t, int n, size_t extra)
{
	CUdeviceptr x[PAGES], y, z = 0;
	for (int i = 0; i < n; i++)
		x[i] = PT_MALLOC(t, 1, VPMM_NO_STREAM);
	for (int i = 1; i < n; i += 2)
		PT_FREE(t, x[i], VPMM_NO_STREAM);
	if (extra)
		z = PT_MALLOC(t, extra, VPMM_NO_STREAM);
	y = PT_MALLOC(t, (size_t)n / 2, VPMM_NO_STREAM);
	for (int i = 0; i < n; i += 2)
		PT_FREE(t, x[i], VPMM_NO_STREAM);
	if (z)
		PT_FREE(t, z, VPMM_NO_STREAM);
	PT_FREE(t, y, VPMM_NO_STREAM);
}

static void step(struct pt *t, size_t extra)
{
	step_of(t, PAGES, extra);
}

static void open_loop(struct pt *t, bool off)
{
	struct pt_setup su = {.va_pages = 4096, .no_loop_growth = off};
	pt_open(t, &su);
	/* Held all along, so that the steps' pages are not the whole pool. */
	PT_MALLOC(t, 64, VPMM_NO_STREAM);
}

/* The loop grew at least once, and nothing was remapped since `remapped`
 * was read. */
static void assert_settled(struct pt *t, uint64_t remapped, const char *unseen)
{
	struct vpmm_stats s = pt_stats(t);
	cr_assert_geq(s.loop_growths, 1, "%s", unseen);
	cr_assert_eq(s.handles_remapped, remapped, "still remapping: %llu -> %llu",
		     (unsigned long long)remapped, (unsigned long long)s.handles_remapped);
}

/* Without the rule, the step remaps every time: the premise of the rest. */
Test(loop, without_the_rule_every_step_remaps)
{
	struct pt t;
	open_loop(&t, true);
	step(&t, 0);
	for (int i = 0; i < 8; i++) {
		uint64_t before = pt_stats(&t).handles_remapped;
		step(&t, 0);
		cr_assert_gt(pt_stats(&t).handles_remapped, before, "step %d did not remap", i);
	}
	cr_assert_eq(pt_stats(&t).loop_growths, 0);
	pt_close(&t);
}

/* With it, the repeats turn into growth, the steps stop remapping, and the
 * pool grows by at most 15 % of what it held before. */
Test(loop, a_repeating_step_stops_remapping)
{
	struct pt t;
	open_loop(&t, false);
	step(&t, 0);
	struct vpmm_stats first = pt_stats(&t);
	cr_assert_eq(first.loop_growths, 0);
	for (int i = 0; i < 5; i++)
		step(&t, 0);
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_geq(s0.loop_growths, 1, "no loop growth after 6 equal steps");
	for (int i = 0; i < 4; i++)
		step(&t, 0);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.handles_remapped, s0.handles_remapped, "still remapping: %llu -> %llu",
		     (unsigned long long)s0.handles_remapped,
		     (unsigned long long)s1.handles_remapped);
	cr_assert_leq(s1.mapped, first.mapped + first.mapped * 15 / 100,
		      "mapped %llu, %llu after the first step", (unsigned long long)s1.mapped,
		      (unsigned long long)first.mapped);
	pt_close(&t);
}

/* A model of many layers: the same step with 5 000 more mallocs, each
 * freed at once, more than half the first ring of hashes (loop.c). The
 * loop is seen all the same, a few steps later, and the steps stop
 * remapping. */
Test(loop, a_step_of_thousands_of_mallocs_stops_remapping)
{
	struct pt t;
	open_loop(&t, false);
	uint64_t remapped = 0;
	for (int k = 0; k < 12; k++) {
		for (int i = 0; i < 5000; i++)
			PT_FREE(&t, PT_MALLOC(&t, 1, VPMM_NO_STREAM), VPMM_NO_STREAM);
		step(&t, 0);
		if (k == 8)
			remapped = pt_stats(&t).handles_remapped;
	}
	assert_settled(&t, remapped, "the loop was not seen");
	PT_CHECK(&t);
	pt_close(&t);
}

/* The same step with one more request whose size changes every step: the
 * stretches never repeat, and every step remaps as without the rule. */
Test(loop, a_step_that_changes_keeps_remapping)
{
	struct pt t;
	open_loop(&t, false);
	for (size_t i = 0; i < 10; i++) {
		uint64_t before = pt_stats(&t).handles_remapped;
		step(&t, 1 + i % 7 + i / 7);
		if (i)
			cr_assert_gt(pt_stats(&t).handles_remapped, before, "step %zu did not remap", i);
	}
	cr_assert_eq(pt_stats(&t).loop_growths, 0);
	pt_close(&t);
}

/* VPMM_LOOP_GROWTH's cap: with the pool too small for the step's request to
 * fit within 15 % of it, the step keeps remapping. */
Test(loop, growth_stays_within_the_cap)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096};
	pt_open(&t, &su);
	for (int i = 0; i < 10; i++)
		step(&t, 0);
	struct vpmm_stats s = pt_stats(&t);
	cr_assert_eq(s.loop_growths, 0, "grew past the cap (mapped %llu, live peak %llu)",
		     (unsigned long long)s.mapped, (unsigned long long)s.live_peak);
	pt_close(&t);
}

/* Every step keeps one page more, taken just before the step's request:
 * the sizes repeat exactly, but each request raises the live peak, so it
 * is memory the pool never had, and the step remaps as before. */
Test(loop, a_request_that_raises_the_peak_remaps)
{
	struct pt t;
	CUdeviceptr x[PAGES];
	open_loop(&t, false);
	for (int k = 0; k < 10; k++) {
		for (int i = 0; i < PAGES; i++)
			x[i] = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
		for (int i = 1; i < PAGES; i += 2)
			PT_FREE(&t, x[i], VPMM_NO_STREAM);
		PT_MALLOC(&t, 1, VPMM_NO_STREAM); /* held to the end */
		uint64_t before = pt_stats(&t).handles_remapped;
		CUdeviceptr y = PT_MALLOC(&t, PAGES / 2, VPMM_NO_STREAM);
		if (k)
			cr_assert_gt(pt_stats(&t).handles_remapped, before, "step %d did not remap", k);
		for (int i = 0; i < PAGES; i += 2)
			PT_FREE(&t, x[i], VPMM_NO_STREAM);
		PT_FREE(&t, y, VPMM_NO_STREAM);
	}
	cr_assert_eq(pt_stats(&t).loop_growths, 0);
	pt_close(&t);
}

/* Under VPMM_LIMIT: where the growth a loop would take passes the limit,
 * the request remaps as it would without the rule, and nothing fails. */
Test(loop, past_the_limit_it_remaps)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096, .limit_pages = 64 + PAGES + 4};
	pt_open(&t, &su);
	PT_MALLOC(&t, 64, VPMM_NO_STREAM);
	for (int i = 0; i < 10; i++)
		step(&t, 0); /* every malloc asserts success */
	struct vpmm_stats s = pt_stats(&t);
	cr_assert_eq(s.loop_growths, 0);
	cr_assert_eq(s.failures, 0);
	cr_assert_leq(s.mapped, (64 + PAGES + 4) * t.page);
	pt_close(&t);
}

/* After a trim gives back what the loop grew (and more), the cap is again a
 * share of what the pool holds: a smaller loop in the trimmed pool, which
 * holds less than the first loop grew, keeps remapping, as in a fresh pool
 * of that size (growth_stays_within_the_cap). */
Test(loop, the_cap_after_a_trim)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096};
	pt_open(&t, &su);
	CUdeviceptr hold = PT_MALLOC(&t, 64, VPMM_NO_STREAM);
	for (int i = 0; i < 6; i++)
		step(&t, 0);
	uint64_t grown = pt_stats(&t).loop_growths;
	cr_assert_geq(grown, 1);
	PT_FREE(&t, hold, VPMM_NO_STREAM);
	pt_settle(&t);
	cr_assert_gt(vpmm_pool_trim(t.pool, 0), 0);
	cr_assert_eq(pt_stats(&t).mapped, 0, "the trim left %llu bytes",
		     (unsigned long long)pt_stats(&t).mapped);
	for (int i = 0; i < 10; i++)
		step_of(&t, 8, 0);
	cr_assert_eq(pt_stats(&t).loop_growths, grown, "grew past the cap after the trim");
	pt_close(&t);
}

/* The cap counts what a loop's growth creates, not the request: here a free
 * neighbour lends 8 of the request's 20 pages, and the 12 it lacks fit
 * within 15 % of the pool where 20 would not. */
Test(loop, the_cap_counts_what_is_created)
{
	struct pt t;
	open_loop(&t, false);
	CUdeviceptr x[PAGES];
	uint64_t remapped = 0, mapped = 0;
	for (int k = 0; k < 10; k++) {
		for (int i = 0; i < PAGES; i++)
			x[i] = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
		CUdeviceptr tail = PT_MALLOC(&t, 8, VPMM_NO_STREAM);
		for (int i = 1; i < PAGES; i += 2)
			PT_FREE(&t, x[i], VPMM_NO_STREAM);
		PT_FREE(&t, tail, VPMM_NO_STREAM);
		if (!k)
			mapped = pt_stats(&t).mapped;
		cr_assert_gt((PAGES / 2 + 8) * t.page, mapped / 100 * 15,
			     "the request fits the cap whole: the test shows nothing");
		CUdeviceptr y = PT_MALLOC(&t, PAGES / 2 + 8, VPMM_NO_STREAM);
		for (int i = 0; i < PAGES; i += 2)
			PT_FREE(&t, x[i], VPMM_NO_STREAM);
		PT_FREE(&t, y, VPMM_NO_STREAM);
		if (k == 5)
			remapped = pt_stats(&t).handles_remapped;
	}
	assert_settled(&t, remapped, "the lent request never grew");
	struct vpmm_stats s = pt_stats(&t);
	cr_assert_leq(s.mapped, mapped + mapped * 15 / 100, "mapped %llu, %llu before",
		      (unsigned long long)s.mapped, (unsigned long long)mapped);
	pt_close(&t);
}

/* step() with one more request of 3 pages (A), taken before the step's big
 * request, all on stream s but A freed on `a_freed_on`; returns where A
 * went. */
static CUdeviceptr step_a_on(struct pt *t, CUstream s, CUstream a_freed_on)
{
	CUdeviceptr x[PAGES], a, y;
	for (int i = 0; i < PAGES; i++)
		x[i] = PT_MALLOC(t, 1, s);
	for (int i = 1; i < PAGES; i += 2)
		PT_FREE(t, x[i], s);
	a = PT_MALLOC(t, 3, s);
	y = PT_MALLOC(t, PAGES / 2, s);
	for (int i = 0; i < PAGES; i += 2)
		PT_FREE(t, x[i], s);
	PT_FREE(t, a, a_freed_on);
	PT_FREE(t, y, s);
	return a;
}

static CUdeviceptr step_with_a(struct pt *t)
{
	return step_a_on(t, VPMM_NO_STREAM, VPMM_NO_STREAM);
}

/* The loop run 8 times over a pool that holds a region of exactly A's size
 * (the bait), then the bait freed; returns where A went in the last step. */
static CUdeviceptr looped(struct pt *t, unsigned front_entries, CUdeviceptr *bait)
{
	struct pt_setup su = {.va_pages = 4096, .front_entries = front_entries};
	CUdeviceptr a = 0;
	pt_open(t, &su);
	PT_MALLOC(t, 64, VPMM_NO_STREAM);
	*bait = PT_MALLOC(t, 3, VPMM_NO_STREAM);
	PT_MALLOC(t, 1, VPMM_NO_STREAM); /* keeps the bait's free range apart */
	for (int i = 0; i < 8; i++)
		a = step_with_a(t);
	cr_assert_geq(pt_stats(t).loop_growths, 1, "the loop was not seen");
	cr_assert_neq(a, *bait);
	PT_FREE(t, *bait, VPMM_NO_STREAM);
	pt_settle(t);
	vpmm_pool_trim(t->pool, SIZE_MAX); /* flushes the caches; gives nothing back */
	return a;
}

/* Once the loop is seen, a malloc goes where the same malloc went a step
 * before, if that memory is free, even where best fit would choose other
 * memory: here the bait, freed between two steps (a free is no malloc: the
 * sequence still repeats). Placing by best fit there is what lets a step's
 * tensors take each other's places, so that a large one finds no room and
 * memory is regathered every step. With the cache on, as the shim has it,
 * its hits count in the sequence too. */
static void same_place(unsigned front_entries)
{
	struct pt t;
	CUdeviceptr bait, a = looped(&t, front_entries, &bait);
	uint64_t hints = pt_stats(&t).loop_hints;
	CUdeviceptr again = step_with_a(&t);
	cr_assert_eq(again, a, "A went to %#llx, not %#llx where it went a step before "
		     "(the bait is %#llx)", (unsigned long long)again,
		     (unsigned long long)a, (unsigned long long)bait);
	cr_assert_gt(pt_stats(&t).loop_hints, hints);
	PT_CHECK(&t);
	pt_close(&t);
	/* A pool built the same way, and a request of A's size out of the
	 * loop's order: best fit takes the bait. */
	looped(&t, front_entries, &bait);
	hints = pt_stats(&t).loop_hints;
	cr_assert_eq(PT_MALLOC(&t, 3, VPMM_NO_STREAM), bait,
		     "best fit did not take the bait: the test shows nothing");
	cr_assert_eq(pt_stats(&t).loop_hints, hints);
	pt_close(&t);
}

Test(loop, a_malloc_goes_where_it_went_a_step_before)
{
	same_place(0);
}

Test(loop, a_malloc_goes_where_it_went_through_the_cache)
{
	same_place(16);
}

/* The loop on stream a, 8 steps, every step's work completed. */
static CUdeviceptr looped_on(struct pt *t, unsigned front_entries, CUstream *a, CUstream *b)
{
	struct pt_setup su = {.va_pages = 4096, .front_entries = front_entries};
	CUdeviceptr at = 0;
	pt_open(t, &su);
	*a = vpmm_host_stream_create(t->drv);
	*b = vpmm_host_stream_create(t->drv);
	PT_MALLOC(t, 64, *a);
	for (int i = 0; i < 8; i++) {
		at = step_a_on(t, *a, *a);
		pt_settle(t);
	}
	cr_assert_geq(pt_stats(t).loop_growths, 1, "the loop was not seen");
	return at;
}

/* Whether [p, p + pages) and [q, q + qpages) overlap. */
static bool overlaps(struct pt *t, CUdeviceptr p, size_t pages, CUdeviceptr q, size_t qpages)
{
	return p < q + qpages * t->page && q < p + pages * t->page;
}

/* A place freed on another stream whose work is still pending is no place
 * for the caller: stream order covers only the caller's own frees. Here A
 * of one step is freed on stream b; in the next step no malloc on stream a
 * may take any of it, though A's place (and those of the step's pages that
 * went there before) are offered. */
Test(loop, a_place_freed_on_a_busy_stream_is_refused)
{
	struct pt t;
	CUstream a, b;
	CUdeviceptr place = looped_on(&t, 0, &a, &b);
	cr_assert_eq(step_a_on(&t, a, b), place, "A left its place before the test");
	struct vpmm_region_info ri;
	cr_assert(pt_region_at(&t, place, &ri));
	cr_assert(ri.kind == VPMM_REGION_FREE && !ri.settled && ri.stream == b,
		  "the place is not pending on stream b: the test shows nothing");
	uint64_t hints = pt_stats(&t).loop_hints;
	CUdeviceptr x[PAGES], at, y;
	for (int i = 0; i < PAGES; i++) {
		x[i] = PT_MALLOC(&t, 1, a);
		cr_assert_not(overlaps(&t, x[i], 1, place, 3), "a page took memory freed on b");
	}
	for (int i = 1; i < PAGES; i += 2)
		PT_FREE(&t, x[i], a);
	at = PT_MALLOC(&t, 3, a);
	cr_assert_not(overlaps(&t, at, 3, place, 3), "A took memory freed on b");
	y = PT_MALLOC(&t, PAGES / 2, a);
	cr_assert_not(overlaps(&t, y, PAGES / 2, place, 3), "the big request took memory freed on b");
	cr_assert_gt(pt_stats(&t).loop_hints, hints, "no place was offered at all");
	PT_CHECK(&t);
	pt_close(&t);
}

/* The place taken by an allocation parked in the caller's cache (here a
 * larger one over it, freed on stream a): the cache goes back to the pool,
 * and A gets its place, though a free range of exactly its size waits
 * elsewhere for best fit. The step's pages before A come from the cache,
 * so A is the first malloc of the step to reach the pool lock. */
Test(loop, a_place_parked_in_the_callers_cache_is_taken_back)
{
	struct pt t;
	CUstream a, b;
	struct pt_setup su = {.va_pages = 4096, .front_entries = 64};
	pt_open(&t, &su);
	a = vpmm_host_stream_create(t.drv);
	b = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 64, a);
	/* A free range of exactly A's size for best fit to take, kept apart. */
	CUdeviceptr bait = PT_MALLOC(&t, 3, b);
	PT_MALLOC(&t, 1, b);
	CUdeviceptr place = 0;
	for (int i = 0; i < 8; i++) {
		place = step_a_on(&t, a, a);
		pt_settle(&t);
	}
	cr_assert_geq(pt_stats(&t).loop_growths, 1, "the loop was not seen");
	vpmm_pool_trim(t.pool, SIZE_MAX); /* empties the caches */
	pt_settle(&t);
	struct vpmm_region_info ri;
	cr_assert(pt_region_at(&t, place, &ri));
	cr_assert(ri.kind == VPMM_REGION_FREE && ri.size > 3 * t.page,
		  "the place lies in no free region larger than A: the test shows nothing");
	/* The whole free region around the place, and the step's pages, taken
	 * on a third stream; then the bait freed and settled. */
	CUstream c = vpmm_host_stream_create(t.drv);
	CUdeviceptr other = PT_MALLOC(&t, ri.size / t.page, c), pages[PAGES];
	cr_assert_eq(other, ri.va, "the other allocation is not over the place: the test shows nothing");
	for (int i = 0; i < PAGES; i++)
		pages[i] = PT_MALLOC(&t, 1, c);
	PT_FREE(&t, bait, b);
	vpmm_pool_trim(t.pool, SIZE_MAX);
	pt_settle(&t);
	/* All of them parked in a's cache. */
	PT_FREE(&t, other, a);
	for (int i = 0; i < PAGES; i++)
		PT_FREE(&t, pages[i], a);
	uint64_t hits = pt_stats(&t).front_hits;
	CUdeviceptr x[PAGES];
	for (int i = 0; i < PAGES; i++)
		x[i] = PT_MALLOC(&t, 1, a);
	cr_assert_eq(pt_stats(&t).front_hits, hits + PAGES, "the step's pages did not come from the cache");
	for (int i = 1; i < PAGES; i += 2)
		PT_FREE(&t, x[i], a);
	CUdeviceptr at = PT_MALLOC(&t, 3, a);
	cr_assert_eq(at, place, "A went to %#llx, not to its place %#llx (the bait is %#llx)",
		     (unsigned long long)at, (unsigned long long)place, (unsigned long long)bait);
	PT_CHECK(&t);
	pt_close(&t);
}
