/* test_racing.c — a program's double free racing the pool: one free takes
 * the locked path while another, of the same pointer, is stopped half way
 * through the lock-free one (front.c), between reading the allocation and
 * claiming it. Exactly one of the two may succeed, and the memory must be
 * freed once: before the claim was a CAS that the locked path also made,
 * the stopped free parked memory the pool had already freed, and the next
 * two mallocs got the same address.
 *
 * Built against the core with -DVPMM_TEST_HOOKS (allocator/meson.build):
 * the hook stops the racing thread at the named VPMM_TEST_POINT(). */
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <time.h>

#include "pool_test.h"
#include "vpi.h"

static __thread bool am_racer;
static const char *stop_at; /* set before the racer starts */
static sem_t at_point, go_on;

static void hook(const char *point)
{
	if (!am_racer || !stop_at || strcmp(point, stop_at) != 0)
		return;
	stop_at = NULL;
	sem_post(&at_point);
	sem_wait(&go_on);
}

struct racer {
	pthread_t th;
	vpmm_pool *pool;
	CUdeviceptr ptr;
	CUstream stream;
	int rc;
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;
	am_racer = true;
	r->rc = vpmm_pool_free(r->pool, r->ptr, r->stream);
	return NULL;
}

/* Starts a free of ptr on `stream` and returns once it is stopped at
 * `point`; fails the test if it never gets there (the test would then
 * prove nothing). */
static void race_start(struct racer *r, vpmm_pool *pool, CUdeviceptr ptr,
		       CUstream stream, const char *point)
{
	*r = (struct racer){.pool = pool, .ptr = ptr, .stream = stream, .rc = 1};
	cr_assert_eq(sem_init(&at_point, 0, 0), 0);
	cr_assert_eq(sem_init(&go_on, 0, 0), 0);
	stop_at = point;
	vpi_test_hook = hook;
	cr_assert_eq(pthread_create(&r->th, NULL, racer_main, r), 0);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	int rc;
	while ((rc = sem_timedwait(&at_point, &until)) != 0 && errno == EINTR)
		;
	cr_assert_eq(rc, 0, "the racing free never reached %s (it returned %d)", point,
		     r->rc);
}

static int race_finish(struct racer *r)
{
	sem_post(&go_on);
	pthread_join(r->th, NULL);
	vpi_test_hook = NULL;
	sem_destroy(&at_point);
	sem_destroy(&go_on);
	return r->rc;
}

/* One cache entry per stream. */
static void open_racing(struct pt *t, size_t small_max, size_t limit_pages, CUstream *s1,
			CUstream *s2)
{
	struct pt_setup su = {.va_pages = 256, .front_entries = 1, .small_max = small_max,
			      .limit_pages = limit_pages};
	pt_open(t, &su);
	*s1 = vpmm_host_stream_create(t->drv);
	*s2 = vpmm_host_stream_create(t->drv);
}

/* Takes s's one entry, so that s's next free goes the locked way. */
static void fill_cache(struct pt *t, CUstream s)
{
	CUdeviceptr filler = PT_MALLOC(t, 5, s);
	PT_FREE(t, filler, s);
	cr_assert_eq(pt_stats(t).parked, 5 * t->page, "s's one entry is not taken");
}

static CUdeviceptr malloc_small(struct pt *t, size_t bytes, CUstream s)
{
	CUdeviceptr p = 0;
	cr_assert_eq(vpmm_pool_malloc(t->pool, bytes, s, &p), 0);
	return p;
}

Test(racing, a_double_free_racing_the_locked_free_loses)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 0, 0, &s1, &s2);
	CUdeviceptr p = PT_MALLOC(&t, 1, s1);
	fill_cache(&t, s1);
	uint64_t frees = pt_stats(&t).frees;

	struct racer r;
	race_start(&r, t.pool, p, s2, "front_free:claim");
	cr_assert_eq(vpmm_pool_free(t.pool, p, s1), 0);
	cr_assert_eq(race_finish(&r), -EINVAL, "both frees of %#llx succeeded",
		     (unsigned long long)p);
	PT_CHECK(&t);

	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.frees, frees + 1);
	cr_assert_eq(st.live, 0, "live %zu after every allocation was freed", (size_t)st.live);
	cr_assert_eq(st.parked, 5 * t.page, "parked %zu: the racer parked freed memory",
		     (size_t)st.parked);
	/* Freed once, so handed out once. */
	CUdeviceptr a = PT_MALLOC(&t, 1, s2), b = PT_MALLOC(&t, 1, s2);
	cr_assert_neq(a, b);
	pt_close(&t);
}

/* The same with the racer first: it claims, the locked free loses. */
Test(racing, the_lock_free_claim_first_wins)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 0, 0, &s1, &s2);
	CUdeviceptr p = PT_MALLOC(&t, 1, s1);
	fill_cache(&t, s1);

	struct racer r;
	race_start(&r, t.pool, p, s2, "front_free:claim");
	cr_assert_eq(race_finish(&r), 0);
	cr_assert_eq(vpmm_pool_free(t.pool, p, s1), -EINVAL);
	PT_CHECK(&t);
	cr_assert_eq(pt_stats(&t).parked, 6 * t.page);
	cr_assert_eq(PT_MALLOC(&t, 1, s2), p, "s2's cache did not give p back");
	pt_close(&t);
}

/* A stopped free must not claim the region struct once the pool has made
 * it another allocation: the claim carries the times it became live. Here
 * p's free region absorbs its free left neighbour q, so p's struct then
 * starts at q, and the next malloc makes it live there. */
Test(racing, a_stale_free_cannot_claim_a_reused_region)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 0, 0, &s1, &s2);
	CUdeviceptr q = PT_MALLOC(&t, 1, s1);
	CUdeviceptr p = PT_MALLOC(&t, 1, s1);
	CUdeviceptr z = PT_MALLOC(&t, 1, s1);
	cr_assert(q + t.page == p && p + t.page == z, "not side by side");
	fill_cache(&t, s1);
	PT_FREE(&t, q, s1);

	struct racer r;
	race_start(&r, t.pool, p, s2, "front_free:claim");
	cr_assert_eq(vpmm_pool_free(t.pool, p, s1), 0);
	CUdeviceptr both = PT_MALLOC(&t, 2, s1);
	cr_assert_eq(both, q, "the two free pages were not taken together");
	int rc = race_finish(&r);
	PT_CHECK(&t);
	cr_assert_eq(rc, -EINVAL, "the stale free of %#llx returned %d",
		     (unsigned long long)p, rc);
	cr_assert_eq(pt_stats(&t).parked, 5 * t.page);
	cr_assert_eq(pt_stats(&t).live, 3 * t.page);
	pt_close(&t);
}

/* Blocks under a page: the park bit is the block's claim. */
Test(racing, a_double_free_of_a_block_racing_the_locked_free_loses)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 8 * PT_KiB, 0, &s1, &s2);
	CUdeviceptr keep = malloc_small(&t, 512, s1); /* the slab stays */
	CUdeviceptr p = malloc_small(&t, 512, s1);
	(void)keep;
	fill_cache(&t, s1);

	struct racer r;
	race_start(&r, t.pool, p, s2, "small_park:claim");
	cr_assert_eq(vpmm_pool_free(t.pool, p, s1), 0);
	cr_assert_eq(race_finish(&r), -EINVAL, "both frees of block %#llx succeeded",
		     (unsigned long long)p);
	PT_CHECK(&t);
	CUdeviceptr a = malloc_small(&t, 512, s2), b = malloc_small(&t, 512, s2);
	cr_assert_neq(a, b);
	pt_close(&t);
}

/* The same, with the block's slab given back to the pool before the stopped
 * free goes on: it must not touch a slab that is gone (AddressSanitizer
 * sees a use after free if it does). The pool may hold 6 pages: the slab
 * and the cache's 5; a malloc of 6 takes the slab back, as the last
 * resort before failing. */
Test(racing, a_stopped_free_outlives_its_slab)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 8 * PT_KiB, 6, &s1, &s2);
	/* p is not the slab's first block, so the 6 pages below do not start
	 * at p: a stale free of an address handed out again frees the new
	 * owner's memory, as with any allocator. */
	CUdeviceptr first = malloc_small(&t, 512, s1), p = malloc_small(&t, 512, s1);
	cr_assert_eq(pt_stats(&t).live, t.page, "not one slab of one page");
	fill_cache(&t, s1);
	cr_assert_eq(vpmm_pool_free(t.pool, first, s1), 0);

	struct racer r;
	race_start(&r, t.pool, p, s2, "small_park:claim");
	cr_assert_eq(vpmm_pool_free(t.pool, p, s1), 0);
	CUdeviceptr all = PT_MALLOC(&t, 6, s1);
	cr_assert_eq(pt_stats(&t).live, 6 * t.page, "the slab was not given back");
	/* A new slab of the class fails at the limit: its struct (the old
	 * one's) must stay, not be freed (review). */
	CUdeviceptr none = 0;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 512, s1, &none), -ENOMEM);
	cr_assert_eq(race_finish(&r), -EINVAL);
	PT_CHECK(&t);
	PT_FREE(&t, all, s1);
	pt_close(&t);
}

/* A free on s2 of a block of s1's slab, stopped once it holds the block,
 * while s1 is destroyed: the destroy takes the blocks of s1's slabs out of
 * every cache, and this one is not in s2's yet. The free must not park it
 * afterwards, or it keeps the slab and s1's record until s2's cache is
 * flushed; it reads s1 dead under the cache's lock and frees the block
 * under the pool's. */
Test(racing, a_block_freed_while_its_slabs_stream_goes_is_not_parked)
{
	struct pt t;
	CUstream s1, s2;
	open_racing(&t, 8 * PT_KiB, 0, &s1, &s2);
	CUdeviceptr keep = PT_MALLOC(&t, 1, s2); /* s2's record; its one entry free */
	CUdeviceptr p = malloc_small(&t, 512, s1);

	struct racer r;
	race_start(&r, t.pool, p, s2, "front_free:parked");
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s1), 0);
	vpmm_host_stream_destroy(t.drv, s1);
	cr_assert_eq(race_finish(&r), 0);
	cr_expect_eq(pt_stats(&t).parked, 0, "%" PRIu64 " bytes parked", pt_stats(&t).parked);
	vpmm_host_complete_all(t.drv);
	cr_assert_geq(vpmm_pool_poll(t.pool, false), 0);
	PT_CHECK(&t);
	cr_expect_eq(pt_stats(&t).streams, 1, "%" PRIu64 " stream records left, s2's only",
		     pt_stats(&t).streams);
	PT_FREE(&t, keep, s2);
	pt_close(&t);
}
