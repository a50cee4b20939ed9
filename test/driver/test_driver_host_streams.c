/* test_driver_host_streams.c — the host driver's streams and events: records
 * stay pending until completed, waits block later work, re-recording, event
 * sync, chains across streams, destroyed events, special streams. */
#include "host_test.h"

/* ---- streams and events ----------------------------------------------------------- */

Test(driver, events_pending_until_completed)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	cr_assert_not_null(a);
	cr_assert_neq(a, b);
	CUevent e;
	OK(d->event_create(d, &e));
	OK(d->event_query(d, e)); /* never recorded */
	OK(d->event_record(d, e, a));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 1);
	OK(d->event_query(d, e));
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0);
	OK(d->event_destroy(d, e));
	d->destroy(d);
}

Test(driver, wait_blocks_later_records)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e1, e2;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	cr_assert(vpmm_host_stream_waits_on(d, b, e1));
	cr_assert_not(vpmm_host_stream_waits_on(d, a, e1));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e2));
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 1);
	cr_assert_eq(vpmm_host_stream_wait_count(d, a), 0);

	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	FAILS(d->event_query(d, e2), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 1);
	FAILS(d->event_query(d, e2), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, e2));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e1));
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 1);

	/* A wait on a completed or never-recorded event blocks nothing. */
	CUevent e3;
	OK(d->event_create(d, &e3));
	OK(d->stream_wait(d, b, e3));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 3);
	d->destroy(d);
}

Test(driver, re_record_resets)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e;
	OK(d->event_create(d, &e));
	OK(d->event_record(d, e, a));
	vpmm_host_stream_complete(d, a);
	OK(d->event_query(d, e));
	OK(d->event_record(d, e, b));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);

	/* Recorded on a, then again on b: only b's record completes it. */
	OK(d->event_record(d, e, a));
	OK(d->event_record(d, e, b));
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0);
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, e));
	d->destroy(d);
}

Test(driver, wait_is_on_the_record_at_wait_time)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUstream c = vpmm_host_stream_create(d);
	CUevent e, f;
	OK(d->event_create(d, &e));
	OK(d->event_create(d, &f));
	OK(d->event_record(d, e, a));
	OK(d->stream_wait(d, b, e));
	OK(d->event_record(d, f, b));
	OK(d->event_record(d, e, c)); /* re-recorded after the wait was issued */
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0); /* no longer e's latest */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1); /* a's record passed it */
	OK(d->event_query(d, f));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	d->destroy(d);
}

Test(driver, event_sync_completes_only_what_is_needed)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUstream c = vpmm_host_stream_create(d);
	CUevent e1, e2, e3, e4;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_create(d, &e3));
	OK(d->event_create(d, &e4));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	OK(d->event_record(d, e4, b)); /* after e2 on b */
	OK(d->event_record(d, e3, c));

	OK(d->event_sync(d, e2));
	OK(d->event_query(d, e1));
	OK(d->event_query(d, e2));
	FAILS(d->event_query(d, e4), CUDA_ERROR_NOT_READY);
	FAILS(d->event_query(d, e3), CUDA_ERROR_NOT_READY);
	OK(d->event_sync(d, e2)); /* complete already */
	OK(d->event_sync(d, e3));
	FAILS(d->event_query(d, e4), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_complete_all(d), 1);
	d->destroy(d);
}

Test(driver, complete_all_follows_chains)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e1, e2, e3;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_create(d, &e3));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	OK(d->stream_wait(d, a, e2));
	OK(d->event_record(d, e3, a));
	OK(d->stream_wait(d, b, e3));
	cr_assert_eq(vpmm_host_complete_all(d), 3);
	OK(d->event_query(d, e3));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e3));
	cr_assert_eq(vpmm_host_complete_all(d), 0);
	d->destroy(d);
}

Test(driver, destroy_pending_event)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e, f;
	OK(d->event_create(d, &e));
	OK(d->event_create(d, &f));
	OK(d->event_record(d, e, a));
	OK(d->stream_wait(d, b, e));
	OK(d->event_record(d, f, b));
	OK(d->event_destroy(d, e)); /* allowed while pending */
	cr_assert_eq(live(d).events, 1);
	/* The device still runs a up to the record, and b's wait on it. */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0); /* no event left to complete */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, f));

	FAILS(d->event_query(d, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_record(d, e, a), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_sync(d, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_wait(d, a, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_destroy(d, e), CUDA_ERROR_INVALID_HANDLE);
	int not_an_event;
	FAILS(d->event_query(d, (CUevent)&not_an_event), CUDA_ERROR_INVALID_HANDLE);
	d->destroy(d);
}

Test(driver, special_and_unknown_streams)
{
	vpmm_driver *d = mk(G, 0, true);
	CUevent e;
	OK(d->event_create(d, &e));
	CUstream specials[] = { (CUstream)0, CU_STREAM_PER_THREAD, CU_STREAM_LEGACY };
	for (size_t i = 0; i < 3; i++) {
		CUstream s = specials[i];
		OK(d->event_record(d, e, s));
		FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
		cr_assert_eq(vpmm_host_stream_complete(d, s), 1);
		OK(d->event_query(d, e));
	}
	int bogus;
	CUstream unknown = (CUstream)&bogus;
	bool cap = true;
	FAILS(d->event_record(d, e, unknown), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_wait(d, unknown, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_capturing(d, unknown, &cap), CUDA_ERROR_INVALID_HANDLE);
	cr_assert_eq(vpmm_host_stream_complete(d, unknown), 0);

	CUstream s = vpmm_host_stream_create(d);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert_not(cap);
	vpmm_host_set_capturing(d, s, true);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert(cap);
	OK(d->stream_capturing(d, (CUstream)0, &cap));
	cr_assert_not(cap);
	vpmm_host_set_capturing(d, s, false);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert_not(cap);
	d->destroy(d);
}

/* A reset of the context, as the primary context's: the handle stays, the
 * id changes (CUDA_ERROR_CONTEXT_IS_DESTROYED until it is made again), the
 * streams and events of before die with their work, and every later use of
 * one is refused and counted; memory stays mapped. */
Test(driver, context_reset_kills_streams_and_events)
{
	vpmm_driver *d = mk(G, 0, false);
	unsigned long long id = 0;
	OK(d->ctx_id(d, NULL, &id));
	cr_assert_eq(id, 1);
	CUstream a = vpmm_host_stream_create(d);
	CUevent e, f;
	OK(d->event_create(d, &e));
	OK(d->event_record(d, e, a));
	OK(d->event_record(d, e, 0)); /* a default stream's work too */
	CUmemGenericAllocationHandle h = create(d, G);
	CUdeviceptr va = reserve(d, G);
	map_rw(d, va, G, h);

	vpmm_host_ctx_reset(d, false);
	FAILS(d->ctx_id(d, NULL, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	FAILS(d->event_create(d, &f), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	cr_assert_eq(vpmm_host_dead_calls(d), 0);
	FAILS(d->event_query(d, e), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	cr_assert_eq(vpmm_host_dead_calls(d), 1);
	vpmm_host_ctx_remake(d);
	OK(d->ctx_id(d, NULL, &id));
	cr_assert_eq(id, 2);
	FAILS(d->event_record(d, e, a), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_destroy(d, e), CUDA_ERROR_INVALID_HANDLE);
	cr_assert_eq(vpmm_host_dead_calls(d), 3); /* e twice (and a not reached) */
	cr_assert_eq(live(d).events, 0);
	*(volatile int *)va = 5; /* still mapped, still accessible */

	CUstream b = vpmm_host_stream_create(d);
	cr_assert_neq(b, a, "a dead stream's address came back");
	OK(d->event_create(d, &f));
	cr_assert_neq(f, e, "a dead event's address came back");
	OK(d->event_record(d, f, b));
	FAILS(d->event_query(d, f), CUDA_ERROR_NOT_READY);
	OK(d->event_record(d, f, 0)); /* the default stream starts empty */
	cr_assert_eq(vpmm_host_stream_complete(d, 0), 1);
	OK(d->event_query(d, f));
	OK(d->event_destroy(d, f));
	cr_assert_eq(vpmm_host_dead_calls(d), 3);
	OK(d->unmap(d, va, G));
	OK(d->mem_release(d, h));
	OK(d->va_free(d, va, G));
	d->destroy(d);
}
