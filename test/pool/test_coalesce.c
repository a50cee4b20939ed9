/* test_coalesce.c — freed neighbours merge: in every order on one stream,
 * settled memory with any free neighbour, and regions of two streams only
 * once the pool has seen both streams' work complete. */
#include "pool_test.h"

static void open_small(struct pt *t, size_t initial)
{
	struct pt_setup su = { .va_pages = 64, .initial_pages = initial };
	pt_open(t, &su);
}

/* The layout expected when the blocks flagged in `freed` are free (runs of
 * freed blocks merge), followed by the rest of the chunk as a hole. */
static const char *expect(char *buf, size_t n, const size_t *pages,
			  const bool *freed, int nblocks, size_t hole)
{
	size_t len = 0, run = 0;
	buf[0] = 0;
	for (int i = 0; i < nblocks; i++) {
		if (freed[i]) {
			run += pages[i];
			continue;
		}
		if (run)
			len += (size_t)snprintf(buf + len, n - len, "[-%zu]", run);
		run = 0;
		len += (size_t)snprintf(buf + len, n - len, "[%zu]", pages[i]);
	}
	if (run)
		len += (size_t)snprintf(buf + len, n - len, "[-%zu]", run);
	snprintf(buf + len, n - len, "[*%zu]", hole);
	return buf;
}

/* Four adjacent allocations freed in all 24 orders on one stream: after each
 * step every run of freed blocks is one region; at the end one region. */
Test(coalesce, every_free_order_merges_into_one_region)
{
	static const size_t pages[4] = { 2, 3, 4, 1 };
	int perm[4] = { 0, 1, 2, 3 };
	char want[256];
	int orders = 0;
	for (;;) {
		struct pt t;
		open_small(&t, 0);
		CUstream s = vpmm_host_stream_create(t.drv);
		CUdeviceptr p[4];
		for (int i = 0; i < 4; i++)
			p[i] = PT_MALLOC(&t, pages[i], s);
		bool freed[4] = { false, false, false, false };
		PT_LAYOUT_IS(&t, expect(want, sizeof want, pages, freed, 4, 54));
		for (int k = 0; k < 4; k++) {
			PT_FREE(&t, p[perm[k]], s);
			freed[perm[k]] = true;
			PT_LAYOUT_IS(&t, expect(want, sizeof want, pages, freed, 4, 54));
		}
		cr_assert_eq(vpmm_pool_regions(t.pool, NULL, 0), 2,
			     "order %d%d%d%d: not one free region + hole",
			     perm[0], perm[1], perm[2], perm[3]);
		struct vpmm_stats st = pt_stats(&t);
		cr_assert_eq(st.reusable, 10 * t.page);
		cr_assert_eq(st.live, 0);
		/* The merged region serves an allocation of all of it in place. */
		CUdeviceptr all = PT_MALLOC(&t, 10, s);
		cr_assert_eq(all, p[0]);
		cr_assert_eq(pt_stats(&t).pages_created, st.pages_created);
		pt_close(&t);
		orders++;

		/* next permutation */
		int i = 2;
		while (i >= 0 && perm[i] > perm[i + 1])
			i--;
		if (i < 0)
			break;
		int j = 3;
		while (perm[j] < perm[i])
			j--;
		int tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
		for (int a = i + 1, b = 3; a < b; a++, b--) {
			tmp = perm[a]; perm[a] = perm[b]; perm[b] = tmp;
		}
	}
	cr_assert_eq(orders, 24);
}

/* A free next to the settled initial pages merges with them. */
Test(coalesce, free_merges_with_settled_neighbour)
{
	struct pt t;
	open_small(&t, 10);
	CUstream s = vpmm_host_stream_create(t.drv);
	PT_LAYOUT_IS(&t, "[-10][*54]");
	CUdeviceptr p = PT_MALLOC(&t, 4, s);
	PT_LAYOUT_IS(&t, "[4][-6][*54]");
	PT_FREE(&t, p, s);
	PT_LAYOUT_IS(&t, "[-10][*54]");
	pt_close(&t);
}

/* Settled memory merges with a free neighbour of any stream, but two pending
 * regions of different streams stay apart. */
Test(coalesce, settled_merges_with_any_stream_pending_do_not)
{
	struct pt t;
	open_small(&t, 12);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr x = PT_MALLOC(&t, 4, a);
	CUdeviceptr y = PT_MALLOC(&t, 4, a);
	PT_LAYOUT_IS(&t, "[4][4][-4][*52]");
	PT_FREE(&t, x, a);
	PT_LAYOUT_IS(&t, "[-4][4][-4][*52]");
	/* y: its right neighbour is settled (merge), its left one is stream a's
	 * and pending (no merge with a region freed on b). */
	PT_FREE(&t, y, b);
	PT_LAYOUT_IS(&t, "[-4][-8][*52]");
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, x, &r));
	cr_assert_eq(r.kind, VPMM_REGION_FREE);
	cr_assert_eq(r.stream, a);
	cr_assert_not(r.settled, "a region whose event is pending is settled");
	pt_close(&t);
}

/* Regions of two streams side by side stay separate while pending, and are
 * one region once both streams completed and the pool looked at them. */
Test(coalesce, two_streams_merge_after_both_complete)
{
	struct pt t;
	open_small(&t, 0);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUstream c = vpmm_host_stream_create(t.drv);
	CUdeviceptr x = PT_MALLOC(&t, 2, a);
	CUdeviceptr y = PT_MALLOC(&t, 3, b);
	CUdeviceptr g = PT_MALLOC(&t, 1, a);
	PT_FREE(&t, x, a);
	PT_FREE(&t, y, b);
	PT_LAYOUT_IS(&t, "[-2][-3][1][*58]");
	vpmm_host_complete_all(t.drv);
	/* Stream c must look at the others' regions (it has none) and finds both
	 * complete: the smallest, x's, becomes settled and merges with y's. */
	struct vpmm_stats before = pt_stats(&t);
	CUdeviceptr w = PT_MALLOC(&t, 1, c);
	cr_assert_eq(w, x, "phase 1 did not take the smallest completed region");
	PT_LAYOUT_IS(&t, "[1][-4][1][*58]");
	cr_assert_eq(pt_stats(&t).pages_created, before.pages_created);
	cr_assert_eq(pt_stats(&t).pages_remapped, before.pages_remapped);
	PT_FREE(&t, w, c);
	PT_FREE(&t, g, a);
	pt_close(&t);
}

/* A free between two free regions of its stream joins both. */
Test(coalesce, free_between_two_free_regions_joins_all_three)
{
	struct pt t;
	open_small(&t, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[5];
	for (int i = 0; i < 5; i++)
		p[i] = PT_MALLOC(&t, 1 + (size_t)i, s);
	PT_LAYOUT_IS(&t, "[1][2][3][4][5][*49]");
	PT_FREE(&t, p[1], s);
	PT_FREE(&t, p[3], s);
	PT_LAYOUT_IS(&t, "[1][-2][3][-4][5][*49]");
	PT_FREE(&t, p[2], s);
	PT_LAYOUT_IS(&t, "[1][-9][5][*49]");
	cr_assert_eq(vpmm_pool_regions(t.pool, NULL, 0), 4);
	pt_close(&t);
}
