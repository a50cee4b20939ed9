/* test_streams.c — the cross-stream rules: memory freed on one stream is
 * reusable at once on that stream, by another stream in phase 1 only once the
 * freeing stream's work completed, and by a defrag only behind a device-side
 * wait. Harvest order: own stream, settled, then other streams oldest first. */
#include <time.h>

#include "pool_test.h"

static void open64(struct pt *t, size_t initial, enum vpmm_defrag_policy policy)
{
	struct pt_setup su = { .va_pages = 64, .initial_pages = initial,
			       .defrag = policy };
	pt_open(t, &su);
}

static bool inside(CUdeviceptr p, CUdeviceptr base, size_t len)
{
	return p >= base && p < base + len;
}

Test(streams, pending_region_is_not_handed_to_another_stream)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	CUdeviceptr g = PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p, a);
	PT_LAYOUT_IS(&t, "[-4][1][*59]");

	struct vpmm_stats s0 = pt_stats(&t);
	unsigned long w0 = vpmm_host_stream_wait_count(t.drv, b);
	CUdeviceptr q = PT_MALLOC(&t, 4, b);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_not(inside(q, p, 4 * t.page),
		      "stream b got stream a's pending region at its old address");
	/* The defrag harvested a's pages behind a wait on b. */
	PT_LAYOUT_IS(&t, "[~4][1][4][*55]");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 4);
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), w0 + 1,
		     "stream b does not wait for a's work");
	cr_assert_eq(s1.stream_waits - s0.stream_waits, 1);

	/* b alone cannot get past the wait, a's work is still pending: the old
	 * address may not be unmapped. */
	vpmm_host_stream_complete(t.drv, b);
	int n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_eq(n, 0, "zombie reclaimed while stream a's work is pending");
	PT_LAYOUT_IS(&t, "[~4][1][4][*55]");

	cr_assert_gt(pt_settle(&t), 0);
	PT_LAYOUT_IS(&t, "[*4][1][4][*55]");
	PT_FREE(&t, q, b);
	PT_FREE(&t, g, a);
	pt_close(&t);
}

Test(streams, completed_region_is_reused_in_place_by_another_stream)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p, a);
	vpmm_host_stream_complete(t.drv, a);

	struct vpmm_stats s0 = pt_stats(&t);
	unsigned long w0 = vpmm_host_stream_wait_count(t.drv, b);
	CUdeviceptr q = PT_MALLOC(&t, 4, b);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(q, p, "completed region of stream a not reused by b");
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_eq(s1.pages_remapped, s0.pages_remapped);
	cr_assert_eq(s1.defrags, s0.defrags);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), w0,
		     "phase 1 inserted a wait");
	PT_LAYOUT_IS(&t, "[4][1][*59]");
	pt_close(&t);
}

Test(streams, own_stream_reuses_its_pending_region_at_once)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p, a);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, p, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE);
	cr_assert_eq(r.stream, a);
	cr_assert_not(r.settled);
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr q = PT_MALLOC(&t, 3, a);
	cr_assert_eq(q, p);
	cr_assert_eq(pt_stats(&t).pages_created, s0.pages_created);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, a), 0);
	PT_LAYOUT_IS(&t, "[3][-1][1][*59]");
	pt_close(&t);
}

Test(streams, settled_initial_pages_serve_any_stream)
{
	struct pt t;
	open64(&t, 4, VPMM_DEFRAG_LACKING);
	CUstream b = vpmm_host_stream_create(t.drv);
	struct vpmm_region_info r;
	cr_assert_eq(vpmm_pool_regions(t.pool, &r, 1), 2);
	cr_assert_eq(r.kind, VPMM_REGION_FREE);
	cr_assert(r.settled, "initial pages not settled");
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_eq(s0.pages_created, 4);
	cr_assert_eq(s0.mapped, 4 * t.page);
	cr_assert_eq(s0.reusable, 4 * t.page);
	CUdeviceptr q = PT_MALLOC(&t, 4, b);
	cr_assert_eq(q, r.va);
	cr_assert_eq(pt_stats(&t).pages_created, 4);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 0);
	pt_close(&t);
}

/* Blocks [2][1][2][1][2][1]: the 2s freed on a, b, b. */
static void three_freed(struct pt *t, CUstream a, CUstream b)
{
	CUdeviceptr x = PT_MALLOC(t, 2, a);
	PT_MALLOC(t, 1, a);
	CUdeviceptr y = PT_MALLOC(t, 2, b);
	PT_MALLOC(t, 1, a);
	CUdeviceptr z = PT_MALLOC(t, 2, b);
	PT_MALLOC(t, 1, a);
	PT_FREE(t, x, a);
	PT_FREE(t, y, b);
	PT_FREE(t, z, b);
	PT_LAYOUT_IS(t, "[-2][1][-2][1][-2][1][*55]");
}

Test(streams, harvest_takes_own_stream_first_without_wait)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	three_freed(&t, a, b);
	struct vpmm_stats s0 = pt_stats(&t);
	PT_MALLOC(&t, 3, b);
	struct vpmm_stats s1 = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[-2][1][~2][1][~1][-1][1][3][*52]");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 3);
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 0,
		     "own-stream harvest made the stream wait");
	cr_assert_eq(s1.stream_waits, s0.stream_waits);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[-2][1][*2][1][*1][-1][1][3][*52]");
	pt_close(&t);
}

Test(streams, policy_all_harvests_every_free_page_with_waits)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_ALL);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	three_freed(&t, a, b);
	struct vpmm_stats s0 = pt_stats(&t);
	PT_MALLOC(&t, 3, b);
	struct vpmm_stats s1 = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[~2][1][~2][1][~2][1][3][-3][*49]");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 6);
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 1,
		     "harvesting stream a's pending pages needs one wait on b");
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*2][1][*2][1][*2][1][3][-3][*49]");
	pt_close(&t);
}

Test(streams, other_streams_harvested_oldest_first)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUstream c = vpmm_host_stream_create(t.drv);
	/* c is the first stream the pool sees; its free is the newer one. */
	CUdeviceptr x = PT_MALLOC(&t, 2, c);
	PT_MALLOC(&t, 1, a);
	CUdeviceptr y = PT_MALLOC(&t, 2, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, y, a); /* older */
	PT_FREE(&t, x, c); /* newer, lower address, stream known first */
	PT_LAYOUT_IS(&t, "[-2][1][-2][1][*58]");
	PT_MALLOC(&t, 2, b);
	PT_LAYOUT_IS(&t, "[-2][1][~2][1][2][*56]");
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 1);
	/* The zombie hangs on a's work, not on c's. */
	vpmm_host_stream_complete(t.drv, c);
	vpmm_host_stream_complete(t.drv, b);
	int n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_eq(n, 0, "zombie reclaimed before stream a completed");
	cr_assert_gt(pt_settle(&t), 0);
	PT_LAYOUT_IS(&t, "[-2][1][*2][1][2][*56]");
	pt_close(&t);
}

/* A pending region of another stream right in front of the hole is no
 * place to start an allocation: its pages are harvested behind a wait.
 * Once its stream completed (and the pool learned it) it is. */
Test(streams, pending_region_of_another_stream_is_no_prefix)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr x = PT_MALLOC(&t, 2, a);
	PT_FREE(&t, x, a);
	PT_LAYOUT_IS(&t, "[-2][*62]");
	CUdeviceptr q = PT_MALLOC(&t, 3, b);
	cr_assert_neq(q, x, "stream b's allocation starts in a's pending region");
	PT_LAYOUT_IS(&t, "[~2][3][*59]");
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 1);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*2][3][*59]");
	pt_close(&t);
}

Test(streams, completed_region_of_another_stream_is_a_prefix)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr x = PT_MALLOC(&t, 2, a);
	PT_FREE(&t, x, a);
	vpmm_host_stream_complete(t.drv, a);
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr q = PT_MALLOC(&t, 3, b);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(q, x, "the completed region in front of the hole was not used");
	PT_LAYOUT_IS(&t, "[3][*61]");
	cr_assert_eq(s1.pages_created - s0.pages_created, 1);
	cr_assert_eq(s1.pages_remapped, s0.pages_remapped);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 0);
	pt_close(&t);
}

/* With a long event interval a second free may join the stream's open epoch
 * instead of recording an event. The event the first free recorded tells
 * nothing about work issued after it: the second region must not reach
 * another stream on the strength of it. */
Test(streams, epoch_join_never_hands_out_memory_early)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 64,
			       .event_interval_ns = 10ull * 1000 * 1000 * 1000 };
	pt_open(&t, &su);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p1 = PT_MALLOC(&t, 2, a);
	PT_MALLOC(&t, 1, a);
	CUdeviceptr p2 = PT_MALLOC(&t, 2, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p1, a);
	vpmm_host_stream_complete(t.drv, a);
	PT_FREE(&t, p2, a);
	PT_LAYOUT_IS(&t, "[-2][1][-2][1][*58]");

	CUdeviceptr q1 = PT_MALLOC(&t, 2, b);
	cr_assert_eq(q1, p1, "p1's completed region not reused by stream b");

	struct vpmm_stats s0 = pt_stats(&t);
	unsigned long w0 = vpmm_host_stream_wait_count(t.drv, b);
	CUdeviceptr q2 = PT_MALLOC(&t, 2, b);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_not(inside(q2, p2, 2 * t.page),
		      "p2 handed to stream b before any event after its free completed");
	if (s1.pages_remapped != s0.pages_remapped) {
		cr_assert_gt(vpmm_host_stream_wait_count(t.drv, b), w0,
			     "p2's pages harvested without a wait");
		vpmm_host_stream_complete(t.drv, b);
		int n = vpmm_pool_reclaim(t.pool);
		PT_CHECK(&t);
		cr_assert_eq(n, 0, "p2's old address unmapped on the strength of "
			     "an event older than its free");
	}
	pt_settle(&t);
	pt_close(&t);
}

/* VPMM_NO_STREAM (cudaFree): the caller synchronized, so the memory is
 * settled at once and any stream takes it without a wait. */
Test(streams, free_on_no_stream_is_settled_at_once)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p, VPMM_NO_STREAM);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, p, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE);
	cr_assert(r.settled, "a free on VPMM_NO_STREAM is not settled");
	CUdeviceptr q = PT_MALLOC(&t, 4, b);
	cr_assert_eq(q, p);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 0);
	pt_close(&t);
}

/* VPMM_NO_STREAM (cudaMalloc): what it gets has no pending work, whatever
 * it took; stream a's pending free is waited for on the CPU, not handed out
 * in place. */
Test(streams, malloc_on_no_stream_gets_no_pending_memory)
{
	struct pt t;
	open64(&t, 0, VPMM_DEFRAG_LACKING);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	PT_MALLOC(&t, 1, a);
	PT_FREE(&t, p, a);
	CUdeviceptr q = PT_MALLOC(&t, 4, VPMM_NO_STREAM);
	struct vpmm_stats st = pt_stats(&t);
	if (q == p) {
		/* Taken in place: only after a CPU wait for a's work. */
		cr_assert_gt(vpmm_host_calls(t.drv, VPMM_OP_EVENT_SYNC), 0);
	} else {
		cr_assert_not(inside(q, p, 4 * t.page));
	}
	if (st.pages_remapped) {
		cr_assert_gt(vpmm_host_calls(t.drv, VPMM_OP_EVENT_SYNC), 0,
			     "a's pending pages given to a stream-less caller "
			     "without a wait");
	}
	cr_assert_eq(vpmm_host_stream_complete(t.drv, a), 0,
		     "stream a still had pending work before the memory it freed");
	PT_FREE(&t, q, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

/* Around a device synchronisation (the shim's cudaFree): frees made on a
 * stream, pending or parked in its cache, become everyone's memory. */
Test(streams, poll_around_sync_settles_every_stream)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .event_interval_ns = 1000000000,
			      .front_entries = 16};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	CUdeviceptr b = PT_MALLOC(&t, 2, s);
	CUdeviceptr keep = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	PT_FREE(&t, a, s); /* parked in s's cache */
	PT_FREE(&t, b, s);
	cr_assert_eq(vpmm_pool_poll(t.pool, false), 0, "nothing completed yet");
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_geq(vpmm_pool_poll(t.pool, true), 0);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.events_recorded, s0.events_recorded + 1,
		     "one event closes s's open epoch");
	cr_assert_eq(s1.parked, 0, "s's cache was not flushed");
	PT_CHECK(&t);
	vpmm_host_complete_all(t.drv); /* the synchronisation */
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 1);
	PT_CHECK(&t);
	struct vpmm_region_info ri;
	cr_assert(pt_region_at(&t, a, &ri));
	cr_assert_eq(ri.kind, VPMM_REGION_FREE);
	cr_assert(ri.settled, "a is still s's");
	cr_assert_geq(ri.size, 6 * t.page, "a and b did not merge (%zu)", ri.size);
	/* A synchronous caller takes it in place, without growing. */
	struct vpmm_stats s2 = pt_stats(&t);
	CUdeviceptr c = PT_MALLOC(&t, 6, VPMM_NO_STREAM);
	cr_assert_eq(c, a);
	cr_assert_eq(pt_stats(&t).pages_created, s2.pages_created);
	PT_FREE(&t, c, VPMM_NO_STREAM);
	PT_FREE(&t, keep, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

/* A stream that is the only taker needs events only for a trim or a taker
 * yet to come: its frees record at most once per 10 ms (SOLE_RECORD_NS),
 * not once per interval, until a second stream takes memory. */
static void sleep_ms(long ms)
{
	struct timespec ts = {0, ms * 1000000L};
	while (nanosleep(&ts, &ts) != 0)
		;
}

/* A 1 ms event interval: 2 ms sleeps pass it, well within the 10 ms of a
 * sole stream. */
static void open_1ms(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .event_interval_ns = 1000 * 1000};
	pt_open(t, &su);
}

static uint64_t free_records(struct pt *t, CUdeviceptr p, CUstream s)
{
	uint64_t e0 = pt_stats(t).events_recorded;
	PT_FREE(t, p, s);
	return pt_stats(t).events_recorded - e0;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

Test(streams, a_sole_stream_records_once_per_ten_ms)
{
	struct pt t;
	open_1ms(&t);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 1, a);
	/* A round: a free 11 ms after the last record records; the next one,
	 * 2 ms later (past the interval), must not if it came within 10 ms of
	 * that record. A descheduled test can overshoot: that round tells
	 * nothing, and another is tried. */
	bool told = false;
	for (int round = 0; round < 20 && !told; round++) {
		CUdeviceptr p = PT_MALLOC(&t, 2, a);
		sleep_ms(11);
		uint64_t t0 = mono_ns();
		cr_assert_eq(free_records(&t, p, a), 1, "a free 11 ms after the last recorded nothing");
		p = PT_MALLOC(&t, 2, a);
		sleep_ms(2);
		uint64_t n = free_records(&t, p, a);
		if (mono_ns() - t0 < 10 * 1000 * 1000) {
			cr_assert_eq(n, 0, "a sole stream recorded at the interval, not 10 ms");
			told = true;
		}
	}
	cr_assert(told, "20 rounds overshot 10 ms: the host is too slow to tell");

	PT_MALLOC(&t, 1, b); /* b takes memory: a's frees follow the interval */
	CUdeviceptr p = PT_MALLOC(&t, 2, a);
	sleep_ms(2);
	cr_assert_eq(free_records(&t, p, a), 1,
		     "with two takers a's free past the interval recorded nothing");
	vpmm_host_complete_all(t.drv);
	pt_settle(&t);
	pt_close(&t);
}

static uint64_t test_clock(void *arg)
{
	return *(const uint64_t *)arg;
}

/* On the pool's clock (vpmm_pool_set_clock, as vpmm-replay sets it), the
 * same rules without a sleep: with two takers a free records once the
 * interval (1 ms) has passed since the stream's last record, not before; a
 * sole stream once 10 ms have. */
Test(streams, the_interval_follows_the_pools_clock)
{
	struct pt t;
	uint64_t now = 1000000000ull; /* 1 s */
	open_1ms(&t);
	vpmm_pool_set_clock(t.pool, test_clock, &now);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 1, a);
	CUdeviceptr p = PT_MALLOC(&t, 2, a);
	cr_assert_eq(free_records(&t, p, a), 1, "a sole stream's first free");
	p = PT_MALLOC(&t, 2, a);
	now += 9999999; /* 10 ms less 1 ns */
	cr_assert_eq(free_records(&t, p, a), 0, "a sole stream recorded before 10 ms");
	p = PT_MALLOC(&t, 2, a);
	now += 1;
	cr_assert_eq(free_records(&t, p, a), 1, "a sole stream, 10 ms on, recorded nothing");

	PT_MALLOC(&t, 1, b); /* two takers: the interval, 1 ms */
	p = PT_MALLOC(&t, 2, a);
	now += 999999;
	cr_assert_eq(free_records(&t, p, a), 0, "recorded before the interval");
	p = PT_MALLOC(&t, 2, a);
	now += 1;
	cr_assert_eq(free_records(&t, p, a), 1, "the interval passed, nothing recorded");
	vpmm_host_complete_all(t.drv);
	pt_settle(&t);
	pt_close(&t);
}

/* A synchronous caller takes only completed memory: once one has come
 * through the lock, the interval applies to a sole stream again. */
Test(streams, a_synchronous_taker_brings_back_the_interval)
{
	struct pt t;
	open_1ms(&t);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 2, a);
	cr_assert_eq(free_records(&t, p, a), 1);
	CUdeviceptr k = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	p = PT_MALLOC(&t, 2, a);
	sleep_ms(2);
	cr_assert_eq(free_records(&t, p, a), 1,
		     "with a synchronous taker a's free past the interval recorded nothing");
	PT_FREE(&t, k, VPMM_NO_STREAM);
	vpmm_host_complete_all(t.drv);
	pt_settle(&t);
	pt_close(&t);
}

/* A destroyed stream's slab empties later, by frees of others: released in
 * the epoch of the stream's last event, which must exist and cover the
 * blocks' work, even if the stream never freed anything itself. */
Test(streams, a_destroyed_streams_slab_settles)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .small_max = SIZE_MAX,
			      .event_interval_ns = 1000 * 1000};
	pt_open(&t, &su);
	CUstream a = vpmm_host_stream_create(t.drv);
	size_t bs = t.page / 8;
	CUdeviceptr blk[9]; /* two slabs: an empty one that is not the last goes */
	for (int i = 0; i < 9; i++)
		cr_assert_eq(vpmm_pool_malloc(t.pool, bs, a, &blk[i]), 0);
	cr_assert_eq(pt_stats(&t).events_recorded, 0);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, a), 0);
	cr_assert_eq(pt_stats(&t).events_recorded, 1, "no last event for the stream");
	vpmm_host_complete_all(t.drv);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(vpmm_pool_free(t.pool, blk[i], VPMM_NO_STREAM), 0);
	PT_CHECK(&t);
	pt_settle(&t);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, blk[0], &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE, "the empty slab was not released");
	cr_assert(r.settled, "the destroyed stream's slab never settles");
	cr_assert_gt(vpmm_pool_trim(t.pool, 0), 0, "nothing to give back");
	cr_assert_eq(vpmm_pool_free(t.pool, blk[8], VPMM_NO_STREAM), 0);
	pt_close(&t);
}

/* A sole stream's frees, completed, go back at the first trim: the first
 * free records (there is no earlier event), the trim finds it complete. */
Test(streams, a_trim_gives_back_a_sole_streams_completed_frees)
{
	struct pt t;
	open_1ms(&t);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 4, a);
	PT_FREE(&t, p, a);
	vpmm_host_complete_all(t.drv);
	cr_assert_eq(vpmm_pool_trim(t.pool, 0), (long long)(4 * t.page),
		     "the first trim gave back less than the completed frees");
	pt_close(&t);
}
