/* test_reset.c — the pool's context ends without a word to the pool, as the
 * CUDA 13 runtime's cudaDeviceReset ends the primary context (the shim's
 * hooks never see it): the host driver's vpmm_host_ctx_reset kills every
 * stream and event with their work and changes the context's id. The pool
 * must learn of it by the id before it names any of them again (each use
 * of a dead handle is a crash inside libcuda on a GPU: the host driver
 * counts them), settle what was pending, and keep live memory live. */
#include <time.h>

#include "pool_test.h"

static void open_reset(struct pt *t, unsigned front, bool background)
{
	struct pt_setup su = {.va_pages = 64, .front_entries = front,
			      .small_max = front ? 64 * PT_KiB : 0,
			      .grain = front ? 4 * PT_KiB : 0, .background = background};
	pt_open(t, &su);
}

static void no_dead_call(struct pt *t, int line)
{
	cr_assert_eq(vpmm_host_dead_calls(t->drv), 0,
		     "line %d: %lu driver call(s) named a stream or event of the ended context",
		     line, vpmm_host_dead_calls(t->drv));
}
#define NO_DEAD_CALL(t) no_dead_call((t), __LINE__)

/* [2][1], free the 2, +3: the 2 pages move behind the guard, a zombie
 * holding s's event until s's work completes. */
static CUdeviceptr small_malloc(struct pt *t, size_t bytes, CUstream s)
{
	CUdeviceptr p = 0;
	cr_assert_eq(vpmm_pool_malloc(t->pool, bytes, s, &p), 0);
	return p;
}

static void make_zombie(struct pt *t, CUstream s)
{
	CUdeviceptr old = PT_MALLOC(t, 2, s);
	PT_MALLOC(t, 1, s);
	PT_FREE(t, old, s);
	PT_MALLOC(t, 3, s);
	cr_assert_eq(pt_stats(t).zombies, 2 * t->page);
}

Test(reset, pending_frees_settle_and_dead_events_are_not_named)
{
	struct pt t;
	open_reset(&t, 0, false);
	CUstream a = vpmm_host_stream_create(t.drv), b = vpmm_host_stream_create(t.drv);
	make_zombie(&t, b);
	CUdeviceptr x = PT_MALLOC(&t, 1, a); /* live across the reset */
	*(volatile uint32_t *)x = 0x5eed;
	CUdeviceptr y = PT_MALLOC(&t, 2, a);
	PT_FREE(&t, y, a); /* pending on a: its event never completes now */
	struct vpmm_stats s0 = pt_stats(&t);

	vpmm_host_ctx_reset(t.drv, true);
	CUstream c = vpmm_host_stream_create(t.drv);
	/* Another stream's request: a's pending pages are settled, not
	 * waited for, and nothing is recorded on a or queried of its event. */
	CUdeviceptr p = PT_MALLOC(&t, 2, c);
	NO_DEAD_CALL(&t);
	cr_assert_eq(p, y, "a's pages, settled by the reset, were not reused");
	cr_assert_eq(pt_stats(&t).mapped, s0.mapped, "the pool grew");
	/* The zombie's event died complete: it is unmapped (by the malloc's
	 * phase 0 already, or now). */
	cr_assert_geq(vpmm_pool_reclaim(t.pool), 0);
	cr_assert_eq(pt_stats(&t).zombies, 0);
	NO_DEAD_CALL(&t);
	/* Live memory stays live, mapped and whole. */
	cr_assert_eq(*(volatile uint32_t *)x, 0x5eed);
	PT_FREE(&t, x, c);
	PT_FREE(&t, p, c);
	pt_synchronise(&t);
	cr_assert_geq(vpmm_pool_trim(t.pool, 0), 0);
	NO_DEAD_CALL(&t);
	/* The program's stream handles of before are gone from the pool. */
	cr_assert_eq(pt_stats(&t).streams, 1, "%llu stream records",
		     (unsigned long long)pt_stats(&t).streams);
	pt_close(&t);
}

Test(reset, parked_frees_and_small_blocks_settle)
{
	struct pt t;
	open_reset(&t, 16, false);
	CUstream a = vpmm_host_stream_create(t.drv), b = vpmm_host_stream_create(t.drv);
	CUdeviceptr big = PT_MALLOC(&t, 2, a);
	CUdeviceptr small = small_malloc(&t, 1024, b), keep = small_malloc(&t, 1024, b);
	PT_FREE(&t, big, a);   /* parked in a's cache */
	PT_FREE(&t, small, b); /* parked in b's */
	struct vpmm_stats s0 = pt_stats(&t);

	vpmm_host_ctx_reset(t.drv, true);
	CUstream c = vpmm_host_stream_create(t.drv);
	CUdeviceptr p = PT_MALLOC(&t, 2, c);
	NO_DEAD_CALL(&t);
	cr_assert_eq(p, big, "a's parked pages were not settled for c");
	cr_assert_eq(pt_stats(&t).mapped, s0.mapped, "the pool grew");
	PT_FREE(&t, keep, c); /* a block of b's slab, freed on the next context's stream */
	PT_FREE(&t, p, c);
	CUdeviceptr q = small_malloc(&t, 1024, c);
	PT_FREE(&t, q, c);
	pt_synchronise(&t);
	cr_assert_geq(vpmm_pool_reclaim(t.pool), 0);
	NO_DEAD_CALL(&t);
	pt_close(&t);
}

/* Between the reset and the context's remaking the id answers
 * CUDA_ERROR_CONTEXT_IS_DESTROYED: that is the end already, and the id of
 * the context made again is the first one seen, not a second end. */
Test(reset, destroyed_until_made_again)
{
	struct pt t;
	open_reset(&t, 0, false);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUdeviceptr y = PT_MALLOC(&t, 2, a);
	PT_FREE(&t, y, a);

	vpmm_host_ctx_reset(t.drv, false);
	CUdeviceptr p = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	cr_assert_eq(p, y, "a's pages were not settled");
	NO_DEAD_CALL(&t);
	vpmm_host_ctx_remake(t.drv);
	CUstream c = vpmm_host_stream_create(t.drv);
	CUdeviceptr q = PT_MALLOC(&t, 1, c);
	PT_FREE(&t, q, c); /* recorded in the new context */
	PT_FREE(&t, p, VPMM_NO_STREAM);
	cr_assert_eq(pt_stats(&t).streams, 1, "c was forgotten as if the context ended twice");
	pt_synchronise(&t);
	NO_DEAD_CALL(&t);
	pt_close(&t);
}

/* The background thread polls a zombie's event every 100 us: after the
 * reset its next pass must learn of it first, and unmap the zombie. A
 * reset that lands between a pass's check of the context and its query
 * cannot be told apart by any check (on a GPU, the program's race: a reset
 * beside another thread's CUDA calls), and made this test fail 1 run in
 * 200 under ASan; so the reset is made while the pool holds the thread
 * off (the pause takes the pool's lock, which a pass holds from its check
 * to its query), and nothing tells the pool of it: the next pass must learn
 * it by the context's id. */
Test(reset, the_background_thread_checks_first)
{
	struct pt t;
	open_reset(&t, 0, true);
	CUstream b = vpmm_host_stream_create(t.drv);
	make_zombie(&t, b);
	vpmm_pool_pause(t.pool, true);
	vpmm_host_ctx_reset(t.drv, true);
	vpmm_pool_pause(t.pool, false);
	struct timespec pause = {0, 1000 * 1000};
	for (int i = 0; i < 2000 && pt_stats(&t).zombies; i++)
		nanosleep(&pause, NULL);
	NO_DEAD_CALL(&t);
	cr_assert_eq(pt_stats(&t).zombies, 0, "the zombie of the ended context stayed");
	pt_close(&t);
}

/* While the program destroys the pool's context (the shim's hook pauses the
 * pool until the real call returned), the background thread makes no
 * driver call: a zombie's event it queried then could die inside the
 * query. It goes on once resumed. */
Test(reset, a_paused_thread_stays_out_of_the_driver)
{
	struct pt t;
	open_reset(&t, 0, true);
	CUstream b = vpmm_host_stream_create(t.drv);
	make_zombie(&t, b);
	struct timespec pause = {0, 1000 * 1000};
	unsigned long q0 = vpmm_host_calls(t.drv, VPMM_OP_EVENT_QUERY);
	for (int i = 0; i < 200 && vpmm_host_calls(t.drv, VPMM_OP_EVENT_QUERY) == q0; i++)
		nanosleep(&pause, NULL);
	cr_assert_gt(vpmm_host_calls(t.drv, VPMM_OP_EVENT_QUERY), q0,
		     "the thread does not poll the zombie's event: nothing to pause");
	vpmm_pool_pause(t.pool, true);
	unsigned long calls = 0;
	for (int op = 0; op < VPMM_OP_COUNT; op++)
		calls += vpmm_host_calls(t.drv, (enum vpmm_op)op);
	for (int i = 0; i < 30; i++)
		nanosleep(&pause, NULL);
	unsigned long after = 0;
	for (int op = 0; op < VPMM_OP_COUNT; op++)
		after += vpmm_host_calls(t.drv, (enum vpmm_op)op);
	cr_assert_eq(after, calls, "%lu driver calls while paused", after - calls);
	vpmm_host_complete_all(t.drv);
	vpmm_pool_pause(t.pool, false);
	for (int i = 0; i < 2000 && pt_stats(&t).zombies; i++)
		nanosleep(&pause, NULL);
	cr_assert_eq(pt_stats(&t).zombies, 0, "the thread did not go on");
	pt_close(&t);
}
