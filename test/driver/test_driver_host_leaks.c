/* test_driver_host_leaks.c — the host driver accounts without memory
 * (unbacked), its live counts go back to zero, destroy frees what is left,
 * drivers are independent, and threads share one driver. */
#include "host_test.h"

#include <pthread.h>

/* ---- accounting without memory, leaks ---------------------------------------------- */

Test(driver, unbacked_accounts_100_GiB_without_memory)
{
	vpmm_driver *d = mk(2 * MiB, 0, true);
	struct rusage ru0, ru1;
	getrusage(RUSAGE_SELF, &ru0);
	enum { N = 100 };
	CUmemGenericAllocationHandle h[N];
	CUdeviceptr r = reserve(d, 128 * GiB);
	cr_assert_eq(r % (2 * MiB), 0);
	for (int i = 0; i < N; i++) {
		h[i] = create(d, GiB);
		OK(d->map(d, r + (size_t)i * GiB, GiB, h[i]));
	}
	OK(d->set_access(d, r, N * GiB, dev0, 1));
	size_t fr, total;
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(total - fr, N * GiB);
	struct vpmm_host_live l = live(d);
	cr_assert_eq(l.handle_bytes, N * GiB);
	cr_assert_eq(l.handles, N);
	cr_assert_eq(l.mappings, N);
	getrusage(RUSAGE_SELF, &ru1);
	/* ru_maxrss is in KiB; 100 GiB touched would be 10^8 of them. */
	cr_assert_lt(ru1.ru_maxrss - ru0.ru_maxrss, 256 * 1024L,
		     "unbacked mode used memory");

	OK(d->unmap(d, r, N * GiB));
	for (int i = 0; i < N; i++)
		OK(d->mem_release(d, h[i]));
	OK(d->va_free(d, r, 128 * GiB));
	assert_nothing_live(d);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, total);
	d->destroy(d);
}

static void leak_cycle(bool unbacked)
{
	size_t fds = open_fds();
	vpmm_driver *d = mk(G, 0, unbacked);
	CUstream s = vpmm_host_stream_create(d);
	CUdeviceptr r[3];
	CUmemGenericAllocationHandle h[6];
	CUevent e[4];
	for (int i = 0; i < 3; i++)
		r[i] = reserve(d, 16 * G);
	for (int i = 0; i < 6; i++) {
		h[i] = create(d, (size_t)(i % 2 + 1) * G);
		map_rw(d, r[i % 3] + (size_t)(i / 3) * 4 * G, (size_t)(i % 2 + 1) * G, h[i]);
	}
	for (int i = 0; i < 4; i++) {
		OK(d->event_create(d, &e[i]));
		OK(d->event_record(d, e[i], s));
	}
	if (!unbacked)
		cr_assert_gt(open_fds(), fds);
	struct vpmm_host_live l = live(d);
	cr_assert_eq(l.handles, 6);
	cr_assert_eq(l.handle_bytes, 9 * G);
	cr_assert_eq(l.reservations, 3);
	cr_assert_eq(l.mappings, 6);
	cr_assert_eq(l.events, 4);

	/* Release first (the memory lives on while mapped), then unmap. */
	for (int i = 0; i < 6; i++)
		OK(d->mem_release(d, h[i]));
	cr_assert_eq(live(d).handles, 6);
	for (int i = 0; i < 6; i++)
		OK(d->unmap(d, r[i % 3] + (size_t)(i / 3) * 4 * G, (size_t)(i % 2 + 1) * G));
	for (int i = 0; i < 3; i++)
		OK(d->va_free(d, r[i], 16 * G));
	for (int i = 0; i < 4; i++)
		OK(d->event_destroy(d, e[i])); /* two still pending */
	assert_nothing_live(d);
	cr_assert_eq(open_fds(), fds, "memfds leaked");
	d->destroy(d);
}

Test(driver, leak_counters_back_to_zero_backed) { leak_cycle(false); }
Test(driver, leak_counters_back_to_zero_unbacked) { leak_cycle(true); }

Test(driver, destroy_cleans_up_what_is_left)
{
	size_t fds = open_fds();
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 4 * G);
	CUmemGenericAllocationHandle h = create(d, G);
	map_rw(d, r, G, h);
	CUevent e;
	OK(d->event_create(d, &e));
	OK(d->event_record(d, e, vpmm_host_stream_create(d)));
	d->destroy(d);
	cr_assert_eq(open_fds(), fds);
	cr_assert_eq(probe(r, false), SIGSEGV, "the reservation outlived the driver");
}

Test(driver, drivers_are_independent)
{
	vpmm_driver *a = mk(G, 2 * G, true), *b = mk(G, 2 * G, true);
	CUmemGenericAllocationHandle h = create(a, 2 * G);
	create(b, 2 * G);
	FAILS(a->mem_create(a, 0, G, &h), CUDA_ERROR_OUT_OF_MEMORY);
	CUstream s = vpmm_host_stream_create(a);
	CUevent e;
	OK(b->event_create(b, &e));
	FAILS(b->event_record(b, e, s), CUDA_ERROR_INVALID_HANDLE);
	FAILS(a->event_query(a, e), CUDA_ERROR_INVALID_HANDLE);
	a->destroy(a);
	b->destroy(b);
}

/* ---- threads ------------------------------------------------------------------------- */

struct worker {
	vpmm_driver *d;
	int id;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	vpmm_driver *d = w->d;
	CUdeviceptr r;
	if (d->va_reserve(d, 16 * G, &r) != CUDA_SUCCESS)
		return (void *)1;
	CUstream s = vpmm_host_stream_create(d);
	CUevent e;
	if (d->event_create(d, &e) != CUDA_SUCCESS)
		return (void *)1;
	for (int i = 0; i < 300; i++) {
		CUmemGenericAllocationHandle h;
		size_t off = (size_t)(i % 8) * 2 * G;
		if (d->mem_create(d, 0, 2 * G, &h) != CUDA_SUCCESS ||
		    d->map(d, r + off, 2 * G, h) != CUDA_SUCCESS ||
		    d->set_access(d, r + off, 2 * G, dev0, 1) != CUDA_SUCCESS)
			return (void *)1;
		volatile int *p = (volatile int *)(uintptr_t)(r + off);
		*p = w->id * 1000 + i;
		if (*p != w->id * 1000 + i)
			return (void *)1;
		if (d->mem_release(d, h) != CUDA_SUCCESS ||
		    d->event_record(d, e, s) != CUDA_SUCCESS ||
		    d->unmap(d, r + off, 2 * G) != CUDA_SUCCESS)
			return (void *)1;
		if (i % 16 == 0 && d->event_sync(d, e) != CUDA_SUCCESS)
			return (void *)1;
	}
	if (d->event_sync(d, e) != CUDA_SUCCESS || d->event_query(d, e) != CUDA_SUCCESS ||
	    d->event_destroy(d, e) != CUDA_SUCCESS || d->va_free(d, r, 16 * G) != CUDA_SUCCESS)
		return (void *)1;
	return NULL;
}

Test(driver, threads_share_one_driver)
{
	vpmm_driver *d = mk(G, 0, false);
	enum { T = 4 };
	pthread_t t[T];
	struct worker w[T];
	for (int i = 0; i < T; i++) {
		w[i] = (struct worker){ d, i + 1 };
		cr_assert_eq(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < T; i++) {
		void *ret;
		pthread_join(t[i], &ret);
		cr_assert_null(ret, "worker %d failed", i);
	}
	assert_nothing_live(d);
	cr_assert_eq(vpmm_host_calls(d, VPMM_OP_MAP), T * 300);
	d->destroy(d);
}
