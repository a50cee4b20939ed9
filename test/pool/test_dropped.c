/* test_dropped.c — what the pool holds for a request while its lock is
 * dropped for driver work: other threads run meanwhile (here: a trim, made
 * from inside the request's own map through the host driver's hook), and
 * the request must find after the drop what it reserved before it. */
#include "pool_test.h"

#define N 32 /* free regions of one whole page each, between live ones */

static vpmm_pool *hook_pool;
static unsigned hook_runs;

static CUdeviceptr grains(struct pt *t, size_t n)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, n * (t->page / 4), VPMM_NO_STREAM, &p);
	cr_assert_eq(rc, 0, "malloc of %zu grains: %d (layout %s)", n, rc, pt_layout(t));
	PT_CHECK(t);
	return p;
}

/* Inside the caller's first map: the program's other thread trims. */
static void trim_in_map(void *arg, enum vpmm_op op)
{
	(void)arg;
	if (op != VPMM_OP_MAP || hook_runs++)
		return;
	vpmm_pool_trim(hook_pool, 0);
}

/* Pages of 4 grains, handles of one page. The pool grows page by page, a
 * request starting in the free tail of the page before when that spares a
 * page: a takes grains [0, 2), then per i c [2, 8), d [8, 9), e [9, 14)
 * (+ 12 i), and f the last page's tail. Freed, each c and d leave 7 free
 * grains from the middle of a page to a grain into the second next: one
 * whole page with parts of pages on both sides, so that a trim splits two
 * pieces off each and frees no struct when it commits. A request of 10
 * grains fits none of them and takes three of their pages; the trim, inside
 * its map, unmaps the others. */
Test(dropped, a_trim_while_a_defragmentation_maps)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 4096, .grain = 16 * PT_KiB, .handle_pages = 1,
			      .unit = 16 * PT_KiB};
	pt_open(&t, &su);
	size_t g = t.page / 4;
	CUdeviceptr a = grains(&t, 2), c[N], d[N], e[N];
	for (int i = 0; i < N; i++) {
		c[i] = grains(&t, 6);
		d[i] = grains(&t, 1);
		e[i] = grains(&t, 5);
		cr_assert(c[i] == a + (2 + 12 * (CUdeviceptr)i) * g && d[i] == c[i] + 6 * g &&
			  e[i] == d[i] + g, "%d out of place: layout %s", i, pt_layout(&t));
	}
	CUdeviceptr f = grains(&t, 2);
	for (int i = 0; i < N; i++) {
		PT_FREE(&t, c[i], VPMM_NO_STREAM);
		PT_FREE(&t, d[i], VPMM_NO_STREAM);
	}
	hook_pool = t.pool;
	vpmm_host_set_hook(t.drv, trim_in_map, NULL);
	CUdeviceptr big = grains(&t, 10);
	vpmm_host_set_hook(t.drv, NULL, NULL);
	cr_assert_gt(hook_runs, 0, "the request never mapped");
	cr_assert_eq(pt_stats(&t).pages_released, N - 3, "the trim meant to release the "
		     "other free regions' pages (layout %s)", pt_layout(&t));
	PT_FREE(&t, big, VPMM_NO_STREAM);
	for (int i = 0; i < N; i++)
		PT_FREE(&t, e[i], VPMM_NO_STREAM);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	PT_FREE(&t, f, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

/* The device's free bytes, as the pool tracks them between reads
 * (growth.c), lose what each growth creates, once: a growth that commits
 * while another request has the lock dropped is that one's to count, not
 * the other's too. */
static CUdeviceptr grown_in_map;
static bool growing_in_map;

static void grow_in_map(void *arg, enum vpmm_op op)
{
	struct pt *t = arg;
	if (op != VPMM_OP_MAP || growing_in_map) /* once; not in its own map */
		return;
	growing_in_map = true;
	int rc = vpmm_pool_malloc(t->pool, 64 * t->page, VPMM_NO_STREAM, &grown_in_map);
	cr_assert_eq(rc, 0, "the growth inside the map: %d (CUresult %d)", rc,
		     (int)vpmm_pool_last_result(t->pool));
}

Test(dropped, a_growth_while_another_maps_is_counted_once)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 8192, .capacity = 4096 * 64 * PT_KiB,
			      .handle_pages = 1024, .remap = VPMM_REMAP_PRESSURE};
	pt_open(&t, &su);
	CUdeviceptr a = PT_MALLOC(&t, 8, VPMM_NO_STREAM); /* reads the device */
	vpmm_host_set_hook(t.drv, grow_in_map, &t);
	CUdeviceptr b = PT_MALLOC(&t, 8, VPMM_NO_STREAM);
	vpmm_host_set_hook(t.drv, NULL, NULL);
	cr_assert_neq(grown_in_map, 0, "nothing grew inside the map");
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr c = PT_MALLOC(&t, 8, VPMM_NO_STREAM);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.room_growths, s0.room_growths + 1, "the test meant a growth for room");
	cr_assert_eq(s1.headroom, 4096 * t.page - s0.mapped,
		     "headroom %llu pages, the device has %llu free",
		     (unsigned long long)(s1.headroom / t.page),
		     (unsigned long long)(4096 - s0.mapped / t.page));
	PT_FREE(&t, a, VPMM_NO_STREAM);
	PT_FREE(&t, b, VPMM_NO_STREAM);
	PT_FREE(&t, c, VPMM_NO_STREAM);
	PT_FREE(&t, grown_in_map, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}
