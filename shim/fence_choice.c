/* fence_choice.c — whether the synchronous calls of a context with many
 * non-blocking streams fence them or synchronise the context: whichever
 * costs the host less, learnt from synchronisations timed as they happen.
 *
 * Owns: per device, the balance in ns of what a synchronisation costs
 * against the fences, the count of frees fenced since the last probe, and
 * whether a probe is out. Calls nothing (fence.c asks and tells it, with
 * the streams counted; alloc.c times the synchronisations).
 *
 * Decisions, and why (docs/shim.md, "Fences or a synchronisation"):
 *  - The fences cost the host about FENCE_STREAM_NS a stream a free (a
 *    capture query each on every synchronous call, a record and a wait
 *    each for a run of frees, a wait each after a malloc). A
 *    synchronisation costs the host its duration: about 15 us while the
 *    GPU keeps up with the host, what is queued on every stream while it
 *    does not. So the fences pay over many streams only while the GPU runs
 *    behind. Measured on an H200, PyTorch without its cache, a step of
 *    linear layers with 128 streams: with the host setting the pace, 5.5-
 *    8.8 ms a step fenced, 3.5-3.8 synchronising; with the GPU setting it,
 *    9.7-10.4 against 11.3-11.5.
 *  - Up to VPMM_FENCE_ALWAYS_MAX streams every call fences: the two cost
 *    about the same with the host setting the pace (16 and 32 streams),
 *    and the fences win with the GPU setting it.
 *  - Past it, the balance decides, for mallocs and frees alike. Each free
 *    that synchronises adds its duration less the fences' cost: a run of
 *    frees finds the GPU idle after the first, so the durations are
 *    summed, and one long wait outweighs the quick ones after it. While
 *    the frees fence, one in PROBE_EVERY synchronises instead (a probe),
 *    and counts for the PROBE_EVERY: the only measure of what a
 *    synchronisation would cost now. Whether the legacy stream has passed
 *    its last record is not one: work on the non-blocking streams alone
 *    leaves it idle while a synchronisation would wait.
 *  - The balance starts in favour of the fences (as before there was a
 *    choice) and is held within BALANCE_MAX either way, so that a change
 *    of pace turns it within a few probes or a few dozen frees.
 */
#include <stdatomic.h>

#include "devices.h"
#include "live_streams.h"

/* The fences' host time, a stream a free: 0.3-0.6 us measured in the step
 * above (bench/fence_streams.py). */
#define FENCE_STREAM_NS 500
/* The most the balance holds either way, and the most one
 * synchronisation counts for. */
#define BALANCE_MAX 1000000ll
/* One fenced free in this many synchronises instead, to measure. */
#define PROBE_EVERY 16

static struct {
	/* BALANCE_MAX less the balance, so that zero, the start, favours
	 * the fences fully. */
	_Atomic long long spent;
	atomic_uint since_probe;
	atomic_bool probing;
} dev_choice[VPMM_MAX_DEVICES];

static bool counted(int dev, unsigned streams)
{
	return streams > VPMM_FENCE_ALWAYS_MAX && dev >= 0 && dev < VPMM_MAX_DEVICES;
}

bool vpmm_fence_choice_fences(int dev, unsigned streams)
{
	return !counted(dev, streams) ||
	       atomic_load_explicit(&dev_choice[dev].spent, memory_order_relaxed) <= BALANCE_MAX;
}

bool vpmm_fence_choice_probe(int dev, unsigned streams)
{
	if (!counted(dev, streams) ||
	    atomic_fetch_add_explicit(&dev_choice[dev].since_probe, 1, memory_order_relaxed) + 1 <
		    PROBE_EVERY)
		return false;
	atomic_store_explicit(&dev_choice[dev].since_probe, 0, memory_order_relaxed);
	atomic_store_explicit(&dev_choice[dev].probing, true, memory_order_relaxed);
	return true;
}

void vpmm_fence_choice_synced(int dev, unsigned streams, unsigned long long ns)
{
	if (!counted(dev, streams))
		return;
	long long took = ns > (unsigned long long)BALANCE_MAX ? BALANCE_MAX : (long long)ns;
	long long gain = took - (long long)streams * FENCE_STREAM_NS;
	if (atomic_exchange_explicit(&dev_choice[dev].probing, false, memory_order_relaxed))
		gain *= PROBE_EVERY;
	long long old = atomic_load_explicit(&dev_choice[dev].spent, memory_order_relaxed), now;
	do {
		now = old - gain;
		if (now < 0)
			now = 0;
		if (now > 2 * BALANCE_MAX)
			now = 2 * BALANCE_MAX;
	} while (!atomic_compare_exchange_weak_explicit(&dev_choice[dev].spent, &old, now,
							 memory_order_relaxed, memory_order_relaxed));
}
