/* test_split.c — where the free memory lies (the snapshot's free_split):
 * free bytes in wholly free handles, which a defragmentation can move, and
 * free bytes stranded in handles that also hold live memory; zombies,
 * parked allocations and every VA chunk. Handles of one page, a grain of a
 * quarter page. */
#include "pool_test.h"
#include "snapshot.h"

static void open_split(struct pt *t)
{
	struct pt_setup su = {.grain = 16 * PT_KiB, .va_pages = 256};
	pt_open(t, &su);
	cr_assert_eq(t->page, 64 * PT_KiB, "the host driver's page is %zu", t->page);
}

/* A malloc placed at a grain, not a page: PT_MALLOC_BYTES asks for pages. */
static CUdeviceptr gmalloc(struct pt *t, size_t bytes, CUstream s)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, bytes, s, &p);
	cr_assert_eq(rc, 0, "malloc(%zu) = %d", bytes, rc);
	cr_assert_eq(p % (16 * PT_KiB), 0, "%#llx not at a grain", (unsigned long long)p);
	PT_CHECK(t);
	return p;
}

static struct vpmm_free_split split_of(struct pt *t)
{
	struct vpmm_snapshot sn;
	cr_assert_eq(vpmm_pool_snapshot(t->pool, &sn), 0);
	struct vpmm_free_split f = sn.free_split;
	vpmm_snapshot_free(&sn);
	return f;
}

/* No free memory anywhere: every field of the split is 0. */
static void assert_nothing_free(struct pt *t, struct vpmm_free_split f)
{
	cr_assert(!f.whole && !f.whole_handles && !f.stranded && !f.stranded_handles &&
			  !f.largest,
		  "whole %llu in %llu, stranded %llu in %llu, largest %llu (%s)",
		  (unsigned long long)f.whole, (unsigned long long)f.whole_handles,
		  (unsigned long long)f.stranded, (unsigned long long)f.stranded_handles,
		  (unsigned long long)f.largest, pt_layout(t));
}

/* The free regions' sum and the largest one, from the region list. */
static size_t free_regions(struct pt *t, size_t *largest, size_t *count)
{
	struct vpmm_region_info reg[64];
	size_t n = vpmm_pool_regions(t->pool, reg, 64), sum = 0;
	cr_assert_leq(n, 64);
	*largest = *count = 0;
	for (size_t i = 0; i < n; i++)
		if (reg[i].kind == VPMM_REGION_FREE) {
			sum += reg[i].size;
			++*count;
			if (reg[i].size > *largest)
				*largest = reg[i].size;
		}
	return sum;
}

/* An allocation ending a quarter into a page strands the rest of that
 * page's handle; every other free page is a whole handle. */
Test(split, a_partly_live_handle_strands_its_free_part)
{
	struct pt t;
	open_split(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, 3 * t.page + 16 * PT_KiB, s);
	struct vpmm_free_split f = split_of(&t);
	struct vpmm_stats st = pt_stats(&t);
	size_t largest, nfree, sum = free_regions(&t, &largest, &nfree);
	cr_assert_eq(sum, st.reusable);
	cr_assert_eq(f.stranded, 48 * PT_KiB, "stranded %llu", (unsigned long long)f.stranded);
	cr_assert_eq(f.stranded_handles, 1);
	cr_assert_eq(f.whole, st.reusable - 48 * PT_KiB, "whole %llu of %llu free",
		     (unsigned long long)f.whole, (unsigned long long)st.reusable);
	cr_assert_eq(f.whole_handles, f.whole / t.page);
	cr_assert_eq(f.largest, largest);

	/* A request that fits the stranded part takes it: nothing stranded. */
	CUdeviceptr b = gmalloc(&t, 48 * PT_KiB, s);
	cr_assert_eq(b, a + 3 * t.page + 16 * PT_KiB, "b at %+lld from a",
		     (long long)(b - a));
	f = split_of(&t);
	cr_assert_eq(f.stranded, 0);
	cr_assert_eq(f.stranded_handles, 0);
	cr_assert_eq(f.whole, pt_stats(&t).reusable);

	/* b freed: its bytes are stranded beside a's last grain again. */
	PT_FREE(&t, b, s);
	f = split_of(&t);
	cr_assert_eq(f.stranded, 48 * PT_KiB);
	cr_assert_eq(f.stranded_handles, 1);
	PT_FREE(&t, a, s);
	f = split_of(&t);
	cr_assert_eq(f.stranded, 0);
	cr_assert_eq(f.whole, pt_stats(&t).reusable);
	cr_assert_eq(f.whole_handles, f.whole / t.page);
	pt_settle(&t);
	pt_close(&t);
}

/* A handle freed in two pieces on two streams lies under two free regions
 * that do not merge while their work is pending: it is wholly free all the
 * same. */
Test(split, a_handle_under_two_free_regions_is_whole)
{
	struct pt t;
	open_split(&t);
	CUstream s1 = vpmm_host_stream_create(t.drv), s2 = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, t.page + 32 * PT_KiB, s1);
	CUdeviceptr b = gmalloc(&t, 32 * PT_KiB, s2);
	cr_assert_eq(b, a + t.page + 32 * PT_KiB, "b at %+lld from a", (long long)(b - a));
	PT_FREE(&t, a, s1);
	PT_FREE(&t, b, s2);
	size_t largest, nfree, sum = free_regions(&t, &largest, &nfree);
	cr_assert_geq(nfree, 2, "the two frees merged: the case is not made");
	struct vpmm_free_split f = split_of(&t);
	cr_assert_eq(f.stranded, 0, "stranded %llu in %llu handles",
		     (unsigned long long)f.stranded, (unsigned long long)f.stranded_handles);
	cr_assert_eq(f.whole, sum);
	cr_assert_eq(f.whole_handles, sum / t.page);
	cr_assert_eq(f.largest, largest);
	pt_settle(&t);
	pt_close(&t);
}

/* An empty pool, and one whose memory is all live: nothing free. */
Test(split, nothing_free)
{
	struct pt t;
	open_split(&t);
	size_t largest, nfree, sum = free_regions(&t, &largest, &nfree);
	cr_assert(pt_stats(&t).mapped == 0 && nfree == 0, "the pool is not empty");
	assert_nothing_free(&t, split_of(&t));
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s);
	sum = free_regions(&t, &largest, &nfree);
	cr_assert(sum == 0 && nfree == 0 && pt_stats(&t).reusable == 0,
		  "%zu bytes free in %zu regions: the case is not made", sum, nfree);
	assert_nothing_free(&t, split_of(&t));
	PT_FREE(&t, a, s);
	pt_settle(&t);
	pt_close(&t);
}

/* A zombie is mapped but not free: [~2][1][3] holds nothing free, though
 * the 2 pages' handles are mapped twice (at their old address and in the
 * 3). Freed, the 3 are three wholly free handles, each counted once. */
Test(split, a_zombie_is_not_free)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr old = PT_MALLOC(&t, 2, s);
	CUdeviceptr guard = PT_MALLOC(&t, 1, s);
	PT_FREE(&t, old, s);
	CUdeviceptr q = PT_MALLOC(&t, 3, s);
	PT_LAYOUT_IS(&t, "[~2][1][3][*58]");
	assert_nothing_free(&t, split_of(&t));
	PT_FREE(&t, q, s);
	PT_LAYOUT_IS(&t, "[~2][1][-3][*58]");
	struct vpmm_free_split f = split_of(&t);
	cr_assert_eq(f.whole, 3 * t.page, "whole %llu", (unsigned long long)f.whole);
	cr_assert_eq(f.whole_handles, 3);
	cr_assert_eq(f.stranded, 0);
	cr_assert_eq(f.largest, 3 * t.page);
	PT_FREE(&t, guard, s);
	pt_settle(&t);
	pt_close(&t);
}

/* An allocation parked in its stream's cache is live to the pool's
 * structures but free to the program: it counts where it lies. The pool
 * maps the 3 pages a and b need: a ends a quarter into its last page,
 * beside b, which leaves 32 KiB free there and nothing else. Parked, a is
 * the largest free region (2 pages and a grain); its 2 whole pages are
 * wholly free and its last grain joins the 32 KiB: 48 KiB stranded. */
Test(split, a_parked_allocation_counts_where_it_lies)
{
	struct pt t;
	struct pt_setup su = {.grain = 16 * PT_KiB, .va_pages = 256, .front_entries = 4};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, 2 * t.page + 16 * PT_KiB, s);
	CUdeviceptr b = gmalloc(&t, 16 * PT_KiB, s);
	cr_assert_eq(b, a + 2 * t.page + 16 * PT_KiB, "b at %+lld from a", (long long)(b - a));
	struct vpmm_free_split f = split_of(&t);
	cr_assert(f.stranded == 32 * PT_KiB && f.stranded_handles == 1 && !f.whole &&
		  !f.whole_handles && f.largest == 32 * PT_KiB, "whole %llu, stranded %llu (%s)",
		  (unsigned long long)f.whole, (unsigned long long)f.stranded, pt_layout(&t));
	cr_assert_eq(vpmm_pool_free(t.pool, a, s), 0);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.parked, 2 * t.page + 16 * PT_KiB, "a not parked: %llu",
		     (unsigned long long)st.parked);
	cr_assert_eq(st.reusable, 2 * t.page + 48 * PT_KiB);
	f = split_of(&t);
	cr_assert_eq(f.whole, 2 * t.page, "whole %llu", (unsigned long long)f.whole);
	cr_assert_eq(f.whole_handles, 2);
	cr_assert_eq(f.stranded, 48 * PT_KiB, "stranded %llu", (unsigned long long)f.stranded);
	cr_assert_eq(f.stranded_handles, 1);
	cr_assert_eq(f.largest, 2 * t.page + 16 * PT_KiB, "largest %llu",
		     (unsigned long long)f.largest);
	PT_FREE(&t, b, s);
	pt_settle(&t);
	pt_close(&t);
}

/* Two VA chunks of 8 pages: a fills 6 of the first, b (5 pages and a
 * grain, 6 pages mapped) needs a second. With a freed, its 6 handles in
 * chunk 0 are wholly free and the largest region, and b's last page
 * strands 48 KiB in chunk 1: 6 pages and 48 KiB free, all counted. */
Test(split, every_chunk_counts)
{
	struct pt t;
	struct pt_setup su = {.grain = 16 * PT_KiB, .va_pages = 8};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, 6 * t.page, s);
	CUdeviceptr b = gmalloc(&t, 5 * t.page + 16 * PT_KiB, s);
	PT_FREE(&t, a, s);
	struct vpmm_snapshot sn;
	cr_assert_eq(vpmm_pool_snapshot(t.pool, &sn), 0);
	size_t nchunks = sn.nchunks;
	unsigned ca = 9, cb = 9; /* the chunks of a and b */
	for (size_t i = 0; i < sn.nregions; i++)
		if (sn.regions[i].va == a)
			ca = sn.regions[i].chunk;
		else if (sn.regions[i].va == b)
			cb = sn.regions[i].chunk;
	vpmm_snapshot_free(&sn);
	cr_assert(nchunks == 2 && ca == 0 && cb == 1,
		  "%zu chunks, a in %u, b in %u: the case is not made (%s)", nchunks, ca, cb,
		  pt_layout(&t));
	cr_assert_eq(pt_stats(&t).reusable, 6 * t.page + 48 * PT_KiB, "(%s)", pt_layout(&t));
	struct vpmm_free_split f = split_of(&t);
	cr_assert_eq(f.stranded, 48 * PT_KiB, "stranded %llu (%s)",
		     (unsigned long long)f.stranded, pt_layout(&t));
	cr_assert_eq(f.stranded_handles, 1);
	cr_assert_eq(f.whole, 6 * t.page, "whole %llu", (unsigned long long)f.whole);
	cr_assert_eq(f.whole_handles, 6);
	cr_assert_eq(f.largest, 6 * t.page);
	PT_FREE(&t, b, s);
	pt_settle(&t);
	pt_close(&t);
}
