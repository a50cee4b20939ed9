/* syncfree_owed.c — the record that synchronous frees owe the legacy
 * stream, with blocking streams only: made by the next malloc on it that
 * may hand out their memory, once for a run of frees, and never where
 * that last record already orders what the malloc hands out. Scenarios of
 * syncfree_prog (helpers in syncfree.h). */
#include "syncfree.h"

/* start(), and this file's own copy of the test controls (shimtest.h
 * keeps them per file). */
static void begin(void)
{
	start();
	controls_init();
}

/* The record a synchronous free owes the legacy stream is made by the
 * next malloc on it, once for a run of frees: the sync malloc (how 0), a
 * stream-ordered one on the legacy stream (1: CU_STREAM_LEGACY, 2: 0), one
 * on the per-thread default stream (3), which the shim serves as a
 * synchronous caller. (A malloc on another stream does not get the memory
 * here before it settled.) Each time, two allocations written
 * late on blocking stream `late`, both freed, then one of the same size
 * taken and written on blocking stream `next`, which the device runs
 * first: with no action on the legacy stream between the frees and the new
 * write, it would not wait for the late one. Returns whether the memory
 * was reused. */
static bool owed_write(CUstream late, CUstream next, int how)
{
	CUdeviceptr a[2], b;
	for (int i = 0; i < 2; i++)
		CHECK_EQ(cuMemAlloc(&a[i], 4 * P), 0);
	CUevent old = work_on(late);
	long long records = hook_calls("fence_owed");
	for (int i = 0; i < 2; i++)
		CHECK_EQ(cuMemFree(a[i]), 0);
	static const CUstream on[] = {NULL, CU_STREAM_LEGACY, NULL, CU_STREAM_PER_THREAD};
	if (how == 0)
		CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
	else
		CHECK_EQ(cuMemAllocAsync(&b, 4 * P, on[how]), 0);
	/* one record for the two frees, made by this malloc */
	if (!device_mode() && expect_pool())
		CHECK_EQ(hook_calls("fence_owed") - records, 1);
	new_write(old, next, b);
	return b == a[0] || b == a[1];
}

void owed(void)
{
	CUstream b1, b2;
	begin();
	CHECK_EQ(cuStreamCreate(&b1, 0), 0);
	CHECK_EQ(cuStreamCreate(&b2, 0), 0);
	for (int how = 0; how < 4; how++) {
		bool reused = owed_write(b1, b2, how);
		reused &= owed_write(b2, b1, how);
		/* at once, in the legacy stream's order */
		if (!device_mode() && expect_pool())
			CHECK(reused);
	}
	expect_fenced();
}

/* With blocking streams only, the record that frees owe the legacy stream
 * is made by the next synchronous malloc that may hand out their memory:
 * one of memory freed before the last record, while a free since is
 * owed, makes none, and its new owner is still ordered after the old one
 * (by that last record); the next malloc of the memory freed since makes
 * it. */
void owed_clean(void)
{
	CUstream b1, b2;
	CUdeviceptr a, c, g, x, h, b, d, y;
	begin();
	CHECK_EQ(cuStreamCreate(&b1, 0), 0);
	CHECK_EQ(cuStreamCreate(&b2, 0), 0);
	CHECK_EQ(cuMemAlloc(&a, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&c, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&g, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&x, 2 * P), 0);
	CHECK_EQ(cuMemAlloc(&h, P), 0);
	CUevent old_ac = work_on(b1);
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuMemFree(c), 0);
	bool counted = !device_mode() && expect_pool();
	long long owed = hook_calls("fence_owed");
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0); /* a's or c's pages: recorded */
	if (counted)
		CHECK_EQ(hook_calls("fence_owed") - owed, 1);
	CUevent old_x = work_on(b1);
	CHECK_EQ(cuMemFree(x), 0);
	owed = hook_calls("fence_owed");
	long long records = fake_calls("cuEventRecord");
	long long spared = hook_calls("fence_spared");
	CHECK_EQ(cuMemAlloc(&d, 4 * P), 0); /* the rest of a and c: none */
	if (counted) {
		CHECK_EQ(hook_calls("fence_spared") - spared, 1);
		CHECK(d + 4 * P <= x || x + 2 * P <= d);
		CHECK((a <= d && d < a + 4 * P) || (c <= d && d < c + 4 * P));
		CHECK_EQ(hook_calls("fence_owed"), owed);
		CHECK_EQ(fake_calls("cuEventRecord"), records);
	}
	expect_ordered(old_ac, b2); /* after the record b's malloc made */
	CHECK_EQ(cuMemAlloc(&y, 2 * P), 0); /* x's pages: recorded */
	if (counted) {
		CHECK_EQ(y, x);
		CHECK_EQ(hook_calls("fence_owed") - owed, 1);
	}
	new_write(old_x, b2, y);
	CHECK_EQ(cuMemFree(b), 0);
	CHECK_EQ(cuMemFree(d), 0);
	CHECK_EQ(cuMemFree(g), 0);
	CHECK_EQ(cuMemFree(h), 0);
	expect_fenced();
}

/* Blocking streams only: memory a stream-ordered free on the legacy
 * stream gave back names no range (an obligation), and a synchronous
 * malloc that takes it makes the record owed, though it overlaps no
 * range freed since the last one; its writer is ordered after the old
 * one. */
void owed_obligation(void)
{
	CUstream b1, b2;
	CUdeviceptr a, g, x, h, f, y;
	begin();
	CHECK_EQ(cuStreamCreate(&b1, 0), 0);
	CHECK_EQ(cuStreamCreate(&b2, 0), 0);
	CHECK_EQ(cuMemAlloc(&a, 2 * P), 0);
	CHECK_EQ(cuMemAlloc(&g, P), 0);
	CHECK_EQ(cuMemAlloc(&x, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&h, P), 0);
	CHECK_EQ(cuMemAlloc(&f, P), 0);
	fence_now(&f); /* a record: the last fence */
	CUevent old = work_on(b1);
	CHECK_EQ(cuMemFreeAsync(x, NULL), 0); /* in the legacy stream's order */
	CHECK_EQ(cuMemFree(a), 0);            /* a record owed */
	long long owed = hook_calls("fence_owed");
	CHECK_EQ(cuMemAlloc(&y, 4 * P), 0); /* x's pages */
	if (!device_mode() && expect_pool()) {
		CHECK_EQ(y, x);
		CHECK_EQ(hook_calls("fence_owed") - owed, 1);
	}
	new_write(old, b2, y);
	CHECK_EQ(cuMemFree(g), 0);
	CHECK_EQ(cuMemFree(h), 0);
	CHECK_EQ(cuMemFree(f), 0);
	expect_fenced();
}
