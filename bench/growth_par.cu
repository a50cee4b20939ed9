// growth_par.cu — does the driver's per-handle cost of growing (cuMemCreate,
// cuMemMap, cuMemSetAccess) shrink when several threads share the handles of
// one growth? Decides whether the pool should grow with helper threads
// (docs/policy.md, "Handles"). For 64 MiB and 1 GiB grown as 16 handles: one
// thread, then 2, 4 and 8 threads each creating, mapping and granting their
// share of the handles into one reservation; cudaMalloc of the same size for
// reference. Medians of REPS runs, µs. Build: nvcc -O2 growth_par.cu -lcuda.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#define CU(call)                                                              \
	do {                                                                  \
		CUresult r_ = (call);                                         \
		if (r_ != CUDA_SUCCESS) {                                     \
			fprintf(stderr, "FAIL %s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)r_); \
			exit(1);                                              \
		}                                                             \
	} while (0)

static const int REPS = 15;
static CUcontext ctx;

static double now_us()
{
	return std::chrono::duration<double, std::micro>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

static void part(CUdeviceptr base, size_t hsize, int first, int n,
		 std::vector<CUmemGenericAllocationHandle> *hs)
{
	CU(cuCtxSetCurrent(ctx));
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CUmemAccessDesc acc = {};
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = 0;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (int i = first; i < first + n; i++) {
		CU(cuMemCreate(&(*hs)[i], hsize, &prop, 0));
		CU(cuMemMap(base + (size_t)i * hsize, hsize, 0, (*hs)[i], 0));
	}
	CU(cuMemSetAccess(base + (size_t)first * hsize, (size_t)n * hsize, &acc, 1));
}

static double grow(size_t total, int nhandles, int threads)
{
	size_t hsize = total / nhandles;
	CUdeviceptr base;
	CU(cuMemAddressReserve(&base, total, 0, 0, 0));
	std::vector<CUmemGenericAllocationHandle> hs(nhandles);
	double t0 = now_us();
	if (threads == 1) {
		part(base, hsize, 0, nhandles, &hs);
	} else {
		std::vector<std::thread> th;
		int per = nhandles / threads;
		for (int t = 0; t < threads; t++)
			th.emplace_back(part, base, hsize, t * per, per, &hs);
		for (auto &t : th)
			t.join();
	}
	double dt = now_us() - t0;
	CU(cuMemUnmap(base, total));
	for (auto h : hs)
		CU(cuMemRelease(h));
	CU(cuMemAddressFree(base, total));
	return dt;
}

static double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

int main()
{
	CU(cuInit(0));
	CUdevice dev;
	CU(cuDeviceGet(&dev, 0));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	cudaFree(0);
	for (size_t total : {(size_t)64 << 20, (size_t)1 << 30}) {
		std::vector<double> m;
		for (int r = 0; r < REPS; r++) {
			void *p;
			double t0 = now_us();
			if (cudaMalloc(&p, total) != cudaSuccess)
				return 1;
			m.push_back(now_us() - t0);
			cudaFree(p);
		}
		printf("growth %4zu MiB cudaMalloc %8.1f us\n", total >> 20, median(m));
		for (int nh : {1, 16}) {
			for (int threads : {1, 2, 4, 8}) {
				if (threads > nh)
					continue;
				std::vector<double> v;
				for (int r = 0; r < REPS; r++)
					v.push_back(grow(total, nh, threads));
				printf("growth %4zu MiB handles %2d threads %d %8.1f us\n", total >> 20, nh,
				       threads, median(v));
			}
		}
	}
	return 0;
}
