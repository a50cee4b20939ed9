/* The per-stream caches (allocator/front.c): a loop's many sizes all come
 * back from the cache, the newest of a size first; the cache stops at its
 * entry count; a request that no free region fits takes parked memory back
 * before the pool grows. */
#include "pool_test.h"
#include "snapshot.h"

static void open_front(struct pt *t, unsigned entries, size_t va_pages)
{
	struct pt_setup su = {.va_pages = va_pages, .front_entries = entries,
			      .event_interval_ns = 1000000000, .unbacked = true,
			      .capacity = 4 * PT_GiB};
	pt_open(t, &su);
}

/* 150 allocations of 150 sizes (under the cache's byte bound), freed, then
 * asked for again in the other order: every one a cache hit at its old
 * address, nothing created. */
Test(front, many_sizes_all_hit)
{
	enum { N = 150 };
	struct pt t;
	CUdeviceptr p[N];
	open_front(&t, 256, 16384);
	CUstream s = vpmm_host_stream_create(t.drv);
	for (int i = 0; i < N; i++)
		p[i] = PT_MALLOC(&t, i + 1, s);
	for (int i = 0; i < N; i++)
		PT_FREE(&t, p[i], s);
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_eq(s0.front_parks, N, "parked %llu of %d",
		     (unsigned long long)s0.front_parks, N);
	for (int i = N; i-- > 0;) {
		CUdeviceptr q = PT_MALLOC(&t, i + 1, s);
		cr_assert_eq(q, p[i], "size %d pages came back at another address", i + 1);
	}
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.front_hits - s0.front_hits, N);
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_eq(s1.parked, 0);
	for (int i = 0; i < N; i++)
		PT_FREE(&t, p[i], s);
	pt_settle(&t);
	pt_close(&t);
}

/* Three of one size: the last freed comes back first, then the one before. */
Test(front, newest_of_a_size_first)
{
	struct pt t;
	open_front(&t, 64, 256);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s), b = PT_MALLOC(&t, 2, s), c = PT_MALLOC(&t, 2, s);
	CUdeviceptr other = PT_MALLOC(&t, 3, s);
	PT_FREE(&t, a, s);
	PT_FREE(&t, other, s);
	PT_FREE(&t, c, s);
	PT_FREE(&t, b, s);
	cr_assert_eq(PT_MALLOC(&t, 2, s), b);
	cr_assert_eq(PT_MALLOC(&t, 2, s), c);
	cr_assert_eq(PT_MALLOC(&t, 2, s), a);
	cr_assert_eq(PT_MALLOC(&t, 3, s), other);
	cr_assert_eq(pt_stats(&t).front_hits, 4);
	PT_FREE(&t, a, s);
	PT_FREE(&t, b, s);
	PT_FREE(&t, c, s);
	PT_FREE(&t, other, s);
	pt_settle(&t);
	pt_close(&t);
}

/* With room for 5, the sixth free reaches the pool; a slot a hit frees is
 * used again. */
Test(front, stops_at_its_entry_count)
{
	struct pt t;
	CUdeviceptr p[8];
	open_front(&t, 5, 256);
	CUstream s = vpmm_host_stream_create(t.drv);
	for (int i = 0; i < 8; i++)
		p[i] = PT_MALLOC(&t, 1, s);
	for (int i = 0; i < 6; i++)
		PT_FREE(&t, p[i], s);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.front_parks, 5);
	cr_assert_eq(st.parked, 5 * t.page, "the sixth free did not reach the pool");
	cr_assert_eq(st.reusable, st.parked + t.page);
	p[0] = PT_MALLOC(&t, 1, s); /* a hit frees a slot */
	PT_FREE(&t, p[6], s);       /* which the next free takes */
	st = pt_stats(&t);
	cr_assert_eq(st.front_parks, 6);
	cr_assert_eq(st.parked, 5 * t.page);
	PT_FREE(&t, p[0], s);
	PT_FREE(&t, p[7], s);
	pt_settle(&t);
	pt_close(&t);
}

/* Only small entries parked, side by side: a request as large as all of
 * them together takes them back and is served in their place, no growth. */
Test(front, all_entries_go_back_before_growth)
{
	struct pt t;
	CUdeviceptr small[6];
	open_front(&t, 64, 64);
	CUstream s = vpmm_host_stream_create(t.drv);
	for (int i = 0; i < 6; i++)
		small[i] = PT_MALLOC(&t, 1, s);
	CUdeviceptr fence = PT_MALLOC(&t, 1, s);
	for (int i = 0; i < 6; i++)
		PT_FREE(&t, small[i], s);
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr q = PT_MALLOC(&t, 6, s);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(q, small[0]);
	cr_assert_eq(s1.pages_created, s0.pages_created, "grew instead");
	cr_assert_eq(s1.parked, 0);
	PT_FREE(&t, q, s);
	PT_FREE(&t, fence, s);
	pt_settle(&t);
	pt_close(&t);
}

static void open_handles(struct pt *t, unsigned entries)
{
	struct pt_setup su = {.va_pages = 256, .front_entries = entries, .handle_pages = 4,
			      .growth_split = 1, .event_interval_ns = 1000000000,
			      .unbacked = true, .capacity = 4 * PT_GiB};
	pt_open(t, &su);
}

/* A cache of two entries: y parked beside x, which was freed to the pool,
 * and z parked between live neighbours; a free region of one 4-page
 * handle elsewhere (`big`). Every malloc is a growth of its own handle.
 * Returns where a malloc of `pages` went. */
static CUdeviceptr beside_free(struct pt *t, size_t pages, CUdeviceptr *x, CUdeviceptr *big)
{
	open_handles(t, 2);
	CUstream s = vpmm_host_stream_create(t->drv);
	*x = PT_MALLOC(t, 1, s);
	CUdeviceptr y = PT_MALLOC(t, 1, s);
	PT_MALLOC(t, 1, s);
	CUdeviceptr z = PT_MALLOC(t, 1, s);
	PT_MALLOC(t, 1, s);
	*big = PT_MALLOC(t, 4, s);
	PT_MALLOC(t, 1, s);
	PT_FREE(t, z, s);    /* parked */
	PT_FREE(t, y, s);    /* parked: the cache is full */
	PT_FREE(t, *x, s);   /* to the pool, beside y */
	PT_FREE(t, *big, s);
	cr_assert_eq(pt_stats(t).parked, 2 * t->page, "y and z are not parked: the test shows nothing");
	CUdeviceptr q = PT_MALLOC(t, pages, s);
	PT_CHECK(t);
	return q;
}

/* A malloc whose only place would strand memory (2 pages of the 4-page
 * handle): the parked y goes back first, joins x, and the malloc takes the
 * two pages there, stranding nothing. Parked, y would have kept x a page
 * short until some malloc of its own size took it back. z, with no free
 * neighbour, stays parked. */
Test(front, a_parked_allocation_beside_free_memory_joins_it)
{
	struct pt t;
	CUdeviceptr x, big;
	CUdeviceptr q = beside_free(&t, 2, &x, &big);
	cr_assert_eq(q, x, "placed at %#llx, not at x %#llx (big is %#llx)",
		     (unsigned long long)q, (unsigned long long)x, (unsigned long long)big);
	cr_assert_eq(pt_stats(&t).parked, t.page, "z went back too");
	pt_close(&t);
}

/* The control: a malloc that fills the 4-page handle strands nothing, and
 * the cache keeps both. */
Test(front, a_place_that_strands_nothing_leaves_the_cache)
{
	struct pt t;
	CUdeviceptr x, big;
	cr_assert_eq(beside_free(&t, 4, &x, &big), big);
	cr_assert_eq(pt_stats(&t).parked, 2 * t.page);
	pt_close(&t);
}

/* A 3-page malloc strands a page of big1 (or big2) and sends y back; m3,
 * parked beside the page it left, then faces the next miss (4 pages),
 * which fills a handle exactly. Returns what is parked after that miss. */
static size_t after_a_stranding_miss(struct pt *t, enum vpmm_remap_policy remap)
{
	struct pt_setup su = {.va_pages = 256, .front_entries = 2, .handle_pages = 4,
			      .growth_split = 1, .event_interval_ns = 1000000000,
			      .unbacked = true, .capacity = 4 * PT_GiB, .remap = remap};
	pt_open(t, &su);
	CUstream s = vpmm_host_stream_create(t->drv);
	CUdeviceptr x = PT_MALLOC(t, 1, s);
	CUdeviceptr y = PT_MALLOC(t, 1, s);
	PT_MALLOC(t, 1, s);
	CUdeviceptr z = PT_MALLOC(t, 1, s);
	PT_MALLOC(t, 1, s);
	CUdeviceptr big1 = PT_MALLOC(t, 4, s);
	PT_MALLOC(t, 1, s);
	CUdeviceptr big2 = PT_MALLOC(t, 4, s);
	PT_MALLOC(t, 1, s);
	PT_FREE(t, z, s);    /* parked, between live neighbours */
	PT_FREE(t, y, s);    /* parked: the cache is full */
	PT_FREE(t, x, s);    /* to the pool, beside y */
	PT_FREE(t, big1, s);
	PT_FREE(t, big2, s);
	CUdeviceptr m3 = PT_MALLOC(t, 3, s); /* strands a page: y goes back */
	cr_assert(m3 == big1 || m3 == big2, "m3 at %#llx", (unsigned long long)m3);
	cr_assert_eq(pt_stats(t).parked, t->page, "y stayed parked: the test shows nothing");
	PT_FREE(t, m3, s); /* parked, beside the page it left free */
	cr_assert_eq(pt_stats(t).parked, 4 * t->page);
	CUdeviceptr q = PT_MALLOC(t, 4, s);
	PT_CHECK(t);
	cr_assert(q == big1 || q == big2, "q at %#llx", (unsigned long long)q);
	return pt_stats(t).parked;
}

/* After a miss whose place stranded, the stream's next miss gives back its
 * parked allocations beside free memory before it places, even where its
 * place would strand nothing (take.c): most misses of such a stream gave
 * some back anyway, after a first place, and placed twice. So m3 goes back
 * and z alone stays parked. */
Test(front, after_a_miss_that_strands_the_next_gives_back_first)
{
	struct pt t;
	cr_assert_eq(after_a_stranding_miss(&t, VPMM_REMAP_PRESSURE), t.page,
		     "m3 stayed parked (z alone should)");
	pt_close(&t);
}

/* Without the room for twice the pool (vpi_growth_ample: here because
 * VPMM_REMAP=always never counts on room), a miss places first and gives
 * back only if that place strands: m3 stays parked. Walking first at any
 * room failed capacity runs (docs/design.md, "A miss places once"). */
Test(front, without_room_a_miss_places_before_it_gives_back)
{
	struct pt t;
	cr_assert_eq(after_a_stranding_miss(&t, VPMM_REMAP_ALWAYS), 4 * t.page,
		     "m3 went back: the walk came first without room");
	pt_close(&t);
}

/* e, parked by a synchronous caller, lies between a free page pending on
 * stream u and a settled 4-page handle r. A 1-page malloc would strand 3
 * pages of r, but given back, e would merge with both neighbours into one
 * region pending on u, which the caller cannot place in: the request lost
 * its place and defragmented (found by a review). e stays parked, and the
 * malloc goes to r. */
Test(front, a_parked_allocation_beside_another_streams_free_memory_stays)
{
	struct pt t;
	open_handles(&t, 1);
	CUstream u = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 1, u);
	CUdeviceptr e = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	CUdeviceptr r = PT_MALLOC(&t, 4, VPMM_NO_STREAM);
	CUdeviceptr w = PT_MALLOC(&t, 4, u);
	PT_FREE(&t, w, u);                 /* u's one entry */
	PT_FREE(&t, a, u);                 /* to the pool, pending on u */
	PT_FREE(&t, e, VPMM_NO_STREAM);    /* parked */
	PT_FREE(&t, r, VPMM_NO_STREAM);    /* to the pool, settled */
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_eq(s0.parked, 6 * t.page, "e and w are not parked: the test shows nothing");
	CUdeviceptr q = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(q, r, "placed at %#llx, not at r %#llx", (unsigned long long)q,
		     (unsigned long long)r);
	cr_assert_eq(s1.defrags, s0.defrags);
	cr_assert_eq(s1.parked, s0.parked);
	PT_CHECK(&t);
	pt_close(&t);
}

/* 300 frees and mallocs of one size, one after the other: each hit gives
 * its slot back and the next free takes it, so a cache of 256 never fills. */
Test(front, a_hit_gives_its_slot_back)
{
	struct pt t;
	open_front(&t, 256, 256);
	CUstream s = vpmm_host_stream_create(t.drv);
	for (int i = 0; i < 300; i++)
		PT_FREE(&t, PT_MALLOC(&t, 1, s), s);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.front_parks, 300);
	cr_assert_eq(st.front_hits, 299);
	pt_settle(&t);
	pt_close(&t);
}

static const struct vpmm_snap_region *snap_at(const struct vpmm_snapshot *sn, CUdeviceptr va)
{
	for (size_t i = 0; i < sn->nregions; i++)
		if (sn->regions[i].va == va)
			return &sn->regions[i];
	return NULL;
}

/* What vpmm-dump shows: after a hit, the allocation taken back is live and
 * the one still parked is shown parked (the snapshot reads the chains, not
 * stale slots). */
Test(front, snapshot_shows_what_is_parked)
{
	struct pt t;
	open_front(&t, 16, 256);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s), b = PT_MALLOC(&t, 3, s), keep = PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a, s);
	PT_FREE(&t, b, s);
	cr_assert_eq(PT_MALLOC(&t, 2, s), a);
	struct vpmm_snapshot sn;
	cr_assert_eq(vpmm_pool_snapshot(t.pool, &sn), 0);
	const struct vpmm_snap_region *ra = snap_at(&sn, a), *rb = snap_at(&sn, b);
	cr_assert(ra && rb);
	cr_assert(ra->kind == VPMM_REGION_LIVE && !ra->parked, "a: kind %d parked %d",
		  (int)ra->kind, ra->parked);
	cr_assert(rb->parked, "b is parked, the snapshot says not");
	vpmm_snapshot_free(&sn);
	PT_FREE(&t, a, s);
	PT_FREE(&t, keep, s);
	pt_settle(&t);
	pt_close(&t);
}

/* A flush whose free of a packed block fails (no event could cover it on
 * the cache's stream) hands the block out again, as before it was parked;
 * the caches' counts still agree (vpmm_pool_check: every park is a hit, an
 * entry, a block given back or one handed out again). A block of a slab of
 * stream a, freed on stream b into b's cache, then a trim with b's next
 * event record failing. */
Test(front, a_flush_whose_free_fails_hands_the_block_out_again)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .front_entries = 16, .small_max = SIZE_MAX,
			      .event_interval_ns = 1000000000};
	pt_open(&t, &su);
	CUstream a = vpmm_host_stream_create(t.drv), b = vpmm_host_stream_create(t.drv);
	CUdeviceptr big = PT_MALLOC(&t, 2, b), blk = 0;
	PT_FREE(&t, big, b); /* b's first free records: later ones wait */
	cr_assert_eq(vpmm_pool_malloc(t.pool, t.page / 8, a, &blk), 0);
	cr_assert_eq(vpmm_pool_free(t.pool, blk, b), 0);
	cr_assert_eq(pt_stats(&t).parked, t.page / 8, "the block is not parked: the test shows nothing");
	unsigned long rec = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	vpmm_host_fail(t.drv, VPMM_OP_EVENT_RECORD, 1, CUDA_ERROR_LAUNCH_FAILED);
	vpmm_pool_trim(t.pool, 0);
	vpmm_host_fail(t.drv, VPMM_OP_EVENT_RECORD, 0, CUDA_SUCCESS);
	cr_assert_gt(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec, "no record was tried");
	cr_assert_eq(pt_stats(&t).parked, 0, "the block stayed parked");
	PT_CHECK(&t);
	/* Handed out again: a free of it is no double free. */
	cr_assert_eq(vpmm_pool_free(t.pool, blk, a), 0, "the block was freed after all");
	PT_CHECK(&t);
	pt_close(&t);
}
