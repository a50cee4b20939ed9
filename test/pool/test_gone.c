/* test_gone.c — a stream the program destroys: one last event covers its
 * pending frees, the pool never records on it again, and a new stream that
 * gets the same handle starts afresh. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "pool_test.h"

static void open16(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .event_interval_ns = 1000000000};
	pt_open(t, &su);
}

Test(gone, last_event_covers_pending_frees)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s); /* the first free records; close the epoch later */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, b, s); /* pending, no event of its own yet (interval) */
	unsigned long rec0 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	PT_CHECK(&t);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec0 + 1,
		     "no last event recorded before the destroy");
	/* Another stream asks for memory: nothing more may be recorded on s,
	 * and its memory comes back once s's last event completed. */
	unsigned long rec1 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	vpmm_host_stream_complete(t.drv, s);
	CUdeviceptr c = PT_MALLOC(&t, 4, u);
	cr_assert_eq(c, a, "settled memory of the destroyed stream not reused");
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec1,
		     "an event was recorded on a destroyed stream");
	PT_FREE(&t, c, u);
	pt_settle(&t);
	pt_close(&t);
}

Test(gone, same_handle_is_a_new_stream)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	/* The same handle again (a new stream the driver gave the same
	 * address): the old stream's pending memory is not its own. */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	cr_assert_neq(b, a, "pending memory of the destroyed stream reused in place");
	PT_FREE(&t, b, s);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0, "a second destroy is harmless");
	pt_settle(&t);
	pt_close(&t);
}

/* Blocks of a destroyed stream's slab, freed later by others, are released
 * in the epoch of the stream's last event. The stream_gone record is what
 * covers them; if it fails, the epoch stays as it was, so that they wait for
 * the last event that was recorded instead of one that never will be. */
static void open_small(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .small_max = SIZE_MAX,
			      .event_interval_ns = 1000000000};
	pt_open(t, &su);
}

static bool slab_settles(struct pt *t, CUstream s, bool fail_last_record)
{
	CUdeviceptr big = PT_MALLOC(t, 2, s);
	PT_FREE(t, big, s); /* the first free records: epoch 1 is closed */
	CUdeviceptr blk[9]; /* two slabs: an empty one that is not the last goes */
	for (int i = 0; i < 9; i++)
		cr_assert_eq(vpmm_pool_malloc(t->pool, t->page / 8, s, &blk[i]), 0);
	if (fail_last_record)
		vpmm_host_fail(t->drv, VPMM_OP_EVENT_RECORD, 1, CUDA_ERROR_INVALID_HANDLE);
	int rc = vpmm_pool_stream_gone(t->pool, s);
	cr_assert(fail_last_record ? rc < 0 : rc == 0, "stream_gone: %d", rc);
	vpmm_host_complete_all(t->drv);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(vpmm_pool_free(t->pool, blk[i], VPMM_NO_STREAM), 0);
	PT_CHECK(t);
	pt_settle(t);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(t, blk[0], &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE, "the empty slab was not released");
	cr_assert_eq(vpmm_pool_free(t->pool, blk[8], VPMM_NO_STREAM), 0);
	return r.settled;
}

Test(gone, a_slab_emptied_after_the_destroy_settles)
{
	struct pt t;
	open_small(&t);
	cr_assert(slab_settles(&t, vpmm_host_stream_create(t.drv), false),
		  "the destroyed stream's slab never settles");
	pt_close(&t);
}

Test(gone, a_failed_last_record_leaves_the_epoch_as_it_was)
{
	struct pt t;
	open_small(&t);
	cr_assert(slab_settles(&t, vpmm_host_stream_create(t.drv), true),
		  "after a failed last record the slab waits for an event never recorded");
	pt_close(&t);
}

/* The last record failed with a free in the open epoch: no event covers
 * that free, but a synchronisation of the context completes the dead
 * stream's work too, so the poll after it settles the free. Before, it
 * stayed pending for good, and the stream's record with it. */
Test(gone, a_failed_last_record_settles_at_the_next_synchronisation)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s); /* the first free records: epoch 1 is closed */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, b, s); /* in the open epoch */
	vpmm_host_fail(t.drv, VPMM_OP_EVENT_RECORD, 1, CUDA_ERROR_INVALID_HANDLE);
	cr_assert_lt(vpmm_pool_stream_gone(t.pool, s), 0);
	pt_synchronise(&t);
	PT_CHECK(&t);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, b, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE);
	cr_assert(r.settled, "the dead stream's uncovered free stayed pending");
	cr_assert_eq(pt_stats(&t).streams, 0, "the dead stream's record stayed");
	pt_close(&t);
}

/* Recording on a stream another thread captures would put our event into
 * its graph: no last event then. */
Test(gone, a_capturing_stream_gets_no_last_event)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s); /* the first free records */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, b, s); /* in the open epoch: a last event is due */
	vpmm_host_set_capturing(t.drv, s, true);
	unsigned long rec0 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	cr_assert_lt(vpmm_pool_stream_gone(t.pool, s), 0);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec0,
		     "an event recorded on a capturing stream");
	vpmm_host_set_capturing(t.drv, s, false);
	pt_close(&t);
}

/* A stream destroyed while a defragmentation for it has the lock dropped
 * (in the driver, mapping): the span it leaves free is pending on the
 * stream (its malloc waits for another stream's frees there), in an epoch
 * that the stream's last event, recorded meanwhile, must cover. An epoch
 * past it would never settle, and a defragmentation that later needed the
 * memory would fail for want of an event to wait for. */
struct held {
	struct pt *t;
	CUstream s;
	size_t pages;
	CUdeviceptr p;
	int rc;
};

static void *held_malloc(void *arg)
{
	struct held *h = arg;
	h->rc = vpmm_pool_malloc(h->t->pool, h->pages * h->t->page, h->s, &h->p);
	return NULL;
}

Test(gone, destroyed_while_its_defragmentation_maps)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .handle_pages = 2, .growth_split = 1};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	/* Two free slabs of two pages pending on u, apart. */
	CUdeviceptr a = PT_MALLOC(&t, 2, u), b = PT_MALLOC(&t, 1, u);
	CUdeviceptr c = PT_MALLOC(&t, 2, u), d = PT_MALLOC(&t, 1, u);
	PT_FREE(&t, a, u);
	PT_FREE(&t, c, u);
	/* Three pages for s: both slabs move (one page beyond the request
	 * stays free behind it), held in the first map. */
	unsigned long maps = vpmm_host_calls(t.drv, VPMM_OP_MAP);
	vpmm_host_gate(t.drv, VPMM_OP_MAP, true);
	struct held h = {.t = &t, .s = s, .pages = 3};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, held_malloc, &h), 0);
	for (int i = 0; i < 2000 && vpmm_host_calls(t.drv, VPMM_OP_MAP) == maps; i++)
		usleep(1000);
	cr_assert_gt(vpmm_host_calls(t.drv, VPMM_OP_MAP), maps, "the defragmentation never mapped");
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	vpmm_host_gate(t.drv, VPMM_OP_MAP, false);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_eq(h.rc, 0, "the held malloc failed: %d", h.rc);
	PT_CHECK(&t);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.pages_remapped, 4, "the test meant both slabs to move");
	/* Not before the stream's waits for u's frees have run: the destroy
	 * records a last event after them, though s freed nothing. */
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, h.p + 3 * t.page, &r));
	cr_assert(r.kind == VPMM_REGION_FREE && !r.settled,
		  "the span's free page settled before the work it waits for (layout %s)",
		  pt_layout(&t));

	vpmm_host_complete_all(t.drv);
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	cr_assert(pt_region_at(&t, h.p + 3 * t.page, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE, "layout %s", pt_layout(&t));
	cr_assert(r.settled, "the span's free page never settles (layout %s)", pt_layout(&t));
	PT_FREE(&t, h.p, VPMM_NO_STREAM);
	PT_FREE(&t, b, u);
	PT_FREE(&t, d, u);
	/* Everything is free and settled: one request takes all of it. */
	pt_settle(&t);
	CUdeviceptr all = PT_MALLOC(&t, 6, u);
	PT_FREE(&t, all, u);
	pt_settle(&t);
	pt_close(&t);
}

/* A stream whose frees an event recorded already covers needs no last one:
 * a destroy then costs no driver call. */
Test(gone, a_covered_stream_gets_no_last_event)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s); /* the first free records: nothing in the open epoch */
	unsigned long rec0 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec0,
		     "a last event recorded where every free was covered");
	vpmm_host_complete_all(t.drv);
	CUdeviceptr c = PT_MALLOC(&t, 4, u);
	cr_assert_eq(c, a, "the destroyed stream's completed memory not reused");
	PT_FREE(&t, c, u);
	pt_close(&t);
}

/* A destroyed stream's record stays while something refers to it (a slab
 * with a block still out, memory pending on its last event) and goes once
 * nothing does; memory it allocated is no such thing. */
Test(gone, a_record_goes_once_nothing_refers_to_it)
{
	struct pt t;
	open_small(&t);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	CUdeviceptr big = PT_MALLOC(&t, 2, s), blk, gone_free;
	cr_assert_eq(vpmm_pool_malloc(t.pool, t.page / 8, s, &blk), 0);
	gone_free = PT_MALLOC(&t, 1, s);
	PT_FREE(&t, gone_free, s);
	PT_FREE(&t, PT_MALLOC(&t, 1, u), u);
	cr_assert_eq(pt_stats(&t).streams, 2);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	PT_CHECK(&t);
	vpmm_host_complete_all(t.drv);
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	cr_assert_eq(pt_stats(&t).streams, 2, "a record went while its slab has a block out");
	cr_assert_eq(vpmm_pool_free(t.pool, blk, VPMM_NO_STREAM), 0);
	PT_CHECK(&t);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, blk, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE, "the dead stream's empty slab was kept");
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	PT_CHECK(&t);
	cr_assert_eq(pt_stats(&t).streams, 1, "the record stays with nothing referring to it");
	PT_FREE(&t, big, u); /* allocated on s: the program's, not s's */
	CUstream n = vpmm_host_stream_create(t.drv);
	PT_FREE(&t, PT_MALLOC(&t, 1, n), n);
	cr_assert_eq(pt_stats(&t).streams, 2);
	pt_settle(&t);
	pt_close(&t);
}

/* ---- streams by the thousand ------------------------------------------------ */

/* CPU time of this thread: what other processes on the machine do does not
 * count. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void open_churn(struct pt *t)
{
	struct pt_setup su = {.va_pages = 1024, .small_max = SIZE_MAX, .front_entries = 16,
			      .keep_event_interval = true};
	pt_open(t, &su);
}

struct churn {
	uint64_t ns;        /* CPU time of the streams made */
	unsigned made;      /* streams made before the budget ran out */
	uint64_t records;   /* most stream records the pool held at once */
	size_t events;      /* most driver events alive at once */
};

/* A program that makes a stream per request: n streams, one after another,
 * each created, given 1 MiB and a small block that are freed on it,
 * synchronised and destroyed. The device runs a destroyed stream's last
 * work a little later (every `lag` streams). Stops once `budget_ns` of CPU
 * time is spent (0: no budget). */
static void churn(struct pt *t, unsigned n, unsigned lag, uint64_t budget_ns,
		  struct churn *c)
{
	*c = (struct churn){0};
	uint64_t t0 = cpu_ns();
	for (unsigned i = 0; i < n; i++) {
		CUstream s = vpmm_host_stream_create(t->drv);
		CUdeviceptr a, b;
		cr_assert_not_null(s);
		cr_assert_eq(vpmm_pool_malloc(t->pool, PT_MiB, s, &a), 0);
		cr_assert_eq(vpmm_pool_malloc(t->pool, 4 * PT_KiB, s, &b), 0);
		cr_assert_eq(vpmm_pool_free(t->pool, b, s), 0);
		cr_assert_eq(vpmm_pool_free(t->pool, a, s), 0);
		vpmm_host_stream_complete(t->drv, s);
		cr_assert_eq(vpmm_pool_stream_gone(t->pool, s), 0);
		vpmm_host_stream_destroy(t->drv, s);
		if (i % lag == lag - 1)
			vpmm_host_complete_all(t->drv);
		struct vpmm_stats st = pt_stats(t);
		struct vpmm_host_live l;
		vpmm_host_live(t->drv, &l);
		if (st.streams > c->records)
			c->records = st.streams;
		if (l.events > c->events)
			c->events = l.events;
		c->made = i + 1;
		c->ns = cpu_ns() - t0;
		if (budget_ns && c->ns > budget_ns)
			break;
	}
}

/* What the pool keeps for streams the program destroyed stays bounded: the
 * records of the streams whose last work the device has not run yet, and
 * the events recorded on them. */
Test(gone, destroyed_streams_leave_nothing_behind)
{
	struct pt t;
	open_churn(&t);
	struct churn c;
	churn(&t, 5000, 16, 0, &c);
	PT_CHECK(&t);
	cr_expect_leq(c.records, 40, "%" PRIu64 " stream records held for 5000 streams "
		      "destroyed 16 at a time", c.records);
	cr_expect_leq(c.events, 40, "%zu events alive for 5000 streams destroyed 16 at a time",
		      c.events);
	vpmm_host_complete_all(t.drv);
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	struct vpmm_stats st = pt_stats(&t);
	cr_expect_eq(st.streams, 0, "%" PRIu64 " stream records left after every destroyed "
		     "stream's work completed", st.streams);
	cr_expect_leq(st.events, c.events, "%" PRIu64 " events kept, %zu at most before",
		      st.events, c.events);
	pt_close(&t);
}

/* The thousandth stream and the twenty-thousandth cost the same. Compared in
 * CPU time, the best of three runs of 1 000 against one of 20 000 in a new
 * pool, which stops as soon as it has spent four times as much a stream. */
Test(gone, a_stream_costs_the_same_however_many_came_before)
{
	struct pt t;
	struct churn c;
	uint64_t best = UINT64_MAX;
	for (int round = 0; round < 3; round++) {
		open_churn(&t);
		churn(&t, 1000, 16, 0, &c);
		pt_close(&t);
		if (c.ns < best)
			best = c.ns;
	}
	uint64_t per = best / 1000, budget = 4 * per * 20000;
	open_churn(&t);
	churn(&t, 20000, 16, budget, &c);
	pt_close(&t);
	cr_expect_eq(c.made, 20000, "20 000 streams took over 4x the CPU time a stream of "
		     "1 000 did (%" PRIu64 " ns): %u made in %" PRIu64 " ns, %" PRIu64
		     " ns a stream", per, c.made, c.ns, c.ns / c.made);
	cr_expect_leq(c.records, 40, "%" PRIu64 " stream records held", c.records);
}

/* The mallocs and frees a destroyed stream's cache served stay counted
 * once its record is freed: the stats count the program's calls. */
Test(gone, a_freed_record_keeps_its_calls_counted)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .front_entries = 16};
	pt_open(&t, &su);
	uint64_t calls = 0;
	for (int round = 0; round < 20; round++) {
		CUstream s = vpmm_host_stream_create(t.drv);
		for (int i = 0; i < 10; i++) { /* after the first, cache hits */
			CUdeviceptr a = PT_MALLOC(&t, 1, s);
			PT_FREE(&t, a, s);
			calls++;
		}
		cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
		vpmm_host_stream_destroy(t.drv, s);
		pt_settle(&t);
	}
	struct vpmm_stats st = pt_stats(&t);
	cr_expect_lt(st.streams, 20, "no destroyed stream's record was freed (%" PRIu64 ")",
		     st.streams);
	cr_expect_gt(st.front_hits, 0);
	cr_expect_eq(st.mallocs, calls, "mallocs %" PRIu64 ", calls %" PRIu64, st.mallocs, calls);
	cr_expect_eq(st.frees, calls, "frees %" PRIu64 ", calls %" PRIu64, st.frees, calls);
	pt_close(&t);
}

/* A block of a destroyed stream's slab, freed afterwards, goes to the slab,
 * not to a cache: parked in the freeing stream's cache (or the synchronous
 * callers', where a program's last free goes), it kept the slab, and the
 * destroyed stream's record, until that cache was flushed, which a pool
 * that goes idle never does. Once the device ran the work, a poll frees
 * the record. */
Test(gone, a_block_freed_after_its_slabs_stream_is_gone_is_not_parked)
{
	for (int sync = 0; sync < 2; sync++) {
		struct pt t;
		open_churn(&t);
		CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
		CUdeviceptr keep = PT_MALLOC(&t, 1, u); /* u's record, for its cache */
		PT_FREE(&t, keep, u);
		CUdeviceptr b;
		cr_assert_eq(vpmm_pool_malloc(t.pool, 4 * PT_KiB, s, &b), 0);
		cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
		vpmm_host_stream_destroy(t.drv, s);
		uint64_t parks = pt_stats(&t).front_parks;
		cr_assert_eq(vpmm_pool_free(t.pool, b, sync ? VPMM_NO_STREAM : u), 0);
		cr_expect_eq(pt_stats(&t).front_parks, parks, "%s: the block was parked",
			     sync ? "synchronous" : "another stream");
		vpmm_host_complete_all(t.drv);
		cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
		PT_CHECK(&t);
		cr_expect_eq(pt_stats(&t).streams, 1, "%s: %" PRIu64 " stream records left, "
			     "u's only expected", sync ? "synchronous" : "another stream",
			     pt_stats(&t).streams);
		PT_FREE(&t, PT_MALLOC(&t, 1, u), u); /* the pool still serves u */
		pt_close(&t);
	}
}

/* The other order: the block is parked in another cache first, then its
 * slab's stream goes. The parked block would keep the slab, and the
 * stream's record, until that cache was flushed. */
Test(gone, a_block_parked_elsewhere_goes_back_when_its_slabs_stream_goes)
{
	for (int sync = 0; sync < 2; sync++) {
		struct pt t;
		open_churn(&t);
		CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
		CUdeviceptr keep = PT_MALLOC(&t, 1, u); /* u's record, for its cache */
		PT_FREE(&t, keep, u);
		CUdeviceptr b;
		cr_assert_eq(vpmm_pool_malloc(t.pool, 4 * PT_KiB, s, &b), 0);
		uint64_t parks = pt_stats(&t).front_parks;
		cr_assert_eq(vpmm_pool_free(t.pool, b, sync ? VPMM_NO_STREAM : u), 0);
		cr_assert_eq(pt_stats(&t).front_parks, parks + 1, "%s: the block was not parked",
			     sync ? "synchronous" : "another stream");
		cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
		vpmm_host_stream_destroy(t.drv, s);
		cr_expect_eq(pt_stats(&t).parked, 0, "%s: %" PRIu64 " bytes still parked",
			     sync ? "synchronous" : "another stream", pt_stats(&t).parked);
		vpmm_host_complete_all(t.drv);
		cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
		PT_CHECK(&t);
		cr_expect_eq(pt_stats(&t).streams, 1, "%s: %" PRIu64 " stream records left, "
			     "u's only expected", sync ? "synchronous" : "another stream",
			     pt_stats(&t).streams);
		PT_FREE(&t, PT_MALLOC(&t, 1, u), u); /* the pool still serves u */
		pt_close(&t);
	}
}

/* The same, with the event that would cover the freeing stream's work
 * failing: the block stays parked in that cache, claimed, as it was, and
 * goes back when the cache is flushed. */
Test(gone, a_parked_block_whose_event_fails_stays_parked)
{
	struct pt t;
	open_churn(&t);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	CUdeviceptr keep = PT_MALLOC(&t, 1, u); /* u's record; its cache empty */
	CUdeviceptr b;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 4 * PT_KiB, s, &b), 0);
	cr_assert_eq(vpmm_pool_free(t.pool, b, u), 0);
	uint64_t parked = pt_stats(&t).parked;
	cr_assert_gt(parked, 0, "the block was not parked");
	/* s's last event, then the one on u for the block. */
	unsigned long records = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	vpmm_host_fail(t.drv, VPMM_OP_EVENT_RECORD, 2, CUDA_ERROR_INVALID_HANDLE);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	vpmm_host_stream_destroy(t.drv, s);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), records + 2,
		     "the block's event was not the one that failed");
	cr_expect_eq(pt_stats(&t).parked, parked, "the block left the cache: %" PRIu64
		     " bytes parked", pt_stats(&t).parked);
	PT_CHECK(&t);
	cr_assert_eq(vpmm_pool_free(t.pool, b, u), -EINVAL, "a second free of the block was taken");
	cr_assert_geq(vpmm_pool_poll(t.pool, true), 0); /* flushes u's cache */
	vpmm_host_complete_all(t.drv);
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	PT_CHECK(&t);
	cr_expect_eq(pt_stats(&t).parked, 0);
	cr_expect_eq(pt_stats(&t).streams, 1, "%" PRIu64 " stream records left, u's only",
		     pt_stats(&t).streams);
	PT_FREE(&t, keep, u);
	pt_close(&t);
}

/* The context's end (vpmm_pool_drop_events, after the context's work
 * completed and a poll settled it): a block of s's slab parked in another
 * cache, the synchronous callers' (which the shim's poll before the
 * synchronisation leaves) or that of u, a stream of the same context (made
 * before or after s, so that the walk meets either first). Both streams end
 * with the context; the block goes back with s, and no record is made on a
 * stream of the ended context. */
Test(gone, a_block_parked_elsewhere_goes_back_when_its_slabs_context_ends)
{
	for (int c = 0; c < 3; c++) {
		const char *name = c == 0 ? "synchronous" : c == 1 ? "u made first" : "u made last";
		struct pt t;
		open_churn(&t);
		CUstream s, u = NULL;
		if (c == 1)
			u = vpmm_host_stream_create(t.drv);
		s = vpmm_host_stream_create(t.drv);
		if (c == 2)
			u = vpmm_host_stream_create(t.drv);
		CUdeviceptr keep = 0, b;
		if (u)
			keep = PT_MALLOC(&t, 1, u); /* u's record; its cache empty */
		cr_assert_eq(vpmm_pool_malloc(t.pool, 4 * PT_KiB, s, &b), 0);
		uint64_t parks = pt_stats(&t).front_parks;
		cr_assert_eq(vpmm_pool_free(t.pool, b, u ? u : VPMM_NO_STREAM), 0);
		cr_assert_eq(pt_stats(&t).front_parks, parks + 1, "%s: the block was not parked",
			     name);
		vpmm_host_complete_all(t.drv);
		cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
		unsigned long records = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
		vpmm_pool_drop_events(t.pool, NULL, true);
		cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), records,
			     "%s: a record on a stream of the ended context", name);
		cr_expect_eq(pt_stats(&t).parked, 0, "%s: %" PRIu64 " bytes still parked", name,
			     pt_stats(&t).parked);
		cr_assert_geq(vpmm_pool_reclaim(t.pool), 0);
		cr_expect_eq(pt_stats(&t).live, u ? t.page : 0, "%s: the slab was not given back "
			     "(live %" PRIu64 ")", name, pt_stats(&t).live);
		PT_CHECK(&t);
		cr_expect_eq(pt_stats(&t).streams, 0, "%s: %" PRIu64 " stream records left", name,
			     pt_stats(&t).streams);
		if (u)
			PT_FREE(&t, keep, VPMM_NO_STREAM);
		pt_close(&t);
	}
}

/* The same end without a synchronisation (a context adopted while another
 * thread may still have work queued on its streams): what s freed is not
 * known done, and no stream may take it until an event says so. */
Test(gone, an_unsynchronised_context_end_settles_nothing)
{
	struct pt t;
	open_churn(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, b, s); /* its work still queued */
	vpmm_pool_drop_events(t.pool, NULL, false);
	CUstream x = vpmm_host_stream_create(t.drv);
	CUdeviceptr y = 0;
	int rc = vpmm_pool_malloc(t.pool, 4 * t.page, x, &y);
	cr_expect(rc != 0 || y + 4 * t.page <= b || y >= b + 4 * t.page,
		  "x got %#llx, inside s's free at %#llx while s's work ran",
		  (unsigned long long)y, (unsigned long long)b);
	if (rc == 0)
		PT_FREE(&t, y, x);
	vpmm_host_complete_all(t.drv);
	pt_close(&t);
}
