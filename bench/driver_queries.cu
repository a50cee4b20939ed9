// driver_queries.cu — how the driver queries the shim makes on every call
// (cuStreamIsCapturing, cuCtxGetCurrent, cuStreamGetCtx, cuCtxGetDevice, and
// the runtime's cudaStreamIsCapturing for comparison) scale from one thread to
// eight, each thread on its own stream. Prints calls per second and the
// ratio. Build: nvcc -O2 -o driver_queries bench/driver_queries.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

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
	return 0;
}
