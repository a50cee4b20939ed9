/* test_stress.c — randomized multi-threaded stress of the pool on backed host
 * memory: worker threads allocate and free on their own stream and on a
 * shared one, a "GPU" thread completes streams now and then, and every live
 * allocation carries a pattern that is checked when it is freed and, for all
 * live allocations, after every defragmentation. Some calls come without a
 * stream (VPMM_NO_STREAM, as cudaMalloc/cudaFree).
 *
 * Reproduce a failure with VPMM_STRESS_SEED=<seed printed>; VPMM_STRESS_OPS
 * sets the total number of operations. Thread interleaving is not
 * reproducible, the per-thread operation sequences are. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver_host.h"
#include "vpmm.h"

#define NTHREADS 4
#define MAXLIVE 24

struct alloc {
	CUdeviceptr p;
	size_t bytes; /* as requested */
	uint64_t id;
};

struct worker {
	pthread_t th;
	int idx;
	CUstream own;
	uint64_t rng;
	pthread_mutex_t mu; /* guards live[] and n against verify_all */
	struct alloc live[MAXLIVE];
	size_t n;
	unsigned long ops, mallocs, frees, enomem;
};

struct stress {
	vpmm_driver *drv;
	vpmm_pool *pool;
	size_t page;
	bool small; /* sub-page classes on */
	CUstream shared;
	struct worker w[NTHREADS];
	unsigned long ops_per_thread;
	atomic_ulong next_id;
	atomic_ulong verified_defrags; /* highest defrag count verified after */
	atomic_ulong verifications;    /* verify_all runs */
	atomic_ulong errors;
	atomic_bool stop;     /* workers: give up (an error was found) */
	atomic_bool gpu_stop; /* the GPU thread: workers are done */
};

static uint64_t rnd(uint64_t *s)
{
	/* splitmix64: small, good enough, reproducible */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Depends on the word's place, so that places which coincide in a short
 * piece agree. */
static uint64_t pattern(uint64_t id, size_t page, size_t word)
{
	return (id * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)page << 40) ^ word;
}

/* The pattern lives in the first, middle and last word of every page-sized
 * piece of the requested bytes (a sub-page block is one piece). */
static size_t piece_words(const struct stress *S, const struct alloc *a, size_t i)
{
	size_t len = a->bytes - i * S->page;
	return (len < S->page ? len : S->page) / sizeof(uint64_t);
}

static size_t npieces(const struct stress *S, const struct alloc *a)
{
	return (a->bytes + S->page - 1) / S->page;
}

static void fill(struct stress *S, const struct alloc *a)
{
	for (size_t i = 0; i < npieces(S, a); i++) {
		uint64_t *w = (uint64_t *)(uintptr_t)(a->p + i * S->page);
		size_t n = piece_words(S, a, i);
		if (!n)
			continue;
		w[0] = pattern(a->id, i, 0);
		w[n / 2] = pattern(a->id, i, n / 2);
		w[n - 1] = pattern(a->id, i, n - 1);
	}
}

static void fail(struct stress *S, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void fail(struct stress *S, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "stress: FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	atomic_fetch_add(&S->errors, 1);
	atomic_store(&S->stop, true);
}

static bool verify(struct stress *S, const struct alloc *a, const char *when)
{
	for (size_t i = 0; i < npieces(S, a); i++) {
		const uint64_t *w = (const uint64_t *)(uintptr_t)(a->p + i * S->page);
		size_t n = piece_words(S, a, i);
		if (!n)
			continue;
		const size_t at[3] = { 0, n / 2, n - 1 };
		for (unsigned k = 0; k < 3; k++) {
			uint64_t want = pattern(a->id, i, at[k]);
			if (w[at[k]] != want) {
				fail(S, "%s: allocation #%" PRIu64 " at %#llx (%zu bytes): "
				     "page %zu word %zu is %#" PRIx64 ", expected %#" PRIx64,
				     when, a->id, (unsigned long long)a->p, a->bytes, i,
				     at[k], w[at[k]], want);
				return false;
			}
		}
	}
	return true;
}

/* Every live allocation of every thread. */
static void verify_all(struct stress *S)
{
	for (int t = 0; t < NTHREADS; t++) {
		struct worker *w = &S->w[t];
		pthread_mutex_lock(&w->mu);
		for (size_t i = 0; i < w->n; i++)
			if (!verify(S, &w->live[i], "after a defrag"))
				break;
		pthread_mutex_unlock(&w->mu);
	}
	atomic_fetch_add(&S->verifications, 1);
}

/* Mostly one page, sometimes a few, rarely many: defrags need several.
 * With sub-page classes on, a quarter are under a page (8 B .. 32 KiB). */
static size_t pick_bytes(const struct stress *S, uint64_t *rng)
{
	if (S->small && rnd(rng) % 4 == 0) {
		size_t b = 8 + rnd(rng) % ((size_t)64 << (rnd(rng) % 10));
		return b < S->page ? b : S->page - 1;
	}
	unsigned r = (unsigned)(rnd(rng) % 100);
	size_t pages;
	if (r < 60)
		return S->page;
	if (r < 85)
		pages = 2 + rnd(rng) % 3;
	else if (r < 97)
		pages = 5 + rnd(rng) % 8;
	else
		pages = 13 + rnd(rng) % 20;
	return pages * S->page - rnd(rng) % S->page;
}

static void do_malloc(struct stress *S, struct worker *w, CUstream s)
{
	size_t bytes = pick_bytes(S, &w->rng);
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(S->pool, bytes, s, &p);
	if (rc == -ENOMEM) {
		w->enomem++;
		return;
	}
	if (rc != 0) {
		fail(S, "thread %d: malloc(%zu) = %d (CUresult %d)", w->idx, bytes, rc,
		     (int)vpmm_pool_last_result(S->pool));
		return;
	}
	/* whole pages above a page, cudaMalloc's 256 B below */
	if (p % (bytes > S->page - 1 ? S->page : 256)) {
		fail(S, "thread %d: malloc(%zu) returned unaligned %#llx", w->idx,
		     bytes, (unsigned long long)p);
		return;
	}
	struct alloc a = { p, bytes, atomic_fetch_add(&S->next_id, 1) };
	fill(S, &a);
	pthread_mutex_lock(&w->mu);
	w->live[w->n++] = a;
	pthread_mutex_unlock(&w->mu);
	w->mallocs++;

	struct vpmm_stats st;
	vpmm_pool_stats(S->pool, &st);
	unsigned long seen = atomic_load(&S->verified_defrags);
	if (st.defrags > seen) {
		verify_all(S);
		/* raise to what this verification covered */
		while (seen < st.defrags &&
		       !atomic_compare_exchange_weak(&S->verified_defrags, &seen,
						     (unsigned long)st.defrags))
			;
	}
}

static void do_free(struct stress *S, struct worker *w, CUstream s)
{
	pthread_mutex_lock(&w->mu);
	size_t i = (size_t)(rnd(&w->rng) % w->n);
	struct alloc a = w->live[i];
	w->live[i] = w->live[--w->n];
	pthread_mutex_unlock(&w->mu);
	verify(S, &a, "at free");
	int rc = vpmm_pool_free(S->pool, a.p, s);
	if (rc != 0)
		fail(S, "thread %d: free(%#llx) = %d", w->idx, (unsigned long long)a.p, rc);
	w->frees++;
}

static void do_find(struct stress *S, struct worker *w)
{
	pthread_mutex_lock(&w->mu);
	struct alloc a = w->live[rnd(&w->rng) % w->n];
	pthread_mutex_unlock(&w->mu);
	CUdeviceptr inner = a.p + rnd(&w->rng) % a.bytes;
	CUdeviceptr base = 0;
	size_t size = 0;
	size_t rounded = (a.bytes + S->page - 1) / S->page * S->page;
	int rc = vpmm_pool_find(S->pool, inner, &base, &size);
	/* A page allocation is found whole; a sub-page one as its block. */
	bool ok = rc == 0 && base == a.p &&
		  (a.bytes < S->page ? size >= a.bytes && size < S->page : size == rounded);
	if (!ok)
		fail(S, "thread %d: find(%#llx) = %d, base %#llx size %zu; allocation "
		     "%#llx of %zu bytes", w->idx, (unsigned long long)inner, rc,
		     (unsigned long long)base, size, (unsigned long long)a.p, a.bytes);
}

static struct stress *G;

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct stress *S = G;
	for (unsigned long k = 0; k < S->ops_per_thread && !atomic_load(&S->stop); k++) {
		uint64_t r = rnd(&w->rng);
		/* a quarter on the shared stream, 1/16 stream-less (cudaMalloc,
		 * cudaFree), the rest on the thread's own stream */
		unsigned pick = (unsigned)(r & 15);
		CUstream s = pick < 4 ? S->shared : pick == 4 ? VPMM_NO_STREAM : w->own;
		bool alloc = w->n == 0 || (w->n < MAXLIVE && (r >> 8) % 100 < 52);
		if (alloc)
			do_malloc(S, w, s);
		else
			do_free(S, w, s);
		w->ops++;
		if (w->n && (r >> 16) % 16 == 0)
			do_find(S, w);
		if ((r >> 24) % 512 == 0) {
			int n = vpmm_pool_reclaim(S->pool);
			if (n < 0)
				fail(S, "thread %d: reclaim = %d", w->idx, n);
		}
		if (k % 25000 == 24999) {
			size_t bad = vpmm_pool_check(S->pool, stderr);
			if (bad)
				fail(S, "thread %d: check found %zu broken invariants "
				     "after %lu ops", w->idx, bad, k + 1);
		}
	}
	return NULL;
}

/* The device: completes a random stream (or all) every so often. */
static void *gpu_main(void *arg)
{
	struct stress *S = arg;
	uint64_t rng = 0x6770u;
	while (!atomic_load(&S->gpu_stop)) {
		unsigned r = (unsigned)(rnd(&rng) % (NTHREADS + 2));
		if (r < NTHREADS)
			vpmm_host_stream_complete(S->drv, S->w[r].own);
		else if (r == NTHREADS)
			vpmm_host_stream_complete(S->drv, S->shared);
		else
			vpmm_host_complete_all(S->drv);
		usleep(50 + (useconds_t)(rnd(&rng) % 200));
	}
	return NULL;
}

static unsigned long env_ul(const char *name, unsigned long dflt)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return dflt;
	char *end;
	unsigned long x = strtoul(v, &end, 0);
	cr_assert(*end == 0, "%s=%s is not a number", name, v);
	return x;
}

struct stress_cfg {
	const char *name;
	unsigned long ops; /* total, all threads */
	enum vpmm_defrag_policy defrag;
	bool every_free_records; /* event_interval_ns = 0 */
	bool pages_only;         /* small_max = 0: no sub-page classes */
};

static void run_stress(const struct stress_cfg *sc)
{
	static struct stress S;
	memset(&S, 0, sizeof S);
	G = &S;
	uint64_t seed = env_ul("VPMM_STRESS_SEED", 0x5eed2024u);
	unsigned long total = env_ul("VPMM_STRESS_OPS", sc->ops);
	S.ops_per_thread = (total + NTHREADS - 1) / NTHREADS;
	fprintf(stderr, "stress %s: seed %#" PRIx64 " (VPMM_STRESS_SEED), %lu ops "
		"on %d threads\n", sc->name, seed, S.ops_per_thread * NTHREADS, NTHREADS);

	struct vpmm_host_options ho = {
		.granularity = 64 << 10,
		.capacity = 320 * (size_t)(64 << 10),
	};
	cr_assert_eq(vpmm_driver_host_create(&ho, &S.drv), CUDA_SUCCESS);
	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.page_size = ho.granularity;
	cfg.va_size = 4096 * cfg.page_size;
	cfg.initial_pages = 64;
	cfg.defrag = sc->defrag;
	if (sc->every_free_records)
		cfg.event_interval_ns = 0;
	if (sc->pages_only)
		cfg.small_max = 0;
	S.small = !sc->pages_only;
	cr_assert_eq(vpmm_pool_create(&cfg, S.drv, &S.pool), 0);
	S.page = vpmm_pool_page_size(S.pool);
	S.shared = vpmm_host_stream_create(S.drv);
	for (int i = 0; i < NTHREADS; i++) {
		struct worker *w = &S.w[i];
		w->idx = i;
		w->own = vpmm_host_stream_create(S.drv);
		w->rng = seed ^ (0x1000193u * (uint64_t)(i + 1));
		pthread_mutex_init(&w->mu, NULL);
	}

	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_t gpu;
	cr_assert_eq(pthread_create(&gpu, NULL, gpu_main, &S), 0);
	for (int i = 0; i < NTHREADS; i++)
		cr_assert_eq(pthread_create(&S.w[i].th, NULL, worker_main, &S.w[i]), 0);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(S.w[i].th, NULL);
	atomic_store(&S.gpu_stop, true);
	pthread_join(gpu, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;

	/* Everything still live is intact; then free it all. */
	verify_all(&S);
	vpmm_host_complete_all(S.drv);
	cr_assert_geq(vpmm_pool_reclaim(S.pool), 0);
	size_t bad = vpmm_pool_check(S.pool, stderr);
	cr_assert_eq(bad, 0, "check after the run: %zu broken invariants", bad);

	unsigned long ops = 0, mallocs = 0, frees = 0, enomem = 0;
	for (int i = 0; i < NTHREADS; i++) {
		struct worker *w = &S.w[i];
		ops += w->ops;
		mallocs += w->mallocs;
		frees += w->frees;
		enomem += w->enomem;
		while (w->n)
			do_free(&S, w, w->own);
	}
	vpmm_host_complete_all(S.drv);
	cr_assert_geq(vpmm_pool_reclaim(S.pool), 0);
	bad = vpmm_pool_check(S.pool, stderr);
	cr_assert_eq(bad, 0, "check after freeing everything: %zu broken", bad);

	struct vpmm_stats st;
	vpmm_pool_stats(S.pool, &st);
	uint64_t retained = st.live; /* empty sub-page slabs kept for reuse */

	/* Nothing is lost: the whole device fits in one allocation again. */
	CUdeviceptr all = 0;
	int rc = vpmm_pool_malloc(S.pool, ho.capacity, S.w[0].own, &all);
	cr_assert_eq(rc, 0, "malloc of the whole device after freeing all: %d", rc);
	bad = vpmm_pool_check(S.pool, stderr);
	cr_assert_eq(bad, 0, "check after allocating the whole device: %zu broken", bad);
	cr_assert_eq(vpmm_pool_free(S.pool, all, S.w[0].own), 0);

	fprintf(stderr, "stress %s: %lu ops in %.1f s (%.0f ops/s): %lu mallocs, "
		"%lu frees, %lu ENOMEM; %" PRIu64 " defrags, %" PRIu64 " pages "
		"created, %" PRIu64 " remapped, %" PRIu64 " waits, %" PRIu64
		" zombies reclaimed, %lu full verifications; peak live %" PRIu64
		" KiB, peak mapped %" PRIu64 " KiB, reserved %" PRIu64 " KiB; %" PRIu64
		" KiB in empty sub-page slabs at the end\n",
		sc->name, ops, secs, (double)ops / secs, mallocs, frees, enomem,
		st.defrags, st.pages_created, st.pages_remapped, st.stream_waits,
		st.zombies_reclaimed, atomic_load(&S.verifications),
		st.live_peak >> 10, st.mapped_peak >> 10, st.reserved >> 10,
		retained >> 10);

	cr_assert_eq(atomic_load(&S.errors), 0, "%lu errors (see above), seed %#" PRIx64,
		     atomic_load(&S.errors), seed);
	cr_assert_eq(ops, S.ops_per_thread * NTHREADS, "only %lu ops ran", ops);
	if (sc->pages_only)
		cr_assert_eq(retained, 0, "%" PRIu64 " bytes live after freeing all",
			     retained);
	cr_assert_eq(st.mallocs, mallocs, "pool counted %" PRIu64 " mallocs, threads %lu",
		     st.mallocs, mallocs);
	cr_assert_leq(st.mapped_peak, ho.capacity, "mapped beyond the device");
	/* The run must have exercised what it is for. */
	cr_assert_gt(st.defrags, 0, "no defragmentation happened");
	cr_assert_gt(st.pages_remapped, 0, "no page was remapped");
	cr_assert_gt(atomic_load(&S.verifications), 0);

	vpmm_pool_destroy(S.pool);
	struct vpmm_host_live l;
	vpmm_host_live(S.drv, &l);
	cr_expect_eq(l.handles, 0, "leak: %zu handles", l.handles);
	cr_expect_eq(l.reservations, 0, "leak: %zu reservations", l.reservations);
	cr_expect_eq(l.mappings, 0, "leak: %zu mappings", l.mappings);
	cr_expect_eq(l.events, 0, "leak: %zu events", l.events);
	S.drv->destroy(S.drv);
	for (int i = 0; i < NTHREADS; i++)
		pthread_mutex_destroy(&S.w[i].mu);
}

/* The default configuration: epochs, sub-page classes, LACKING. */
Test(stress, defaults_with_small_classes, .timeout = 500)
{
	struct stress_cfg sc = { "defaults", 1000000, VPMM_DEFRAG_LACKING, false, false };
	run_stress(&sc);
}

/* Whole pages only, the reference policy, an event on every free. */
Test(stress, pages_only_policy_all_every_free_records, .timeout = 500)
{
	struct stress_cfg sc = { "pages-all", 400000, VPMM_DEFRAG_ALL, true, true };
	run_stress(&sc);
}
