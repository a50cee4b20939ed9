/* syncfree_choice.c — with more than VPMM_FENCE_ALWAYS_MAX (32)
 * non-blocking streams, synchronous frees fence them only while that costs
 * the host less than synchronising (shim/fence_choice.c): while a
 * synchronisation would wait for the device. On the fake libcuda a lazy
 * device (work runs when the program synchronises) is behind, and a
 * synchronisation that finds work to run takes the time
 * fakecuda_set_sync_cost gives it; an eager one (fakecuda_set_eager) keeps
 * up, and its synchronisations find nothing to run.
 */
#include "syncfree.h"

void fakecuda_set_eager(int on);
void fakecuda_set_sync_cost(unsigned us);

/* n pairs of a malloc and its free, the free after work queued on the
 * legacy stream; how many of the frees synchronised, and (*probes) how
 * many of those to measure. */
static long long pairs(int n, long long *probes)
{
	long long h = hook_calls("sync_free"), p = hook_calls("fence_probe");
	for (int i = 0; i < n; i++) {
		CUdeviceptr a;
		CHECK_EQ(cuMemAlloc(&a, P), 0);
		CUevent ev = work_on(NULL);
		CHECK_EQ(cuMemFree(a), 0);
		cuEventDestroy(ev);
	}
	*probes = hook_calls("fence_probe") - p;
	return hook_calls("sync_free") - h;
}

void choice(void)
{
	enum { NB = 192 }; /* the most that may fence: 96 us of fences a free */
	static CUstream nb[NB];
	long long s, probes;
	start();
	controls_init(); /* this file's copy (shimtest.h keeps them per file) */
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], CU_STREAM_NON_BLOCKING), 0);
	bool counted = !device_mode() && expect_pool();

	/* Behind: one free in 16 synchronises to measure, waits 2 ms, and
	 * the others keep fencing. */
	fakecuda_set_sync_cost(2000);
	s = pairs(40, &probes);
	if (counted) {
		CHECK_EQ(s, 2);
		CHECK_EQ(probes, 2);
	}

	/* Keeping up: a probe takes the device no time, and after two the
	 * frees synchronise. A preempted one may look long and turn them
	 * back to the fences for a while: the bound leaves room for that. */
	fakecuda_set_eager(1);
	s = pairs(100, &probes);
	if (counted) {
		CHECK(s >= 60 && s < 100);
		CHECK(probes <= 2 + (100 - s) / 16);
	}

	/* Synchronising, frees still order a late write before the new
	 * owner's (late_write's checks). */
	fakecuda_set_eager(0);
	long long h = hook_calls("sync_free");
	bool reused = late_write(nb[0], nb[1]);
	if (counted) {
		CHECK(reused);
		CHECK(hook_calls("sync_free") > h);
	}

	/* Behind again: a synchronisation that waits 2 ms outweighs the
	 * fences, and after one or two the frees fence again, but for the
	 * probes. */
	s = pairs(20, &probes);
	if (counted)
		CHECK(s >= 1 && s - probes <= 2);
	s = pairs(32, &probes);
	if (counted)
		CHECK(s == probes && s <= 2);
	fakecuda_set_sync_cost(0);

	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamDestroy(nb[i]), 0);
	CHECK_EQ(pool_stats(0).failures, 0);
}
