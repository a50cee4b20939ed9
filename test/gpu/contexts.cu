// contexts.cu — the shim's handling of contexts on a real driver
// (scripts/gpu-shim.sh). The shim's tests model these rules in a fake libcuda
// (test/shim/fakecuda.c: an event records only on a stream of its context,
// a context's end takes its streams and events with it); this program checks
// the same scenarios against libcuda itself. One scenario per run:
//   user_context   stream-ordered allocations on a stream of a context the
//                  program made (cuCtxCreate), mixed with the primary
//                  context's, every buffer written and read back;
//   user_default   a late kernel on a made context's default stream writes a
//                  buffer that is then freed there; the primary context's
//                  default stream allocates the same size and writes its
//                  own pattern: the late write must not land on it;
//   device_reset   cudaDeviceReset three times, with frees pending and
//                  work in flight on four streams and pool memory live,
//                  allocations of every kind between (run with the static
//                  and the shared runtime);
//   primary_release the program's last cuDevicePrimaryCtxRelease, then a new
//                  retain and stream-ordered allocations again;
//   ctx_destroy    a program of its own contexts: the pool made in one,
//                  that context destroyed, another made; no primary context
//                  is made for it.
// Prints PASS or "FAIL file:line what"; EXPECT_POOL=1 also requires that the
// pool served the allocations (libvpmm.so's vpmm_shim_stats_json).
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "check.h"

#define CU(call)                                                                   \
	do {                                                                       \
		CUresult r_ = (call);                                              \
		if (r_ != CUDA_SUCCESS) {                                          \
			const char *s_ = "?";                                      \
			cuGetErrorName(r_, &s_);                                   \
			fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_); \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

static const size_t MiB = 1 << 20;
static CUdevice dev;

// Writes `value` over the buffer on `s` and reads it all back: the memory is
// mapped, accessible from the current context, and holds what was written.
static void write_and_check(CUdeviceptr p, size_t bytes, uint32_t value, CUstream s)
{
	std::vector<uint32_t> h(bytes / 4);
	CU(cuMemsetD32Async(p, value, bytes / 4, s));
	CU(cuMemcpyDtoHAsync(h.data(), p, bytes, s));
	CU(cuStreamSynchronize(s));
	for (size_t i = 0; i < h.size(); i++)
		if (h[i] != value) {
			fprintf(stderr, "FAIL word %zu: %#x, expected %#x\n", i, h[i], value);
			exit(1);
		}
}

// Spins for about `ns` on the device, then writes `value`: a late writer.
__global__ void late_fill(uint32_t *p, size_t n, uint32_t value, unsigned long long ns)
{
	unsigned long long t0, t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	while (t - t0 < ns);
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = value;
}

static void user_context(void)
{
	CUcontext uc, pc;
	CUstream us, ps;
	CU(cuDevicePrimaryCtxRetain(&pc, dev));
	CU(cuCtxSetCurrent(pc));
	CU(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
	CU(cuCtxCreate(&uc, NULL, 0, dev));
	CU(cuStreamCreate(&us, CU_STREAM_NON_BLOCKING));
	for (int round = 0; round < 40; round++) {
		size_t sz = (size_t)(1 + round % 7) * 4 * MiB;
		CUdeviceptr a, b;
		CU(cuCtxSetCurrent(uc));
		CU(cuMemAllocAsync(&a, sz, us));
		write_and_check(a, sz, 0xa0000000u + round, us);
		CU(cuCtxSetCurrent(pc));
		CU(cuMemAllocAsync(&b, sz, ps));
		write_and_check(b, sz, 0xb0000000u + round, ps);
		// each freed from the other context: the pool must not adopt a
		// stream of a context its events cannot be recorded in
		CU(cuMemFreeAsync(a, ps));
		CU(cuCtxSetCurrent(uc));
		CU(cuMemFreeAsync(b, us));
	}
	CU(cuStreamSynchronize(us));
	CU(cuStreamDestroy(us));
	CU(cuCtxSetCurrent(pc));
	CU(cuStreamSynchronize(ps));
	CU(cuStreamDestroy(ps));
	CU(cuCtxDestroy(uc));
	CU(cuCtxSetCurrent(pc));
	CUdeviceptr c;
	CU(cuMemAlloc(&c, 8 * MiB));
	write_and_check(c, 8 * MiB, 0xc0ffee, 0);
	CU(cuMemFree(c));
}

static void user_default(void)
{
	const size_t sz = 16 * MiB;
	CUcontext uc, pc;
	CUdeviceptr first;
	CU(cuDevicePrimaryCtxRetain(&pc, dev));
	CU(cuCtxSetCurrent(pc));
	CU(cuMemAlloc(&first, 2 * MiB)); // the pool lives in the primary context
	CU(cuCtxCreate(&uc, NULL, 0, dev));
	for (int round = 0; round < 4; round++) {
		CUdeviceptr p, q;
		CU(cuCtxSetCurrent(uc));
		CU(cuMemAllocAsync(&p, sz, 0));
		late_fill<<<64, 256>>>((uint32_t *)p, sz / 4, 0xdead0000u + round, 200000000ull);
		CK(cudaGetLastError());
		CU(cuMemFreeAsync(p, 0)); // on the made context's default stream
		CU(cuCtxSetCurrent(pc));
		CU(cuMemAllocAsync(&q, sz, 0)); // the primary context's default stream
		uint32_t mine = 0x600d0000u + round;
		CU(cuMemsetD32Async(q, mine, sz / 4, 0));
		CU(cuCtxSetCurrent(uc));
		CU(cuCtxSynchronize()); // the late writer is done
		CU(cuCtxSetCurrent(pc));
		std::vector<uint32_t> h(sz / 4);
		CU(cuMemcpyDtoH(h.data(), q, sz));
		for (size_t i = 0; i < h.size(); i++)
			if (h[i] != mine) {
				fprintf(stderr, "FAIL round %d word %zu: %#x: the late write of the "
						"other context landed on the new owner\n",
					round, i, h[i]);
				exit(1);
			}
		CU(cuMemFreeAsync(q, 0));
		CU(cuCtxSynchronize());
	}
	CU(cuCtxDestroy(uc));
	CU(cuCtxSetCurrent(pc));
	CU(cuMemFree(first));
}

// cudaDeviceReset while frees are pending on several streams, work still
// in flight on them, and memory live: the CUDA 13 runtime resets the primary
// context through its private table, which no hook of the shim sees, so the
// pool must learn of it by the context's id before it records on a stream
// or queries an event of the ended context (a crash inside libcuda before).
// Three resets between rounds of stream-ordered and synchronous allocations
// on four streams; the streams die with each reset and are made again.
static void device_reset(void)
{
	const int NS = 4;
	cudaStream_t s[NS];
	void *live;
	CK(cudaMalloc(&live, 64 * MiB)); // live across the first reset
	write_and_check((CUdeviceptr)live, 64 * MiB, 0x11, 0);
	for (int k = 0; k < NS; k++)
		CK(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking));
	for (int round = 0; round < 12; round++) {
		for (int k = 0; k < NS; k++) {
			size_t sz = (size_t)(1 + (round + k) % 5) * 8 * MiB;
			void *d, *late;
			CK(cudaMallocAsync(&d, sz, s[k]));
			write_and_check((CUdeviceptr)d, sz, 0x2000u + round * NS + k, (CUstream)s[k]);
			CK(cudaFreeAsync(d, s[k])); // pending on s[k]
			// a late writer still running when the round ends
			CK(cudaMallocAsync(&late, 4 * MiB, s[k]));
			late_fill<<<16, 256, 0, s[k]>>>((uint32_t *)late, MiB, 0xdead, 2000000ull);
			CK(cudaGetLastError());
			CK(cudaFreeAsync(late, s[k]));
		}
		void *c;
		CK(cudaMalloc(&c, (size_t)(1 + round % 3) * 16 * MiB));
		write_and_check((CUdeviceptr)c, (size_t)(1 + round % 3) * 16 * MiB, 0x1000u + round, 0);
		CK(cudaFree(c));
		if (round % 4 == 3) {
			CK(cudaDeviceReset()); // the streams, live and the work die with it
			for (int k = 0; k < NS; k++)
				CK(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking));
		}
	}
	for (int k = 0; k < NS; k++) {
		CK(cudaStreamSynchronize(s[k]));
		CK(cudaStreamDestroy(s[k]));
	}
	CK(cudaDeviceSynchronize());
}

static void primary_release(void)
{
	CUcontext pc;
	CUdeviceptr p;
	CUstream s;
	CU(cuDevicePrimaryCtxRetain(&pc, dev));
	CU(cuCtxSetCurrent(pc));
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU(cuMemAllocAsync(&p, 16 * MiB, s));
	write_and_check(p, 16 * MiB, 0x51, s);
	CU(cuMemFreeAsync(p, s));
	CU(cuStreamSynchronize(s));
	CU(cuStreamDestroy(s));
	CU(cuCtxSetCurrent(NULL));
	CU(cuDevicePrimaryCtxRelease(dev)); // the program's last release
	for (int round = 0; round < 4; round++) {
		CU(cuDevicePrimaryCtxRetain(&pc, dev));
		CU(cuCtxSetCurrent(pc));
		CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		for (int i = 0; i < 8; i++) {
			CU(cuMemAllocAsync(&p, (size_t)(1 + i) * 2 * MiB, s));
			write_and_check(p, (size_t)(1 + i) * 2 * MiB, 0x700u + i, s);
			CU(cuMemFreeAsync(p, s));
		}
		CU(cuStreamSynchronize(s));
		CU(cuStreamDestroy(s));
		CU(cuCtxSetCurrent(NULL));
		CU(cuDevicePrimaryCtxRelease(dev));
	}
}

static void ctx_destroy(void)
{
	for (int round = 0; round < 4; round++) {
		CUcontext c;
		CUstream s;
		CUdeviceptr p, q;
		CU(cuCtxCreate(&c, NULL, 0, dev));
		CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		CU(cuMemAlloc(&p, 8 * MiB));
		write_and_check(p, 8 * MiB, 0x800u + round, s);
		CU(cuMemAllocAsync(&q, 12 * MiB, s));
		write_and_check(q, 12 * MiB, 0x900u + round, s);
		CU(cuMemFreeAsync(q, s));
		CU(cuMemFree(p));
		CU(cuStreamSynchronize(s));
		CU(cuStreamDestroy(s));
		CU(cuCtxDestroy(c));
	}
	unsigned flags;
	int active = -1;
	CU(cuDevicePrimaryCtxGetState(dev, &flags, &active));
	REQUIRE(active == 0); // nothing made the primary context for the program
}

static const struct {
	const char *name;
	void (*run)(void);
} scenarios[] = {
	{"user_context", user_context},       {"user_default", user_default},
	{"device_reset", device_reset},       {"primary_release", primary_release},
	{"ctx_destroy", ctx_destroy},
};

int main(int argc, char **argv)
{
	bool expect_pool = getenv("EXPECT_POOL") && !strcmp(getenv("EXPECT_POOL"), "1");
	if (argc != 2) {
		fprintf(stderr, "usage: contexts SCENARIO\n");
		return 2;
	}
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	for (const auto &sc : scenarios) {
		if (strcmp(argv[1], sc.name) != 0)
			continue;
		sc.run();
		long (*stats_json)(int, char *, size_t);
		*(void **)&stats_json = dlsym(RTLD_DEFAULT, "vpmm_shim_stats_json");
		char buf[2048] = "";
		bool pool = stats_json && stats_json(0, buf, sizeof buf) >= 0;
		const char *m = pool ? strstr(buf, "\"mallocs\":") : NULL;
		long mallocs = m ? atol(m + 10) : 0;
		printf("%s: pool %s, %ld mallocs\n", sc.name, pool ? "present" : "absent", mallocs);
		if (expect_pool)
			REQUIRE(mallocs > 0);
		printf("PASS %s\n", sc.name);
		return 0;
	}
	fprintf(stderr, "unknown scenario %s\n", argv[1]);
	return 2;
}
