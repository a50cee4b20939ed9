/* test_driver_host.c — the host driver behaves like the GPU: its options and
 * names, mappings share bytes, memory is inaccessible until set_access and
 * shared through exported fds, capacity and another tenant. The other
 * test_driver_host_*.c files test validation, streams and events, fault
 * injection, leaks and threads. */
#include "host_test.h"

#include <string.h>

/* ---- creation, names ------------------------------------------------------- */

Test(driver, options_and_defaults)
{
	vpmm_driver *d = NULL;
	struct vpmm_host_options bad[] = {
		{ 3000, 0, false },
		{ 4097, 0, false },
		{ 3 * 4096, 0, false },
		{ 2048, 0, true },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		FAILS(vpmm_driver_host_create(&bad[i], &d), CUDA_ERROR_INVALID_VALUE);
	cr_assert_null(d);

	OK(vpmm_driver_host_create(NULL, &d));
	cr_assert_str_eq(d->name, "host");
	size_t g = 0, fr = 0, total = 0;
	OK(d->granularity(d, 0, &g));
	cr_assert_eq(g, 2 * MiB);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(total, (size_t)1 << 40);
	cr_assert_eq(fr, total);
	d->destroy(d);

	d = mk(G, 0, false);
	OK(d->granularity(d, 0, &g));
	cr_assert_eq(g, G);
	d->destroy(d);
}

Test(driver, op_names)
{
	cr_assert_str_eq(vpmm_op_name(VPMM_OP_MAP), "map");
	cr_assert_str_eq(vpmm_op_name(VPMM_OP_SET_ACCESS), "set_access");
	for (int i = 0; i < VPMM_OP_COUNT; i++) {
		const char *a = vpmm_op_name((enum vpmm_op)i);
		cr_assert_str_neq(a, "unknown", "op %d has no name", i);
		for (int j = 0; j < i; j++)
			cr_assert_str_neq(a, vpmm_op_name((enum vpmm_op)j));
	}
	cr_assert_str_eq(vpmm_op_name(VPMM_OP_COUNT), "unknown");
}

Test(driver, reservation_aligned_to_granularity)
{
	vpmm_driver *d = mk(2 * MiB, 0, false);
	for (int i = 0; i < 4; i++) {
		CUdeviceptr va = reserve(d, (size_t)(i + 1) * 2 * MiB);
		cr_assert_eq(va % (2 * MiB), 0);
	}
	FAILS(d->va_reserve(d, 0, &(CUdeviceptr){ 0 }), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->va_reserve(d, MiB, &(CUdeviceptr){ 0 }), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).reservations, 4);
	d->destroy(d);
}

/* ---- memory behaves like device memory --------------------------------------- */

Test(driver, double_mapping_shows_same_bytes)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 8 * G);
	CUmemGenericAllocationHandle h = create(d, 2 * G);
	CUdeviceptr a = r, b = r + 4 * G;
	map_rw(d, a, 2 * G, h);
	map_rw(d, b, 2 * G, h);

	unsigned char *pa = (unsigned char *)(uintptr_t)a;
	unsigned char *pb = (unsigned char *)(uintptr_t)b;
	for (size_t i = 0; i < 2 * G; i += 4096)
		pa[i] = (unsigned char)(i / 4096 + 1);
	for (size_t i = 0; i < 2 * G; i += 4096)
		cr_assert_eq(pb[i], (unsigned char)(i / 4096 + 1));
	pb[2 * G - 1] = 0xab;
	cr_assert_eq(pa[2 * G - 1], 0xab);

	/* The bytes survive unmapping one of the two views. */
	OK(d->unmap(d, a, 2 * G));
	cr_assert_eq(pb[2 * G - 1], 0xab);
	/* And a handle mapped again elsewhere still holds them. */
	map_rw(d, r + 2 * G, 2 * G, h);
	cr_assert_eq(((unsigned char *)(uintptr_t)(r + 2 * G))[2 * G - 1], 0xab);
	d->destroy(d);
}

Test(driver, inaccessible_until_set_access)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 4 * G);
	CUmemGenericAllocationHandle h = create(d, 2 * G);

	cr_assert_eq(probe(r, false), SIGSEGV, "a bare reservation is readable");
	OK(d->map(d, r, 2 * G, h));
	cr_assert_eq(probe(r, false), SIGSEGV, "mapped memory readable before set_access");
	cr_assert_eq(probe(r + G, true), SIGSEGV, "mapped memory writable before set_access");

	OK(d->set_access(d, r, 2 * G, dev0, 1));
	cr_assert_eq(probe(r, false), 0);
	cr_assert_eq(probe(r + 2 * G - 1, true), 0);
	/* Beyond the mapping the reservation stays closed. */
	cr_assert_eq(probe(r + 2 * G, false), SIGSEGV);

	OK(d->unmap(d, r, 2 * G));
	cr_assert_eq(probe(r, false), SIGSEGV, "unmapped memory still readable");

	/* Mapping again starts without access, as on the GPU. */
	OK(d->map(d, r, 2 * G, h));
	cr_assert_eq(probe(r, false), SIGSEGV);
	d->destroy(d);
}

Test(driver, set_access_needs_every_byte_mapped)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 8 * G);
	CUmemGenericAllocationHandle a = create(d, 2 * G), b = create(d, G);
	OK(d->map(d, r, 2 * G, a));
	OK(d->map(d, r + 2 * G, G, b));

	FAILS(d->set_access(d, r, 4 * G, dev0, 1), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->set_access(d, r + 3 * G, G, dev0, 1), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->set_access(d, r, 2 * G, dev0, 0), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->set_access(d, r, 2 * G, NULL, 1), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->set_access(d, r + 1, G, dev0, 1), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(probe(r, false), SIGSEGV, "a refused set_access opened memory");

	/* One call over two adjacent mappings, and over part of one. */
	OK(d->set_access(d, r + G, 2 * G, dev0, 1));
	cr_assert_eq(probe(r, false), SIGSEGV);
	cr_assert_eq(probe(r + G, true), 0);
	cr_assert_eq(probe(r + 2 * G, true), 0);
	OK(d->set_access(d, r, 3 * G, dev0, 1));
	cr_assert_eq(probe(r, true), 0);
	d->destroy(d);
}

Test(driver, export_fd_shares_the_memory)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, G);
	CUmemGenericAllocationHandle h = create(d, G);
	map_rw(d, r, G, h);
	memcpy((void *)(uintptr_t)(r + 100), "vpmm", 4);

	int fd = -1;
	OK(d->export_fd(d, h, &fd));
	cr_assert_geq(fd, 0);
	char buf[4];
	cr_assert_eq(pread(fd, buf, 4, 100), 4);
	cr_assert_eq(memcmp(buf, "vpmm", 4), 0);
	close(fd);

	FAILS(d->export_fd(d, h + 1000, &fd), CUDA_ERROR_INVALID_VALUE);
	OK(d->mem_release(d, h));
	FAILS(d->export_fd(d, h, &fd), CUDA_ERROR_INVALID_VALUE);
	d->destroy(d);

	d = mk(G, 0, true);
	h = create(d, G);
	FAILS(d->export_fd(d, h, &fd), CUDA_ERROR_NOT_SUPPORTED);
	d->destroy(d);
}

/* ---- capacity ------------------------------------------------------------------- */

/* Another process takes and gives back memory: mem_create and mem_info see
 * what it leaves, and handles made before it came stay. */
Test(driver, tenant_takes_and_gives_back)
{
	vpmm_driver *d = mk(G, 4 * G, false);
	size_t fr, total;
	CUmemGenericAllocationHandle a = create(d, G), b;
	vpmm_host_set_tenant(d, 2 * G);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, G);
	cr_assert_eq(vpmm_host_free_bytes(d), G);
	FAILS(d->mem_create(d, 0, 2 * G, &b), CUDA_ERROR_OUT_OF_MEMORY);
	b = create(d, G);
	/* More than is free: nothing left, the pool's handles untouched. */
	vpmm_host_set_tenant(d, 3 * G);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 0);
	cr_assert_eq(live(d).handle_bytes, 2 * G);
	FAILS(d->mem_create(d, 0, G, &(CUmemGenericAllocationHandle){ 0 }),
	      CUDA_ERROR_OUT_OF_MEMORY);
	vpmm_host_set_tenant(d, 0);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 2 * G);
	OK(d->mem_release(d, a));
	OK(d->mem_release(d, b));
	d->destroy(d);
}

Test(driver, capacity_out_of_memory)
{
	vpmm_driver *d = mk(G, 4 * G, false);
	CUmemGenericAllocationHandle h[4];
	h[0] = create(d, 2 * G);
	h[1] = create(d, G);
	FAILS(d->mem_create(d, 0, 2 * G, &(CUmemGenericAllocationHandle){ 0 }),
	      CUDA_ERROR_OUT_OF_MEMORY);
	h[2] = create(d, G);
	FAILS(d->mem_create(d, 0, G, &(CUmemGenericAllocationHandle){ 0 }),
	      CUDA_ERROR_OUT_OF_MEMORY);
	size_t fr, total;
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 0);
	cr_assert_eq(total, 4 * G);
	cr_assert_eq(live(d).handle_bytes, 4 * G);

	/* Released but still mapped: the memory is still in use. */
	CUdeviceptr r = reserve(d, 2 * G);
	OK(d->map(d, r, G, h[1]));
	OK(d->mem_release(d, h[1]));
	cr_assert_eq(live(d).handles, 3);
	FAILS(d->mem_create(d, 0, G, &(CUmemGenericAllocationHandle){ 0 }),
	      CUDA_ERROR_OUT_OF_MEMORY);
	/* A released handle can no longer be named, even while mapped. */
	FAILS(d->map(d, r + G, G, h[1]), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->mem_release(d, h[1]), CUDA_ERROR_INVALID_VALUE);

	OK(d->unmap(d, r, G));
	cr_assert_eq(live(d).handles, 2);
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, G);
	h[3] = create(d, G);
	cr_assert_neq(h[3], h[1]);

	/* Unmapped but not released: still in use. */
	OK(d->map(d, r, G, h[2]));
	OK(d->unmap(d, r, G));
	FAILS(d->mem_create(d, 0, G, &(CUmemGenericAllocationHandle){ 0 }),
	      CUDA_ERROR_OUT_OF_MEMORY);
	OK(d->mem_release(d, h[2]));
	OK(d->mem_release(d, h[0]));
	OK(d->mem_release(d, h[3]));
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 4 * G);
	d->destroy(d);
}

Test(driver, release_unknown_handle)
{
	vpmm_driver *d = mk(G, 0, true);
	FAILS(d->mem_release(d, 12345), CUDA_ERROR_INVALID_VALUE);
	CUmemGenericAllocationHandle h = create(d, G);
	FAILS(d->mem_create(d, 0, G + 1, &h), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->mem_create(d, 0, 0, &h), CUDA_ERROR_INVALID_VALUE);
	OK(d->mem_release(d, h));
	FAILS(d->mem_release(d, h), CUDA_ERROR_INVALID_VALUE);
	assert_nothing_live(d);
	d->destroy(d);
}
