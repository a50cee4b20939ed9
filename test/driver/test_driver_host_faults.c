/* test_driver_host_faults.c — the host driver's fault injection: a failed
 * call of any operation has no effect, the nth call fails, and disarming. */
#include "host_test.h"

/* ---- fault injection ----------------------------------------------------------------- */

#define BOOM CUDA_ERROR_LAUNCH_FAILED /* a code no validation produces */

/* Arms op to fail on its next call. */
static void arm(vpmm_driver *d, enum vpmm_op op)
{
	vpmm_host_fail(d, op, 1, BOOM);
}

static bool same_live(struct vpmm_host_live a, struct vpmm_host_live b)
{
	return a.handles == b.handles && a.handle_bytes == b.handle_bytes &&
	       a.reservations == b.reservations && a.mappings == b.mappings &&
	       a.events == b.events;
}

Test(driver, fault_injection_each_op_has_no_effect)
{
	vpmm_driver *d = mk(G, 0, false);
	CUstream s = vpmm_host_stream_create(d);
	CUdeviceptr r = reserve(d, 8 * G);
	CUmemGenericAllocationHandle h = create(d, G);
	CUevent e;
	OK(d->event_create(d, &e));
	bool seen[VPMM_OP_COUNT] = { false };
	struct vpmm_host_live before;
	unsigned long calls;
#define FAULT(op, call)                                                       \
	do {                                                                  \
		seen[op] = true;                                              \
		before = live(d);                                             \
		calls = vpmm_host_calls(d, op);                               \
		arm(d, op);                                                   \
		FAILS(call, BOOM);                                            \
		cr_assert_eq(vpmm_host_calls(d, op), calls + 1, "%s", #op);   \
		cr_assert(same_live(before, live(d)), "%s had an effect", #op); \
	} while (0)

	size_t g = 77;
	FAULT(VPMM_OP_GRANULARITY, d->granularity(d, 0, &g));
	cr_assert_eq(g, 77);
	OK(d->granularity(d, 0, &g));

	CUdeviceptr va = 77;
	FAULT(VPMM_OP_VA_RESERVE, d->va_reserve(d, 4 * G, &va));
	cr_assert_eq(va, 77);
	OK(d->va_reserve(d, 4 * G, &va));

	FAULT(VPMM_OP_VA_FREE, d->va_free(d, va, 4 * G));
	OK(d->map(d, va, G, h)); /* still reserved */
	OK(d->unmap(d, va, G));
	OK(d->va_free(d, va, 4 * G));

	CUmemGenericAllocationHandle h2 = 77;
	FAULT(VPMM_OP_MEM_CREATE, d->mem_create(d, 0, G, &h2));
	cr_assert_eq(h2, 77);
	h2 = create(d, G);

	FAULT(VPMM_OP_MEM_RELEASE, d->mem_release(d, h2));
	OK(d->map(d, r + 4 * G, G, h2)); /* still a valid handle */
	OK(d->unmap(d, r + 4 * G, G));
	OK(d->mem_release(d, h2));

	FAULT(VPMM_OP_MAP, d->map(d, r, G, h));
	FAILS(d->unmap(d, r, G), CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
	OK(d->map(d, r, G, h));

	FAULT(VPMM_OP_SET_ACCESS, d->set_access(d, r, G, dev0, 1));
	cr_assert_eq(probe(r, false), SIGSEGV);
	OK(d->set_access(d, r, G, dev0, 1));
	*(volatile int *)(uintptr_t)r = 42;

	FAULT(VPMM_OP_UNMAP, d->unmap(d, r, G));
	cr_assert_eq(*(volatile int *)(uintptr_t)r, 42); /* still mapped, open */
	OK(d->unmap(d, r, G));

	CUevent e2 = (CUevent)(uintptr_t)77;
	FAULT(VPMM_OP_EVENT_CREATE, d->event_create(d, &e2));
	cr_assert_eq(e2, (CUevent)(uintptr_t)77);

	FAULT(VPMM_OP_EVENT_RECORD, d->event_record(d, e, s));
	OK(d->event_query(d, e)); /* still never recorded */
	cr_assert_eq(vpmm_host_stream_complete(d, s), 0);
	OK(d->event_record(d, e, s));

	FAULT(VPMM_OP_EVENT_QUERY, d->event_query(d, e));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);

	CUstream s2 = vpmm_host_stream_create(d);
	FAULT(VPMM_OP_STREAM_WAIT, d->stream_wait(d, s2, e));
	cr_assert_not(vpmm_host_stream_waits_on(d, s2, e));
	cr_assert_eq(vpmm_host_stream_wait_count(d, s2), 0);
	OK(d->stream_wait(d, s2, e));
	cr_assert(vpmm_host_stream_waits_on(d, s2, e));

	FAULT(VPMM_OP_EVENT_SYNC, d->event_sync(d, e));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	OK(d->event_sync(d, e));
	OK(d->event_query(d, e));

	FAULT(VPMM_OP_EVENT_DESTROY, d->event_destroy(d, e));
	OK(d->event_query(d, e)); /* still alive */

	bool cap = true;
	FAULT(VPMM_OP_STREAM_CAPTURING, d->stream_capturing(d, s, &cap));
	cr_assert(cap);

	size_t fr = 77, total = 77;
	FAULT(VPMM_OP_MEM_INFO, d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 77);
	cr_assert_eq(total, 77);

	size_t fds = open_fds();
	int fd = 77;
	FAULT(VPMM_OP_EXPORT_FD, d->export_fd(d, h, &fd));
	cr_assert_eq(fd, 77);
	cr_assert_eq(open_fds(), fds);

	OK(d->export_fd(d, h, &fd));
	CUmemGenericAllocationHandle h3 = 77;
	size_t live_before = open_fds();
	FAULT(VPMM_OP_IMPORT_FD, d->import_fd(d, fd, &h3));
	cr_assert_eq(h3, 77);
	cr_assert_eq(open_fds(), live_before);
	OK(d->import_fd(d, fd, &h3));
	OK(d->mem_release(d, h3));
	close(fd);

	CUcontext ctx = NULL;
	FAULT(VPMM_OP_CTX_CURRENT, d->ctx_current(d, &ctx));
	cr_assert_null(ctx);
	FAULT(VPMM_OP_CTX_BIND, d->ctx_bind(d, NULL));
	unsigned long long id = 77;
	FAULT(VPMM_OP_CTX_ID, d->ctx_id(d, NULL, &id));
	cr_assert_eq(id, 77);
#undef FAULT

	for (int op = 0; op < VPMM_OP_COUNT; op++)
		cr_assert(seen[op], "op %s not covered", vpmm_op_name((enum vpmm_op)op));
	d->destroy(d);
}

Test(driver, fault_nth_call_and_disarm)
{
	vpmm_driver *d = mk(G, 0, true);
	unsigned long c0 = vpmm_host_calls(d, VPMM_OP_MEM_CREATE);
	vpmm_host_fail(d, VPMM_OP_MEM_CREATE, 3, CUDA_ERROR_OUT_OF_MEMORY);
	CUmemGenericAllocationHandle h;
	OK(d->mem_create(d, 0, G, &h));
	OK(d->mem_create(d, 0, G, &h));
	FAILS(d->mem_create(d, 0, G, &h), CUDA_ERROR_OUT_OF_MEMORY);
	OK(d->mem_create(d, 0, G, &h)); /* one shot */
	cr_assert_eq(vpmm_host_calls(d, VPMM_OP_MEM_CREATE), c0 + 4);
	cr_assert_eq(live(d).handles, 3);
	cr_assert_eq(vpmm_host_calls(d, VPMM_OP_MAP), 0);

	vpmm_host_fail(d, VPMM_OP_MEM_CREATE, 1, CUDA_ERROR_UNKNOWN);
	vpmm_host_fail(d, VPMM_OP_MEM_CREATE, 0, CUDA_ERROR_UNKNOWN); /* disarm */
	OK(d->mem_create(d, 0, G, &h));
	/* Other ops are not affected by an armed one. */
	vpmm_host_fail(d, VPMM_OP_MAP, 1, CUDA_ERROR_UNKNOWN);
	OK(d->mem_create(d, 0, G, &h));
	d->destroy(d);
}
