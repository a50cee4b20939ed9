// graphs.cu — CUDA graphs captured from streams, with and without the shim:
// scripts/gpu-graphs.sh runs it plainly (the driver's behaviour, the
// baseline) and under LD_PRELOAD=libvpmm.so with EXPECT_POOL=1.
//
//   replay      cudaMallocAsync / kernels / cudaFreeAsync captured on a
//               stream (graph memory nodes), instantiated, launched 1,000
//               times into a buffer the pool served before the capture;
//               every element checked; the pool's live and mapped bytes
//               the same after the 1,000th launch as after the 10th.
//   free_inside a buffer made before the capture (cudaMalloc, then
//               cudaMallocAsync) freed inside it: under the shim the frees
//               succeed and the capture stays valid, the memory is given
//               back once the capture ended (live drops then, not before);
//               plainly the driver refuses the cudaFree
//               (cudaErrorStreamCaptureUnsupported) and invalidates the
//               capture, which is checked as the baseline.
//   steps       200 captures, each freeing inside it a buffer made before
//               it (as PyTorch frees a tensor), launched once: the pool's
//               live bytes back to where they started, mapped flat.
//   other_thread another thread captures in the global mode while this one
//               calls cudaFree on pool memory: under the shim the free
//               waits, the capture stays valid; plainly refused, as above.
//   sync_malloc cudaMalloc inside a global capture: refused the same way
//               plainly and under the shim.
//
// `graphs [SCENARIO]`: all of them by default. Exit 0 when every check
// held; "FAIL file:line ..." otherwise. Pool figures from vpmm_shim_stats
// (include/vpmm/vpmm.h), found with dlsym when the library is loaded.
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "check.h"
#include "vpmm/stats.h"

static int (*shim_stats)(int, struct vpmm_stats *);
static bool pool; // EXPECT_POOL=1: the pool must serve, and defer

static struct vpmm_stats stats(void)
{
	struct vpmm_stats s;
	memset(&s, 0, sizeof s);
	if (shim_stats)
		REQUIRE(shim_stats(0, &s) == 0);
	return s;
}

static const int N = 1 << 20; // ints: 4 MiB buffers

__global__ void fill(int *a, int n, int k)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		a[i] = (k * i) % 1009;
}

__global__ void add(int *dst, const int *src, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		dst[i] += src[i];
}

#define GRID ((N + 255) / 256), 256

static void replay(void)
{
	cudaStream_t s;
	int *acc, *tmp;
	cudaGraph_t g;
	cudaGraphExec_t exec;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMallocAsync((void **)&acc, N * sizeof(int), s));
	CK(cudaMemsetAsync(acc, 0, N * sizeof(int), s));
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	CK(cudaMallocAsync((void **)&tmp, N * sizeof(int), s)); // a graph allocation
	fill<<<GRID, 0, s>>>(tmp, N, 3);
	add<<<GRID, 0, s>>>(acc, tmp, N);
	CK(cudaFreeAsync(tmp, s));
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiate(&exec, g, 0));
	const int launches = 1000;
	struct vpmm_stats at10 = {};
	for (int i = 1; i <= launches; i++) {
		CK(cudaGraphLaunch(exec, s));
		if (i == 10) {
			CK(cudaStreamSynchronize(s));
			at10 = stats();
		}
	}
	CK(cudaStreamSynchronize(s));
	struct vpmm_stats end = stats();
	std::vector<int> h(N);
	CK(cudaMemcpy(h.data(), acc, N * sizeof(int), cudaMemcpyDeviceToHost));
	for (int i = 0; i < N; i++)
		if (h[i] != launches * ((3 * i) % 1009)) {
			fprintf(stderr, "FAIL replay: acc[%d] = %d, expected %d\n", i, h[i],
				launches * ((3 * i) % 1009));
			exit(1);
		}
	if (pool) {
		REQUIRE(end.mallocs > 0);
		REQUIRE(end.live == at10.live);
		REQUIRE(end.mapped == at10.mapped);
	}
	printf("replay: %d launches checked; pool live %llu, mapped %llu bytes after 10 and %d\n",
	       launches, (unsigned long long)end.live, (unsigned long long)end.mapped, launches);
	CK(cudaGraphExecDestroy(exec));
	CK(cudaGraphDestroy(g));
	CK(cudaFreeAsync(acc, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamDestroy(s));
}

// Ends a capture the driver invalidated: the error it must report, no graph.
static void end_invalidated(cudaStream_t s)
{
	cudaGraph_t g = NULL;
	REQUIRE(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
	REQUIRE(g == NULL);
	(void)cudaGetLastError();
}

static void free_inside(void)
{
	cudaStream_t s;
	int *pre, *pre2, *acc;
	cudaGraph_t g;
	cudaGraphExec_t exec;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMalloc((void **)&pre, N * sizeof(int)));
	CK(cudaMallocAsync((void **)&pre2, N * sizeof(int), s));
	CK(cudaMallocAsync((void **)&acc, N * sizeof(int), s));
	CK(cudaMemsetAsync(acc, 0, N * sizeof(int), s));
	fill<<<GRID, 0, s>>>(pre, N, 5); // work on them before the capture
	fill<<<GRID, 0, s>>>(pre2, N, 7);
	CK(cudaStreamSynchronize(s));
	struct vpmm_stats before = stats();

	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	fill<<<GRID, 0, s>>>(acc, N, 11);
	cudaError_t e = cudaFree(pre);
	if (!pool) {
		// the driver's answer without the pool: refused, capture invalidated
		REQUIRE(e == cudaErrorStreamCaptureUnsupported);
		end_invalidated(s);
		CK(cudaFree(pre));
		CK(cudaFreeAsync(pre2, s));
		CK(cudaFreeAsync(acc, s));
		CK(cudaStreamSynchronize(s));
		CK(cudaStreamDestroy(s));
		printf("free_inside: plain cudaFree refused inside the capture, as expected\n");
		return;
	}
	CK(e);
	CK(cudaFreeAsync(pre2, s));
	REQUIRE(stats().live == before.live); // nothing given back during the capture
	CK(cudaStreamEndCapture(s, &g));
	REQUIRE(g != NULL);
	struct vpmm_stats after = stats();
	REQUIRE(after.live + 2 * N * sizeof(int) <= before.live);
	CK(cudaGraphInstantiate(&exec, g, 0));
	for (int i = 0; i < 10; i++)
		CK(cudaGraphLaunch(exec, s));
	CK(cudaStreamSynchronize(s));
	std::vector<int> h(N);
	CK(cudaMemcpy(h.data(), acc, N * sizeof(int), cudaMemcpyDeviceToHost));
	for (int i = 0; i < N; i++)
		REQUIRE(h[i] == (11 * i) % 1009);
	printf("free_inside: live %llu before the capture, %llu after its end\n",
	       (unsigned long long)before.live, (unsigned long long)after.live);
	CK(cudaGraphExecDestroy(exec));
	CK(cudaGraphDestroy(g));
	CK(cudaFreeAsync(acc, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamDestroy(s));
}

static void steps(void)
{
	cudaStream_t s;
	int *acc;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMallocAsync((void **)&acc, N * sizeof(int), s));
	CK(cudaMemsetAsync(acc, 0, N * sizeof(int), s));
	CK(cudaStreamSynchronize(s));
	struct vpmm_stats start = stats(), after5 = {};
	const int n_steps = 200;
	for (int i = 0; i < n_steps; i++) {
		int *x;
		cudaGraph_t g;
		cudaGraphExec_t exec;
		CK(cudaMallocAsync((void **)&x, N * sizeof(int), s));
		fill<<<GRID, 0, s>>>(x, N, i);
		add<<<GRID, 0, s>>>(acc, x, N);
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		fill<<<GRID, 0, s>>>(acc, N, 2);
		// freed inside the capture under the shim: deferred to its end.
		// Plainly CUDA refuses a free of memory no graph allocated inside
		// a capture (invalid argument, seen on an H200), so the baseline
		// frees it after the capture.
		if (pool)
			CK(cudaFreeAsync(x, s));
		CK(cudaStreamEndCapture(s, &g));
		if (!pool)
			CK(cudaFreeAsync(x, s));
		CK(cudaGraphInstantiate(&exec, g, 0));
		CK(cudaGraphLaunch(exec, s));
		CK(cudaGraphExecDestroy(exec));
		CK(cudaGraphDestroy(g));
		if (i == 4) {
			CK(cudaStreamSynchronize(s));
			after5 = stats();
		}
	}
	CK(cudaStreamSynchronize(s));
	struct vpmm_stats end = stats();
	if (pool) {
		REQUIRE(end.live == start.live);
		REQUIRE(end.mapped <= after5.mapped);
	}
	printf("steps: %d captures; pool live %llu at the start, %llu at the end; mapped %llu after 5, %llu at the end\n",
	       n_steps, (unsigned long long)start.live, (unsigned long long)end.live,
	       (unsigned long long)after5.mapped, (unsigned long long)end.mapped);
	CK(cudaFreeAsync(acc, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamDestroy(s));
}

static pthread_barrier_t bar;
static cudaStream_t cap_s;
static cudaError_t cap_end;

static void *capturer(void *arg)
{
	cudaGraph_t g = NULL;
	int *acc = (int *)arg;
	CK(cudaStreamBeginCapture(cap_s, cudaStreamCaptureModeGlobal));
	fill<<<GRID, 0, cap_s>>>(acc, N, 13);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	cap_end = cudaStreamEndCapture(cap_s, &g);
	if (g)
		CK(cudaGraphDestroy(g));
	return NULL;
}

static void other_thread(void)
{
	pthread_t t;
	int *p, *acc;
	CK(cudaStreamCreateWithFlags(&cap_s, cudaStreamNonBlocking));
	CK(cudaMalloc((void **)&p, N * sizeof(int)));
	CK(cudaMalloc((void **)&acc, N * sizeof(int)));
	pthread_barrier_init(&bar, NULL, 2);
	REQUIRE(pthread_create(&t, NULL, capturer, acc) == 0);
	pthread_barrier_wait(&bar);
	struct vpmm_stats before = stats();
	cudaError_t e = cudaFree(p);
	struct vpmm_stats during = stats();
	pthread_barrier_wait(&bar);
	REQUIRE(pthread_join(t, NULL) == 0);
	if (pool) {
		CK(e);
		REQUIRE(during.live == before.live);
		CK(cap_end);
		REQUIRE(stats().live + N * sizeof(int) <= before.live);
	} else {
		REQUIRE(e == cudaErrorStreamCaptureUnsupported);
		REQUIRE(cap_end == cudaErrorStreamCaptureInvalidated);
		(void)cudaGetLastError();
		CK(cudaFree(p));
	}
	printf("other_thread: cudaFree during another thread's global capture: %s, capture %s\n",
	       cudaGetErrorName(e), cudaGetErrorName(cap_end));
	CK(cudaFree(acc));
	CK(cudaStreamDestroy(cap_s));
}

static void sync_malloc(void)
{
	cudaStream_t s;
	void *p = NULL;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	cudaError_t e = cudaMalloc(&p, 1 << 20);
	REQUIRE(e == cudaErrorStreamCaptureUnsupported);
	end_invalidated(s);
	printf("sync_malloc: cudaMalloc inside a global capture: %s\n", cudaGetErrorName(e));
	CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		void (*fn)(void);
	} scenarios[] = {
		{"replay", replay},         {"free_inside", free_inside},
		{"steps", steps},           {"other_thread", other_thread},
		{"sync_malloc", sync_malloc},
	};
	pool = getenv("EXPECT_POOL") && !strcmp(getenv("EXPECT_POOL"), "1");
	CK(cudaFree(0));
	*(void **)&shim_stats = dlsym(RTLD_DEFAULT, "vpmm_shim_stats");
	if (pool)
		REQUIRE(shim_stats != NULL);
	int ran = 0;
	for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
		if (argc < 2 || !strcmp(argv[1], scenarios[i].name)) {
			scenarios[i].fn();
			ran++;
		}
	if (!ran) {
		fprintf(stderr, "usage: %s [SCENARIO]\n", argv[0]);
		return 2;
	}
	printf("ok graphs\n");
	return 0;
}
