/* test_pressure.c — nothing freed is lost: once every allocation is freed
 * (on whatever stream) and the device completed the work, the whole device
 * can be allocated again in one request, whatever caches the pool keeps. */
#include "pool_test.h"

#define DEVICE_PAGES 64

static void open_device(struct pt *t, size_t small_max)
{
	struct pt_setup su = { .va_pages = 1024,
			       .capacity = DEVICE_PAGES * 64 * PT_KiB,
			       .small_max = small_max };
	pt_open(t, &su);
}

enum free_on { ON_OWNER, ON_OTHER, ON_NO_STREAM, ON_MIXED };

static CUstream free_stream(enum free_on how, int i, CUstream a, CUstream b)
{
	switch (how) {
	case ON_OWNER: return a;
	case ON_OTHER: return b;
	case ON_NO_STREAM: return VPMM_NO_STREAM;
	case ON_MIXED: break;
	}
	return i % 3 == 0 ? a : i % 3 == 1 ? b : VPMM_NO_STREAM;
}

/* The whole device in one allocation, on either stream. */
static void whole_device_fits(struct pt *t, CUstream s, const char *what)
{
	struct vpmm_stats st = pt_stats(t);
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, DEVICE_PAGES * t->page, s, &p);
	PT_CHECK(t);
	cr_assert_eq(rc, 0, "%s: the whole device does not fit after freeing "
		     "everything: %d (live %llu KiB, reusable %llu KiB, mapped %llu KiB)",
		     what, rc, (unsigned long long)st.live >> 10,
		     (unsigned long long)st.reusable >> 10,
		     (unsigned long long)st.mapped >> 10);
	PT_FREE(t, p, s);
}

static void pages(enum free_on how, const char *what)
{
	struct pt t;
	open_device(&t, 0);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[16];
	for (int i = 0; i < 16; i++)
		p[i] = PT_MALLOC(&t, 1 + i % 5, a);
	for (int i = 0; i < 16; i += 2)
		PT_FREE(&t, p[i], free_stream(how, i, a, b));
	CUdeviceptr mid = PT_MALLOC(&t, 6, b); /* a defrag in between */
	for (int i = 1; i < 16; i += 2)
		PT_FREE(&t, p[i], free_stream(how, i, a, b));
	PT_FREE(&t, mid, b);
	pt_settle(&t);
	whole_device_fits(&t, b, what);
	pt_close(&t);
}

/* Blocks of many sub-page classes, taken on stream a. */
static void sub_page(enum free_on how, const char *what)
{
	struct pt t;
	open_device(&t, 64 * PT_KiB);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[64];
	int n = 0;
	for (size_t sz = 700; sz < 64 * PT_KiB && n < 64; sz = sz * 3 / 2, n++)
		p[n] = PT_MALLOC_BYTES(&t, sz, a);
	for (int i = 0; i < n; i++)
		PT_FREE(&t, p[i], free_stream(how, i, a, b));
	pt_settle(&t);
	whole_device_fits(&t, b, what);
	whole_device_fits(&t, a, what);
	pt_close(&t);
}

Test(pressure, pages_freed_on_owner) { pages(ON_OWNER, "pages, owner"); }
Test(pressure, pages_freed_on_other) { pages(ON_OTHER, "pages, other stream"); }
Test(pressure, pages_freed_mixed) { pages(ON_MIXED, "pages, mixed"); }
Test(pressure, sub_page_freed_on_owner) { sub_page(ON_OWNER, "sub-page, owner"); }
Test(pressure, sub_page_freed_on_other) { sub_page(ON_OTHER, "sub-page, other stream"); }
Test(pressure, sub_page_freed_without_stream) { sub_page(ON_NO_STREAM, "sub-page, no stream"); }
Test(pressure, sub_page_freed_mixed) { sub_page(ON_MIXED, "sub-page, mixed"); }
