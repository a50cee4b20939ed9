// vmm_costs.cu — what one handle operation costs the driver, and whether any
// way of calling it costs less: per-handle vs one call over a range, a fresh
// VA vs a VA that was mapped before, a second address for handles already
// mapped, handle size, the GPU busy with a kernel, and how many handles the
// context holds mapped already (the pool's replays hold thousands).
//
// The pool's replay time is made of these operations (docs/policy.md,
// "What peak <= 1.01 costs in driver time"); this program decides whether
// the pool can make them cheaper rather than fewer.
// Build: nvcc -O2 -o vmm_costs bench/vmm_costs.cu -lcuda
// Prints one line per case: "cost CASE us_per_handle".
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "driver_bench.h"

#include <algorithm>
#include <vector>

static CUmemAllocationProp prop;
static CUmemAccessDesc access;
static const int N = 64;

static void make(std::vector<CUmemGenericAllocationHandle> &h, size_t sz)
{
	for (auto &x : h)
		CU(cuMemCreate(&x, sz, &prop, 0));
}

static void report(const char *what, double us, int n)
{
	printf("cost %-44s %8.2f\n", what, us / n);
	fflush(stdout);
}

// "cost TAG WHAT": one case of one handle size.
static void reportf(const char *tag, const char *what, double us)
{
	char name[96];
	snprintf(name, sizeof name, "%s %s", tag, what);
	report(name, us, N);
}

// Releases every handle of h; returns the µs it took.
static double release_all(std::vector<CUmemGenericAllocationHandle> &h)
{
	double t0 = now_us();
	for (auto x : h)
		CU(cuMemRelease(x));
	return now_us() - t0;
}

// Maps h at va, one handle after another; access per handle or once.
static void map_all(CUdeviceptr va, std::vector<CUmemGenericAllocationHandle> &h,
		    size_t sz, bool per_handle, double *map_us, double *acc_us)
{
	double t0 = now_us();
	for (size_t i = 0; i < h.size(); i++) {
		CU(cuMemMap(va + i * sz, sz, 0, h[i], 0));
		if (per_handle)
			CU(cuMemSetAccess(va + i * sz, sz, &access, 1));
	}
	double t1 = now_us();
	if (!per_handle)
		CU(cuMemSetAccess(va, sz * h.size(), &access, 1));
	double t2 = now_us();
	*map_us = per_handle ? 0 : t1 - t0;
	*acc_us = per_handle ? t2 - t0 : t2 - t1;
}

static double unmap_all(CUdeviceptr va, size_t sz, int n, bool per_handle)
{
	double t0 = now_us();
	if (per_handle)
		for (int i = 0; i < n; i++)
			CU(cuMemUnmap(va + i * sz, sz));
	else
		CU(cuMemUnmap(va, sz * n));
	return now_us() - t0;
}

__global__ void spin(long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles)
		;
}

static void sizes(size_t sz, const char *tag)
{
	std::vector<CUmemGenericAllocationHandle> h(N);
	double t0 = now_us();
	make(h, sz);
	reportf(tag, "create", now_us() - t0);

	CUdeviceptr a, b, c;
	CU(cuMemAddressReserve(&a, sz * N, 0, 0, 0));
	CU(cuMemAddressReserve(&b, sz * N, 0, 0, 0));
	CU(cuMemAddressReserve(&c, sz * N, 0, 0, 0));
	double m, s;

	map_all(a, h, sz, false, &m, &s);
	reportf(tag, "map, fresh VA", m);
	reportf(tag, "access, one call over range", s);

	map_all(b, h, sz, true, &m, &s);
	reportf(tag, "map+access each, 2nd address", s);

	reportf(tag, "unmap, one call over range", unmap_all(a, sz, N, false));

	map_all(a, h, sz, true, &m, &s);
	reportf(tag, "map+access each, reused VA", s);
	reportf(tag, "unmap each", unmap_all(a, sz, N, true));

	// The same with a kernel running on the device the whole time.
	CUstream st;
	CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	spin<<<1, 1, 0, (cudaStream_t)st>>>(2000000000LL);
	map_all(c, h, sz, true, &m, &s);
	reportf(tag, "map+access each, GPU busy", s);
	reportf(tag, "unmap each, GPU busy", unmap_all(c, sz, N, true));
	CU(cuStreamSynchronize(st));
	CU(cuStreamDestroy(st));

	unmap_all(b, sz, N, false);
	reportf(tag, "release", release_all(h));
	CU(cuMemAddressFree(a, sz * N));
	CU(cuMemAddressFree(b, sz * N));
	CU(cuMemAddressFree(c, sz * N));
}

// The 64-handle operations again, with `crowd` handles of `crowd_sz` already
// mapped (and granted) in the context: is a handle operation's cost constant,
// or does it grow with what the context holds? Same bytes in fewer, larger
// handles tells the number of mappings from the bytes mapped.
static void crowded(size_t g, size_t crowd, size_t crowd_sz, const char *tag)
{
	std::vector<CUmemGenericAllocationHandle> held(crowd), h(N);
	CUdeviceptr base = 0, va;
	if (crowd) {
		make(held, crowd_sz);
		CU(cuMemAddressReserve(&base, crowd * crowd_sz, 0, 0, 0));
		for (size_t i = 0; i < crowd; i++)
			CU(cuMemMap(base + i * crowd_sz, crowd_sz, 0, held[i], 0));
		CU(cuMemSetAccess(base, crowd * crowd_sz, &access, 1));
	}
	CU(cuMemAddressReserve(&va, g * N, 0, 0, 0));
	double t0 = now_us();
	make(h, g);
	reportf(tag, "create", now_us() - t0);
	double m, s;
	map_all(va, h, g, true, &m, &s);
	reportf(tag, "map+access each", s);
	reportf(tag, "unmap each", unmap_all(va, g, N, true));
	reportf(tag, "release", release_all(h));
	CU(cuMemAddressFree(va, g * N));
	if (crowd) {
		CU(cuMemUnmap(base, crowd * crowd_sz));
		release_all(held);
		CU(cuMemAddressFree(base, crowd * crowd_sz));
	}
}


// Can a handle be mapped in part, at an offset? One handle of 4 pages:
// page 1 alone mapped at a second address, written there, read back through
// the whole handle's mapping. Prints "offset map: <result>" with the driver's
// code (0 is success) and, on success, whether the bytes landed at page 1.
static void offset_probe(size_t g)
{
	CUmemGenericAllocationHandle h;
	CU(cuMemCreate(&h, 4 * g, &prop, 0));
	CUdeviceptr whole, part;
	CU(cuMemAddressReserve(&whole, 4 * g, 0, 0, 0));
	CU(cuMemAddressReserve(&part, g, 0, 0, 0));
	CU(cuMemMap(whole, 4 * g, 0, h, 0));
	CU(cuMemSetAccess(whole, 4 * g, &access, 1));
	CU(cuMemsetD8(whole, 0, 4 * g));
	CUresult r = cuMemMap(part, g, g, h, 0);
	int landed = -1;
	if (r == CUDA_SUCCESS) {
		CU(cuMemSetAccess(part, g, &access, 1));
		CU(cuMemsetD8(part, 0x5a, g));
		unsigned char at[3];
		CU(cuMemcpyDtoH(&at[0], whole, 1));
		CU(cuMemcpyDtoH(&at[1], whole + g, 1));
		CU(cuMemcpyDtoH(&at[2], whole + 2 * g, 1));
		landed = at[0] == 0 && at[1] == 0x5a && at[2] == 0;
		CU(cuMemUnmap(part, g));
	}
	printf("offset map: driver %d, %s\n", (int)r,
	       r != CUDA_SUCCESS ? "refused"
	       : landed	  ? "maps that page"
			  : "accepted but wrote elsewhere");
	fflush(stdout);
	CU(cuMemUnmap(whole, 4 * g));
	CU(cuMemRelease(h));
	CU(cuMemAddressFree(whole, 4 * g));
	CU(cuMemAddressFree(part, g));
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	size_t g;
	CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	char name[64];
	cudaFree(0);
	offset_probe(g);
	for (int rep = 0; rep < 2; rep++) { // the first pass warms the driver
		printf("pass %d\n", rep);
		snprintf(name, sizeof name, "%zuM", g >> 20);
		sizes(g, name);
		sizes(16 * g, "32M");
	}
	// Up to 16 GiB held, as in the replays (llm_serving, training_varlen).
	for (size_t k : {0, 1024, 4096, 8192}) {
		snprintf(name, sizeof name, "crowd %zu x %zuM:", k, g >> 20);
		crowded(g, k, g, name);
	}
	snprintf(name, sizeof name, "crowd %d x %zuM:", 512, (16 * g) >> 20);
	crowded(g, 512, 16 * g, name);
	// cudaMalloc for comparison, 2 MiB.
	double t0 = now_us();
	std::vector<void *> p(N);
	for (auto &x : p)
		cudaMalloc(&x, g);
	report("cudaMalloc 2M", now_us() - t0, N);
	t0 = now_us();
	for (auto x : p)
		cudaFree(x);
	report("cudaFree 2M", now_us() - t0, N);
	return 0;
}
