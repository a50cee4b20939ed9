// driver_queries.cu — how the driver queries the shim makes on every call
// (cuStreamIsCapturing, cuCtxGetCurrent, cuStreamGetCtx, cuCtxGetDevice, and
// the runtime's cudaStreamIsCapturing for comparison) scale from one thread to
// eight, each thread on its own stream. Prints calls per second and the
// ratio. Then, on one thread, what the calls of a synchronous malloc and free
// through the shim's fences cost (shim/live_streams.c): the legacy stream's
// capture status, the context's id, an event recorded on the legacy stream
// and on a stream of its own, a wait for an event, an event's query, a
// stream's query; each on an idle device. Owns nothing but these measurements; calls the CUDA
// driver and runtime only. Build: nvcc -O2 -o driver_queries
// bench/driver_queries.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include <algorithm>
#include <vector>

static const long calls_per_thread = 2000000;
static int query;
static CUcontext ctx;
static pthread_barrier_t start;

static double now(void)
{
	timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *worker(void *)
{
	CUstream s;
	CUstreamCaptureStatus cs;
	CUcontext c;
	CUdevice d;
	volatile long sink = 0; // keeps the calls' results alive
	cuCtxSetCurrent(ctx);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	pthread_barrier_wait(&start);
	for (long i = 0; i < calls_per_thread; i++) {
		switch (query) {
		case 0: cuStreamIsCapturing(s, &cs); sink += cs; break;
		case 1: cuCtxGetCurrent(&c); sink += (long)c; break;
		case 2: cuStreamGetCtx(s, &c); sink += (long)c; break;
		case 3: cuCtxGetDevice(&d); sink += d; break;
		default:
			cudaStreamIsCapturing((cudaStream_t)s, (cudaStreamCaptureStatus *)&cs);
			sink += cs;
		}
	}
	cuStreamDestroy(s);
	return nullptr;
}

// Million calls per second with n threads.
static double rate(int n)
{
	std::vector<pthread_t> t(n);
	pthread_barrier_init(&start, nullptr, n + 1);
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], nullptr, worker, nullptr);
	pthread_barrier_wait(&start);
	double t0 = now();
	for (int i = 0; i < n; i++)
		pthread_join(t[i], nullptr);
	double r = (double)n * (double)calls_per_thread / (now() - t0) / 1e6;
	pthread_barrier_destroy(&start);
	return r;
}

// Nanoseconds a call: batches of 256 calls, each timed alone after the
// stream was synchronised (outside the clock), so that what the calls queue
// never fills the device's queue and the host's cost is what is measured;
// 400 batches a loop, the median of 5 loops.
template <typename F> static double ns_per_call(CUstream s, F call)
{
	const int loops = 5, batches = 400, batch = 256;
	double t[loops];
	for (int l = 0; l < loops; l++) {
		double sum = 0;
		for (int b = 0; b < batches; b++) {
			cuStreamSynchronize(s);
			double t0 = now();
			for (int i = 0; i < batch; i++)
				if (call() != CUDA_SUCCESS)
					return -1;
			sum += now() - t0;
		}
		t[l] = sum * 1e9 / ((double)batches * batch);
	}
	cuStreamSynchronize(s);
	std::sort(t, t + loops);
	return t[loops / 2];
}

static bool fence_calls(void)
{
	CUstream s = nullptr;
	CUevent ev = nullptr, ev2 = nullptr;
	CUstreamCaptureStatus cs;
	unsigned long long id;
	if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
	    cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
	    cuEventCreate(&ev2, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
		if (ev)
			cuEventDestroy(ev);
		if (s)
			cuStreamDestroy(s);
		fprintf(stderr, "driver_queries: no stream or event for the fences' calls\n");
		return false;
	}
	cuEventRecord(ev2, s);
	const struct {
		const char *name;
		double ns;
	} r[] = {
		{"cuStreamIsCapturing(legacy)",
		 ns_per_call(s, [&] { return cuStreamIsCapturing(CU_STREAM_LEGACY, &cs); })},
		{"cuStreamIsCapturing(stream)",
		 ns_per_call(s, [&] { return cuStreamIsCapturing(s, &cs); })},
		{"cuCtxGetId", ns_per_call(s, [&] { return cuCtxGetId(ctx, &id); })},
		{"cuEventRecord(legacy)",
		 ns_per_call(CU_STREAM_LEGACY, [&] { return cuEventRecord(ev, CU_STREAM_LEGACY); })},
		{"cuEventRecord(stream)", ns_per_call(s, [&] { return cuEventRecord(ev, s); })},
		{"cuStreamWaitEvent(legacy)",
		 ns_per_call(CU_STREAM_LEGACY,
			     [&] { return cuStreamWaitEvent(CU_STREAM_LEGACY, ev2, 0); })},
		{"cuEventQuery(done)", ns_per_call(s, [&] { return cuEventQuery(ev2); })},
		// whether a non-blocking stream has work left: a fence could skip
		// the streams that have none
		{"cuStreamQuery(idle stream)", ns_per_call(s, [&] { return cuStreamQuery(s); })},
		{"cuStreamQuery(idle legacy)",
		 ns_per_call(CU_STREAM_LEGACY, [&] { return cuStreamQuery(CU_STREAM_LEGACY); })},
	};
	bool ok = true;
	for (const auto &c : r) {
		if (c.ns < 0)
			ok = false;
		printf("%-30s one thread: %7.1f ns a call%s\n", c.name, c.ns,
		       c.ns < 0 ? " (the call failed)" : "");
	}
	cuEventDestroy(ev);
	cuEventDestroy(ev2);
	cuStreamDestroy(s);
	return ok;
}

int main(void)
{
	static const char *const names[] = {"cuStreamIsCapturing", "cuCtxGetCurrent",
					    "cuStreamGetCtx", "cuCtxGetDevice",
					    "cudaStreamIsCapturing"};
	if (cudaFree(nullptr) != cudaSuccess || cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "driver_queries: no CUDA device\n");
		return 1;
	}
	for (query = 0; query < 5; query++) {
		double one = rate(1), eight = rate(8);
		printf("%-24s 1 thread %7.1f M calls/s (%5.1f ns), 8 threads %7.1f M calls/s: %.2fx\n",
		       names[query], one, 1e3 / one, eight, eight / one);
	}
	return fence_calls() ? 0 : 1;
}
