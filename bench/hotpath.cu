/* hotpath.cu — GPU microbenchmarks of the pool against what CUDA offers,
 * measured side by side in one process, printed as medians and ratios.
 *
 * Owns the device-side numbers that a trace replay cannot give:
 *   hit      malloc that reuses pool memory and its free, one thread: the
 *            pool directly (vpmm.h over the cuda driver) vs
 *            cudaMallocAsync/cudaFreeAsync on the default mempool with the
 *            release threshold at UINT64_MAX
 *   growth   mapping fresh memory (64 MiB, 1 GiB): handles of one page vs
 *            one handle the size of the request vs cudaMalloc
 *   defrag   a malloc that remaps N free pages into one range, per handle,
 *            vs the driver's own cuMemMap + cuMemSetAccess of as many
 *            handles (libcuda called directly, with the 2N handles the
 *            pool holds mapped beside them: fresh handles, and the same
 *            handles at a second address); and the next malloc, which
 *            finds the zombies it left
 *   threads  8 threads on 8 streams vs one thread, malloc/free pairs
 * Every line is also a key in the JSON object printed last (one line,
 * prefixed "HOTPATH_JSON "), which scripts/gpu-bench.sh tabulates.
 *
 * Build (scripts/gpu-bench.sh does it): the allocator's C files compiled
 * with gcc, then
 *   nvcc -O2 -Iallocator bench/hotpath.cu allocator-objects -ldl -lpthread
 * Options: --quick (fewer repetitions), --threads N (default 8).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

extern "C" {
#include "vpmm.h"
}

static const size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

/* ---- reporting ---------------------------------------------------------- */

static std::vector<std::pair<std::string, double>> metrics;

static void metric(const std::string &key, double v)
{
	metrics.push_back({key, v});
}

static void print_json(void)
{
	printf("HOTPATH_JSON {");
	for (size_t i = 0; i < metrics.size(); i++)
		printf("%s\"%s\": %.6g", i ? ", " : "", metrics[i].first.c_str(),
		       metrics[i].second);
	printf("}\n");
	fflush(stdout);
}

static void die(const char *what, long code)
{
	fprintf(stderr, "hotpath: %s failed (%ld)\n", what, code);
	print_json(); /* what was measured so far still counts */
	exit(1);
}

#define CK(x)                                                                  \
	do {                                                                   \
		cudaError_t e_ = (x);                                          \
		if (e_ != cudaSuccess)                                         \
			die(#x, (long)e_);                                     \
	} while (0)
#define CU(x)                                                                  \
	do {                                                                   \
		CUresult r_ = (x);                                             \
		if (r_ != CUDA_SUCCESS)                                        \
			die(#x, (long)r_);                                     \
	} while (0)
#define VP(x)                                                                  \
	do {                                                                   \
		int v_ = (x);                                                  \
		if (v_ != 0)                                                   \
			die(#x, (long)v_);                                     \
	} while (0)

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double median(std::vector<double> v)
{
	if (v.empty())
		return 0;
	std::sort(v.begin(), v.end());
	size_t n = v.size();
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double mean(const std::vector<double> &v)
{
	double s = 0;
	for (double x : v)
		s += x;
	return v.empty() ? 0 : s / (double)v.size();
}

static double timer_overhead_ns;

static void measure_timer(void)
{
	std::vector<double> d;
	for (int i = 0; i < 100000; i++) {
		uint64_t a = now_ns(), b = now_ns();
		d.push_back((double)(b - a));
	}
	timer_overhead_ns = median(d);
	printf("timer: clock_gettime pair %.0f ns (subtracted from per-call medians)\n",
	       timer_overhead_ns);
	metric("timer_ns", timer_overhead_ns);
}

/* ---- the driver, for the raw baseline --------------------------------------- */

struct raw_fns {
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t,
			      const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
				      unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			   unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
};
static raw_fns raw;

static void load_raw(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		die("dlopen(libcuda.so.1)", 0);
#define SYM(f, n)                                                              \
	do {                                                                   \
		void *p_ = dlsym(lib, n);                                      \
		if (!p_)                                                       \
			die("dlsym(" n ")", 0);                                \
		memcpy(&raw.f, &p_, sizeof p_);                                \
	} while (0)
	SYM(MemCreate, "cuMemCreate");
	SYM(MemRelease, "cuMemRelease");
	SYM(MemAddressReserve, "cuMemAddressReserve");
	SYM(MemAddressFree, "cuMemAddressFree");
	SYM(MemMap, "cuMemMap");
	SYM(MemUnmap, "cuMemUnmap");
	SYM(MemSetAccess, "cuMemSetAccess");
#undef SYM
}

/* As the pool's driver makes them: shareable as a POSIX fd where allowed. */
static void raw_create(size_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (raw.MemCreate(h, size, &prop, 0) == CUDA_SUCCESS)
		return;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	CU(raw.MemCreate(h, size, &prop, 0));
}

static void raw_access(CUdeviceptr va, size_t size)
{
	CUmemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = 0;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU(raw.MemSetAccess(va, size, &d, 1));
}

/* ---- the pool --------------------------------------------------------------- */

static vpmm_driver *drv;

/* handle_size and growth_split as given; split < 0: the defaults. */
static vpmm_pool *pool_new(size_t handle_size, int split = -1, bool background = false)
{
	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.background = background;
	if (split >= 0) {
		cfg.handle_size = handle_size;
		cfg.growth_split = (unsigned)split;
	}
	vpmm_pool *p;
	VP(vpmm_pool_create(&cfg, drv, &p));
	return p;
}

static struct vpmm_stats pool_stats(vpmm_pool *p)
{
	struct vpmm_stats s;
	vpmm_pool_stats(p, &s);
	return s;
}

static int reps_scale = 1; /* --quick divides repetitions */

/* ---- 1. pool hit, one thread ------------------------------------------------ */

enum hit_mode { HIT_ASYNC, HIT_VPMM_STREAM, HIT_VPMM_NOSTREAM };

struct hit_ctx {
	enum hit_mode mode;
	cudaStream_t s;
	vpmm_pool *p;
	size_t size;
};

static inline void hit_malloc(struct hit_ctx *c, void **ptr)
{
	CUdeviceptr d = 0;
	int r;
	switch (c->mode) {
	case HIT_ASYNC:
		if (cudaMallocAsync(ptr, c->size, c->s) != cudaSuccess)
			die("cudaMallocAsync", 0);
		return;
	case HIT_VPMM_STREAM:
		r = vpmm_pool_malloc(c->p, c->size, (CUstream)c->s, &d);
		break;
	default:
		r = vpmm_pool_malloc(c->p, c->size, VPMM_NO_STREAM, &d);
		break;
	}
	if (r)
		die("vpmm_pool_malloc", r);
	*ptr = (void *)(uintptr_t)d;
}

static inline void hit_free(struct hit_ctx *c, void *ptr)
{
	int r;
	switch (c->mode) {
	case HIT_ASYNC:
		if (cudaFreeAsync(ptr, c->s) != cudaSuccess)
			die("cudaFreeAsync", 0);
		return;
	case HIT_VPMM_STREAM:
		r = vpmm_pool_free(c->p, (CUdeviceptr)(uintptr_t)ptr, (CUstream)c->s);
		break;
	default:
		r = vpmm_pool_free(c->p, (CUdeviceptr)(uintptr_t)ptr, VPMM_NO_STREAM);
		break;
	}
	if (r)
		die("vpmm_pool_free", r);
}

struct hit_result {
	double malloc_ns, free_ns, malloc_mean, free_mean, pair_ns, calls;
};

/* One mode alone (no interleaving: each keeps its caches as a program
 * calling only it would): warm, then n pairs timed call by call, then
 * batches of 1000 pairs timed whole (no timer inside: the cross-check). */
static struct hit_result hit_run(struct hit_ctx *c, int n)
{
	struct hit_result res;
	std::vector<double> m, f, batch;
	m.reserve((size_t)n);
	f.reserve((size_t)n);
	void *ptr;
	for (int i = 0; i < 100; i++) {
		hit_malloc(c, &ptr);
		hit_free(c, ptr);
	}
	CK(cudaStreamSynchronize(c->s));
	struct vpmm_stats before = {}, after = {};
	if (c->p)
		before = pool_stats(c->p);
	for (int i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		hit_malloc(c, &ptr);
		uint64_t t1 = now_ns();
		hit_free(c, ptr);
		uint64_t t2 = now_ns();
		m.push_back((double)(t1 - t0) - timer_overhead_ns);
		f.push_back((double)(t2 - t1) - timer_overhead_ns);
	}
	if (c->p)
		after = pool_stats(c->p);
	for (int b = 0; b < 21; b++) {
		uint64_t t0 = now_ns();
		for (int i = 0; i < 1000; i++) {
			hit_malloc(c, &ptr);
			hit_free(c, ptr);
		}
		batch.push_back((double)(now_ns() - t0) / 1000.0);
	}
	CK(cudaStreamSynchronize(c->s));
	res.malloc_ns = median(m);
	res.free_ns = median(f);
	res.malloc_mean = mean(m);
	res.free_mean = mean(f);
	res.pair_ns = median(batch);
	res.calls = c->p ? (double)(after.driver_calls - before.driver_calls) / n * 1000.0 : 0;
	return res;
}

static void bench_hit(cudaStream_t s)
{
	const size_t sizes[] = {64 * KiB, 2 * MiB, 64 * MiB};
	const int n = 20000 / reps_scale;
	printf("\n== hit: malloc that reuses pool memory, then free; one thread, %d pairs "
	       "per mode, run one mode at a time; ns, median (mean); pair = median of "
	       "batches of 1000 pairs timed whole ==\n", n);

	cudaMemPool_t mp;
	CK(cudaDeviceGetDefaultMemPool(&mp, 0));
	uint64_t thr = UINT64_MAX;
	CK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &thr));
	vpmm_pool *p = pool_new(0);
	const char *names[] = {"cudaMallocAsync", "vpmm stream", "vpmm no-stream"};
	const char *keys[] = {"async", "vpmm", "vpmm_nostream"};

	for (size_t size : sizes) {
		std::string k = size >= MiB ? std::to_string(size / MiB) + "M"
					    : std::to_string(size / KiB) + "K";
		struct hit_result r[3];
		for (int mode = 0; mode < 3; mode++) {
			struct hit_ctx c = {(enum hit_mode)mode, s, mode ? p : NULL, size};
			r[mode] = hit_run(&c, n);
			printf("%4s  %-16s malloc %6.0f (%6.0f)  free %6.0f (%6.0f)  pair %6.0f",
			       k.c_str(), names[mode], r[mode].malloc_ns, r[mode].malloc_mean,
			       r[mode].free_ns, r[mode].free_mean, r[mode].pair_ns);
			if (mode)
				printf("  | driver calls per 1000 pairs %.1f", r[mode].calls);
			printf("\n");
			std::string pre = "hit_" + k + "_" + keys[mode];
			metric(pre + "_malloc_ns", r[mode].malloc_ns);
			metric(pre + "_free_ns", r[mode].free_ns);
			metric(pre + "_malloc_mean_ns", r[mode].malloc_mean);
			metric(pre + "_free_mean_ns", r[mode].free_mean);
			metric(pre + "_pair_ns", r[mode].pair_ns);
			if (mode)
				metric(pre + "_driver_calls_per_1000", r[mode].calls);
		}
		printf("%4s  ratio vpmm stream / cudaMallocAsync: malloc %.2f, free %.2f, "
		       "pair %.2f\n", k.c_str(), r[1].malloc_ns / r[0].malloc_ns,
		       r[1].free_ns / r[0].free_ns, r[1].pair_ns / r[0].pair_ns);
	}
	vpmm_pool_destroy(p);
	CK(cudaMemPoolTrimTo(mp, 0));
}

/* ---- 2. growth ---------------------------------------------------------------- */

static void bench_growth(void)
{
	const size_t sizes[] = {64 * MiB, 1 * GiB};
	printf("\n== growth: mapping fresh memory, medians ==\n");
	for (size_t size : sizes) {
		int reps = (size >= GiB ? 6 : 12) / reps_scale;
		if (reps < 2)
			reps = 2;
		std::vector<double> pg, one, cm, cf, rw, df;
		size_t handles_pg = 0, handles_one = 0, handles_df = 0;
		for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms, not kept */
			CUdeviceptr d;
			vpmm_pool *p = pool_new(0, 0); /* handle = page */
			uint64_t t0 = now_ns();
			VP(vpmm_pool_malloc(p, size, VPMM_NO_STREAM, &d));
			uint64_t t1 = now_ns();
			handles_pg = pool_stats(p).handles_created;
			vpmm_pool_destroy(p);

			p = pool_new(size, 0); /* one handle of the request's size */
			uint64_t t2 = now_ns();
			VP(vpmm_pool_malloc(p, size, VPMM_NO_STREAM, &d));
			uint64_t t3 = now_ns();
			handles_one = pool_stats(p).handles_created;
			vpmm_pool_destroy(p);

			p = pool_new(0); /* the defaults: VPMM_GROWTH_SPLIT handles */
			uint64_t t9 = now_ns();
			VP(vpmm_pool_malloc(p, size, VPMM_NO_STREAM, &d));
			uint64_t t10 = now_ns();
			handles_df = pool_stats(p).handles_created;
			vpmm_pool_destroy(p);

			void *ptr;
			uint64_t t4 = now_ns();
			CK(cudaMalloc(&ptr, size));
			uint64_t t5 = now_ns();
			CK(cudaFree(ptr));
			uint64_t t6 = now_ns();

			/* The driver's floor for one handle: create, map, access. */
			CUdeviceptr va;
			CUmemGenericAllocationHandle h;
			CU(raw.MemAddressReserve(&va, size, 0, 0, 0));
			uint64_t t7 = now_ns();
			raw_create(size, &h);
			CU(raw.MemMap(va, size, 0, h, 0));
			raw_access(va, size);
			uint64_t t8 = now_ns();
			CU(raw.MemUnmap(va, size));
			CU(raw.MemRelease(h));
			CU(raw.MemAddressFree(va, size));
			if (rep == 0)
				continue;
			pg.push_back((double)(t1 - t0));
			one.push_back((double)(t3 - t2));
			df.push_back((double)(t10 - t9));
			cm.push_back((double)(t5 - t4));
			cf.push_back((double)(t6 - t5));
			rw.push_back((double)(t8 - t7));
		}
		std::string k = size >= GiB ? std::to_string(size / GiB) + "G"
					    : std::to_string(size / MiB) + "M";
		printf("%4s  page handles (%zu) %9.1f us | one handle (%zu) %8.1f us | "
		       "cudaMalloc %8.1f us (cudaFree %8.1f us) | raw create+map+access %8.1f us | "
		       "ratio vs cudaMalloc: pages %.2f, one handle %.2f\n",
		       k.c_str(), handles_pg, median(pg) / 1e3, handles_one, median(one) / 1e3,
		       median(cm) / 1e3, median(cf) / 1e3, median(rw) / 1e3,
		       median(pg) / median(cm), median(one) / median(cm));
		metric("growth_" + k + "_pages_us", median(pg) / 1e3);
		metric("growth_" + k + "_pages_handles", (double)handles_pg);
		metric("growth_" + k + "_one_us", median(one) / 1e3);
		metric("growth_" + k + "_one_handles", (double)handles_one);
		metric("growth_" + k + "_cudamalloc_us", median(cm) / 1e3);
		metric("growth_" + k + "_cudafree_us", median(cf) / 1e3);
		metric("growth_" + k + "_raw_one_us", median(rw) / 1e3);
		printf("%4s  default policy (%zu handles) %8.1f us, ratio vs cudaMalloc %.2f\n",
		       k.c_str(), handles_df, median(df) / 1e3, median(df) / median(cm));
		metric("growth_" + k + "_default_us", median(df) / 1e3);
		metric("growth_" + k + "_default_handles", (double)handles_df);
	}
}

/* ---- 3. defragmentation ---------------------------------------------------------- */

/* The pool's defragmentation and the driver doing the same work are timed in
 * pairs, one pair a round, and the order inside a pair alternates from round
 * to round: the driver's own cost per handle moved by up to 1.6x between runs
 * on these hosts (docs/performance.md), so a ratio of two medians taken at
 * different moments spread over 0.88-1.26 for unchanged pool code. The ratio
 * reported is the median of the rounds' own ratios, with their range. */
static void bench_defrag(cudaStream_t s)
{
	const size_t counts[] = {64, 512};
	const size_t page = 2 * MiB;
	printf("\n== defrag: one malloc remapping N free 2 MiB handles (stream-ordered), "
	       "medians per handle ==\n");
	for (size_t n : counts) {
		int reps = (n >= 512 ? 8 : 12) / reps_scale;
		if (reps < 3)
			reps = 3;
		std::vector<double> df, next, rawv, raw2, unm, bg_next, bg_gone;
		std::vector<double> r_fresh, r_second; /* each round's own ratio */
		uint64_t bg_left = 0;
		double bg_by_thread = 0;
		size_t remapped = 0, created = 0;
		std::vector<CUdeviceptr> a(2 * n);

		/* 2N pages, each its own allocation; free the even ones: N free
		 * pages, none adjacent to another, the last page live. */
		auto fragment = [&](vpmm_pool *p) {
			for (size_t i = 0; i < 2 * n; i++)
				VP(vpmm_pool_malloc(p, page, (CUstream)s, &a[i]));
			for (size_t i = 0; i < 2 * n; i += 2)
				VP(vpmm_pool_free(p, a[i], (CUstream)s));
		};

		/* Then one malloc of N pages, timed; then the next malloc. */
		struct pool_round {
			uint64_t defrag_ns, next_ns;
			double reclaimed;
			size_t remapped, created;
		};
		auto pool_part = [&]() {
			pool_round r{};
			vpmm_pool *p = pool_new(0);
			if (vpmm_pool_page_size(p) != page)
				printf("  (pool page is %zu, not 2 MiB)\n", vpmm_pool_page_size(p));
			fragment(p);
			struct vpmm_stats b = pool_stats(p);
			CUdeviceptr big, after;
			uint64_t t0 = now_ns();
			VP(vpmm_pool_malloc(p, n * page, (CUstream)s, &big));
			uint64_t t1 = now_ns();
			struct vpmm_stats m = pool_stats(p);
			r.remapped = m.pages_remapped - b.pages_remapped;
			r.created = m.handles_created - b.handles_created;
			/* The old addresses are zombies until the stream passes the
			 * frees; then the next malloc may unmap them. */
			CK(cudaStreamSynchronize(s));
			uint64_t t2 = now_ns();
			VP(vpmm_pool_malloc(p, page, (CUstream)s, &after));
			uint64_t t3 = now_ns();
			struct vpmm_stats z = pool_stats(p);
			vpmm_pool_destroy(p);
			r.defrag_ns = t1 - t0;
			r.next_ns = t3 - t2;
			r.reclaimed = (double)(z.zombies_reclaimed - m.zombies_reclaimed);
			return r;
		};

		/* The same with the pool's own thread unmapping zombies (the
		 * shim's setting): the next malloc should not pay for it. */
		auto bg_part = [&](bool keep) {
			vpmm_pool *p = pool_new(0, -1, true);
			CUdeviceptr big, after;
			fragment(p);
			VP(vpmm_pool_malloc(p, n * page, (CUstream)s, &big));
			struct vpmm_stats bm = pool_stats(p);
			CK(cudaStreamSynchronize(s));
			uint64_t b2 = now_ns();
			VP(vpmm_pool_malloc(p, page, (CUstream)s, &after));
			uint64_t b3 = now_ns();
			/* and the zombies do go, off this thread */
			struct vpmm_stats bz = pool_stats(p);
			for (int w = 0; w < 2000 && bz.zombies; w++) {
				usleep(500);
				bz = pool_stats(p);
			}
			uint64_t b4 = now_ns();
			vpmm_pool_destroy(p);
			if (keep) {
				bg_next.push_back((double)(b3 - b2) / (double)n);
				bg_gone.push_back((double)(b4 - b2) / 1e3);
				bg_left = bz.zombies;
				bg_by_thread = (double)(bz.zombies_reclaimed - bm.zombies_reclaimed);
			}
		};

		/* The driver alone, in the state the pool's defragmentation starts
		 * from: 2N handles of a page mapped side by side, and the same two
		 * operations timed on top of them. */
		struct raw_round {
			uint64_t fresh_ns, second_ns, unmap_ns;
		};
		auto raw_part = [&]() {
			raw_round r{};
			std::vector<CUmemGenericAllocationHandle> h(3 * n);
			for (size_t i = 0; i < 3 * n; i++)
				raw_create(page, &h[i]);
			CUdeviceptr held, va, va2;
			CU(raw.MemAddressReserve(&held, 2 * n * page, 0, 0, 0));
			for (size_t i = 0; i < 2 * n; i++)
				CU(raw.MemMap(held + i * page, page, 0, h[i], 0));
			raw_access(held, 2 * n * page);
			/* Reserves a range, maps n handles (h[first], h[first +
			 * step], ...) side by side in it and grants access over the
			 * range, as the pool does; returns the ns the mapping took. */
			auto map_all = [&](CUdeviceptr *at, size_t first, size_t step) {
				CU(raw.MemAddressReserve(at, n * page, 0, 0, 0));
				uint64_t t = now_ns();
				for (size_t i = 0; i < n; i++)
					CU(raw.MemMap(*at + i * page, page, 0, h[first + i * step], 0));
				raw_access(*at, n * page);
				return now_ns() - t;
			};
			/* n handles never mapped before */
			r.fresh_ns = map_all(&va, 2 * n, 1);
			/* the even ones of the held range, mapped already, at a
			 * second address: what a defragmentation does (the old
			 * address stays mapped until its zombie is unmapped) */
			r.second_ns = map_all(&va2, 0, 2);
			/* and the zombie's unmap: the old address of those handles */
			uint64_t t5 = now_ns();
			for (size_t i = 0; i < 2 * n; i += 2)
				CU(raw.MemUnmap(held + i * page, page));
			r.unmap_ns = now_ns() - t5;
			for (size_t i = 1; i < 2 * n; i += 2)
				CU(raw.MemUnmap(held + i * page, page));
			CU(raw.MemUnmap(va, n * page));
			CU(raw.MemUnmap(va2, n * page));
			for (size_t i = 0; i < 3 * n; i++)
				CU(raw.MemRelease(h[i]));
			CU(raw.MemAddressFree(held, 2 * n * page));
			CU(raw.MemAddressFree(va, n * page));
			CU(raw.MemAddressFree(va2, n * page));
			return r;
		};

		for (int rep = 0; rep <= reps; rep++) {
			pool_round pr;
			raw_round rr;
			/* round 0 warms up and is dropped */
			if (rep % 2 == 0) {
				pr = pool_part();
				rr = raw_part();
			} else {
				rr = raw_part();
				pr = pool_part();
			}
			bg_part(rep > 0);
			if (rep == 0)
				continue;
			remapped = pr.remapped;
			created = pr.created;
			double per = (double)pr.defrag_ns / (double)n;
			df.push_back(per);
			rawv.push_back((double)rr.fresh_ns / (double)n);
			raw2.push_back((double)rr.second_ns / (double)n);
			r_fresh.push_back(per / ((double)rr.fresh_ns / (double)n));
			r_second.push_back(per / ((double)rr.second_ns / (double)n));
			unm.push_back((double)rr.unmap_ns / (double)n);
			next.push_back(pr.reclaimed > 0 ? (double)pr.next_ns / (double)n : 0);
			if (rep == reps)
				printf("  N=%zu: %zu pages remapped, %zu handles created, "
				       "%.0f zombie ranges unmapped by the next malloc\n",
				       n, remapped, created, pr.reclaimed);
		}
		auto lo = [](const std::vector<double> &v) {
			return *std::min_element(v.begin(), v.end());
		};
		auto hi = [](const std::vector<double> &v) {
			return *std::max_element(v.begin(), v.end());
		};
		std::string k = std::to_string(n);
		printf("N=%4zu  vpmm defrag %6.1f us/handle | driver map+access %6.1f us/handle | "
		       "ratio %.2f (paired rounds, %d: median; %.2f-%.2f) | next malloc (unmaps "
		       "zombies) %6.1f us/handle, raw unmap %6.1f us/handle\n",
		       n, median(df) / 1e3, median(rawv) / 1e3, median(r_fresh), reps,
		       lo(r_fresh), hi(r_fresh), median(next) / 1e3, median(unm) / 1e3);
		metric("defrag_" + k + "_vpmm_us_per_handle", median(df) / 1e3);
		metric("defrag_" + k + "_raw_us_per_handle", median(rawv) / 1e3);
		metric("defrag_" + k + "_ratio", median(r_fresh));
		metric("defrag_" + k + "_ratio_min", lo(r_fresh));
		metric("defrag_" + k + "_ratio_max", hi(r_fresh));
		printf("N=%4zu  driver mapping the same handles at a second address %6.1f us/handle | "
		       "ratio %.2f (%.2f-%.2f)\n", n, median(raw2) / 1e3, median(r_second),
		       lo(r_second), hi(r_second));
		metric("defrag_" + k + "_raw_second_us_per_handle", median(raw2) / 1e3);
		metric("defrag_" + k + "_ratio_second", median(r_second));
		metric("defrag_" + k + "_ratio_second_min", lo(r_second));
		metric("defrag_" + k + "_ratio_second_max", hi(r_second));
		metric("defrag_" + k + "_rounds", (double)reps);
		metric("defrag_" + k + "_remapped", (double)remapped);
		metric("defrag_" + k + "_created", (double)created);
		metric("defrag_" + k + "_next_malloc_us_per_handle", median(next) / 1e3);
		metric("defrag_" + k + "_raw_unmap_us_per_handle", median(unm) / 1e3);
		printf("N=%4zu  background reclaimer: next malloc %6.2f us/handle; zombies gone "
		       "%.0f us after the sync (%.0f ranges unmapped by the thread, %llu bytes left)\n",
		       n, median(bg_next) / 1e3, median(bg_gone), bg_by_thread,
		       (unsigned long long)bg_left);
		metric("defrag_" + k + "_bg_next_malloc_us_per_handle", median(bg_next) / 1e3);
		metric("defrag_" + k + "_bg_zombies_gone_us", median(bg_gone));
		metric("defrag_" + k + "_bg_zombies_left", (double)bg_left);
	}
}

/* ---- 4. threads ------------------------------------------------------------------- */

struct worker {
	pthread_t th;
	int use_vpmm;
	vpmm_pool *pool;
	cudaStream_t stream;
	long pairs;
	pthread_barrier_t *go;
	int err;
};

static void *worker_main(void *arg)
{
	worker *w = (worker *)arg;
	size_t size = 2 * MiB;
	if (cudaSetDevice(0) != cudaSuccess) /* makes the context current here */
		w->err = -1;
	/* Warm: this stream's memory exists before the clock starts. */
	void *ptr;
	CUdeviceptr d;
	if (w->use_vpmm) {
		if (vpmm_pool_malloc(w->pool, size, (CUstream)w->stream, &d) ||
		    vpmm_pool_free(w->pool, d, (CUstream)w->stream))
			w->err = -2;
	} else if (cudaMallocAsync(&ptr, size, w->stream) || cudaFreeAsync(ptr, w->stream)) {
		w->err = -3;
	}
	pthread_barrier_wait(w->go);
	for (long i = 0; i < w->pairs && !w->err; i++) {
		if (w->use_vpmm) {
			if (vpmm_pool_malloc(w->pool, size, (CUstream)w->stream, &d) ||
			    vpmm_pool_free(w->pool, d, (CUstream)w->stream))
				w->err = -4;
		} else if (cudaMallocAsync(&ptr, size, w->stream) ||
			   cudaFreeAsync(ptr, w->stream)) {
			w->err = -5;
		}
	}
	pthread_barrier_wait(w->go);
	return NULL;
}

/* Pairs per second with `nthreads` threads, each on its own stream. */
static double run_threads(int use_vpmm, vpmm_pool *p, int nthreads, long pairs,
			  std::vector<cudaStream_t> &streams)
{
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, (unsigned)nthreads + 1);
	std::vector<worker> w((size_t)nthreads);
	for (int i = 0; i < nthreads; i++) {
		w[i] = worker{};
		w[i].use_vpmm = use_vpmm;
		w[i].pool = p;
		w[i].stream = streams[(size_t)i];
		w[i].pairs = pairs;
		w[i].go = &go;
		pthread_create(&w[i].th, NULL, worker_main, &w[i]);
	}
	pthread_barrier_wait(&go);
	uint64_t t0 = now_ns();
	pthread_barrier_wait(&go);
	uint64_t t1 = now_ns();
	for (int i = 0; i < nthreads; i++) {
		pthread_join(w[i].th, NULL);
		if (w[i].err)
			die(use_vpmm ? "vpmm thread" : "cudaMallocAsync thread", w[i].err);
	}
	pthread_barrier_destroy(&go);
	return (double)nthreads * (double)pairs / ((double)(t1 - t0) / 1e9);
}

static void bench_threads(int nthreads)
{
	long pairs = 100000 / reps_scale;
	printf("\n== threads: malloc/free pairs of 2 MiB, each thread on its own stream, "
	       "%ld pairs a thread ==\n", pairs);
	std::vector<cudaStream_t> streams((size_t)nthreads);
	for (auto &s : streams)
		CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	vpmm_pool *p = pool_new(0);
	double v1 = 0, vn = 0, a1 = 0, an = 0;
	for (int rep = 0; rep < 3; rep++) { /* best of 3: noise only slows down */
		v1 = std::max(v1, run_threads(1, p, 1, pairs, streams));
		vn = std::max(vn, run_threads(1, p, nthreads, pairs, streams));
		a1 = std::max(a1, run_threads(0, NULL, 1, pairs, streams));
		an = std::max(an, run_threads(0, NULL, nthreads, pairs, streams));
	}
	printf("vpmm            1 thread %8.2f M pairs/s | %d threads %8.2f M pairs/s | "
	       "scaling %.2fx\n", v1 / 1e6, nthreads, vn / 1e6, vn / v1);
	printf("cudaMallocAsync 1 thread %8.2f M pairs/s | %d threads %8.2f M pairs/s | "
	       "scaling %.2fx\n", a1 / 1e6, nthreads, an / 1e6, an / a1);
	metric("threads_n", nthreads);
	metric("threads_vpmm_1_mpairs", v1 / 1e6);
	metric("threads_vpmm_n_mpairs", vn / 1e6);
	metric("threads_async_1_mpairs", a1 / 1e6);
	metric("threads_async_n_mpairs", an / 1e6);
	vpmm_pool_destroy(p);
	for (auto &s : streams)
		CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
	int nthreads = 8;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			reps_scale = 4;
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			nthreads = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--quick] [--threads N]\n", argv[0]);
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 256)
		nthreads = 8;
	CK(cudaSetDevice(0));
	CK(cudaFree(0)); /* context */
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	int drv_version = 0;
	cudaDriverGetVersion(&drv_version);
	printf("device: %s, CUDA driver %d\n", prop.name, drv_version);
	load_raw();
	CU(vpmm_driver_cuda_create(NULL, NULL, &drv));
	measure_timer();

	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	bench_hit(s);
	bench_growth();
	bench_defrag(s);
	bench_threads(nthreads);
	CK(cudaStreamDestroy(s));
	drv->destroy(drv);
	print_json();
	return 0;
}
