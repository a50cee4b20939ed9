/* test_driver_host.c — the host driver behaves like the GPU: mappings share
 * bytes, memory is inaccessible until set_access, the real driver's
 * validation, capacity, streams and events, fault injection, leak counts. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_host.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define G (64 * KiB) /* granularity of the backed tests: small, still > a page */

#define OK(expr) cr_assert_eq((expr), CUDA_SUCCESS, "%s", #expr)
#define FAILS(expr, code)                                                     \
	do {                                                                  \
		CUresult r__ = (expr);                                        \
		cr_assert_eq(r__, (code), "%s returned %d, expected %d",      \
			     #expr, (int)r__, (int)(code));                   \
	} while (0)

static vpmm_driver *mk(size_t gran, size_t capacity, bool unbacked)
{
	struct vpmm_host_options o = { gran, capacity, unbacked };
	vpmm_driver *d = NULL;
	OK(vpmm_driver_host_create(&o, &d));
	cr_assert_not_null(d);
	return d;
}

static struct vpmm_host_live live(vpmm_driver *d)
{
	struct vpmm_host_live l;
	vpmm_host_live(d, &l);
	return l;
}

static void assert_nothing_live(vpmm_driver *d)
{
	struct vpmm_host_live l = live(d);
	cr_assert_eq(l.handles, 0);
	cr_assert_eq(l.handle_bytes, 0);
	cr_assert_eq(l.reservations, 0);
	cr_assert_eq(l.mappings, 0);
	cr_assert_eq(l.events, 0);
}

static size_t open_fds(void)
{
	size_t n = 0;
	DIR *dir = opendir("/proc/self/fd");
	cr_assert_not_null(dir);
	while (readdir(dir))
		n++;
	closedir(dir);
	return n;
}

/* Touches `p` in a child process: 0 if the access worked, else the signal
 * that killed the child (SIGSEGV for inaccessible memory). */
static int probe(uintptr_t p, bool write)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		struct rlimit no_core = { 0, 0 };
		setrlimit(RLIMIT_CORE, &no_core);
		/* Die of the signal even under a sanitizer's handler. */
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		volatile char *c = (volatile char *)p;
		if (write)
			*c = 1;
		else
			(void)*c;
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st))
		return WTERMSIG(st);
	return WEXITSTATUS(st) == 0 ? 0 : -1;
}

static CUmemGenericAllocationHandle create(vpmm_driver *d, size_t size)
{
	CUmemGenericAllocationHandle h = 0;
	OK(d->mem_create(d, 0, size, &h));
	return h;
}

static CUdeviceptr reserve(vpmm_driver *d, size_t size)
{
	CUdeviceptr va = 0;
	OK(d->va_reserve(d, size, &va));
	cr_assert_neq(va, 0);
	return va;
}

static const int dev0[1] = { 0 };

static void map_rw(vpmm_driver *d, CUdeviceptr va, size_t size,
		   CUmemGenericAllocationHandle h)
{
	OK(d->map(d, va, size, h));
	OK(d->set_access(d, va, size, dev0, 1));
}

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

/* ---- validation of map, unmap, va_free ---------------------------------------------- */

static void map_validation(bool unbacked)
{
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, 8 * G);
	CUdeviceptr other = reserve(d, 8 * G);
	CUmemGenericAllocationHandle a = create(d, 2 * G), b = create(d, 2 * G);
	CUmemGenericAllocationHandle c = create(d, G);
	OK(d->map(d, r + 2 * G, 2 * G, a));

	FAILS(d->map(d, r + 2 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* same */
	FAILS(d->map(d, r + G, 2 * G, b), CUDA_ERROR_INVALID_VALUE);     /* tail */
	FAILS(d->map(d, r + 3 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* head */
	FAILS(d->map(d, r + 3 * G, G, c), CUDA_ERROR_INVALID_VALUE);     /* inside */
	FAILS(d->map(d, r + 7 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* past end */
	FAILS(d->map(d, r - 2 * G, 2 * G, b), CUDA_ERROR_INVALID_VALUE); /* before */
	FAILS(d->map(d, r + 4 * G, G, b), CUDA_ERROR_INVALID_VALUE);     /* size */
	FAILS(d->map(d, r + 4 * G, 3 * G, b), CUDA_ERROR_INVALID_VALUE); /* size */
	FAILS(d->map(d, r + 4 * G + 4096, 2 * G, b), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, 0, 2 * G, b), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, r + 4 * G, 2 * G, b + c + 99), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).mappings, 1);

	/* Right up against the existing mapping, on both sides, and the same
	 * handle twice. */
	OK(d->map(d, r + 4 * G, 2 * G, b));
	OK(d->map(d, r + G, G, c));
	OK(d->map(d, other, 2 * G, a));
	cr_assert_eq(live(d).mappings, 4);
	d->destroy(d);
}

Test(driver, map_validation_backed) { map_validation(false); }
Test(driver, map_validation_unbacked) { map_validation(true); }

static void unmap_validation(bool unbacked)
{
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, 16 * G);
	CUmemGenericAllocationHandle a = create(d, 2 * G), b = create(d, 2 * G);
	CUmemGenericAllocationHandle c = create(d, 2 * G);

	FAILS(d->unmap(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE); /* never mapped */
	OK(d->map(d, r, 2 * G, a));
	OK(d->map(d, r + 2 * G, 2 * G, b));
	OK(d->map(d, r + 6 * G, 2 * G, c)); /* a gap of 2 G before it */

	FAILS(d->unmap(d, r, G), CUDA_ERROR_INVALID_VALUE);          /* part */
	FAILS(d->unmap(d, r + G, 2 * G), CUDA_ERROR_INVALID_VALUE);  /* straddles */
	FAILS(d->unmap(d, r, 3 * G), CUDA_ERROR_INVALID_VALUE);      /* 1.5 maps */
	FAILS(d->unmap(d, r, 8 * G), CUDA_ERROR_INVALID_VALUE);      /* a gap */
	FAILS(d->unmap(d, r + 4 * G, 2 * G), CUDA_ERROR_INVALID_VALUE); /* the gap */
	FAILS(d->unmap(d, r + 6 * G, 4 * G), CUDA_ERROR_INVALID_VALUE); /* past */
	FAILS(d->unmap(d, r, 0), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).mappings, 3);

	/* Two whole mappings in one call. */
	OK(d->unmap(d, r, 4 * G));
	cr_assert_eq(live(d).mappings, 1);
	FAILS(d->unmap(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE); /* again */
	OK(d->unmap(d, r + 6 * G, 2 * G));
	cr_assert_eq(live(d).mappings, 0);
	d->destroy(d);
}

Test(driver, unmap_validation_backed) { unmap_validation(false); }
Test(driver, unmap_validation_unbacked) { unmap_validation(true); }

Test(driver, va_free_validation)
{
	vpmm_driver *d = mk(G, 0, false);
	CUdeviceptr r = reserve(d, 4 * G);
	CUmemGenericAllocationHandle h = create(d, G);
	FAILS(d->va_free(d, r + G, 3 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->va_free(d, r, 2 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->va_free(d, 4096 * G, G), CUDA_ERROR_INVALID_VALUE);

	OK(d->map(d, r + 3 * G, G, h));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	OK(d->unmap(d, r + 3 * G, G));
	OK(d->map(d, r, G, h));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	OK(d->unmap(d, r, G));
	OK(d->va_free(d, r, 4 * G));
	FAILS(d->va_free(d, r, 4 * G), CUDA_ERROR_INVALID_VALUE);
	FAILS(d->map(d, r, G, h), CUDA_ERROR_INVALID_VALUE);
	cr_assert_eq(live(d).reservations, 0);
	d->destroy(d);
}

/* A random sequence of map/unmap/set_access checked against a model of pages. */
static void random_against_model(bool unbacked, unsigned steps)
{
	enum { PAGES = 64, HANDLES = 24 };
	vpmm_driver *d = mk(G, 0, unbacked);
	CUdeviceptr r = reserve(d, PAGES * G);
	CUmemGenericAllocationHandle h[HANDLES];
	size_t hsize[HANDLES];
	int owner[PAGES];     /* handle index mapped on the page, -1 none */
	bool start[PAGES];    /* a mapping starts at this page */
	for (int i = 0; i < HANDLES; i++) {
		hsize[i] = (size_t)(i % 3 + 1);
		h[i] = create(d, hsize[i] * G);
	}
	for (int p = 0; p < PAGES; p++) {
		owner[p] = -1;
		start[p] = false;
	}
	unsigned seed = 12345;
	size_t nmaps = 0;
	for (unsigned s = 0; s < steps; s++) {
		int op = rand_r(&seed) % 3;
		int p = rand_r(&seed) % PAGES;
		if (op == 0) {
			int k = rand_r(&seed) % HANDLES;
			size_t n = hsize[k];
			bool ok = p + (int)n <= PAGES;
			for (size_t i = 0; ok && i < n; i++)
				ok = owner[p + (int)i] < 0;
			CUresult res = d->map(d, r + (size_t)p * G, n * G, h[k]);
			cr_assert_eq(res == CUDA_SUCCESS, ok, "step %u: map page %d", s, p);
			if (ok) {
				for (size_t i = 0; i < n; i++)
					owner[p + (int)i] = k;
				start[p] = true;
				nmaps++;
			}
		} else {
			/* A range of 1..4 pages from p. */
			int n = rand_r(&seed) % 4 + 1;
			bool whole = p + n <= PAGES && start[p] &&
				     (p + n == PAGES || owner[p + n] < 0 || start[p + n]);
			bool mapped = p + n <= PAGES;
			for (int i = 0; mapped && i < n; i++)
				mapped = owner[p + i] >= 0;
			if (op == 1) {
				CUresult res = d->unmap(d, r + (size_t)p * G, (size_t)n * G);
				cr_assert_eq(res == CUDA_SUCCESS, whole && mapped,
					     "step %u: unmap %d+%d", s, p, n);
				if (whole && mapped)
					for (int i = 0; i < n; i++) {
						nmaps -= start[p + i];
						owner[p + i] = -1;
						start[p + i] = false;
					}
			} else {
				CUresult res = d->set_access(d, r + (size_t)p * G,
							     (size_t)n * G, dev0, 1);
				cr_assert_eq(res == CUDA_SUCCESS, mapped,
					     "step %u: set_access %d+%d", s, p, n);
				if (mapped && !unbacked) {
					/* Each page shows its handle's bytes. */
					volatile char *c = (volatile char *)(uintptr_t)(r + (size_t)p * G);
					*c = (char)s;
					cr_assert_eq(*c, (char)s);
				}
			}
		}
		cr_assert_eq(live(d).mappings, nmaps, "step %u", s);
	}
	d->destroy(d);
}

Test(driver, random_against_model_unbacked) { random_against_model(true, 20000); }
Test(driver, random_against_model_backed) { random_against_model(false, 4000); }

/* ---- streams and events ----------------------------------------------------------- */

Test(driver, events_pending_until_completed)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	cr_assert_not_null(a);
	cr_assert_neq(a, b);
	CUevent e;
	OK(d->event_create(d, &e));
	OK(d->event_query(d, e)); /* never recorded */
	OK(d->event_record(d, e, a));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 1);
	OK(d->event_query(d, e));
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0);
	OK(d->event_destroy(d, e));
	d->destroy(d);
}

Test(driver, wait_blocks_later_records)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e1, e2;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	cr_assert(vpmm_host_stream_waits_on(d, b, e1));
	cr_assert_not(vpmm_host_stream_waits_on(d, a, e1));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e2));
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 1);
	cr_assert_eq(vpmm_host_stream_wait_count(d, a), 0);

	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	FAILS(d->event_query(d, e2), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 1);
	FAILS(d->event_query(d, e2), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, e2));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e1));
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 1);

	/* A wait on a completed or never-recorded event blocks nothing. */
	CUevent e3;
	OK(d->event_create(d, &e3));
	OK(d->stream_wait(d, b, e3));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	cr_assert_eq(vpmm_host_stream_wait_count(d, b), 3);
	d->destroy(d);
}

Test(driver, re_record_resets)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e;
	OK(d->event_create(d, &e));
	OK(d->event_record(d, e, a));
	vpmm_host_stream_complete(d, a);
	OK(d->event_query(d, e));
	OK(d->event_record(d, e, b));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);

	/* Recorded on a, then again on b: only b's record completes it. */
	OK(d->event_record(d, e, a));
	OK(d->event_record(d, e, b));
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0);
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, e));
	d->destroy(d);
}

Test(driver, wait_is_on_the_record_at_wait_time)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUstream c = vpmm_host_stream_create(d);
	CUevent e, f;
	OK(d->event_create(d, &e));
	OK(d->event_create(d, &f));
	OK(d->event_record(d, e, a));
	OK(d->stream_wait(d, b, e));
	OK(d->event_record(d, f, b));
	OK(d->event_record(d, e, c)); /* re-recorded after the wait was issued */
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0); /* no longer e's latest */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1); /* a's record passed it */
	OK(d->event_query(d, f));
	FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
	d->destroy(d);
}

Test(driver, event_sync_completes_only_what_is_needed)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUstream c = vpmm_host_stream_create(d);
	CUevent e1, e2, e3, e4;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_create(d, &e3));
	OK(d->event_create(d, &e4));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	OK(d->event_record(d, e4, b)); /* after e2 on b */
	OK(d->event_record(d, e3, c));

	OK(d->event_sync(d, e2));
	OK(d->event_query(d, e1));
	OK(d->event_query(d, e2));
	FAILS(d->event_query(d, e4), CUDA_ERROR_NOT_READY);
	FAILS(d->event_query(d, e3), CUDA_ERROR_NOT_READY);
	OK(d->event_sync(d, e2)); /* complete already */
	OK(d->event_sync(d, e3));
	FAILS(d->event_query(d, e4), CUDA_ERROR_NOT_READY);
	cr_assert_eq(vpmm_host_complete_all(d), 1);
	d->destroy(d);
}

Test(driver, complete_all_follows_chains)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e1, e2, e3;
	OK(d->event_create(d, &e1));
	OK(d->event_create(d, &e2));
	OK(d->event_create(d, &e3));
	OK(d->event_record(d, e1, a));
	OK(d->stream_wait(d, b, e1));
	OK(d->event_record(d, e2, b));
	OK(d->stream_wait(d, a, e2));
	OK(d->event_record(d, e3, a));
	OK(d->stream_wait(d, b, e3));
	cr_assert_eq(vpmm_host_complete_all(d), 3);
	OK(d->event_query(d, e3));
	cr_assert_not(vpmm_host_stream_waits_on(d, b, e3));
	cr_assert_eq(vpmm_host_complete_all(d), 0);
	d->destroy(d);
}

Test(driver, destroy_pending_event)
{
	vpmm_driver *d = mk(G, 0, true);
	CUstream a = vpmm_host_stream_create(d), b = vpmm_host_stream_create(d);
	CUevent e, f;
	OK(d->event_create(d, &e));
	OK(d->event_create(d, &f));
	OK(d->event_record(d, e, a));
	OK(d->stream_wait(d, b, e));
	OK(d->event_record(d, f, b));
	OK(d->event_destroy(d, e)); /* allowed while pending */
	cr_assert_eq(live(d).events, 1);
	/* The device still runs a up to the record, and b's wait on it. */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 0);
	cr_assert_eq(vpmm_host_stream_complete(d, a), 0); /* no event left to complete */
	cr_assert_eq(vpmm_host_stream_complete(d, b), 1);
	OK(d->event_query(d, f));

	FAILS(d->event_query(d, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_record(d, e, a), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_sync(d, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_wait(d, a, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->event_destroy(d, e), CUDA_ERROR_INVALID_HANDLE);
	int not_an_event;
	FAILS(d->event_query(d, (CUevent)&not_an_event), CUDA_ERROR_INVALID_HANDLE);
	d->destroy(d);
}

Test(driver, special_and_unknown_streams)
{
	vpmm_driver *d = mk(G, 0, true);
	CUevent e;
	OK(d->event_create(d, &e));
	CUstream specials[] = { (CUstream)0, CU_STREAM_PER_THREAD, CU_STREAM_LEGACY };
	for (size_t i = 0; i < 3; i++) {
		CUstream s = specials[i];
		OK(d->event_record(d, e, s));
		FAILS(d->event_query(d, e), CUDA_ERROR_NOT_READY);
		cr_assert_eq(vpmm_host_stream_complete(d, s), 1);
		OK(d->event_query(d, e));
	}
	int bogus;
	CUstream unknown = (CUstream)&bogus;
	bool cap = true;
	FAILS(d->event_record(d, e, unknown), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_wait(d, unknown, e), CUDA_ERROR_INVALID_HANDLE);
	FAILS(d->stream_capturing(d, unknown, &cap), CUDA_ERROR_INVALID_HANDLE);
	cr_assert_eq(vpmm_host_stream_complete(d, unknown), 0);

	CUstream s = vpmm_host_stream_create(d);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert_not(cap);
	vpmm_host_set_capturing(d, s, true);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert(cap);
	OK(d->stream_capturing(d, (CUstream)0, &cap));
	cr_assert_not(cap);
	vpmm_host_set_capturing(d, s, false);
	OK(d->stream_capturing(d, s, &cap));
	cr_assert_not(cap);
	d->destroy(d);
}

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
