/* host_device.h — the device's own timing on the host driver, for tests.
 *
 * On a GPU three things happen on the device's time, not the pool's: work
 * completes (events turn complete while the pool queries, waits or has its
 * lock dropped), another process takes and gives back memory (a
 * cuMemCreate the pool planned for fails with CUDA_ERROR_OUT_OF_MEMORY),
 * and driver calls take tens of microseconds, long enough for the pool's
 * other threads (callers, the reclaimer) to run while one of them has the
 * lock dropped. The host driver does none of this by itself: its streams
 * complete only when a test says so and its calls return at once. This
 * model adds them, at random moments drawn from a seed:
 *
 *  - before any driver call (a hook on the caller's thread): one stream's
 *    queue runs, or every stream's; the tenant moves; before the calls the
 *    pool makes with its lock dropped, the test's own work runs
 *    ("interlude": another thread of the program, at the worst moment);
 *  - in the calls the pool makes with its lock dropped (va_reserve,
 *    mem_create, map, unmap, set_access, mem_release) and in event_sync: the
 *    caller yields or sleeps;
 *  - a thread of its own ("the device") does the first two at random
 *    moments too.
 *
 * The interleavings are not reproducible (threads); the draws are, per
 * seed. Owns only its own state; calls only driver_host.h.
 */
#ifndef VPMM_HOST_DEVICE_H
#define VPMM_HOST_DEVICE_H

#include <stdint.h>

#include "driver_host.h"

struct vpmm_host_device_opts {
	uint64_t seed;
	/* Per 1000 driver calls: before the call, a random stream's queue
	 * runs (complete_one), or every stream's (complete_all). */
	unsigned complete_one, complete_all;
	/* Per 1000 slow calls (above): the caller yields (yield), or sleeps
	 * up to sleep_max_us (sleep). */
	unsigned yield, sleep, sleep_max_us;
	/* Per 1000 driver calls (and per 1000 mem_create calls once more,
	 * tenant_create): the tenant moves to a random amount within
	 * [tenant_lo, tenant_hi]. Never, if tenant_hi is 0. */
	unsigned tenant_move, tenant_create;
	size_t tenant_lo, tenant_hi;
	/* Per 1000 calls of mem_create and map, which the pool makes only with
	 * its lock dropped (defrag.c): interlude(interlude_arg) runs first, on
	 * the caller's thread, as another thread of the program would run
	 * while the pool is in the driver. It may call the pool; the driver
	 * calls it makes do not run it again. */
	unsigned interlude;
	void (*interlude_fn)(void *arg);
	void *interlude_arg;
	/* The device's thread: every 0..period_us microseconds it completes a
	 * random stream (or, one time in eight, every stream) and, if the
	 * tenant moves, moves it one time in four. 0: no thread. */
	unsigned period_us;
};

struct vpmm_host_device_stats {
	uint64_t completed; /* events completed by the model */
	uint64_t tenant_moves;
	uint64_t yields, sleeps;
	uint64_t interludes;
};

struct vpmm_host_device;

/* Starts the model on `d` (a host driver) and sets the driver's hook: call
 * it while no other thread uses the driver. -EINVAL for another driver,
 * -ENOMEM, or a thread that could not start. */
int vpmm_host_device_start(vpmm_driver *d, const struct vpmm_host_device_opts *o,
			   struct vpmm_host_device **out);
/* Quiet (true): the hook and the thread do nothing more until quiet is
 * false again; the tenant stays where it is. Returns once a turn of the
 * thread and the hooks begun before are over. Any thread, but not from
 * inside a hook (an interlude). */
void vpmm_host_device_quiet(struct vpmm_host_device *dev, bool quiet);
/* Stops the thread, takes the hook off and frees the model; its counts into
 * *st (may be NULL). No other thread may use the driver meanwhile (destroy
 * the pool first: its own thread calls the driver). */
void vpmm_host_device_stop(struct vpmm_host_device *dev,
			   struct vpmm_host_device_stats *st);

#endif
