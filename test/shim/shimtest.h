/* shimtest.h — what the shim's test programs share: checks that exit with a
 * message, and the controls of libvpmm.so and the fake libcuda, reached by
 * name at run time (the programs must also run without the shim).
 *
 * SHIMTEST_EXPECT=real: the shim is absent, disabled or passing through, and
 * every allocation must reach the fake driver; otherwise the pool.
 */
#ifndef SHIMTEST_H
#define SHIMTEST_H

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vpmm.h"

/* Not in CUDA 13's cuda.h (cuCtxCreate is _v4 there); the fake offers it. */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

#define CHECK(cond)                                                           \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                              \
		}                                                             \
	} while (0)

#define CHECK_EQ(a, b)                                                        \
	do {                                                                  \
		long long a_ = (long long)(a), b_ = (long long)(b);           \
		if (a_ != b_) {                                               \
			fprintf(stderr, "FAIL %s:%d: %s == %s (%lld != %lld)\n", \
				__FILE__, __LINE__, #a, #b, a_, b_);          \
			exit(1);                                              \
		}                                                             \
	} while (0)

static int (*st_shim_stats)(int, struct vpmm_stats *);
static unsigned long long (*st_hook_calls)(const char *);
static unsigned long (*st_fake_calls)(const char *);
static void (*st_fake_set_capturing)(CUstream, int);
static void (*st_fake_mem_info)(size_t *, size_t *);
static bool st_shim_not_global; /* libvpmm.so dlopen'ed, not preloaded */

static inline bool expect_pool(void)
{
	const char *e = getenv("SHIMTEST_EXPECT");
	return !e || strcmp(e, "real") != 0;
}

#define LOOKUP(var, handle, name) ((var) = (__typeof__(var))(uintptr_t)dlsym(handle, name))

/* Call once libcuda.so.1 is loaded (or let it be loaded here). */
static inline void controls_init(void)
{
	void *cu = dlopen("libcuda.so.1", RTLD_NOW);
	CHECK(cu);
	LOOKUP(st_shim_stats, RTLD_DEFAULT, "vpmm_shim_stats");
	LOOKUP(st_hook_calls, RTLD_DEFAULT, "vpmm_shim_hook_calls");
	LOOKUP(st_fake_calls, cu, "fakecuda_calls");
	LOOKUP(st_fake_set_capturing, cu, "fakecuda_set_capturing");
	LOOKUP(st_fake_mem_info, cu, "fakecuda_mem_info");
	CHECK(st_fake_calls && st_fake_set_capturing && st_fake_mem_info);
	if (expect_pool() && !st_shim_not_global)
		CHECK(st_shim_stats && st_hook_calls);
}

static inline long long fake_calls(const char *name)
{
	return (long long)st_fake_calls(name);
}

static inline long long hook_calls(const char *name)
{
	return st_hook_calls ? (long long)st_hook_calls(name) : -1;
}

/* The pool's stats of `dev`; all zero when it has none. */
static inline struct vpmm_stats pool_stats(int dev)
{
	struct vpmm_stats s;
	memset(&s, 0, sizeof s);
	if (!st_shim_stats || st_shim_stats(dev, &s) != 0)
		memset(&s, 0, sizeof s);
	return s;
}

/* With the pool: the pool of `dev` failed no request and holds nothing
 * live. */
static inline void pool_clean(int dev)
{
	if (expect_pool()) {
		struct vpmm_stats st = pool_stats(dev);
		CHECK_EQ(st.failures, 0);
		CHECK_EQ(st.live, 0);
	}
}

static inline bool has_pool(int dev)
{
	struct vpmm_stats s;
	return st_shim_stats && st_shim_stats(dev, &s) == 0;
}

/* Whether function pointer p lies in a library whose path contains `lib`. */
static inline bool fn_in(void *p, const char *lib)
{
	Dl_info info;
	return p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, lib);
}

/* Checks that n bytes at p still hold touch()'s pattern for `seed`. */
static inline void intact(const void *p, size_t n, unsigned char seed)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		CHECK(b[i] == (unsigned char)(seed + i * 7));
}

/* Writes a pattern over n bytes at p and checks it (host-backed "device"). */
static inline void touch(void *p, size_t n, unsigned char seed)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed + i * 7);
	intact(p, n, seed);
}

/* A program's scenarios, by name: `prog SCENARIO` runs one. */
struct scenario {
	const char *name;
	void (*fn)(void);
};

/* Runs the scenario argv[1] names and prints "ok NAME" after it (0); with
 * no such scenario, the usage (2). */
static inline int run_scenario(int argc, char **argv, const struct scenario *list, size_t n)
{
	for (size_t i = 0; argc == 2 && i < n; i++)
		if (!strcmp(argv[1], list[i].name)) {
			list[i].fn();
			printf("ok %s\n", argv[1]);
			return 0;
		}
	fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
	return 2;
}

#endif
