/* test_host_device.c — the host driver's hook, and the device's own timing
 * built on it (host_device.h): the hook runs before every call and may use
 * the controls; the model keeps its tenant within bounds, completes work on
 * its own, falls quiet and stops. */
#include <errno.h>
#include <unistd.h>

#include "host_device.h"
#include "host_test.h"

/* The hook runs before every operation, before the driver's lock: it may
 * use the controls (here: complete the stream the call waits for). */
struct hook_seen {
	vpmm_driver *d;
	CUstream s;
	unsigned long calls[VPMM_OP_COUNT];
};

static void count_and_complete(void *arg, enum vpmm_op op)
{
	struct hook_seen *h = arg;
	h->calls[op]++;
	if (op == VPMM_OP_EVENT_QUERY)
		vpmm_host_stream_complete(h->d, h->s);
}

Test(host_device, hook_runs_before_every_call)
{
	vpmm_driver *d = mk(G, 0, false);
	struct hook_seen h = { .d = d, .s = vpmm_host_stream_create(d) };
	CUevent ev;
	OK(d->event_create(d, &ev));
	OK(d->event_record(d, ev, h.s));
	FAILS(d->event_query(d, ev), CUDA_ERROR_NOT_READY);
	vpmm_host_set_hook(d, count_and_complete, &h);
	OK(d->event_record(d, ev, h.s));
	OK(d->event_query(d, ev)); /* the hook completed it first */
	CUmemGenericAllocationHandle m;
	OK(d->mem_create(d, 0, G, &m));
	OK(d->mem_release(d, m));
	vpmm_host_set_hook(d, NULL, NULL);
	OK(d->event_destroy(d, ev));
	cr_assert_eq(h.calls[VPMM_OP_EVENT_RECORD], 1);
	cr_assert_eq(h.calls[VPMM_OP_EVENT_QUERY], 1);
	cr_assert_eq(h.calls[VPMM_OP_MEM_CREATE], 1);
	cr_assert_eq(h.calls[VPMM_OP_MEM_RELEASE], 1);
	cr_assert_eq(h.calls[VPMM_OP_EVENT_DESTROY], 0, "called after the hook was taken off");
	assert_nothing_live(d);
	d->destroy(d);
}

/* complete_nth reaches every stream, the special ones after the created. */
Test(host_device, complete_nth_picks_each_stream)
{
	vpmm_driver *d = mk(G, 0, false);
	CUstream s[2] = { vpmm_host_stream_create(d), vpmm_host_stream_create(d) };
	CUevent ev[3];
	CUstream on[3] = { s[0], s[1], (CUstream)0 };
	for (int i = 0; i < 3; i++) {
		OK(d->event_create(d, &ev[i]));
		OK(d->event_record(d, ev[i], on[i]));
	}
	unsigned n = 0;
	for (size_t k = 0; k < 2 + 3; k++)
		n += vpmm_host_complete_nth(d, k);
	cr_assert_eq(n, 3, "%u events completed", n);
	for (int i = 0; i < 3; i++) {
		OK(d->event_query(d, ev[i]));
		OK(d->event_destroy(d, ev[i]));
	}
	d->destroy(d);
}

/* The model: its tenant stays within its bounds, its thread and hook
 * complete work, quiet stops both, stop takes the hook off. */
Test(host_device, device_model_moves_the_tenant_and_completes_work)
{
	vpmm_driver *d = mk(G, 64 * G, true);
	CUstream s = vpmm_host_stream_create(d);
	struct vpmm_host_device_opts o = {
		.seed = 7, .complete_one = 500, .tenant_move = 1000,
		.tenant_lo = 8 * G, .tenant_hi = 40 * G, .period_us = 100, .yield = 500,
	};
	struct vpmm_host_device *dev = NULL;
	cr_assert_eq(vpmm_host_device_start(d, &o, &dev), 0);
	CUevent ev;
	OK(d->event_create(d, &ev));
	for (int i = 0; i < 200; i++) {
		size_t fr, total;
		OK(d->mem_info(d, &fr, &total));
		cr_assert(fr >= 24 * G && fr <= 56 * G, "free %zu granules", fr / G);
		OK(d->event_record(d, ev, s));
	}
	for (int i = 0; i < 2000 && d->event_query(d, ev) != CUDA_SUCCESS; i++)
		usleep(1000);
	OK(d->event_query(d, ev));
	vpmm_host_device_quiet(dev, true);
	size_t before = vpmm_host_free_bytes(d);
	OK(d->event_record(d, ev, s));
	usleep(5000);
	FAILS(d->event_query(d, ev), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_free_bytes(d), before, "a quiet model moved its tenant");
	struct vpmm_host_device_stats st;
	vpmm_host_device_stop(dev, &st);
	cr_assert_gt(st.tenant_moves, 0);
	cr_assert_gt(st.completed, 0);
	OK(d->event_destroy(d, ev));
	d->destroy(d);
	struct vpmm_host_device *none = NULL;
	vpmm_driver *other = mk(G, 0, true);
	other->name = "cuda";
	cr_assert_eq(vpmm_host_device_start(other, &o, &none), -EINVAL);
	other->name = "host";
	other->destroy(other);
}
