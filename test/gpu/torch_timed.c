/* torch_timed.c — libvpmm's PyTorch entry points (vpmm_torch_malloc/free in
 * VPMM_LIB) behind CUDAPluggableAllocator with a clock around each call: how
 * much of a training step the pool's calls take, measured inside the step
 * rather than inferred from a CPU profile (shim_torch.py's mode
 * pluggable-timed, scripts/gpu-torch-step.sh). TIMED_TARGET, TIMED_MALLOC
 * and TIMED_FREE put the same clock around another allocator's pair (mode
 * pluggable-cache-timed: the exact-size cache of torch_async_alloc.cu, the
 * least an allocator behind this interface can cost). timed_read() gives the calls
 * and nanoseconds so far, split by malloc and free; timed_histogram() the
 * same per power of two of a call's nanoseconds, so that the many quick
 * calls and the few long ones (a defragmentation) show apart. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

typedef void *(*malloc_fn)(ssize_t, int, void *);
typedef void (*free_fn)(void *, ssize_t, int, void *);

static malloc_fn real_malloc;
static free_fn real_free;
static pthread_once_t once = PTHREAD_ONCE_INIT;
#define BINS 24                       /* [2^i, 2^(i+1)) ns; the last takes the rest */
static _Atomic uint64_t hist[2][BINS][2]; /* [malloc, free][bin][calls, ns] */

static void account(int which, uint64_t ns)
{
	int bin = ns ? 63 - __builtin_clzll(ns) : 0;
	if (bin >= BINS)
		bin = BINS - 1;
	atomic_fetch_add_explicit(&hist[which][bin][0], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hist[which][bin][1], ns, memory_order_relaxed);
}

static void resolve(void)
{
	const char *path = getenv("TIMED_TARGET") ? getenv("TIMED_TARGET") : getenv("VPMM_LIB");
	const char *m = getenv("TIMED_MALLOC") ? getenv("TIMED_MALLOC") : "vpmm_torch_malloc";
	const char *f = getenv("TIMED_FREE") ? getenv("TIMED_FREE") : "vpmm_torch_free";
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
	if (!h) {
		fprintf(stderr, "torch_timed: %s: %s\n", path ? path : "VPMM_LIB",
			path ? dlerror() : "not set");
		return;
	}
	*(void **)&real_malloc = dlsym(h, m);
	*(void **)&real_free = dlsym(h, f);
	if (!real_malloc || !real_free)
		fprintf(stderr, "torch_timed: %s or %s not in %s\n", m, f, path);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((visibility("default"))) void *timed_malloc(ssize_t size, int device, void *stream)
{
	pthread_once(&once, resolve);
	if (!real_malloc)
		return NULL;
	uint64_t t = now_ns();
	void *p = real_malloc(size, device, stream);
	account(0, now_ns() - t);
	return p;
}

__attribute__((visibility("default"))) void timed_free(void *ptr, ssize_t size, int device,
						       void *stream)
{
	pthread_once(&once, resolve);
	if (!real_free)
		return;
	uint64_t t = now_ns();
	real_free(ptr, size, device, stream);
	account(1, now_ns() - t);
}

#ifdef TIMED_RUNTIME
typedef int (*rt_malloc_fn)(void **, size_t);
typedef int (*rt_free_fn)(void *);

__attribute__((visibility("default"))) int cudaMalloc(void **ptr, size_t size)
{
	static rt_malloc_fn next;
	if (!next)
		*(void **)&next = dlsym(RTLD_NEXT, "cudaMalloc");
	if (!next)
		return 3; /* cudaErrorInitializationError */
	uint64_t t = now_ns();
	int r = next(ptr, size);
	account(0, now_ns() - t);
	return r;
}

__attribute__((visibility("default"))) int cudaFree(void *ptr)
{
	static rt_free_fn next;
	if (!next)
		*(void **)&next = dlsym(RTLD_NEXT, "cudaFree");
	if (!next)
		return 3;
	uint64_t t = now_ns();
	int r = next(ptr);
	account(1, now_ns() - t);
	return r;
}
#endif

/* out: malloc calls, malloc ns, free calls, free ns (the histogram summed). */
__attribute__((visibility("default"))) void timed_read(uint64_t out[4])
{
	for (int i = 0; i < 4; i++)
		out[i] = 0;
	for (int w = 0; w < 2; w++)
		for (int b = 0; b < BINS; b++)
			for (int k = 0; k < 2; k++)
				out[2 * w + k] += atomic_load_explicit(&hist[w][b][k],
								       memory_order_relaxed);
}

/* out[which][bin][calls, ns], which 0 malloc, 1 free. */
__attribute__((visibility("default"))) void timed_histogram(uint64_t out[2][BINS][2])
{
	for (int w = 0; w < 2; w++)
		for (int b = 0; b < BINS; b++)
			for (int k = 0; k < 2; k++)
				out[w][b][k] = atomic_load_explicit(&hist[w][b][k],
								    memory_order_relaxed);
}
