// shim_cuda.cu — an unmodified CUDA program for the shim's GPU check
// (scripts/gpu-shim.sh). Built twice: nvcc's default (static runtime) and
// -cudart shared. Every allocation is written by a kernel and checked by
// another; the checks that matter for the shim:
//   sync      cudaMalloc/cudaFree of many sizes, live data checked after
//             every round of frees and allocations;
//   defrag    on a fresh pool, 32 x 32 MiB, every other one freed, then
//             256 MiB: larger than any gap, so the pool must remap freed pages
//             rather than grow (pages_remapped > 0, mapped peak ~1 GiB);
//   syncfree  a slow kernel on a non-blocking stream writes a buffer late;
//             cudaFree of it, then cudaMalloc of the same size (reuse) and a
//             new pattern: the late write must not land on the new owner;
//   syncfree_blocking / _many / _gpa / _destroyed  the same with the late
//             and the new writer on two blocking streams and the per-thread
//             default stream (ordered by the legacy stream alone; the new
//             owner's memory from cudaMalloc and from cudaMallocAsync on
//             the legacy stream); on 256
//             and on 262 non-blocking streams (fenced; past the shim's limit,
//             synchronised); on streams made through
//             cudaGetDriverEntryPointByVersion("cuStreamCreate"...); with
//             the late stream destroyed between the free and the reuse, and
//             before the free (with another non-blocking stream, and as the
//             only one, the new owner on the legacy stream).
//             Under the shim (EXPECT_POOL=1) each also checks how the frees
//             went: by fences (the default) or by synchronisations
//             (VPMM_SYNC_FREE=device, or past the limit), from the shim's
//             counters;
//   streams   cudaMallocAsync/cudaFreeAsync on four streams, reuse within and
//             across streams while slow kernels run;
//   timing    medians of cudaMalloc+cudaFree and cudaMallocAsync+FreeAsync.
// (At the end the pool may still count as live the sub-page slabs it keeps
// for reuse, so "live == 0" is not required.)
// Pool stats come from libvpmm.so's vpmm_shim_stats_json when it is loaded;
// EXPECT_POOL=1 makes "no pool" or "no defragmentation" a failure.
// `--quick` shortens everything (for compute-sanitizer).
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#include "check.h"


static const size_t MiB = 1 << 20;
static bool quick;

__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad)
{
	unsigned long long local = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		local += p[i] != (seed ^ (uint32_t)(i * 2654435761u));
	if (local)
		atomicAdd(bad, local);
}

// Spins for about `ns` on the device, then fills: a late writer.
__global__ void slow_fill(uint32_t *p, size_t n, uint32_t seed, unsigned long long ns)
{
	unsigned long long t0;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	for (;;) {
		unsigned long long t;
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
		if (t - t0 >= ns)
			break;
	}
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static unsigned long long *d_bad;

static void fill_on(void *p, size_t bytes, uint32_t seed, cudaStream_t s = 0)
{
	fill<<<256, 256, 0, s>>>((uint32_t *)p, bytes / 4, seed);
	CK(cudaGetLastError());
}

static unsigned long long check_on(void *p, size_t bytes, uint32_t seed, cudaStream_t s = 0)
{
	unsigned long long bad = 0;
	CK(cudaMemsetAsync(d_bad, 0, sizeof *d_bad, s));
	check<<<256, 256, 0, s>>>((const uint32_t *)p, bytes / 4, seed, d_bad);
	CK(cudaGetLastError());
	CK(cudaMemcpyAsync(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost, s));
	CK(cudaStreamSynchronize(s));
	return bad;
}

static long (*stats_json)(int, char *, size_t);

static void print_stats(const char *when)
{
	char buf[2048];
	if (!stats_json || stats_json(0, buf, sizeof buf) < 0)
		printf("stats %s: no pool\n", when);
	else
		printf("stats %s: %s\n", when, buf);
}

static unsigned long long stat_of(const char *name)
{
	char buf[2048], key[64];
	const char *at;
	if (!stats_json || stats_json(0, buf, sizeof buf) < 0)
		return 0;
	snprintf(key, sizeof key, "\"%s\":", name);
	at = strstr(buf, key);
	return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

struct buf {
	void *p;
	size_t bytes;
	uint32_t seed;
};

static void sync_phase(void)
{
	std::vector<buf> live;
	uint32_t seed = 1;
	unsigned rounds = quick ? 3 : 20;
	srand(7);
	for (unsigned r = 0; r < rounds; r++) {
		for (int k = 0; k < 24; k++) {
			size_t bytes = (size_t)(rand() % 64 + 1) * (rand() % 2 ? MiB : 4096);
			buf b = {nullptr, bytes, seed++};
			CK(cudaMalloc(&b.p, bytes));
			fill_on(b.p, bytes, b.seed);
			live.push_back(b);
		}
		for (size_t i = 0; i < live.size();) {
			if (rand() % 2) {
				CK(cudaFree(live[i].p));
				live[i] = live.back();
				live.pop_back();
			} else {
				i++;
			}
		}
		for (auto &b : live)
			REQUIRE(check_on(b.p, b.bytes, b.seed) == 0);
	}
	for (auto &b : live)
		CK(cudaFree(b.p));
	printf("sync: %u rounds ok\n", rounds);
}

static void defrag_phase(void)
{
	std::vector<buf> bufs;
	for (int i = 0; i < 32; i++) {
		buf b = {nullptr, 32 * MiB, (uint32_t)(100 + i)};
		CK(cudaMalloc(&b.p, b.bytes));
		fill_on(b.p, b.bytes, b.seed);
		bufs.push_back(b);
	}
	for (int i = 0; i < 32; i += 2)
		CK(cudaFree(bufs[i].p));
	// larger than any gap: the pool remaps freed pages (or grows)
	buf big = {nullptr, 256 * MiB, 999};
	CK(cudaMalloc(&big.p, big.bytes));
	fill_on(big.p, big.bytes, big.seed);
	REQUIRE(check_on(big.p, big.bytes, big.seed) == 0);
	for (int i = 1; i < 32; i += 2)
		REQUIRE(check_on(bufs[i].p, bufs[i].bytes, bufs[i].seed) == 0);
	for (int i = 1; i < 32; i += 2)
		CK(cudaFree(bufs[i].p));
	CK(cudaFree(big.p));
	printf("defrag: ok\n");
}

// cudaFree must not let memory be reused while earlier work may touch it.
static void syncfree_phase(void)
{
	cudaStream_t nb;
	size_t bytes = 64 * MiB;
	void *a, *b;
	unsigned long long ns = quick ? 20000000ull : 200000000ull;
	CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	for (int trial = 0; trial < 3; trial++) {
		CK(cudaMalloc(&a, bytes));
		slow_fill<<<132, 256, 0, nb>>>((uint32_t *)a, bytes / 4, 0xdead, ns);
		CK(cudaGetLastError());
		CK(cudaFree(a)); // must wait for slow_fill
		CK(cudaMalloc(&b, bytes));
		fill_on(b, bytes, 0xbeef, nb);
		CK(cudaStreamSynchronize(nb));
		REQUIRE(check_on(b, bytes, 0xbeef) == 0);
		printf("syncfree: trial %d reused=%d ok\n", trial, a == b);
		CK(cudaFree(b));
	}
	CK(cudaStreamDestroy(nb));
}

// The shim's counters (vpmm_shim_hook_calls) when it is loaded, else 0.
static unsigned long long (*hook_calls_fn)(const char *);
static unsigned long long hook(const char *name)
{
	return hook_calls_fn ? hook_calls_fn(name) : 0;
}
static bool expect_pool, sync_device;

// A late write on `late`, cudaFree, cudaMalloc of the same size, a new
// pattern on `next`: checked once both ran. destroy_late: `late` is
// destroyed between the free and the reuse. on_legacy: cudaMallocAsync on
// the legacy stream instead of cudaMalloc (the record the shim's free owes
// the legacy stream is made by either). destroy_first: `late` is destroyed
// before the free, its kernel still running.
static bool late_then_new(cudaStream_t late, cudaStream_t next, unsigned long long ns,
			  bool destroy_late = false, bool on_legacy = false,
			  bool destroy_first = false)
{
	size_t bytes = 16 * MiB;
	void *a, *b;
	CK(cudaMalloc(&a, bytes));
	slow_fill<<<132, 256, 0, late>>>((uint32_t *)a, bytes / 4, 0xdead, ns);
	CK(cudaGetLastError());
	if (destroy_first)
		CK(cudaStreamDestroy(late));
	CK(cudaFree(a));
	if (destroy_late)
		CK(cudaStreamDestroy(late));
	if (on_legacy)
		CK(cudaMallocAsync(&b, bytes, cudaStreamLegacy));
	else
		CK(cudaMalloc(&b, bytes));
	fill_on(b, bytes, 0xbeef, next);
	CK(cudaDeviceSynchronize());
	REQUIRE(check_on(b, bytes, 0xbeef) == 0);
	CK(cudaFree(b));
	return a == b;
}

// How the frees since (f0, s0) went: by fences or by synchronisations.
static void expect_frees(const char *phase, unsigned long long f0, unsigned long long s0,
			 bool fenced)
{
	unsigned long long f = hook("fence_free") - f0, s = hook("sync_free") - s0;
	printf("%s: %llu frees fenced, %llu synchronised\n", phase, f, s);
	if (!expect_pool)
		return;
	if (fenced && !sync_device) {
		REQUIRE(f > 0);
		REQUIRE(s == 0);
	} else {
		REQUIRE(s > 0);
	}
}

static void syncfree_blocking_phase(void)
{
	cudaStream_t b1, b2;
	unsigned long long ns = quick ? 20000000ull : 200000000ull;
	unsigned long long f0 = hook("fence_free"), s0 = hook("sync_free");
	int reused = 0;
	CK(cudaStreamCreate(&b1));
	CK(cudaStreamCreate(&b2));
	reused += late_then_new(b1, b2, ns);
	reused += late_then_new(b2, b1, ns);
	reused += late_then_new(cudaStreamPerThread, b2, ns);
	reused += late_then_new(b1, cudaStreamPerThread, ns);
	reused += late_then_new(b1, b2, ns, false, true);
	reused += late_then_new(cudaStreamPerThread, b1, ns, false, true);
	CK(cudaStreamDestroy(b1));
	CK(cudaStreamDestroy(b2));
	printf("syncfree_blocking: ok, %d of 6 reused\n", reused);
	expect_frees("syncfree_blocking", f0, s0, true);
}

static void syncfree_many_phase(void)
{
	const int N = 262, MAX = 256;
	cudaStream_t s[N];
	unsigned long long ns = quick ? 5000000ull : 50000000ull;
	for (int i = 0; i < N; i++)
		CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
	// 262 non-blocking streams: past the shim's limit (256), synchronised
	unsigned long long f0 = hook("fence_free"), s0 = hook("sync_free");
	for (int i = 0; i < N; i += 29)
		late_then_new(s[i], s[(i + 1) % N], ns);
	expect_frees("syncfree_many (262 streams)", f0, s0, false);
	for (int i = MAX; i < N; i++)
		CK(cudaStreamDestroy(s[i]));
	// 256: fenced, every one of them waited for and waiting
	f0 = hook("fence_free");
	s0 = hook("sync_free");
	for (int i = 0; i < MAX; i += 29)
		late_then_new(s[i], s[MAX - 1 - i], ns);
	expect_frees("syncfree_many (256 streams)", f0, s0, true);
	for (int i = 0; i < MAX; i++)
		CK(cudaStreamDestroy(s[i]));
	printf("syncfree_many: ok\n");
}

static void syncfree_gpa_phase(void)
{
	typedef CUresult (*create_t)(CUstream *, unsigned);
	typedef CUresult (*create_prio_t)(CUstream *, unsigned, int);
	create_t create = nullptr;
	create_prio_t create_prio = nullptr;
	cudaDriverEntryPointQueryResult q;
	CUstream s1, s2;
	unsigned long long ns = quick ? 20000000ull : 200000000ull;
	CK(cudaGetDriverEntryPointByVersion("cuStreamCreate", (void **)&create, 12000,
					    cudaEnableDefault, &q));
	CK(cudaGetDriverEntryPointByVersion("cuStreamCreateWithPriority", (void **)&create_prio,
					    12000, cudaEnableDefault, &q));
	REQUIRE(create && create_prio);
	unsigned long long c0 = hook("cuStreamCreate") + hook("cuStreamCreateWithPriority");
	REQUIRE(create(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	REQUIRE(create_prio(&s2, CU_STREAM_NON_BLOCKING, -1) == CUDA_SUCCESS);
	if (expect_pool) // the shim saw both made
		REQUIRE(hook("cuStreamCreate") + hook("cuStreamCreateWithPriority") == c0 + 2);
	unsigned long long f0 = hook("fence_free"), s0 = hook("sync_free");
	late_then_new((cudaStream_t)s1, (cudaStream_t)s2, ns);
	late_then_new((cudaStream_t)s2, (cudaStream_t)s1, ns);
	expect_frees("syncfree_gpa", f0, s0, true);
	CK(cudaStreamDestroy((cudaStream_t)s1));
	CK(cudaStreamDestroy((cudaStream_t)s2));
	printf("syncfree_gpa: ok\n");
}

static void syncfree_destroyed_phase(void)
{
	cudaStream_t late, next;
	unsigned long long ns = quick ? 20000000ull : 200000000ull;
	unsigned long long f0 = hook("fence_free"), s0 = hook("sync_free");
	CK(cudaStreamCreateWithFlags(&next, cudaStreamNonBlocking));
	for (int i = 0; i < 3; i++) {
		CK(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
		late_then_new(late, next, ns, true);
	}
	// destroyed before the free: with another non-blocking stream, then
	// as the only one (the new owner on the legacy stream)
	for (int i = 0; i < 2; i++) {
		CK(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
		late_then_new(late, next, ns, false, false, true);
	}
	CK(cudaStreamDestroy(next));
	for (int i = 0; i < 2; i++) {
		CK(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
		late_then_new(late, cudaStreamLegacy, ns, false, false, true);
	}
	expect_frees("syncfree_destroyed", f0, s0, true);
	printf("syncfree_destroyed: ok\n");
}

static void streams_phase(void)
{
	const int NS = 4;
	cudaStream_t s[NS];
	unsigned rounds = quick ? 4 : 40;
	unsigned long long ns = quick ? 2000000ull : 20000000ull;
	for (int i = 0; i < NS; i++)
		CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
	for (unsigned r = 0; r < rounds; r++) {
		void *p[NS], *q[NS];
		size_t bytes = (size_t)(1 + r % 8) * 8 * MiB;
		for (int i = 0; i < NS; i++) {
			CK(cudaMallocAsync(&p[i], bytes, s[i]));
			// late writer, then freed on its stream: stream-ordered
			slow_fill<<<132, 128, 0, s[i]>>>((uint32_t *)p[i], bytes / 4, 0xa0 + i, ns);
			CK(cudaGetLastError());
			CK(cudaFreeAsync(p[i], s[i]));
		}
		for (int i = 0; i < NS; i++) {
			// another stream takes the same size: must not share memory
			// with a slow_fill still running
			int j = (i + 1) % NS;
			CK(cudaMallocAsync(&q[i], bytes, s[j]));
			fill_on(q[i], bytes, 0xb0 + i, s[j]);
		}
		for (int i = 0; i < NS; i++) {
			int j = (i + 1) % NS;
			CK(cudaStreamSynchronize(s[j]));
			for (int k = 0; k < NS; k++)
				CK(cudaStreamSynchronize(s[k]));
			REQUIRE(check_on(q[i], bytes, 0xb0 + i, s[j]) == 0);
			CK(cudaFreeAsync(q[i], s[j]));
		}
	}
	for (int i = 0; i < NS; i++) {
		CK(cudaStreamSynchronize(s[i]));
		CK(cudaStreamDestroy(s[i]));
	}
	printf("streams: %u rounds ok\n", rounds);
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

static void timing_phase(void)
{
	const int N = quick ? 50 : 2000;
	std::vector<double> m, f, am, af;
	cudaStream_t s;
	void *p;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	for (int i = 0; i < N; i++) {
		double t0 = now_us();
		CK(cudaMalloc(&p, 2 * MiB));
		double t1 = now_us();
		CK(cudaFree(p));
		double t2 = now_us();
		m.push_back(t1 - t0);
		f.push_back(t2 - t1);
	}
	for (int i = 0; i < N; i++) {
		double t0 = now_us();
		CK(cudaMallocAsync(&p, 2 * MiB, s));
		double t1 = now_us();
		CK(cudaFreeAsync(p, s));
		double t2 = now_us();
		am.push_back(t1 - t0);
		af.push_back(t2 - t1);
	}
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamDestroy(s));
	printf("timing: cudaMalloc %.2f us, cudaFree %.2f us, cudaMallocAsync %.2f us, cudaFreeAsync %.2f us (2 MiB, medians of %d, idle device)\n",
	       median(m), median(f), median(am), median(af), N);
}

int main(int argc, char **argv)
{
	expect_pool = getenv("EXPECT_POOL") && !strcmp(getenv("EXPECT_POOL"), "1");
	sync_device = getenv("VPMM_SYNC_FREE") && !strcmp(getenv("VPMM_SYNC_FREE"), "device");
	quick = argc > 1 && !strcmp(argv[1], "--quick");
	CK(cudaFree(0));
	*(void **)&stats_json = dlsym(RTLD_DEFAULT, "vpmm_shim_stats_json");
	*(void **)&hook_calls_fn = dlsym(RTLD_DEFAULT, "vpmm_shim_hook_calls");
	CK(cudaMalloc(&d_bad, sizeof *d_bad));
	// first, on a fresh pool, so that no large free region exists yet
	defrag_phase();
	print_stats("after defrag");
	if (expect_pool) {
		// the 256 MiB came from remapped pages, not from growth
		REQUIRE(stat_of("pages_remapped") > 0);
		REQUIRE(stat_of("mapped_peak") <= 1024 * MiB + 32 * MiB);
	}
	sync_phase();
	print_stats("after sync");
	{
		unsigned long long f0 = hook("fence_free"), s0 = hook("sync_free");
		syncfree_phase();
		expect_frees("syncfree", f0, s0, true);
	}
	syncfree_blocking_phase();
	syncfree_many_phase();
	syncfree_gpa_phase();
	syncfree_destroyed_phase();
	streams_phase();
	print_stats("after streams");
	if (!quick)
		timing_phase();
	CK(cudaFree(d_bad));
	CK(cudaDeviceSynchronize());
	print_stats("at end");
	if (expect_pool) {
		REQUIRE(stats_json);
		REQUIRE(stat_of("mallocs") > 100);
		REQUIRE(stat_of("defrags") > 0);
	}
	printf("PASS\n");
	return 0;
}
