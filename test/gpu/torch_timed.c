/* torch_timed.c — libvpmm's PyTorch entry points (vpmm_torch_malloc/free in
 * VPMM_LIB) behind CUDAPluggableAllocator with a clock around each call: how
 * much of a training step the pool's calls take, measured inside the step
 * rather than inferred from a CPU profile (shim_torch.py's mode
 * pluggable-timed, scripts/gpu-torch-step.sh). timed_read() gives the calls
 * and nanoseconds so far, split by malloc and free; timed_histogram() the
 * same per power of two of a call's nanoseconds, so that the many quick
 * calls and the few long ones (a defragmentation) show apart. */
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
	const char *path = getenv("VPMM_LIB");
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
	if (!h) {
		fprintf(stderr, "torch_timed: VPMM_LIB: %s\n", path ? dlerror() : "not set");
		return;
	}
	*(void **)&real_malloc = dlsym(h, "vpmm_torch_malloc");
	*(void **)&real_free = dlsym(h, "vpmm_torch_free");
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
