/* host_device.c — the device's own timing on the host driver (host_device.h):
 * a hook before every driver call and a thread that complete streams, move
 * the tenant and slow the calls down at random moments.
 *
 * Owns: struct vpmm_host_device. Calls: driver_host.h's controls only.
 */
#include "host_device.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct vpmm_host_device {
	vpmm_driver *drv;
	struct vpmm_host_device_opts o;
	uint64_t draws;       /* atomic: how many draws were made */
	bool quiet, stopping; /* atomic */
	/* atomic: the thread is past its check of quiet, acting; quiet waits
	 * for it to finish, so that nothing moves once quiet returns */
	bool acting;
	unsigned hooks_in; /* atomic: hooks past their check of quiet, likewise */
	pthread_t thread;
	bool thread_running;
	uint64_t completed, tenant_moves, yields, sleeps, interludes; /* atomic */
};

/* The interlude's own driver calls do not start another one. */
static __thread bool in_interlude;

/* Draw n: splitmix64 of (seed, n). Threads draw from one counter, so the
 * sequence of draws is the seed's whatever the threads. */
static uint64_t draw(struct vpmm_host_device *dev)
{
	uint64_t n = __atomic_fetch_add(&dev->draws, 1, __ATOMIC_RELAXED);
	uint64_t z = dev->o.seed + (n + 1) * 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static bool chance(struct vpmm_host_device *dev, unsigned per_mille)
{
	return per_mille && draw(dev) % 1000 < per_mille;
}

static void count(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static void tenant_move(struct vpmm_host_device *dev)
{
	size_t lo = dev->o.tenant_lo, hi = dev->o.tenant_hi;
	size_t span = hi > lo ? hi - lo : 0;
	vpmm_host_set_tenant(dev->drv, lo + (span ? (size_t)(draw(dev) % (span + 1)) : 0));
	count(&dev->tenant_moves, 1);
}

static void complete_one(struct vpmm_host_device *dev)
{
	count(&dev->completed, vpmm_host_complete_nth(dev->drv, (size_t)draw(dev)));
}

static void complete_all(struct vpmm_host_device *dev)
{
	count(&dev->completed, vpmm_host_complete_all(dev->drv));
}

static void sleep_us(unsigned us)
{
	struct timespec ts = {0, (long)us * 1000};
	nanosleep(&ts, NULL);
}

static bool slow_op(enum vpmm_op op)
{
	switch (op) {
	case VPMM_OP_VA_RESERVE:
	case VPMM_OP_MEM_CREATE:
	case VPMM_OP_MEM_RELEASE:
	case VPMM_OP_MAP:
	case VPMM_OP_UNMAP:
	case VPMM_OP_SET_ACCESS:
	case VPMM_OP_EVENT_SYNC:
		return true;
	default:
		return false;
	}
}

static void hook_act(struct vpmm_host_device *dev, enum vpmm_op op);

/* Counted in before its check of quiet, as the thread's turn (device_main),
 * so that quiet also waits for hooks running on other threads. */
static void hook(void *arg, enum vpmm_op op)
{
	struct vpmm_host_device *dev = arg;
	__atomic_add_fetch(&dev->hooks_in, 1, __ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&dev->quiet, __ATOMIC_SEQ_CST))
		hook_act(dev, op);
	__atomic_sub_fetch(&dev->hooks_in, 1, __ATOMIC_RELEASE);
}

static void hook_act(struct vpmm_host_device *dev, enum vpmm_op op)
{
	if (dev->o.tenant_hi &&
	    (chance(dev, dev->o.tenant_move) ||
	     (op == VPMM_OP_MEM_CREATE && chance(dev, dev->o.tenant_create))))
		tenant_move(dev);
	if (chance(dev, dev->o.complete_all))
		complete_all(dev);
	else if (chance(dev, dev->o.complete_one))
		complete_one(dev);
	if ((op == VPMM_OP_MEM_CREATE || op == VPMM_OP_MAP) && dev->o.interlude_fn &&
	    !in_interlude && chance(dev, dev->o.interlude)) {
		in_interlude = true;
		count(&dev->interludes, 1);
		dev->o.interlude_fn(dev->o.interlude_arg);
		in_interlude = false;
	}
	if (!slow_op(op))
		return;
	if (chance(dev, dev->o.sleep)) {
		count(&dev->sleeps, 1);
		unsigned most = dev->o.sleep_max_us ? dev->o.sleep_max_us : 1;
		sleep_us(1 + (unsigned)(draw(dev) % most));
	} else if (chance(dev, dev->o.yield)) {
		count(&dev->yields, 1);
		sched_yield();
	}
}

static void *device_main(void *arg)
{
	struct vpmm_host_device *dev = arg;
	while (!__atomic_load_n(&dev->stopping, __ATOMIC_ACQUIRE)) {
		sleep_us((unsigned)(draw(dev) % dev->o.period_us));
		/* acting before the check, both sequentially consistent: either
		 * this thread sees quiet or quiet sees it acting, and waits */
		__atomic_store_n(&dev->acting, true, __ATOMIC_SEQ_CST);
		if (!__atomic_load_n(&dev->quiet, __ATOMIC_SEQ_CST)) {
			uint64_t r = draw(dev);
			if (r % 8 == 0)
				complete_all(dev);
			else
				complete_one(dev);
			if (dev->o.tenant_hi && (r >> 8) % 4 == 0)
				tenant_move(dev);
		}
		__atomic_store_n(&dev->acting, false, __ATOMIC_RELEASE);
	}
	return NULL;
}

int vpmm_host_device_start(vpmm_driver *d, const struct vpmm_host_device_opts *o,
			   struct vpmm_host_device **out)
{
	if (!d || !o || !out || !d->name || strcmp(d->name, "host"))
		return -EINVAL;
	struct vpmm_host_device *dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->drv = d;
	dev->o = *o;
	if (o->period_us) {
		int rc = pthread_create(&dev->thread, NULL, device_main, dev);
		if (rc) {
			free(dev);
			return -rc;
		}
		dev->thread_running = true;
	}
	vpmm_host_set_hook(d, hook, dev);
	*out = dev;
	return 0;
}

void vpmm_host_device_quiet(struct vpmm_host_device *dev, bool quiet)
{
	__atomic_store_n(&dev->quiet, quiet, __ATOMIC_SEQ_CST);
	/* A turn of the thread, and hooks on other threads, that began before
	 * they saw quiet end first. Not from inside a hook (interlude_fn):
	 * it would wait for itself. */
	while (quiet && (__atomic_load_n(&dev->acting, __ATOMIC_SEQ_CST) ||
			 __atomic_load_n(&dev->hooks_in, __ATOMIC_SEQ_CST)))
		sched_yield();
}

void vpmm_host_device_stop(struct vpmm_host_device *dev,
			   struct vpmm_host_device_stats *st)
{
	if (!dev)
		return;
	__atomic_store_n(&dev->stopping, true, __ATOMIC_RELEASE);
	if (dev->thread_running)
		pthread_join(dev->thread, NULL);
	vpmm_host_set_hook(dev->drv, NULL, NULL);
	if (st)
		*st = (struct vpmm_host_device_stats){
			.completed = dev->completed,
			.tenant_moves = dev->tenant_moves,
			.yields = dev->yields,
			.sleeps = dev->sleeps,
			.interludes = dev->interludes,
		};
	free(dev);
}
