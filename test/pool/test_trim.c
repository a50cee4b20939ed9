/* test_trim.c — giving memory back: vpmm_pool_trim() and the release
 * threshold, which release only pages whose work completed. */
#include <time.h>
#include <unistd.h>

#include "pool_test.h"

static void open16(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .event_interval_ns = 0};
	pt_open(t, &su);
}

static size_t driver_bytes(struct pt *t)
{
	struct vpmm_host_live l;
	vpmm_host_live(t->drv, &l);
	return l.handle_bytes;
}

Test(trim, releases_settled_pages_down_to_keep)
{
	struct pt t;
	open16(&t);
	CUdeviceptr a = PT_MALLOC(&t, 10, VPMM_NO_STREAM);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	cr_assert_eq(driver_bytes(&t), 10 * t.page);
	long long got = vpmm_pool_trim(t.pool, 3 * t.page);
	PT_CHECK(&t);
	cr_assert_eq(got, 7 * (long long)t.page, "released %lld bytes", got);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.mapped, 3 * t.page);
	cr_assert_eq(st.reusable, 3 * t.page);
	cr_assert_eq(st.pages_released, 7);
	cr_assert_eq(driver_bytes(&t), 3 * t.page, "the driver still holds the pages");
	/* The pool grows again when asked. */
	CUdeviceptr b = PT_MALLOC(&t, 8, VPMM_NO_STREAM);
	cr_assert_eq(pt_stats(&t).mapped, 8 * t.page);
	PT_FREE(&t, b, VPMM_NO_STREAM);
	pt_close(&t);
}

Test(trim, pending_work_keeps_pages)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s);
	cr_assert_eq(vpmm_pool_trim(t.pool, 0), 0, "released pages of pending work");
	PT_CHECK(&t);
	cr_assert_eq(driver_bytes(&t), 4 * t.page);
	vpmm_host_stream_complete(t.drv, s);
	cr_assert_eq(vpmm_pool_trim(t.pool, 0), 4 * (long long)t.page);
	PT_CHECK(&t);
	cr_assert_eq(driver_bytes(&t), 0);
	pt_close(&t);
}

Test(trim, zombie_mapping_keeps_its_slab)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr x = PT_MALLOC(&t, 2, s);
	CUdeviceptr keep = PT_MALLOC(&t, 1, s);
	PT_FREE(&t, x, s);
	/* 3 pages: x's two are remapped (their old VA a zombie until s's work
	 * completes) and one is created. */
	CUdeviceptr z = PT_MALLOC(&t, 3, s);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.zombies, 2 * t.page);
	PT_FREE(&t, z, VPMM_NO_STREAM);
	long long got = vpmm_pool_trim(t.pool, 0);
	PT_CHECK(&t);
	cr_assert_eq(got, (long long)t.page,
		     "only the created page may go while the zombie maps the others");
	pt_settle(&t);
	cr_assert_eq(vpmm_pool_trim(t.pool, 0), 2 * (long long)t.page);
	PT_CHECK(&t);
	PT_FREE(&t, keep, s);
	pt_close(&t);
}

Test(trim, failed_unmap_keeps_the_page)
{
	struct pt t;
	open16(&t);
	CUdeviceptr a = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	vpmm_host_fail(t.drv, VPMM_OP_UNMAP, 1, CUDA_ERROR_UNKNOWN);
	long long got = vpmm_pool_trim(t.pool, 0);
	PT_CHECK(&t);
	cr_assert_eq(got, (long long)t.page, "one of two pages released");
	cr_assert_eq(pt_stats(&t).mapped, t.page);
	cr_assert_eq(vpmm_pool_trim(t.pool, 0), (long long)t.page);
	PT_CHECK(&t);
	pt_close(&t);
}

Test(trim, background_thread_keeps_the_threshold)
{
	struct vpmm_host_options ho = {.granularity = 64 * PT_KiB};
	vpmm_driver *d;
	cr_assert_eq(vpmm_driver_host_create(&ho, &d), CUDA_SUCCESS);
	struct vpmm_config c;
	vpmm_config_default(&c);
	c.va_size = 256 * ho.granularity;
	c.background = true;
	c.release = true;
	c.release_threshold = 2 * ho.granularity;
	vpmm_pool *p;
	cr_assert_eq(vpmm_pool_create(&c, d, &p), 0);
	CUstream s = vpmm_host_stream_create(d);
	CUdeviceptr a;
	cr_assert_eq(vpmm_pool_malloc(p, 8 * ho.granularity, s, &a), 0);
	cr_assert_eq(vpmm_pool_free(p, a, s), 0);
	struct vpmm_stats st;
	vpmm_pool_stats(p, &st);
	cr_assert_eq(st.mapped, 8 * ho.granularity, "released before the work completed");
	for (int i = 0; i < 2000; i++) { /* up to 2 s of a device that keeps up */
		vpmm_host_stream_complete(d, s);
		vpmm_pool_stats(p, &st);
		if (st.mapped <= c.release_threshold)
			break;
		usleep(1000);
	}
	cr_assert_leq(st.mapped, c.release_threshold, "mapped %lu", (unsigned long)st.mapped);
	cr_assert_eq(vpmm_pool_check(p, stderr), 0);
	vpmm_pool_destroy(p);
	d->destroy(d);
}
