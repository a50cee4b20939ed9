/* test_small.c — requests under a page: carved in size classes from shared
 * pool pages, reused in stream order, returned to the pool when empty. */
#include <stdint.h>
#include <stdlib.h>

#include "pool_test.h"

#define PAGE (64 * PT_KiB)

static struct pt t;

static void open_small(void)
{
	struct pt_setup su = {.granularity = PAGE, .capacity = 256 * PAGE};
	pt_open(&t, &su);
	/* pt_open built the pool with small_max = 0; rebuild it with classes. */
	vpmm_pool_destroy(t.pool);
	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.page_size = PAGE;
	cfg.va_size = 1024 * PAGE;
	cfg.small_max = SIZE_MAX;
	cfg.front_entries = 0; /* the slabs' own rules, not the front's */
	cfg.event_interval_ns = 0;
	cr_assert_eq(vpmm_pool_create(&cfg, t.drv, &t.pool), 0);
}

static CUdeviceptr smalloc(size_t n, CUstream s)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t.pool, n, s, &p);
	cr_assert_eq(rc, 0, "malloc(%zu) = %d", n, rc);
	cr_assert_eq(p % 512, 0, "%#llx not 512-aligned", (unsigned long long)p);
	PT_CHECK(&t);
	return p;
}

static void sfree(CUdeviceptr p, CUstream s)
{
	int rc = vpmm_pool_free(t.pool, p, s);
	cr_assert_eq(rc, 0, "free(%#llx) = %d", (unsigned long long)p, rc);
	PT_CHECK(&t);
}

static int cmp_ptr(const void *a, const void *b)
{
	CUdeviceptr x = *(const CUdeviceptr *)a, y = *(const CUdeviceptr *)b;
	return x < y ? -1 : x > y;
}

TestSuite(small, .init = open_small, .fini = NULL);

Test(small, blocks_share_pages_without_overlap)
{
	enum { N = 100 };
	CUdeviceptr p[N];
	for (int i = 0; i < N; i++) {
		p[i] = smalloc(1000, 0);
		memset((void *)(uintptr_t)p[i], i, 1000);
	}
	struct vpmm_stats st = pt_stats(&t);
	/* 100 blocks of 1 KiB fit in two 64 KiB pages, not 100 pages. */
	cr_assert_leq(st.pages_created, 2, "%lu pages for 100 KiB of blocks",
		      (unsigned long)st.pages_created);
	qsort(p, N, sizeof p[0], cmp_ptr);
	for (int i = 1; i < N; i++)
		cr_assert_geq(p[i] - p[i - 1], 1000, "blocks overlap");
	for (int i = 0; i < N; i++) {
		CUdeviceptr base;
		size_t size;
		cr_assert_eq(vpmm_pool_find(t.pool, p[i] + 999, &base, &size), 0);
		cr_assert_eq(base, p[i], "find gives another block's base");
		cr_assert_geq(size, 1000);
		cr_assert_lt(size, 2000, "class of 1000 B is %zu", size);
	}
	pt_close(&t);
}

Test(small, data_survives_neighbours)
{
	CUdeviceptr a = smalloc(3000, 0), b = smalloc(3000, 0), c = smalloc(3000, 0);
	memset((void *)(uintptr_t)a, 0xa, 3000);
	memset((void *)(uintptr_t)c, 0xc, 3000);
	sfree(b, 0);
	CUdeviceptr d = smalloc(3000, 0);
	memset((void *)(uintptr_t)d, 0xd, 3000);
	for (int i = 0; i < 3000; i++) {
		cr_assert_eq(((unsigned char *)(uintptr_t)a)[i], 0xa);
		cr_assert_eq(((unsigned char *)(uintptr_t)c)[i], 0xc);
	}
	sfree(a, 0);
	sfree(c, 0);
	sfree(d, 0);
	pt_close(&t);
}

Test(small, same_stream_reuses_at_once)
{
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = smalloc(700, s);
	CUdeviceptr keep = smalloc(700, s); /* keeps the slab alive */
	sfree(a, s);
	CUdeviceptr b = smalloc(700, s);
	cr_assert_eq(b, a, "a block freed on its own stream was not reused");
	sfree(b, s);
	sfree(keep, s);
	pt_close(&t);
}

Test(small, other_stream_free_waits_for_its_event)
{
	CUstream s1 = vpmm_host_stream_create(t.drv), s2 = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = smalloc(2048, s1);
	CUdeviceptr keep = smalloc(2048, s1);
	sfree(a, s2); /* s2's work on `a` is still pending */
	enum { N = 40 };
	CUdeviceptr got[N];
	for (int i = 0; i < N; i++) {
		got[i] = smalloc(2048, s1);
		cr_assert_neq(got[i], a, "block reused before s2's work completed");
	}
	vpmm_host_stream_complete(t.drv, s2);
	bool again = false;
	CUdeviceptr more[N];
	for (int i = 0; i < N; i++) {
		more[i] = smalloc(2048, s1);
		again |= more[i] == a;
	}
	cr_assert(again, "block never reused after s2 completed");
	for (int i = 0; i < N; i++) {
		sfree(got[i], s1);
		sfree(more[i], s1);
	}
	sfree(keep, s1);
	vpmm_host_complete_all(t.drv);
	pt_close(&t);
}

Test(small, bad_frees_change_nothing)
{
	CUstream s2 = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = smalloc(5000, 0);
	CUdeviceptr b = smalloc(5000, 0);
	struct vpmm_stats before = pt_stats(&t);
	cr_assert_eq(vpmm_pool_free(t.pool, a + 512, 0), -EINVAL, "interior pointer");
	sfree(a, 0);
	cr_assert_eq(vpmm_pool_free(t.pool, a, 0), -EINVAL, "double free");
	sfree(b, s2);
	cr_assert_eq(vpmm_pool_free(t.pool, b, 0), -EINVAL,
		     "double free of a block waiting for another stream");
	struct vpmm_stats after = pt_stats(&t);
	cr_assert_eq(after.frees, before.frees + 2);
	PT_CHECK(&t);
	vpmm_host_complete_all(t.drv);
	pt_close(&t);
}

Test(small, empty_slabs_go_back_but_one)
{
	/* 6 KiB blocks: a class slab holds at least 8; take three slabs' worth. */
	enum { N = 30 };
	CUdeviceptr p[N];
	for (int i = 0; i < N; i++)
		p[i] = smalloc(6 * 1024, 0);
	struct vpmm_stats full = pt_stats(&t);
	for (int i = 0; i < N; i++)
		sfree(p[i], 0);
	struct vpmm_stats empty = pt_stats(&t);
	cr_assert_lt(empty.live, full.live, "no slab went back to the pool");
	cr_assert_gt(empty.live, 0, "the last slab of the class went back too");
	cr_assert_leq(empty.live, 2 * PAGE, "more than one slab kept: %lu bytes",
		      (unsigned long)empty.live);
	pt_close(&t);
}

Test(small, classes_cover_everything_under_a_page)
{
	for (size_t n = 1; n < PAGE; n += 997) {
		CUdeviceptr p = smalloc(n, 0);
		CUdeviceptr base;
		size_t size;
		cr_assert_eq(vpmm_pool_find(t.pool, p, &base, &size), 0);
		/* a block of a slab: the lock-free find tells the same */
		CUdeviceptr own_base;
		size_t own_size;
		cr_assert_eq(vpmm_pool_find_own(t.pool, p, &own_base, &own_size), 0);
		cr_assert_eq(own_base, base);
		cr_assert_eq(own_size, size);
		if (size > 1) /* inside the block: not its start */
			cr_assert_eq(vpmm_pool_find_own(t.pool, p + 1, NULL, NULL), -EINVAL);
		cr_assert_geq(size, n, "class %zu for %zu bytes", size, n);
		cr_assert_leq(size, n + n / 4 + 512, "class %zu wastes too much for %zu",
			      size, n);
		sfree(p, 0);
	}
	/* A page or more takes whole pages. */
	CUdeviceptr big = smalloc(PAGE, 0);
	cr_assert_eq(big % PAGE, 0);
	sfree(big, 0);
	pt_close(&t);
}

/* One small block of every class on each of `nstreams` streams, freed on
 * its stream; `complete`: each stream's work then completes, as a program's
 * streams do sooner or later. Returns the pool's peak of mapped bytes. */
static uint64_t peak_mapped_over_streams(unsigned nstreams, unsigned front, bool complete)
{
	struct pt u;
	struct pt_setup su = {.small_max = SIZE_MAX, .va_pages = 16384,
			      .front_entries = front};
	pt_open(&u, &su);
	for (unsigned i = 0; i < nstreams; i++) {
		CUstream s = vpmm_host_stream_create(u.drv);
		CUdeviceptr blk[128];
		unsigned n = 0;
		for (size_t want = 1; want < u.page && n < 128;) {
			size_t size = 0;
			cr_assert_eq(vpmm_pool_malloc(u.pool, want, s, &blk[n]), 0);
			cr_assert_eq(vpmm_pool_find(u.pool, blk[n], NULL, &size), 0);
			n++;
			want = size + 1; /* the next class */
		}
		PT_CHECK(&u);
		for (unsigned k = 0; k < n; k++)
			cr_assert_eq(vpmm_pool_free(u.pool, blk[k], s), 0);
		PT_CHECK(&u);
		if (complete)
			vpmm_host_stream_complete(u.drv, s);
	}
	uint64_t peak = pt_stats(&u).mapped_peak;
	vpmm_host_complete_all(u.drv);
	pt_close(&u);
	return peak;
}

/* The empty slab kept per class (so that a workload hovering around one
 * block does not take and give a slab at every call) must not add up over
 * streams: kept per class and stream, 64 streams mapped 64 times one
 * stream's slabs at peak. Two sets at most: the kept one and the one in use
 * while the next stream takes its blocks. */
static void assert_streams_do_not_add_up(unsigned front, bool complete)
{
	uint64_t one = peak_mapped_over_streams(1, front, complete);
	uint64_t four = peak_mapped_over_streams(4, front, complete);
	uint64_t many = peak_mapped_over_streams(64, front, complete);
	cr_log_info("front %u, complete %d: peak mapped %lu (1 stream), %lu (4), %lu (64)",
		    front, complete, (unsigned long)one, (unsigned long)four,
		    (unsigned long)many);
	cr_assert_leq(four, 2 * one, "4 streams: %lu bytes mapped at peak, one stream %lu",
		      (unsigned long)four, (unsigned long)one);
	cr_assert_leq(many, 2 * one, "64 streams: %lu bytes mapped at peak, one stream %lu",
		      (unsigned long)many, (unsigned long)one);
}

Test(small, empty_slabs_do_not_add_up_over_streams)
{
	pt_close(&t);
	assert_streams_do_not_add_up(0, true);
}

Test(small, empty_slabs_do_not_add_up_over_streams_pending)
{
	pt_close(&t);
	assert_streams_do_not_add_up(0, false);
}

Test(small, empty_slabs_do_not_add_up_over_streams_cached)
{
	pt_close(&t);
	assert_streams_do_not_add_up(16, false);
}
