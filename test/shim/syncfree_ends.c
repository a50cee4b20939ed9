/* syncfree_ends.c — the synchronous-free program's scenarios (syncfree_prog.c
 * runs them) where a non-blocking stream ends: between the free and the
 * reuse, before the free with work queued, as the context's last one,
 * before the device has a pool, more than ENDED_MAX of them, with no
 * context current, and across a reset no hook sees. The shim keeps each
 * ended stream's last work as an event for the next wait a free owes
 * (shim/fence.c). */
#include "syncfree.h"

/* start(), and this file's own copy of the test controls (shimtest.h
 * keeps them per file). */
static void begin(void)
{
	start();
	controls_init();
}

/* The late stream is destroyed between the free and the reuse. */
void destroyed(void)
{
	CUstream late, next;
	begin();
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&next, CU_STREAM_NON_BLOCKING), 0);
	late_write_then(late, next, true);
	/* the destroyed stream is out of the fences: still no sync */
	late_write(next, next);
	expect_fenced();
}

/* The same, with no context current when the late stream is destroyed
 * (cuStreamDestroy needs none): the legacy stream that waits for it is
 * still that of the stream's context. */
/* A non-blocking stream destroyed with work still queued, after a fence
 * and before any free: the later free's fence pays the streams still
 * there and the kept event of this one's last work, recorded at its
 * end. */
void destroyed_busy(void)
{
	CUstream gate, late, next;
	CUdeviceptr a, x, b;
	begin();
	CHECK_EQ(cuStreamCreate(&gate, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&next, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuMemAlloc(&a, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&x, P), 0);
	CHECK_EQ(cuMemFree(x), 0);
	CHECK_EQ(cuMemAlloc(&x, P), 0); /* a fence: nothing owed after it */
	CUevent g = work_on(gate);
	CHECK_EQ(cuStreamWaitEvent(late, g, 0), 0);
	CUevent old = work_on(late); /* a's last write, behind gate's */
	CHECK_EQ(cuStreamDestroy(late), 0); /* its work still queued */
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
	CHECK_EQ(cuStreamSynchronize(gate), 0);
	CHECK_EQ(cuStreamSynchronize(NULL), 0);
	new_write(old, next, b);
	cuEventDestroy(g);
	CHECK_EQ(cuMemFree(x), 0);
	expect_fenced();
}

/* The context's only non-blocking stream destroyed with its work queued,
 * before the free: no stream is left to wait for, but its kept event
 * still makes the free owe the legacy stream its wait. The new owner
 * allocates synchronously, stream-ordered on the legacy stream, on a
 * blocking stream, or on a non-blocking stream made after the free. */
void destroyed_last(void)
{
	CUstream late, bl, nb;
	CUdeviceptr a, b;
	begin();
	CHECK_EQ(cuStreamCreate(&bl, 0), 0);
	for (int how = 0; how < 4; how++) {
		CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
		CHECK_EQ(cuMemAlloc(&a, 4 * P), 0);
		CUevent old = work_on(late); /* a's last write */
		CHECK_EQ(cuStreamDestroy(late), 0);
		CHECK_EQ(cuMemFree(a), 0);
		CUstream next = how == 2 ? bl : CU_STREAM_LEGACY;
		if (how == 3) {
			CHECK_EQ(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), 0);
			next = nb;
		}
		if (how == 0)
			CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
		else
			CHECK_EQ(cuMemAllocAsync(&b, 4 * P, next), 0);
		if (expect_pool() && how < 2)
			CHECK_EQ(b, a);
		new_write(old, next, b);
		if (how == 3)
			CHECK_EQ(cuStreamDestroy(nb), 0);
	}
	CHECK_EQ(cuStreamDestroy(bl), 0);
	expect_fenced();
}

/* An ended stream's event kept when the primary context is reset unseen
 * (through the private table the CUDA 13 runtime resets through; the
 * hooked reset pays what is owed first): it died with the context, and is
 * neither waited for nor destroyed after. */
void destroyed_reset(void)
{
	const struct {
		size_t size;
		CUresult (*reset)(CUdevice);
	} *table = NULL;
	CUuuid id = {{0}};
	CUstream late;
	CUcontext c;
	CUdeviceptr a, b;
	begin();
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CUevent ev = work_on(late);
	CHECK_EQ(cuStreamDestroy(late), 0);
	CHECK_EQ(cuEventDestroy(ev), 0);
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuGetExportTable((const void **)&table, &id), 0);
	CHECK_EQ(table->reset(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c), 0);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(cuMemAlloc(&b, P), 0);
		CHECK_EQ(cuMemFree(b), 0);
	}
	CHECK_EQ(fake_calls("dead_handle"), 0);
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* A non-blocking stream destroyed before the device has a pool: nothing
 * of its work can touch pool memory, and the legacy stream does not wait
 * for it. Once there is a pool, its last work is kept: the legacy
 * stream waits for it at the next fence a free owes, not at its end; at
 * the ninth end with none such, for all nine (ENDED_MAX). With
 * VPMM_SYNC_FREE=device, never. */
void destroyed_quiet(void)
{
	enum { N = 9 };
	CUstream s, t[N];
	CUdeviceptr a;
	begin();
	CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
	long long waits = fake_calls("cuStreamWaitEvent");
	CHECK_EQ(cuStreamDestroy(s), 0);
	CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
	waits = fake_calls("cuStreamWaitEvent");
	CHECK_EQ(cuStreamDestroy(s), 0);
	CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	if (expect_pool())
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, device_mode() ? 0 : 1);
	for (int i = 0; i < N; i++)
		CHECK_EQ(cuStreamCreate(&t[i], CU_STREAM_NON_BLOCKING), 0);
	waits = fake_calls("cuStreamWaitEvent");
	for (int i = 0; i < N - 1; i++)
		CHECK_EQ(cuStreamDestroy(t[i]), 0);
	CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
	CHECK_EQ(cuStreamDestroy(t[N - 1]), 0);
	if (expect_pool())
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, device_mode() ? 0 : N);
	CHECK_EQ(cuMemFree(a), 0);
	expect_fenced();
}

void destroyed_elsewhere(void)
{
	CUstream late, next;
	CUcontext primary;
	CUdeviceptr a, b;
	begin();
	CHECK_EQ(cuCtxGetCurrent(&primary), 0);
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&next, CU_STREAM_NON_BLOCKING), 0);
	CUevent old = freed_after_work(late, &a);
	CHECK_EQ(cuCtxSetCurrent(NULL), 0);
	CHECK_EQ(cuStreamDestroy(late), 0);
	CHECK_EQ(cuCtxSetCurrent(primary), 0);
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
	if (expect_pool())
		CHECK_EQ(b, a);
	new_write(old, next, b);
	expect_fenced();
}

