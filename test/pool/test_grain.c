/* test_grain.c — allocations rounded to a grain under the page: neighbours
 * share a page's tail, and a page moves only once no live byte is in it. */
#include "pool_test.h"

#define PAGE (2 * PT_MiB)
#define GRAIN (64 * PT_KiB)

static void open_grain_front(struct pt *t, unsigned front_entries)
{
	struct pt_setup su = {.granularity = PAGE, .unbacked = true, .va_pages = 64,
			      .grain = GRAIN, .unit = GRAIN, .front_entries = front_entries};
	pt_open(t, &su);
}

static void open_grain(struct pt *t)
{
	open_grain_front(t, 0);
}

static CUdeviceptr gmalloc(struct pt *t, size_t n, CUstream s)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, n, s, &p);
	cr_assert_eq(rc, 0, "malloc(%zu) = %d", n, rc);
	cr_assert_eq(p % GRAIN, 0, "%#llx not grain-aligned", (unsigned long long)p);
	PT_CHECK(t);
	return p;
}

Test(grain, neighbours_share_pages)
{
	struct pt t;
	open_grain(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	/* 3 MiB + 1 byte rounds to 3 MiB + 64 KiB, not to 4 MiB. */
	CUdeviceptr a = gmalloc(&t, 3 * PT_MiB + 1, s);
	/* b takes the rest of a's last page and one more page, not two. (A
	 * request that the rest of the page would spare no page starts on a
	 * page boundary: the next test.) */
	CUdeviceptr b = gmalloc(&t, 2 * PT_MiB + 1, s);
	cr_assert_eq(b, a + 3 * PT_MiB + GRAIN, "b does not follow a at the grain");
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.live, 5 * PT_MiB + 2 * GRAIN);
	/* a's last page is shared with b, so together they need 3 pages. */
	cr_assert_eq(st.mapped, 3 * PAGE, "mapped %lu", (unsigned long)st.mapped);
	CUdeviceptr base;
	size_t size;
	cr_assert_eq(vpmm_pool_find(t.pool, b + 5, &base, &size), 0);
	cr_assert_eq(base, b);
	cr_assert_eq(size, 2 * PT_MiB + GRAIN);
	PT_FREE(&t, a, s);
	PT_FREE(&t, b, s);
	PT_LAYOUT_IS(&t, "[-96][*1952]"); /* 64 KiB units: 3 pages, 61 */
	pt_close(&t);
}

/* Without the lock, for the owner of an allocation's start: the answer
 * vpmm_pool_find gives; nothing for a pointer inside it, nor once it is
 * freed (parked in its stream's cache, or given back). */
Test(grain, the_owner_finds_its_allocation_without_the_lock)
{
	struct pt t;
	open_grain_front(&t, 4);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, 3 * PT_MiB + 1, s);
	CUdeviceptr b = gmalloc(&t, 2 * PT_MiB + 1, s);
	CUdeviceptr base = 0, base2 = 0;
	size_t size = 0, size2 = 0;
	for (int i = 0; i < 2; i++) {
		CUdeviceptr p = i ? b : a;
		cr_assert_eq(vpmm_pool_find_own(t.pool, p, &base, &size), 0);
		cr_assert_eq(vpmm_pool_find(t.pool, p, &base2, &size2), 0);
		cr_assert_eq(base, p);
		cr_assert_eq(base2, p);
		cr_assert_eq(size, size2);
	}
	cr_assert_eq(size, 2 * PT_MiB + GRAIN);
	cr_assert_eq(vpmm_pool_find_own(t.pool, b + GRAIN, &base, &size), -EINVAL);
	cr_assert_eq(vpmm_pool_find_own(NULL, b, &base, &size), -EINVAL);
	PT_FREE(&t, a, s);
	cr_assert_eq(vpmm_pool_find_own(t.pool, a, &base, &size), -EINVAL);
	PT_FREE(&t, b, s);
	cr_assert_eq(vpmm_pool_find_own(t.pool, b, &base, &size), -EINVAL);
	pt_close(&t);
}

/* The rest of a's last page (960 KiB) would not spare b a page: b starts
 * on the next page, and the two still need 4 pages. */
Test(grain, a_rest_that_spares_no_page_is_not_shared)
{
	struct pt t;
	open_grain(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = gmalloc(&t, 3 * PT_MiB + 1, s);
	CUdeviceptr b = gmalloc(&t, 3 * PT_MiB + 1, s);
	cr_assert_eq(b, a + 2 * PAGE, "b at +%llu KiB, not on the next page",
		     (unsigned long long)((b - a) >> 10));
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.mapped, 4 * PAGE, "mapped %lu", (unsigned long)st.mapped);
	pt_close(&t);
}

Test(grain, a_shared_page_moves_only_when_free)
{
	struct pt t;
	open_grain(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	/* [x: 1.5 pages][y: 0.5 page][z: 2 pages] */
	CUdeviceptr x = gmalloc(&t, 3 * PT_MiB, s);
	CUdeviceptr y = gmalloc(&t, 1 * PT_MiB, s);
	CUdeviceptr z = gmalloc(&t, 4 * PT_MiB, s);
	(void)z;
	struct vpmm_stats s0 = pt_stats(&t);
	cr_assert_eq(s0.mapped, 4 * PAGE);
	/* Freeing x leaves its second page shared with live y: only the first
	 * page may move, so 3 MiB more needs a new page too. */
	PT_FREE(&t, x, s);
	CUdeviceptr w = gmalloc(&t, 4 * PT_MiB, s);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 1,
		     "a page holding live bytes of y was moved");
	cr_assert_eq(s1.pages_created - s0.pages_created, 1);
	/* With y gone too, the whole of x's old second page is free: the next
	 * request can take it. */
	PT_FREE(&t, y, s);
	pt_settle(&t);
	struct vpmm_stats s2 = pt_stats(&t);
	CUdeviceptr v = gmalloc(&t, 2 * PT_MiB, s);
	struct vpmm_stats s3 = pt_stats(&t);
	cr_assert_eq(s3.pages_created, s2.pages_created, "a free page was not reused");
	PT_FREE(&t, v, s);
	PT_FREE(&t, w, s);
	PT_FREE(&t, z, s);
	pt_settle(&t);
	pt_close(&t);
}

Test(grain, holes_stay_page_aligned)
{
	struct pt t;
	open_grain(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[12];
	for (int i = 0; i < 12; i++)
		p[i] = gmalloc(&t, (size_t)(i % 3 + 1) * 700 * PT_KiB + PT_MiB, s);
	for (int i = 0; i < 12; i += 2)
		PT_FREE(&t, p[i], s);
	CUdeviceptr big = gmalloc(&t, 9 * PT_MiB, s); /* defragments */
	pt_settle(&t);
	struct vpmm_region_info r[256];
	size_t n = vpmm_pool_regions(t.pool, r, 256);
	for (size_t i = 0; i < n && i < 256; i++)
		if (r[i].kind == VPMM_REGION_HOLE || r[i].kind == VPMM_REGION_ZOMBIE) {
			cr_assert_eq((r[i].va - r[0].va) % PAGE, 0, "hole at %#llx",
				     (unsigned long long)r[i].va);
			cr_assert_eq(r[i].size % PAGE, 0);
		}
	PT_FREE(&t, big, s);
	for (int i = 1; i < 12; i += 2)
		PT_FREE(&t, p[i], s);
	pt_settle(&t);
	pt_close(&t);
}

/* A page of three grains (192 KiB, set through the API, which allows any
 * multiple of the granularity): the home map and the rounding to pages
 * divide where a power of two would shift (pool.h, vpi_page_index).
 * Mallocs of 1-7 grains and frees in a fixed order, a defragmentation
 * among them, the pool checked after each; then the grain maps and the
 * regions that cover a remapped handle must agree. */
Test(grain, a_page_of_three_grains)
{
	struct pt t;
	struct pt_setup su = {.granularity = GRAIN, .page_size = 3 * GRAIN, .unbacked = true,
			      .va_pages = 256, .grain = GRAIN, .unit = GRAIN, .handle_pages = 4};
	pt_open(&t, &su);
	cr_assert_eq(t.page, 3 * GRAIN);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[24];
	for (int i = 0; i < 24; i++)
		p[i] = gmalloc(&t, (size_t)(i % 7 + 1) * GRAIN - 100, s);
	for (int i = 0; i < 24; i += 2)
		PT_FREE(&t, p[i], s);
	pt_settle(&t);
	CUdeviceptr big = gmalloc(&t, 40 * GRAIN, s);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_gt(st.pages_remapped + st.pages_created, 0, "the big malloc mapped nothing");
	PT_FREE(&t, big, s);
	for (int i = 1; i < 24; i += 2)
		PT_FREE(&t, p[i], s);
	pt_settle(&t);
	pt_close(&t);
}
