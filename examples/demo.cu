// demo.cu — the design's scenario on a GPU, for scripts/demo.sh: on one
// stream, +10, +1, -10, +4 and +11 units, a unit being 1/22 of 90 % of the
// device's free memory (so that even a pool that keeps every block fits),
// through cudaMallocAsync with the default pool told to keep its memory (a
// caching pool). Run plainly, the CUDA pool serves it; under
// LD_PRELOAD=libvpmm.so, libvpmm does. Prints, after each step and at the
// end, the device memory used beyond what it was before the first
// allocation, as NVML counts it (libnvidia-ml.so.1, opened at run time: the
// shim reports its own view through cudaMemGetInfo, which is used here only
// to size the unit). With VPMM_DEMO_DUMP=PATH-TO-vpmm-dump, runs
// `vpmm-dump --map PID` before freeing.
//
// Build: nvcc -O2 -o demo examples/demo.cu -ldl
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CHECK(call)                                                            \
	do {                                                                   \
		cudaError_t e_ = (call);                                       \
		if (e_ != cudaSuccess) {                                       \
			fprintf(stderr, "demo: %s: %s\n", #call,               \
				cudaGetErrorString(e_));                       \
			return 1;                                              \
		}                                                              \
	} while (0)

// NVML, the few calls used (nvml.h's types, spelled out).
struct nvml_memory {
	unsigned long long total, free, used;
};
static int (*nvml_mem)(void *dev, struct nvml_memory *m);
static void *nvml_dev;

static bool nvml_open(int cuda_dev)
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!lib)
		return false;
	int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
	int (*by_bus)(const char *, void **) =
		(int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
	nvml_mem = (int (*)(void *, struct nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
	char bus[32];
	return init && by_bus && nvml_mem && init() == 0 &&
	       cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_dev) == cudaSuccess &&
	       by_bus(bus, &nvml_dev) == 0;
}

static unsigned long long nvml_used(void)
{
	struct nvml_memory m;
	return nvml_mem(nvml_dev, &m) == 0 ? m.used : 0;
}

int main(void)
{
	CHECK(cudaSetDevice(0));
	CHECK(cudaFree(0)); // the context, before the baseline
	if (!nvml_open(0)) {
		fprintf(stderr, "demo: NVML (libnvidia-ml.so.1) is not usable\n");
		return 1;
	}
	size_t free_b, total_b;
	CHECK(cudaMemGetInfo(&free_b, &total_b));
	size_t unit = (size_t)(free_b * 0.9 / 22) >> 21 << 21; // whole 2 MiB
	if (!unit) {
		fprintf(stderr, "demo: too little free memory (%zu bytes)\n", free_b);
		return 1;
	}
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	cudaMemPool_t pool;
	CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
	uint64_t keep = UINT64_MAX; // a caching pool: freed memory stays
	CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

	const double gib = 1 << 30;
	unsigned long long base = nvml_used(), peak = 0;
	printf("unit %.2f GiB (1/22 of 90%% of the free %.2f GiB)\n", unit / gib, free_b / gib);
	static const struct {
		int slot, units; // units < 0: free the slot
	} steps[] = { { 0, 10 }, { 1, 1 }, { 0, -10 }, { 2, 4 }, { 3, 11 } };
	void *p[4] = { 0 };
	size_t live = 0;
	for (const auto &st : steps) {
		if (st.units > 0) {
			CHECK(cudaMallocAsync(&p[st.slot], st.units * unit, s));
			CHECK(cudaMemsetAsync(p[st.slot], 1, st.units * unit, s));
			live += st.units * unit;
		} else {
			CHECK(cudaFreeAsync(p[st.slot], s));
			p[st.slot] = NULL;
			live -= -st.units * unit;
		}
		CHECK(cudaStreamSynchronize(s));
		unsigned long long used = nvml_used() - base;
		if (used > peak)
			peak = used;
		printf("%+3d units: live %5.2f GiB, device used %5.2f GiB (NVML)\n", st.units,
		       live / gib, used / gib);
	}
	printf("peak device memory %.2f GiB = %.1f units for 16 units live\n", peak / gib,
	       (double)peak / unit);
	fflush(stdout);
	const char *dump = getenv("VPMM_DEMO_DUMP");
	if (dump && *dump) {
		char cmd[4096];
		snprintf(cmd, sizeof(cmd), "'%s' --map %d", dump, (int)getpid());
		if (system(cmd) != 0)
			fprintf(stderr, "demo: %s failed\n", cmd);
	}
	for (void *q : p)
		if (q)
			CHECK(cudaFreeAsync(q, s));
	CHECK(cudaStreamSynchronize(s));
	return 0;
}
