/* host_test.h — what the host driver's tests (test_driver_host*.c) share:
 * a driver of a given granularity and capacity, its live counts, the open
 * file descriptors, a probe of memory in a child process, and short forms
 * of create, reserve and map-with-access that assert success. */
#ifndef HOST_TEST_H
#define HOST_TEST_H

#include <criterion/criterion.h>

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
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

static inline vpmm_driver *mk(size_t gran, size_t capacity, bool unbacked)
{
	struct vpmm_host_options o = { gran, capacity, unbacked };
	vpmm_driver *d = NULL;
	OK(vpmm_driver_host_create(&o, &d));
	cr_assert_not_null(d);
	return d;
}

static inline struct vpmm_host_live live(vpmm_driver *d)
{
	struct vpmm_host_live l;
	vpmm_host_live(d, &l);
	return l;
}

static inline void assert_nothing_live(vpmm_driver *d)
{
	struct vpmm_host_live l = live(d);
	cr_assert_eq(l.handles, 0);
	cr_assert_eq(l.handle_bytes, 0);
	cr_assert_eq(l.reservations, 0);
	cr_assert_eq(l.mappings, 0);
	cr_assert_eq(l.events, 0);
}

static inline size_t open_fds(void)
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
static inline int probe(uintptr_t p, bool write)
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

static inline CUmemGenericAllocationHandle create(vpmm_driver *d, size_t size)
{
	CUmemGenericAllocationHandle h = 0;
	OK(d->mem_create(d, 0, size, &h));
	return h;
}

static inline CUdeviceptr reserve(vpmm_driver *d, size_t size)
{
	CUdeviceptr va = 0;
	OK(d->va_reserve(d, size, &va));
	cr_assert_neq(va, 0);
	return va;
}

static const int dev0[1] = { 0 };

static inline void map_rw(vpmm_driver *d, CUdeviceptr va, size_t size,
		   CUmemGenericAllocationHandle h)
{
	OK(d->map(d, va, size, h));
	OK(d->set_access(d, va, size, dev0, 1));
}

#endif
