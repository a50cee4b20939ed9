/* drv_ends.c — the driver-API program's scenarios (drv_prog.c runs them)
 * where a context ends and the pool could not settle first: a sticky
 * error fails the synchronisation before the reset, and pool memory is
 * freed on a stream while the pool has lost its context (some of it live
 * across that end, which keeps its bytes); a cuCtxDestroy the driver
 * refuses, which ends nothing. */
#include "shimtest.h"

#define P ((size_t)64 << 10)

void primary_reset_sticky(void);
void free_without_context(void);
void destroy_refused(void);
void destroy_refused_primary(void);

/* n allocations of 1-3 pages on s, each written, checked and freed on s at
 * once: the pool goes on serving a stream after what ended or did not. */
static void serve(CUstream s, int n)
{
	CUdeviceptr x;
	for (int i = 0; i < n; i++) {
		CHECK_EQ(cuMemAllocAsync(&x, (size_t)(1 + i % 3) * P, s), 0);
		touch((void *)(uintptr_t)x, (size_t)(1 + i % 3) * P, (unsigned char)i);
		CHECK_EQ(cuMemFreeAsync(x, s), 0);
	}
}

/* The primary context reset while a sticky error (a kernel's fault) makes
 * every synchronisation fail: the shim's hook cannot settle the frees
 * pending on the context's stream before the real call, so the pool must
 * let go of them after it, and never query those streams' events again
 * (the fake counts each as dead_handle: a crash inside libcuda). */
void primary_reset_sticky(void)
{
	CUcontext c0, again;
	CUstream s, s2;
	CUdeviceptr a, b, x;
	void (*sticky)(int);
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	controls_init();
	*(void **)&sticky = dlsym(dlopen("libcuda.so.1", RTLD_NOW), "fakecuda_sticky");
	CHECK(sticky != NULL);
	CHECK_EQ(cuMemAllocAsync(&a, 2 * P, s), 0);
	CHECK_EQ(cuMemAllocAsync(&b, 3 * P, s), 0);
	CHECK_EQ(cuMemFreeAsync(a, s), 0);
	CHECK_EQ(cuMemFreeAsync(b, s), 0); /* pending on s at the reset */
	sticky(CUDA_ERROR_ILLEGAL_ADDRESS);
	CHECK_EQ(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
	CHECK_EQ(cuDevicePrimaryCtxReset(0), 0); /* the remedy for a sticky error */
	CHECK_EQ(cuDevicePrimaryCtxRetain(&again, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(again), 0);
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	serve(s2, 8);
	CHECK_EQ(cuMemAlloc(&x, 6 * P), 0);
	CHECK_EQ(cuMemFree(x), 0);
	CHECK_EQ(fake_calls("dead_handle"), 0);
	pool_clean(0);
}

/* Pool memory freed on a stream while the pool has no context (its own was
 * destroyed, the primary one is inactive): the stream's context becomes the
 * pool's. Before, the pool took the stream and recorded its events there,
 * then went on in the next context that allocated; the events made for the
 * first came back from the cache and were recorded on the second's
 * streams, refused every time. */
void free_without_context(void)
{
	CUcontext c1, c2, c3;
	CUstream s2, s3;
	CUdeviceptr p, q, x;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuCtxCreate_v2(&c1, 0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc(&p, 2 * P), 0); /* the pool, in c1 */
	CHECK_EQ(cuMemAlloc(&q, 3 * P), 0);
	touch((void *)(uintptr_t)q, 3 * P, 9);
	CHECK_EQ(cuCtxDestroy(c1), 0); /* the pool has no context now */
	if (expect_pool()) /* live across the end: mapped, its bytes kept */
		intact((void *)(uintptr_t)q, 3 * P, 9);
	CHECK_EQ(cuCtxCreate_v2(&c2, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	CHECK_EQ(cuMemFreeAsync(p, s2), 0);
	CHECK_EQ(cuMemFreeAsync(q, s2), 0);
	CHECK_EQ(cuStreamSynchronize(s2), 0);
	CHECK_EQ(cuCtxCreate_v2(&c3, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s3, 0), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&x, (size_t)(1 + i % 3) * P, s3), 0);
		touch((void *)(uintptr_t)x, (size_t)(1 + i % 3) * P, (unsigned char)i);
		CHECK_EQ(cuMemFreeAsync(x, s3), 0);
		CHECK_EQ(cuStreamSynchronize(s3), 0);
		CHECK_EQ(cuMemAlloc(&x, 2 * P), 0);
		CHECK_EQ(cuMemFree(x), 0);
	}
	CHECK_EQ(fake_calls("record_refused"), 0);
	CHECK_EQ(fake_calls("dead_handle"), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* The program's cuCtxDestroy of the pool's context, refused by the driver
 * (whatever its reason): the context, its streams and their work live on,
 * and so must the pool in it, its frees pending on those streams included.
 * With the primary context active the pool had somewhere else to go. What
 * the shim let go of before the call stays gone: the context's streams in
 * its table (a stream it then meets is one it did not see made, and
 * synchronous frees synchronise the whole context from then on: slower,
 * not wrong). */
static void refused(bool primary)
{
	CUcontext c0, uc;
	CUstream s;
	CUdeviceptr a, b, x;
	void (*refuse)(int);
	CHECK_EQ(cuInit(0), 0);
	if (primary)
		CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	controls_init();
	*(void **)&refuse = dlsym(dlopen("libcuda.so.1", RTLD_NOW), "fakecuda_refuse_destroy");
	CHECK(refuse != NULL);
	CHECK_EQ(cuMemAllocAsync(&a, 2 * P, s), 0); /* the pool, in uc */
	CHECK_EQ(cuMemAllocAsync(&b, 3 * P, s), 0);
	touch((void *)(uintptr_t)b, 3 * P, 5);
	CHECK_EQ(cuMemFreeAsync(a, s), 0); /* pending on s at the refusal */
	refuse(CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(cuCtxDestroy(uc), CUDA_ERROR_INVALID_VALUE);
	serve(s, 8);
	CHECK_EQ(cuMemAlloc(&x, 6 * P), 0);
	CHECK_EQ(cuMemFree(x), 0);
	intact((void *)(uintptr_t)b, 3 * P, 5);
	CHECK_EQ(cuMemFreeAsync(b, s), 0);
	CHECK_EQ(cuStreamSynchronize(s), 0);
	CHECK_EQ(cuCtxDestroy(uc), 0); /* now it ends */
	if (primary)
		CHECK_EQ(cuCtxSetCurrent(c0), 0);
	else
		CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	serve(s, 4);
	CHECK_EQ(cuStreamSynchronize(s), 0);
	CHECK_EQ(fake_calls("record_refused"), 0);
	CHECK_EQ(fake_calls("dead_handle"), 0);
	pool_clean(0);
}

void destroy_refused(void)
{
	refused(false);
}

void destroy_refused_primary(void)
{
	refused(true);
}
