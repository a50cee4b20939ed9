/* vpi.h — what every room of the pool shares: the counted driver call, the
 * gauges, clocks and error codes, the size hash and the test points. Calls
 * nothing; included by every allocator/ file that touches the pool.
 *
 * Naming: vpmm_* is the public API (vpmm.h) and the driver and options
 * layers; vpi_* is internal to allocator/.
 */
#ifndef VPMM_VPI_H
#define VPMM_VPI_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "vpmm.h"

/* A point on a lock-free path where a test makes another thread act
 * (test/pool/test_racing.c). Only in the core the tests build with
 * -DVPMM_TEST_HOOKS; nothing in libvpmm.so. */
#ifdef VPMM_TEST_HOOKS
extern void (*vpi_test_hook)(const char *point);
#define VPMM_TEST_POINT(point)                                                \
	do {                                                                  \
		if (vpi_test_hook)                                           \
			vpi_test_hook(point);                                \
	} while (0)
#else
#define VPMM_TEST_POINT(point) ((void)0)
#endif

/* Locks of the pool's (the pool lock, a front cache's) this thread holds or
 * waits for. A call of the pool's while it holds one can only come from a
 * signal handler that interrupted it, and would wait for itself for ever:
 * the public calls refuse it (vpmm_pool_malloc, -EDEADLK). Counted before
 * the lock is taken and after it is let go, so that no moment of holding
 * goes uncounted. */
extern __thread unsigned vpi_tls_locks;

static inline void vpi_mutex_lock(pthread_mutex_t *m)
{
	vpi_tls_locks++;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	pthread_mutex_lock(m);
}

static inline void vpi_mutex_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	vpi_tls_locks--;
}

/* The top `bits` bits of x times 2^64 / phi: one index into a table of
 * 2^bits for keys that differ in any bits (streams, sizes). 0 < bits < 64. */
static inline unsigned vpi_hash_bits(uint64_t x, unsigned bits)
{
	return (unsigned)((x * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

/* Every driver call goes through DRV() so that it is counted. */
#define DRV(p, op, fn, ...)                                                   \
	((p)->st.driver_calls++, (p)->driver_calls[op]++,                     \
	 (p)->drv->fn((p)->drv, __VA_ARGS__))

#define GAUGE_ADD(p, g, n)                                                    \
	do {                                                                  \
		(p)->st.g += (n);                                             \
		if ((p)->st.g > (p)->st.g##_peak)                             \
			(p)->st.g##_peak = (p)->st.g;                         \
	} while (0)
#define GAUGE_SUB(p, g, n) ((p)->st.g -= (n))

static inline uint64_t vpi_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int vpi_cu_errno(CUresult r)
{
	return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

static inline int vpi_cmp_u64(uint64_t a, uint64_t b)
{
	return a < b ? -1 : a > b;
}

#endif
