/* test_errors.c — bad input gets -EINVAL and changes nothing: zero size,
 * NULL, pointers the pool never handed out, interior pointers, double frees,
 * sizes that overflow when rounded. */
#include <stdint.h>

#include "pool_test.h"

static void open_with_some(struct pt *t, CUstream *s, CUdeviceptr *live,
			   CUdeviceptr *freed)
{
	struct pt_setup su = { .va_pages = 64, .initial_pages = 2 };
	pt_open(t, &su);
	*s = vpmm_host_stream_create(t->drv);
	*live = PT_MALLOC(t, 3, *s);
	*freed = PT_MALLOC(t, 2, *s);
	PT_MALLOC(t, 1, *s);
	PT_FREE(t, *freed, *s);
	PT_LAYOUT_IS(t, "[3][-2][1][*58]");
}

Test(errors, zero_size_malloc_is_einval)
{
	struct pt t; CUstream s; CUdeviceptr live, freed;
	open_with_some(&t, &s, &live, &freed);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	CUdeviceptr p = 0x1234;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 0, s, &p), -EINVAL);
	PT_UNCHANGED(&t, &snap, "malloc(0)");
	cr_assert_eq(pt_stats(&t).mallocs, snap.st.mallocs);
	pt_close(&t);
}

Test(errors, free_null_is_einval)
{
	struct pt t; CUstream s; CUdeviceptr live, freed;
	open_with_some(&t, &s, &live, &freed);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	cr_assert_eq(vpmm_pool_free(t.pool, 0, s), -EINVAL);
	PT_UNCHANGED(&t, &snap, "free(NULL)");
	cr_assert_eq(pt_stats(&t).frees, snap.st.frees);
	pt_close(&t);
}

Test(errors, free_of_pointers_never_allocated_is_einval)
{
	struct pt t; CUstream s; CUdeviceptr live, freed;
	open_with_some(&t, &s, &live, &freed);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	int local;
	const struct { const char *what; CUdeviceptr p; } bad[] = {
		{ "a host address", (CUdeviceptr)(uintptr_t)&local },
		{ "a hole", live + 10 * t.page },
		{ "the end of the chunk's last hole", live + 63 * t.page },
		{ "a free region", freed },
		{ "inside a free region", freed + t.page },
		{ "an interior page", live + t.page },
		{ "an interior byte", live + 8 },
		{ "the last byte", live + 3 * t.page - 1 },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int rc = vpmm_pool_free(t.pool, bad[i].p, s);
		cr_assert_eq(rc, -EINVAL, "free of %s: %d", bad[i].what, rc);
		PT_UNCHANGED(&t, &snap, bad[i].what);
	}
	/* The allocation behind the interior pointers is intact. */
	CUdeviceptr base; size_t sz;
	cr_assert_eq(vpmm_pool_find(t.pool, live, &base, &sz), 0);
	cr_assert_eq(sz, 3 * t.page);
	PT_FREE(&t, live, s);
	pt_close(&t);
}

Test(errors, double_free_is_einval)
{
	struct pt t; CUstream s; CUdeviceptr live, freed;
	open_with_some(&t, &s, &live, &freed);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	cr_assert_eq(vpmm_pool_free(t.pool, freed, s), -EINVAL);
	PT_UNCHANGED(&t, &snap, "double free");
	PT_FREE(&t, live, s);
	pt_snap(&t, &snap);
	cr_assert_eq(vpmm_pool_free(t.pool, live, s), -EINVAL);
	PT_UNCHANGED(&t, &snap, "double free after merge");
	/* A pointer that was freed and whose memory moved on to a new owner. */
	CUdeviceptr again = PT_MALLOC(&t, 1, s);
	cr_assert_eq(again, live, "best fit did not reuse the lowest free region");
	pt_snap(&t, &snap);
	cr_assert_eq(vpmm_pool_free(t.pool, live + t.page, s), -EINVAL);
	PT_UNCHANGED(&t, &snap, "stale pointer into a reused region");
	pt_close(&t);
}

/* Sizes that overflow when rounded up to pages: refused, nothing created. */
Test(errors, overflowing_size_is_refused)
{
	struct pt t; CUstream s; CUdeviceptr live, freed;
	open_with_some(&t, &s, &live, &freed);
	const size_t sizes[] = { SIZE_MAX, SIZE_MAX - t.page + 2, SIZE_MAX / 2 + 1 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		struct pt_snap snap;
		pt_snap(&t, &snap);
		CUdeviceptr p = 0;
		int rc = vpmm_pool_malloc(t.pool, sizes[i], s, &p);
		cr_assert(rc == -ENOMEM || rc == -EINVAL, "malloc(%zu) = %d", sizes[i], rc);
		PT_UNCHANGED(&t, &snap, "overflowing size");
	}
	pt_close(&t);
}
