/* graph_prog.c — stream capture (CUDA graphs) with pool memory, in an
 * unmodified program linked with (the fake) libcudart.so, whose capture
 * calls reach the driver through cuGetProcAddress as the real runtime's do.
 * `graph_prog SCENARIO` exits 0 when every check holds, else prints
 * "FAIL file:line ..." and exits non-zero. See shimtest.h for
 * SHIMTEST_EXPECT; every scenario but sync_malloc expects the pool.
 *
 * The fake driver refuses what a capture forbids (a context
 * synchronisation, a synchronous malloc or free) with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, counts it ("capture_violation")
 * and invalidates the capture, as the real one does.
 */
#include <pthread.h>

#include "shimtest.h"

typedef int cudaError_t;
typedef CUstream cudaStream_t;
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, CUgraph *g);
cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, CUgraph *g);

#define P ((size_t)64 << 10) /* the fake driver's granularity: one pool page */
enum { GLOBAL = 0, THREAD_LOCAL = 1, RELAXED = 2 };
enum { UNSUPPORTED = 900, INVALIDATED = 901, WRONG_THREAD = 908 };

static long long frees(void)
{
	return (long long)pool_stats(0).frees;
}

/* The synchronous frees' synchronisations: of the context, or by fences
 * (the shim's default where it knows every stream). */
static long long syncs(void)
{
	return fake_calls("cuCtxSynchronize") + hook_calls("fence_free");
}

/* A stream-ordered free on the captured stream: deferred, made at the end;
 * the memory is not handed out while the capture runs, and is reused on its
 * stream at once after. A free of no allocation's start, and a second free,
 * are refused at once, as they would be outside a capture. Graph
 * allocations go to the driver. */
static void async_free(void)
{
	cudaStream_t s, s2;
	void *q, *g1, *r, *x;
	CUgraph g = NULL;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	CHECK_EQ(cudaStreamCreate(&s2), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaMallocAsync(&g1, P, s), 0); /* a graph allocation */
	CHECK_EQ(fake_calls("cuMemAllocAsync"), 1);
	CHECK_EQ(cudaFreeAsync(g1, s), 0);
	CHECK_EQ(fake_calls("cuMemFreeAsync"), 1);
	CHECK_EQ(cudaFreeAsync((char *)q + 16, s), 1); /* not an allocation's start */
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	CHECK_EQ(cudaFreeAsync(q, s), 1); /* twice */
	CHECK_EQ(frees(), 0);
	CHECK_EQ(hook_calls("capture_deferred"), 1);
	CHECK_EQ(cudaMallocAsync(&r, P, s2), 0); /* another stream, meanwhile */
	CHECK(r != q);
	CHECK_EQ(cudaFreeAsync(r, s2), 0);
	CHECK_EQ(frees(), 1);
	CHECK_EQ(cudaStreamEndCapture(s, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 2);
	CHECK_EQ(hook_calls("capture_flushed"), 1);
	CHECK_EQ(cudaMallocAsync(&x, P, s), 0);
	CHECK(x == q);
	CHECK_EQ(cudaFreeAsync(x, s), 0);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

/* cudaFree of pool memory inside the thread's own global capture (what
 * PyTorch without its cache does with a tensor freed in the capture): no
 * context synchronisation during the capture, which stays valid; the free
 * is made, synchronising (or fenced), after the end. */
static void sync_free_own(void)
{
	cudaStream_t s;
	void *p;
	CUgraph g = NULL;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMalloc(&p, P), 0);
	long long before = syncs();
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(syncs(), before);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(cudaStreamEndCapture(s, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 1);
	CHECK_EQ(syncs(), before + 1);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

static pthread_barrier_t bar;
static cudaStream_t cap_stream;
static int cap_mode;
static CUgraph cap_graph;
static int cap_end;

/* Begins a capture in cap_mode on cap_stream, waits for the main thread's
 * calls, ends it. */
static void *capturer(void *arg)
{
	(void)arg;
	CHECK_EQ(cudaStreamBeginCapture(cap_stream, cap_mode), 0);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	cap_end = cudaStreamEndCapture(cap_stream, &cap_graph);
	return NULL;
}

/* Another thread's global capture forbids this thread's cudaFree its
 * synchronisation: deferred until that capture ends. A thread-local one
 * does not, nor does a global one for a thread in the relaxed mode. */
static void sync_free_other_thread(void)
{
	pthread_t t;
	void *p, *p2, *p3;

	CHECK_EQ(cudaStreamCreate(&cap_stream), 0);
	controls_init();
	CHECK_EQ(cudaMalloc(&p, P), 0);
	CHECK_EQ(cudaMalloc(&p2, P), 0);
	CHECK_EQ(cudaMalloc(&p3, P), 0);
	pthread_barrier_init(&bar, NULL, 2);

	cap_mode = GLOBAL;
	CHECK_EQ(pthread_create(&t, NULL, capturer, NULL), 0);
	pthread_barrier_wait(&bar);
	long long before = syncs();
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(syncs(), before);
	pthread_barrier_wait(&bar);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, 0);
	CHECK(cap_graph != NULL);
	CHECK_EQ(frees(), 1);

	cap_graph = NULL;
	CHECK_EQ(pthread_create(&t, NULL, capturer, NULL), 0);
	pthread_barrier_wait(&bar);
	int mode = RELAXED;
	CHECK_EQ(cudaThreadExchangeStreamCaptureMode(&mode), 0);
	CHECK_EQ(cudaFree(p3), 0); /* relaxed: not forbidden */
	CHECK_EQ(frees(), 2);
	CHECK_EQ(cudaThreadExchangeStreamCaptureMode(&mode), 0);
	pthread_barrier_wait(&bar);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, 0);
	CHECK(cap_graph != NULL);

	cap_mode = THREAD_LOCAL;
	cap_graph = NULL;
	CHECK_EQ(pthread_create(&t, NULL, capturer, NULL), 0);
	pthread_barrier_wait(&bar);
	CHECK_EQ(cudaFree(p2), 0);
	CHECK_EQ(frees(), 3); /* at once */
	pthread_barrier_wait(&bar);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, 0);
	CHECK(cap_graph != NULL);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

/* A synchronous malloc a capture forbids gets the driver's refusal, and the
 * capture its invalidation, as without the pool; one it does not forbid
 * (another thread's thread-local capture) is the pool's. Also run without
 * the shim. */
static void sync_malloc(void)
{
	cudaStream_t s;
	void *p = NULL;
	CUgraph g = (CUgraph)(uintptr_t)1;
	bool pool = expect_pool();

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaMalloc(&p, P), UNSUPPORTED);
	CHECK_EQ(cudaStreamEndCapture(s, &g), INVALIDATED);
	CHECK(g == NULL);
	CHECK_EQ(fake_calls("capture_violation"), 1);
	if (pool)
		CHECK_EQ(pool_stats(0).mallocs, 0);

	CHECK_EQ(cudaStreamCreate(&cap_stream), 0);
	pthread_barrier_init(&bar, NULL, 2);
	cap_mode = THREAD_LOCAL;
	pthread_t t;
	CHECK_EQ(pthread_create(&t, NULL, capturer, NULL), 0);
	pthread_barrier_wait(&bar);
	CHECK_EQ(cudaMalloc(&p, P), 0);
	pthread_barrier_wait(&bar);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, 0);
	if (pool)
		CHECK_EQ(pool_stats(0).mallocs, 1);
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(fake_calls("capture_violation"), 1);
}

static void *ender(void *arg)
{
	(void)arg;
	cap_end = cudaStreamEndCapture(cap_stream, &cap_graph);
	return NULL;
}

/* A relaxed capture ended by another thread: the frees it deferred are made
 * there. A global one the driver refuses to end on another thread goes on,
 * and so does the wait of its frees. */
static void end_other_thread(void)
{
	pthread_t t;
	void *q, *q2;

	CHECK_EQ(cudaStreamCreate(&cap_stream), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, cap_stream), 0);
	CHECK_EQ(cudaMallocAsync(&q2, P, cap_stream), 0);
	CHECK_EQ(cudaStreamBeginCapture(cap_stream, RELAXED), 0);
	CHECK_EQ(cudaFreeAsync(q, cap_stream), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(pthread_create(&t, NULL, ender, NULL), 0);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, 0);
	CHECK_EQ(frees(), 1);

	CHECK_EQ(cudaStreamBeginCapture(cap_stream, GLOBAL), 0);
	CHECK_EQ(cudaFreeAsync(q2, cap_stream), 0);
	CHECK_EQ(pthread_create(&t, NULL, ender, NULL), 0);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(cap_end, WRONG_THREAD);
	CHECK_EQ(frees(), 1);
	CUgraph g = NULL;
	CHECK_EQ(cudaStreamEndCapture(cap_stream, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 2);
}

/* An invalidated capture ends too: its frees are made, those deferred
 * before and after the invalidation. */
static void invalidated(void)
{
	cudaStream_t s;
	void *q, *q2, *x;
	CUgraph g = (CUgraph)(uintptr_t)1;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	CHECK_EQ(cudaMallocAsync(&q2, P, s), 0);
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	CHECK_EQ(cudaMalloc(&x, P), UNSUPPORTED); /* invalidates the capture */
	CHECK_EQ(cudaFreeAsync(q2, s), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(cudaStreamEndCapture(s, &g), INVALIDATED);
	CHECK(g == NULL);
	CHECK_EQ(frees(), 2);
	CHECK_EQ(pool_stats(0).live, 0);
}

/* A stream destroyed while captured: its deferred frees are made then,
 * as synchronous frees (the stream is gone). */
static void destroyed(void)
{
	cudaStream_t s;
	void *q;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	CHECK_EQ(frees(), 0);
	long long before = syncs();
	CHECK_EQ(cudaStreamDestroy(s), 0);
	CHECK_EQ(frees(), 1);
	CHECK_EQ(syncs(), before + 1);
	CHECK_EQ(pool_stats(0).live, 0);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

/* A free on the legacy stream while a blocking stream is captured would
 * join the capture: deferred, made after the end. */
static void legacy(void)
{
	cudaStream_t s;
	void *q;
	CUgraph g = NULL;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, NULL), 0);
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaFreeAsync(q, NULL), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(cudaStreamEndCapture(s, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 1);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

static void *per_thread_free(void *arg)
{
	CHECK_EQ(cudaFreeAsync_ptsz(arg, NULL), 0);
	return NULL;
}

/* The per-thread default stream captured (the _ptsz forms): a free on it
 * waits for its thread's capture; another thread's per-thread stream is
 * another stream, its free made at once. */
static void per_thread(void)
{
	void *q, *q2;
	pthread_t t;
	CUgraph g = NULL;

	CHECK_EQ(cudaMallocAsync_ptsz(&q, P, NULL), 0);
	CHECK_EQ(cudaMallocAsync_ptsz(&q2, P, NULL), 0);
	controls_init();
	CHECK_EQ(cudaStreamBeginCapture_ptsz(NULL, THREAD_LOCAL), 0);
	CHECK_EQ(cudaFreeAsync_ptsz(q, NULL), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(pthread_create(&t, NULL, per_thread_free, q2), 0);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(frees(), 1);
	CHECK_EQ(cudaStreamEndCapture_ptsz(NULL, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 2);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

/* A capture into an existing graph, begun through the driver's entry point
 * as dlsym gives it: tracked as any capture (the cudaFree it forbids waits,
 * as does the free on its stream). */
static void to_graph(void)
{
	cudaStream_t s;
	void *q, *p;
	CUresult (*begin)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
			  size_t, CUstreamCaptureMode);
	CUgraph g = NULL;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	LOOKUP(begin, dlopen("libcuda.so.1", RTLD_NOW), "cuStreamBeginCaptureToGraph");
	CHECK(begin);
	CHECK(fn_in((void *)(uintptr_t)begin, "libvpmm"));
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	CHECK_EQ(cudaMalloc(&p, P), 0);
	CHECK_EQ(begin(s, (CUgraph)(uintptr_t)1, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(cudaStreamEndCapture(s, &g), 0);
	CHECK(g != NULL);
	CHECK_EQ(frees(), 2);
	CHECK_EQ(hook_calls("cuStreamBeginCapture"), 1);
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

/* The program exits with a capture never ended and a free waiting for it:
 * the memory goes with the process; the exit is clean (no crash, and under
 * AddressSanitizer no leak reported). */
static void exit_mid_capture(void)
{
	cudaStream_t s;
	void *q, *p;

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	CHECK_EQ(cudaMalloc(&p, P), 0);
	CHECK_EQ(cudaStreamBeginCapture(s, GLOBAL), 0);
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(frees(), 0);
	CHECK_EQ(hook_calls("capture_deferred"), 2);
}

/* The pluggable allocator, loaded without the preload (the capture calls
 * never reach the shim): PyTorch frees a pool tensor inside the capture,
 * on the capturing stream. Step after step, the free waits for the end
 * (found by the next call) and nothing stays live. */
static void torch(void)
{
	CUstream st, st2;
	void *lib, *a, *b;
	void *(*tmalloc)(long, int, CUstream);
	void (*tfree)(void *, long, int, CUstream);
	int (*stats)(int, struct vpmm_stats *);
	CUresult (*begin)(CUstream, CUstreamCaptureMode);
	CUresult (*end)(CUstream, CUgraph *);
	struct vpmm_stats s;
	CUgraph g;

	CHECK_EQ(cudaSetDevice(0), 0);
	CHECK_EQ(cudaStreamCreate(&st), 0);
	CHECK_EQ(cudaStreamCreate(&st2), 0);
	st_shim_not_global = true;
	controls_init();
	lib = dlopen(SHIMTEST_LIBVPMM, RTLD_NOW | RTLD_LOCAL);
	void *cu = dlopen("libcuda.so.1", RTLD_NOW);
	CHECK(lib && cu);
	LOOKUP(tmalloc, lib, "vpmm_torch_malloc");
	LOOKUP(tfree, lib, "vpmm_torch_free");
	LOOKUP(stats, lib, "vpmm_shim_stats");
	LOOKUP(begin, cu, "cuStreamBeginCapture_v2");
	LOOKUP(end, cu, "cuStreamEndCapture");
	CHECK(tmalloc && tfree && stats && begin && end);
	for (int step = 1; step <= 3; step++) {
		a = tmalloc((long)(2 * P), 0, st);
		CHECK(a);
		CHECK_EQ(begin(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), 0);
		tfree(a, (long)(2 * P), 0, st);
		CHECK_EQ(stats(0, &s), 0);
		CHECK_EQ(s.frees, 2 * (step - 1));
		CHECK_EQ(end(st, &g), 0);
		b = tmalloc((long)P, 0, st2); /* finds the capture's end */
		CHECK(b);
		CHECK_EQ(stats(0, &s), 0);
		CHECK_EQ(s.frees, 2 * step - 1);
		tfree(b, (long)P, 0, st2);
		CHECK_EQ(stats(0, &s), 0);
		CHECK_EQ(s.live, 0);
	}
	CHECK_EQ(fake_calls("capture_violation"), 0);
}

int main(int argc, char **argv)
{
	static const struct scenario scenarios[] = {
		{"async_free", async_free},
		{"sync_free_own", sync_free_own},
		{"sync_free_other_thread", sync_free_other_thread},
		{"sync_malloc", sync_malloc},
		{"end_other_thread", end_other_thread},
		{"invalidated", invalidated},
		{"destroyed", destroyed},
		{"legacy", legacy},
		{"per_thread", per_thread},
		{"exit_mid_capture", exit_mid_capture},
		{"to_graph", to_graph},
		{"torch", torch},
	};
	return run_scenario(argc, argv, scenarios, sizeof scenarios / sizeof scenarios[0]);
}
