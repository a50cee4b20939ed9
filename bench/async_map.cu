// async_map.cu — can a stream-ordered allocation return before its pages are
// mapped? The caller enqueues a wait on a host flag (cuStreamWaitValue32)
// and goes on; another thread maps the handles, grants access and sets the
// flag; the stream's kernels run only after that. This measures what the
// calling thread then pays, against mapping on the calling thread, and
// checks that the kernel after the wait sees the memory (no fault, its
// writes read back).
//
// The question it answers is in docs/policy.md ("What peak <= 1.01 costs in
// driver time"): cuMemSetAccess is most of a handle operation, and stream
// order could move it off the calling thread for cudaMallocAsync callers.
// Build: nvcc -O2 -o async_map bench/async_map.cu -lcuda -lpthread
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "driver_bench.h"

#include <algorithm>
#include <vector>

static const size_t N = 64;
static size_t page;
static CUcontext ctx;
static CUmemAccessDesc access;
static std::vector<CUmemGenericAllocationHandle> h(N);
static CUdeviceptr va;
static volatile uint32_t *flag;
static uint32_t seq;

__global__ void fill(uint32_t *p, size_t words, uint32_t v)
{
	for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = v + (uint32_t)i;
}

static void map_range(void)
{
	for (size_t i = 0; i < N; i++)
		CU(cuMemMap(va + i * page, page, 0, h[i], 0));
	CU(cuMemSetAccess(va, N * page, &access, 1));
}

static void *mapper(void *)
{
	CU(cuCtxSetCurrent(ctx));
	map_range();
	__sync_synchronize();
	*flag = seq;
	return nullptr;
}

// One round: returns the calling thread's time in us; checks the data.
static double round_trip(CUstream s, bool async, double *total_us)
{
	CU(cuMemAddressReserve(&va, N * page, 0, 0, 0));
	pthread_t t;
	double t0 = now_us();
	if (async) {
		seq++;
		CU(cuStreamWaitValue32(s, (CUdeviceptr)flag, seq, CU_STREAM_WAIT_VALUE_GEQ));
		pthread_create(&t, nullptr, mapper, nullptr);
	} else {
		map_range();
	}
	size_t words = N * page / 4;
	fill<<<264, 256, 0, (cudaStream_t)s>>>((uint32_t *)va, words, seq * 7);
	double t1 = now_us();
	CU(cuStreamSynchronize(s));
	*total_us = now_us() - t0;
	if (async)
		pthread_join(t, nullptr);
	uint32_t got[2];
	CU(cuMemcpyDtoH(&got[0], va, 4));
	CU(cuMemcpyDtoH(&got[1], va + (words - 1) * 4, 4));
	if (got[0] != seq * 7 || got[1] != seq * 7 + (uint32_t)(words - 1)) {
		fprintf(stderr, "async_map: wrong data %u %u\n", got[0], got[1]);
		exit(1);
	}
	CU(cuMemUnmap(va, N * page));
	CU(cuMemAddressFree(va, N * page));
	return t1 - t0;
}

static double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

int main(void)
{
	CUdevice dev;
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	int memops = 0;
	cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
	printf("stream memory operations: %d\n", memops);
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	for (auto &x : h)
		CU(cuMemCreate(&x, page, &prop, 0));
	void *host;
	CU(cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
	flag = (volatile uint32_t *)host;
	*flag = 0;
	CUstream s;
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

	// The enqueue alone.
	std::vector<double> enq;
	for (int i = 0; i < 200; i++) {
		seq++;
		*flag = seq;
		double t0 = now_us();
		CU(cuStreamWaitValue32(s, (CUdeviceptr)flag, seq, CU_STREAM_WAIT_VALUE_GEQ));
		enq.push_back(now_us() - t0);
	}
	CU(cuStreamSynchronize(s));
	printf("cuStreamWaitValue32 enqueue: %.2f us\n", median(enq));

	std::vector<double> sync_caller, sync_total, async_caller, async_total;
	for (int rep = 0; rep < 11; rep++) {
		double tot;
		sync_caller.push_back(round_trip(s, false, &tot));
		sync_total.push_back(tot);
		async_caller.push_back(round_trip(s, true, &tot));
		async_total.push_back(tot);
	}
	printf("map %zu handles + fill kernel, calling thread: synchronous %.1f us, "
	       "stream-ordered %.1f us (%.3fx)\n",
	       N, median(sync_caller), median(async_caller),
	       median(async_caller) / median(sync_caller));
	printf("until the kernel is done: synchronous %.1f us, stream-ordered %.1f us; "
	       "data checked after every round\n",
	       median(sync_total), median(async_total));
	return 0;
}
