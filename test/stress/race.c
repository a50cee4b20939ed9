/* race.c — the pool under concurrent use, as a plain program (Criterion's
 * forked workers cannot start under ThreadSanitizer): four threads allocate,
 * write, verify and free on their own streams and on a shared one, a fifth
 * repeats one training-like step on its own stream (so that loops are seen
 * and mallocs placed where they went a step before), a sixth makes a stream
 * per request and destroys it (the records of destroyed streams are freed
 * while the others run), a "GPU" thread
 * completes streams, a checker thread runs vpmm_pool_check() without
 * pause, and the background reclaimer and the per-stream caches are on.
 * Exit 0 when no pattern was lost, no check failed, nothing leaked and, from
 * COVERAGE_OPS operations a thread, the run defragmented, hit a cache and
 * placed a malloc where it went a step before.
 *
 *   race [OPS_PER_THREAD] [SEED]
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "driver_host.h"
#include "vpmm.h"

#define PAGE ((size_t)64 << 10)
#define THREADS 4
#define LIVE 40
#define COVERAGE_OPS 10000 /* the coverage is checked from this many operations */

static vpmm_pool *pool;
static vpmm_driver *drv;
static CUstream streams[THREADS + 2]; /* [THREADS]: shared; then the looper's */
static atomic_int stop, failed;
static long ops = 20000;
static unsigned seed0 = 1;

struct alloc {
	CUdeviceptr p;
	size_t n;
	uint64_t tag;
};

static void fail(const char *what, long id, long it)
{
	fprintf(stderr, "race: %s (thread %ld, op %ld, seed %u)\n", what, id, it, seed0);
	atomic_store(&failed, 1);
}

/* The first word of every page (or of the block) carries the tag. */
static void stamp(const struct alloc *a)
{
	for (size_t o = 0; o + 8 <= a->n; o += 4096)
		*(uint64_t *)(uintptr_t)(a->p + o) = a->tag;
}

static bool intact(const struct alloc *a)
{
	for (size_t o = 0; o + 8 <= a->n; o += 4096)
		if (*(uint64_t *)(uintptr_t)(a->p + o) != a->tag)
			return false;
	return true;
}

static void *worker(void *arg)
{
	long id = (long)arg;
	unsigned seed = seed0 * 7919u + (unsigned)id;
	struct alloc live[LIVE];
	int n = 0;
	for (long it = 0; it < ops && !atomic_load(&failed); it++) {
		if (rand_r(&seed) % 2 && n < LIVE) {
			size_t size = rand_r(&seed) % 3 == 0 ? 1 + rand_r(&seed) % PAGE
							     : (1 + rand_r(&seed) % 6) * PAGE;
			CUdeviceptr p;
			int rc = vpmm_pool_malloc(pool, size, streams[id], &p);
			if (rc == -ENOMEM)
				continue;
			if (rc) {
				fail("malloc failed", id, it);
				break;
			}
			live[n] = (struct alloc){p, size, ((uint64_t)id << 40) | (uint64_t)it};
			stamp(&live[n++]);
		} else if (n) {
			int i = rand_r(&seed) % n;
			if (!intact(&live[i]))
				fail("pattern lost", id, it);
			CUstream s = rand_r(&seed) % 10 ? streams[id] : streams[THREADS];
			if (vpmm_pool_free(pool, live[i].p, s))
				fail("free failed", id, it);
			live[i] = live[--n];
		}
	}
	for (int i = 0; i < n; i++)
		if (!intact(&live[i]) || vpmm_pool_free(pool, live[i].p, streams[id]))
			fail("final free", id, -1);
	return NULL;
}

/* The same step again and again: 24 pages of 1-3, every other one freed,
 * then A and a larger request; A is freed on the shared stream. */
static void *looper(void *arg)
{
	(void)arg;
	CUstream s = streams[THREADS + 1];
	for (long it = 0; it < ops / 40 && !atomic_load(&failed); it++) {
		struct alloc x[24], a = {0}, y = {0};
		for (int i = 0; i < 24; i++) {
			x[i] = (struct alloc){0, (size_t)(1 + i % 3) * PAGE, (5ull << 40) | (uint64_t)(it * 32 + i)};
			if (vpmm_pool_malloc(pool, x[i].n, s, &x[i].p) == 0)
				stamp(&x[i]);
			else
				x[i].p = 0;
		}
		for (int i = 1; i < 24; i += 2)
			if (x[i].p && (!intact(&x[i]) || vpmm_pool_free(pool, x[i].p, s)))
				fail("looper: odd page", THREADS, it);
		a = (struct alloc){0, 3 * PAGE, (6ull << 40) | (uint64_t)it};
		y = (struct alloc){0, 12 * PAGE, (7ull << 40) | (uint64_t)it};
		if (vpmm_pool_malloc(pool, a.n, s, &a.p) == 0)
			stamp(&a);
		else
			a.p = 0;
		if (vpmm_pool_malloc(pool, y.n, s, &y.p) == 0)
			stamp(&y);
		else
			y.p = 0;
		for (int i = 0; i < 24; i += 2)
			if (x[i].p && (!intact(&x[i]) || vpmm_pool_free(pool, x[i].p, s)))
				fail("looper: even page", THREADS, it);
		if (a.p && (!intact(&a) || vpmm_pool_free(pool, a.p, streams[THREADS])))
			fail("looper: A", THREADS, it);
		if (y.p && (!intact(&y) || vpmm_pool_free(pool, y.p, s)))
			fail("looper: the larger request", THREADS, it);
	}
	return NULL;
}

/* A stream per request: each allocates a few pages and a block on a new
 * stream, frees the pages there or on the shared stream, and is destroyed;
 * its block outlives it and is freed on the next stream, the block's slab
 * still owned by the destroyed one. */
static void *churner(void *arg)
{
	(void)arg;
	struct alloc kept = {0};
	for (long it = 0; it < ops / 20 && !atomic_load(&failed); it++) {
		CUstream s = vpmm_host_stream_create(drv);
		struct alloc a = {0, (size_t)(1 + it % 3) * PAGE, (8ull << 40) | (uint64_t)it};
		struct alloc b = {0, 1000, (9ull << 40) | (uint64_t)it};
		if (!s || vpmm_pool_malloc(pool, a.n, s, &a.p))
			a.p = 0;
		if (!s || vpmm_pool_malloc(pool, b.n, s, &b.p))
			b.p = 0;
		if (a.p)
			stamp(&a);
		if (b.p)
			stamp(&b);
		if (kept.p && (!intact(&kept) || vpmm_pool_free(pool, kept.p, s ? s : VPMM_NO_STREAM)))
			fail("churner: a destroyed stream's block", THREADS + 1, it);
		if (a.p && (!intact(&a) || vpmm_pool_free(pool, a.p, it % 4 ? s : streams[THREADS])))
			fail("churner: pages", THREADS + 1, it);
		kept = b;
		if (s) {
			vpmm_pool_stream_gone(pool, s);
			vpmm_host_stream_destroy(drv, s);
		}
	}
	if (kept.p && (!intact(&kept) || vpmm_pool_free(pool, kept.p, VPMM_NO_STREAM)))
		fail("churner: the last block", THREADS + 1, -1);
	return NULL;
}

static void *gpu(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		vpmm_host_complete_all(drv);
		for (volatile int i = 0; i < 20000; i++)
			;
	}
	return NULL;
}

static void *checker(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop))
		if (vpmm_pool_check(pool, stderr))
			fail("check found broken invariants", -1, -1);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		ops = atol(argv[1]);
	if (argc > 2)
		seed0 = (unsigned)atol(argv[2]);
	struct vpmm_host_options ho = {.granularity = PAGE, .capacity = 300 * PAGE};
	if (vpmm_driver_host_create(&ho, &drv) != CUDA_SUCCESS)
		return 2;
	struct vpmm_config c;
	vpmm_config_default(&c);
	c.va_size = 128 * PAGE;
	c.background = true;
	c.release = true;
	c.release_threshold = 20 * PAGE;
	c.handle_size = 4 * PAGE;
	c.grain = 4096;
	if (vpmm_pool_create(&c, drv, &pool))
		return 2;
	for (int i = 0; i <= THREADS + 1; i++)
		streams[i] = vpmm_host_stream_create(drv);

	pthread_t w[THREADS], g, ch, lo, cn;
	pthread_create(&g, NULL, gpu, NULL);
	pthread_create(&ch, NULL, checker, NULL);
	for (long i = 0; i < THREADS; i++)
		pthread_create(&w[i], NULL, worker, (void *)i);
	pthread_create(&lo, NULL, looper, NULL);
	pthread_create(&cn, NULL, churner, NULL);
	for (int i = 0; i < THREADS; i++)
		pthread_join(w[i], NULL);
	pthread_join(lo, NULL);
	pthread_join(cn, NULL);
	atomic_store(&stop, 1);
	pthread_join(g, NULL);
	pthread_join(ch, NULL);

	vpmm_host_complete_all(drv);
	if (vpmm_pool_reclaim(pool) < 0 || vpmm_pool_check(pool, stderr))
		fail("final check", -1, -1);
	struct vpmm_stats st;
	vpmm_pool_stats(pool, &st);
	if (st.streams > THREADS + 2)
		fail("records of destroyed streams left after their work completed", -1, -1);
	printf("race: %ld ops x %d threads: %" PRIu64 " mallocs, %" PRIu64 " defrags, %" PRIu64
	       " pages remapped, %" PRIu64 " front hits, %" PRIu64 " placed where they went a step before\n",
	       ops, THREADS, st.mallocs, st.defrags, st.pages_remapped, st.front_hits, st.loop_hints);
	vpmm_pool_destroy(pool);
	struct vpmm_host_live l;
	vpmm_host_live(drv, &l);
	if (l.handles || l.reservations || l.mappings || l.events)
		fail("driver resources leaked", -1, -1);
	drv->destroy(drv);
	/* What the run covered. In a short run the looper's mallocs are
	 * sometimes never placed where they went a step before (1 run in 100
	 * at 5 000 operations, with as many defragmentations and cache hits as
	 * the others; why was not found; none in 30 at 20 000, the test
	 * suite's), so below COVERAGE_OPS a missing kind is reported, not
	 * failed. */
	bool covered = st.defrags && st.front_hits && st.loop_hints;
	if (!covered && ops >= COVERAGE_OPS)
		fail("the run exercised no defragmentation, no cache hit or no place of a step before",
		     -1, -1);
	else if (!covered)
		fprintf(stderr, "race: a run of %ld operations exercised no defragmentation, no cache "
				"hit or no place of a step before; not checked below %d\n",
			ops, COVERAGE_OPS);
	return atomic_load(&failed) ? 1 : 0;
}
