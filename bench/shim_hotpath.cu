// shim_hotpath.cu — the hot path as an unmodified program sees it: runtime
// calls timed in this process, run once plainly and once under
// LD_PRELOAD=libvpmm.so by scripts/gpu-check.sh. Prints one line per case:
//   case <name> <size> <median ns per pair> <pairs/s with 8 threads>
// Pool hits only: each case warms up first. The CUDA pool keeps everything
// (release threshold UINT64_MAX), as in cuda-facts.md.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(x)                                                              \
	do {                                                                  \
		cudaError_t e_ = (x);                                         \
		if (e_ != cudaSuccess) {                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
				cudaGetErrorString(e_));                      \
			exit(1);                                              \
		}                                                             \
	} while (0)

static double now_ns()
{
	return std::chrono::duration<double, std::nano>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

enum kind { ASYNC, SYNC };

// Median over batches of `batch` malloc+free pairs, ns per pair.
static double pairs(kind k, size_t size, cudaStream_t s, int batches, int batch)
{
	std::vector<double> t;
	for (int b = 0; b < batches; b++) {
		double t0 = now_ns();
		for (int i = 0; i < batch; i++) {
			void *p;
			if (k == ASYNC) {
				CHECK(cudaMallocAsync(&p, size, s));
				CHECK(cudaFreeAsync(p, s));
			} else {
				CHECK(cudaMalloc(&p, size));
				CHECK(cudaFree(p));
			}
		}
		t.push_back((now_ns() - t0) / batch);
	}
	std::sort(t.begin(), t.end());
	return t[t.size() / 2];
}

static double threads8(size_t size, int per_thread)
{
	std::vector<std::thread> th;
	double t0 = now_ns();
	for (int i = 0; i < 8; i++)
		th.emplace_back([=] {
			cudaStream_t s;
			CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
			pairs(ASYNC, size, s, 1, 100); // warm
			for (int i2 = 0; i2 < per_thread; i2++) {
				void *p;
				CHECK(cudaMallocAsync(&p, size, s));
				CHECK(cudaFreeAsync(p, s));
			}
			CHECK(cudaStreamSynchronize(s));
			CHECK(cudaStreamDestroy(s));
		});
	for (auto &t : th)
		t.join();
	return 8.0 * per_thread / ((now_ns() - t0) * 1e-9);
}

int main()
{
	CHECK(cudaFree(0));
	cudaMemPool_t pool;
	CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
	unsigned long long keep = ~0ull;
	CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	const size_t sizes[] = {64 << 10, 2 << 20, 64 << 20};
	for (size_t size : sizes) {
		pairs(ASYNC, size, s, 5, 1000); // warm up
		double a = pairs(ASYNC, size, s, 31, 1000);
		double m = pairs(SYNC, size, s, 11, 200);
		double th = threads8(size, 20000);
		printf("case async %zu %.1f %.0f\n", size, a, th);
		printf("case sync %zu %.1f 0\n", size, m);
	}
	CHECK(cudaStreamSynchronize(s));
	return 0;
}
