/* test_lab.c — the allocation-order cases that fragment PyTorch's caching
 * allocator (the laboratory cases of bench/workloads.py) with 2 MiB pages: what fragments a caching
 * allocator must cost the pool no new memory. */
#include "pool_test.h"

static void open_lab(struct pt *t, enum vpmm_defrag_policy policy)
{
	struct pt_setup su = {
		.granularity = 2 * PT_MiB, .unbacked = true, .va_pages = 512,
		.defrag = policy, .unit = PT_MiB,
	};
	pt_open(t, &su);
}

/* 8 x 16 MiB, free all, 4 x 32 MiB: the freed memory is one region. */
static void small_then_large(enum vpmm_defrag_policy policy)
{
	struct pt t;
	open_lab(&t, policy);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[8];
	for (int i = 0; i < 8; i++)
		p[i] = PT_MALLOC_BYTES(&t, 16 * PT_MiB, s);
	PT_LAYOUT_IS(&t, "[16][16][16][16][16][16][16][16][*896]");
	cr_assert_eq(pt_stats(&t).pages_created, 64);
	for (int i = 0; i < 8; i++)
		PT_FREE(&t, p[i], s);
	PT_LAYOUT_IS(&t, "[-128][*896]");

	struct vpmm_stats b = pt_stats(&t);
	CUdeviceptr q[4];
	for (int i = 0; i < 4; i++)
		q[i] = PT_MALLOC_BYTES(&t, 32 * PT_MiB, s);
	struct vpmm_stats a = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[32][32][32][32][*896]");
	cr_assert_eq(a.pages_created, b.pages_created, "4x32 MiB created %llu pages",
		     (unsigned long long)(a.pages_created - b.pages_created));
	cr_assert_eq(a.pages_remapped, b.pages_remapped, "4x32 MiB remapped %llu pages",
		     (unsigned long long)(a.pages_remapped - b.pages_remapped));
	cr_assert_eq(a.defrags, b.defrags, "4x32 MiB needed a defrag");
	cr_assert_eq(a.mapped_peak, 128 * PT_MiB, "peak mapped %llu MiB",
		     (unsigned long long)(a.mapped_peak / PT_MiB));
	for (int i = 0; i < 4; i++)
		PT_FREE(&t, q[i], s);
	PT_LAYOUT_IS(&t, "[-128][*896]");
	pt_close(&t);
}

Test(lab, small_then_large_maps_nothing_new_lacking)
{
	small_then_large(VPMM_DEFRAG_LACKING);
}

Test(lab, small_then_large_maps_nothing_new_all)
{
	small_then_large(VPMM_DEFRAG_ALL);
}

/* The "good order" of the post must be as good. */
Test(lab, large_then_small_maps_nothing_new)
{
	struct pt t;
	open_lab(&t, VPMM_DEFRAG_LACKING);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[8];
	for (int i = 0; i < 4; i++)
		p[i] = PT_MALLOC_BYTES(&t, 32 * PT_MiB, s);
	for (int i = 0; i < 4; i++)
		PT_FREE(&t, p[i], s);
	PT_LAYOUT_IS(&t, "[-128][*896]");
	struct vpmm_stats b = pt_stats(&t);
	for (int i = 0; i < 8; i++)
		p[i] = PT_MALLOC_BYTES(&t, 16 * PT_MiB, s);
	struct vpmm_stats a = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[16][16][16][16][16][16][16][16][*896]");
	cr_assert_eq(a.pages_created, b.pages_created);
	cr_assert_eq(a.pages_remapped, b.pages_remapped);
	pt_close(&t);
}

/* Four 16 MiB, free #0 and #2, then 32 MiB: the two freed 16 MiB are remapped
 * side by side into a hole; no page is created. */
static void pinned_holes(enum vpmm_defrag_policy policy)
{
	struct pt t;
	open_lab(&t, policy);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[4];
	for (int i = 0; i < 4; i++)
		p[i] = PT_MALLOC_BYTES(&t, 16 * PT_MiB, s);
	PT_FREE(&t, p[0], s);
	PT_FREE(&t, p[2], s);
	PT_LAYOUT_IS(&t, "[-16][16][-16][16][*960]");

	struct vpmm_stats b = pt_stats(&t);
	CUdeviceptr big = PT_MALLOC_BYTES(&t, 32 * PT_MiB, s);
	struct vpmm_stats a = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[~16][16][~16][16][32][*928]");
	cr_assert_eq(a.pages_created, b.pages_created, "32 MiB created %llu pages",
		     (unsigned long long)(a.pages_created - b.pages_created));
	cr_assert_eq(a.pages_remapped - b.pages_remapped, 16,
		     "32 MiB remapped %llu pages, expected 16",
		     (unsigned long long)(a.pages_remapped - b.pages_remapped));
	cr_assert_eq(a.defrags - b.defrags, 1);
	cr_assert_eq(a.mapped, 64 * PT_MiB, "mapped %llu MiB",
		     (unsigned long long)(a.mapped / PT_MiB));
	cr_assert_eq(a.mapped_peak, 64 * PT_MiB);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*16][16][*16][16][32][*928]");

	/* Free everything: 32 MiB fits again without growing. */
	PT_FREE(&t, big, s);
	PT_FREE(&t, p[1], s);
	PT_FREE(&t, p[3], s);
	b = pt_stats(&t);
	big = PT_MALLOC_BYTES(&t, 32 * PT_MiB, s);
	a = pt_stats(&t);
	cr_assert_eq(a.pages_created, b.pages_created);
	cr_assert_eq(a.mapped, 64 * PT_MiB);
	PT_FREE(&t, big, s);
	pt_close(&t);
}

Test(lab, pinned_holes_remap_without_new_pages_lacking)
{
	pinned_holes(VPMM_DEFRAG_LACKING);
}

Test(lab, pinned_holes_remap_without_new_pages_all)
{
	pinned_holes(VPMM_DEFRAG_ALL);
}

/* 2 MiB pages round every request up: 1 byte costs one page, 2 MiB + 1 two. */
Test(lab, sizes_round_up_to_pages)
{
	struct pt t;
	open_lab(&t, VPMM_DEFRAG_LACKING);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC_BYTES(&t, 1, s);
	CUdeviceptr b = PT_MALLOC_BYTES(&t, 2 * PT_MiB + 1, s);
	CUdeviceptr c = PT_MALLOC_BYTES(&t, 2 * PT_MiB, s);
	PT_LAYOUT_IS(&t, "[2][4][2][*1016]");
	CUdeviceptr base; size_t sz;
	cr_assert_eq(vpmm_pool_find(t.pool, b, &base, &sz), 0);
	cr_assert_eq(sz, 4 * PT_MiB);
	cr_assert_eq(pt_stats(&t).live, 8 * PT_MiB);
	PT_FREE(&t, a, s);
	PT_FREE(&t, b, s);
	PT_FREE(&t, c, s);
	pt_close(&t);
}
