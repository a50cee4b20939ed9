/* test_gone.c — a stream the program destroys: one last event covers its
 * pending frees, the pool never records on it again, and a new stream that
 * gets the same handle starts afresh. */
#include "pool_test.h"

static void open16(struct pt *t)
{
	struct pt_setup su = {.va_pages = 64, .event_interval_ns = 1000000000};
	pt_open(t, &su);
}

Test(gone, last_event_covers_pending_frees)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv), u = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s); /* the first free records; close the epoch later */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, b, s); /* pending, no event of its own yet (interval) */
	unsigned long rec0 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	PT_CHECK(&t);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec0 + 1,
		     "no last event recorded before the destroy");
	/* Another stream asks for memory: nothing more may be recorded on s,
	 * and its memory comes back once s's last event completed. */
	unsigned long rec1 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD);
	vpmm_host_stream_complete(t.drv, s);
	CUdeviceptr c = PT_MALLOC(&t, 4, u);
	cr_assert_eq(c, a, "settled memory of the destroyed stream not reused");
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_RECORD), rec1,
		     "an event was recorded on a destroyed stream");
	PT_FREE(&t, c, u);
	pt_settle(&t);
	pt_close(&t);
}

Test(gone, same_handle_is_a_new_stream)
{
	struct pt t;
	open16(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 4, s);
	PT_FREE(&t, a, s);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	/* The same handle again (a new stream the driver gave the same
	 * address): the old stream's pending memory is not its own. */
	CUdeviceptr b = PT_MALLOC(&t, 4, s);
	cr_assert_neq(b, a, "pending memory of the destroyed stream reused in place");
	PT_FREE(&t, b, s);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0);
	cr_assert_eq(vpmm_pool_stream_gone(t.pool, s), 0, "a second destroy is harmless");
	pt_settle(&t);
	pt_close(&t);
}
