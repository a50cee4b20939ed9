/* test_va.c — VA reservation in chunks: a request no hole can hold reserves
 * another chunk; regions never straddle chunks; find/owns answer about
 * addresses. */
#include <stdint.h>

#include "pool_test.h"

/* Regions of each chunk are contiguous and add up to the chunk size. */
static void assert_chunks_partitioned(struct pt *t, size_t va_size)
{
	struct vpmm_region_info r[256];
	size_t n = vpmm_pool_regions(t->pool, r, 256);
	cr_assert_leq(n, 256);
	size_t sum[16] = { 0 };
	CUdeviceptr end[16] = { 0 };
	for (size_t i = 0; i < n; i++) {
		unsigned c = r[i].chunk;
		cr_assert_lt(c, 16, "chunk index %u", c);
		if (sum[c])
			cr_assert_eq(r[i].va, end[c],
				     "chunk %u: region at %#llx does not follow its "
				     "predecessor", c, (unsigned long long)r[i].va);
		sum[c] += r[i].size;
		end[c] = r[i].va + r[i].size;
		if (i)
			cr_assert_gt(r[i].va, r[i - 1].va, "regions not ascending");
	}
	for (unsigned c = 0; c < 16; c++)
		cr_assert(sum[c] == 0 || sum[c] == va_size,
			  "chunk %u holds %zu bytes of regions, chunk size %zu", c,
			  sum[c], va_size);
}

Test(va, exhaustion_reserves_another_chunk)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 8 };
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	struct vpmm_host_live l;

	CUdeviceptr a = PT_MALLOC(&t, 6, s);
	PT_LAYOUT_IS(&t, "[6][*2]");
	cr_assert_eq(pt_stats(&t).reserved, 8 * t.page);
	vpmm_host_live(t.drv, &l);
	cr_assert_eq(l.reservations, 1);

	CUdeviceptr b = PT_MALLOC(&t, 6, s);
	PT_LAYOUT_IS(&t, "[6][*2] | [6][*2]");
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.reserved, 16 * t.page);
	cr_assert_eq(st.reserved_peak, 16 * t.page);
	cr_assert_eq(st.holes, 4 * t.page);
	vpmm_host_live(t.drv, &l);
	cr_assert_eq(l.reservations, 2);
	assert_chunks_partitioned(&t, 8 * t.page);
	cr_assert(vpmm_pool_owns(t.pool, a) && vpmm_pool_owns(t.pool, b));

	/* Both chunks have a 2-page hole: the lowest one is taken. */
	CUdeviceptr c = PT_MALLOC(&t, 2, s);
	PT_LAYOUT_IS(&t, "[6][2] | [6][*2]");
	vpmm_host_live(t.drv, &l);
	cr_assert_eq(l.reservations, 2, "a chunk reserved while a hole fitted");

	/* Freed chunks stay apart even if the reservations happen to touch. */
	PT_FREE(&t, a, s);
	PT_FREE(&t, b, s);
	PT_FREE(&t, c, s);
	assert_chunks_partitioned(&t, 8 * t.page);
	const char *lay = pt_layout(&t);
	cr_assert(strcmp(lay, "[-8] | [-6][*2]") == 0 || strcmp(lay, "[-6][*2] | [-8]") == 0,
		  "layout after freeing all: %s", lay);
	CUdeviceptr d = PT_MALLOC(&t, 6, s);
	assert_chunks_partitioned(&t, 8 * t.page);
	cr_assert_eq(pt_stats(&t).reserved, 16 * t.page);
	PT_FREE(&t, d, s);
	pt_close(&t);
}

/* A free region at the end of a full chunk is never the start of an
 * allocation in a new chunk, however the reservations lie. */
Test(va, no_allocation_straddles_chunks)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 8 };
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 6, s);
	CUdeviceptr b = PT_MALLOC(&t, 2, s);
	PT_LAYOUT_IS(&t, "[6][2]");
	PT_FREE(&t, b, s);
	CUdeviceptr c = PT_MALLOC(&t, 4, s);
	assert_chunks_partitioned(&t, 8 * t.page);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, c, &r));
	cr_assert_eq(r.va, c);
	cr_assert_eq(r.size, 4 * t.page);
	cr_assert_eq(r.kind, VPMM_REGION_LIVE);
	cr_assert(pt_region_at(&t, c + 3 * t.page, &r));
	cr_assert_eq(r.va, c, "the last page of the allocation lies in another region");
	cr_assert_eq(pt_stats(&t).reserved, 16 * t.page);
	pt_settle(&t);
	assert_chunks_partitioned(&t, 8 * t.page);
	pt_close(&t);
}

/* More than a chunk in one request: served whole, or refused cleanly. */
Test(va, request_larger_than_a_chunk)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 8 };
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 3, s);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t.pool, 20 * t.page, s, &p);
	PT_CHECK(&t);
	if (rc == 0) {
		CUdeviceptr base; size_t sz;
		cr_assert_eq(vpmm_pool_find(t.pool, p + 19 * t.page, &base, &sz), 0);
		cr_assert_eq(base, p);
		cr_assert_eq(sz, 20 * t.page);
		cr_log_info("a 20-page request with 8-page chunks was served");
	} else {
		cr_assert(rc == -ENOMEM || rc == -EINVAL, "rc %d", rc);
		PT_UNCHANGED(&t, &snap, "refused oversize request");
		cr_log_info("a 20-page request with 8-page chunks was refused: %d", rc);
	}
	pt_close(&t);
}

Test(va, find_and_owns)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 64 };
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 3, s);
	CUdeviceptr q = PT_MALLOC(&t, 1, s);
	CUdeviceptr base = 0; size_t sz = 0;
	cr_assert_eq(vpmm_pool_find(t.pool, p, &base, &sz), 0);
	cr_assert_eq(base, p);
	cr_assert_eq(sz, 3 * t.page);
	cr_assert_eq(vpmm_pool_find(t.pool, p + t.page + 17, &base, &sz), 0);
	cr_assert_eq(base, p);
	cr_assert_eq(vpmm_pool_find(t.pool, p + 3 * t.page - 1, &base, &sz), 0);
	cr_assert_eq(base, p);
	cr_assert_eq(vpmm_pool_find(t.pool, q, &base, &sz), 0);
	cr_assert_eq(base, q);
	cr_assert_eq(sz, t.page);
	cr_assert_eq(vpmm_pool_find(t.pool, q + t.page, &base, &sz), -EINVAL,
		     "find in a hole");

	int local = 0;
	cr_assert(vpmm_pool_owns(t.pool, p));
	cr_assert(vpmm_pool_owns(t.pool, q + 10 * t.page), "a hole is the pool's VA");
	cr_assert_not(vpmm_pool_owns(t.pool, (CUdeviceptr)(uintptr_t)&local));
	cr_assert_not(vpmm_pool_owns(t.pool, 0));
	cr_assert_eq(vpmm_pool_find(t.pool, (CUdeviceptr)(uintptr_t)&local, &base, &sz),
		     -EINVAL);

	PT_FREE(&t, p, s);
	cr_assert_eq(vpmm_pool_find(t.pool, p, &base, &sz), -EINVAL, "find of freed memory");
	cr_assert(vpmm_pool_owns(t.pool, p));
	pt_close(&t);
}

/* The pool holds at most 1024 chunks (VPMM_MAX_CHUNKS, pool.h): a request
 * that needs one more is refused as out of memory, and the pool is as it
 * was, its last chunk's slot untouched. */
Test(va, the_last_chunk)
{
	enum { MAX_CHUNKS = 1024 };
	struct pt t;
	struct pt_setup su = { .va_pages = 1, .unbacked = true };
	pt_open(&t, &su);
	static CUdeviceptr p[MAX_CHUNKS];
	for (int i = 0; i < MAX_CHUNKS; i++)
		cr_assert_eq(vpmm_pool_malloc(t.pool, t.page, VPMM_NO_STREAM, &p[i]), 0,
			     "allocation %d", i);
	PT_CHECK(&t);
	cr_assert_eq(pt_stats(&t).reserved, MAX_CHUNKS * t.page);
	struct pt_snap before;
	pt_snap(&t, &before);
	CUdeviceptr q;
	cr_assert_eq(vpmm_pool_malloc(t.pool, t.page, VPMM_NO_STREAM, &q), -ENOMEM);
	PT_UNCHANGED(&t, &before, "a request past the last chunk");
	cr_assert(vpmm_pool_owns(t.pool, p[MAX_CHUNKS - 1]));
	for (int i = 0; i < MAX_CHUNKS; i++)
		PT_FREE(&t, p[i], VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}
