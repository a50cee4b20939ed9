// fake_runtime.cpp — a simulated device behind cuda_runtime.h (the stand-in
// beside it) for test/gpu/pressure_cpu.sh: FAKE_TOTAL bytes (default 80 GiB),
// a 512 MiB context, allocations rounded to 2 MiB, every 37th one 2 MiB
// more (the driver's page tables), and the bytes of "another process" read
// from the file FAKE_OTHER names (absent or empty: none) at every call.
#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>

#include <map>

static const size_t MiB = (size_t)1 << 20;
static size_t used = 512 * MiB;
static std::map<void *, size_t> live;
static long calls;

static size_t total()
{
	const char *t = getenv("FAKE_TOTAL");
	return t && *t ? strtoull(t, nullptr, 10) : (size_t)80 << 30;
}

static size_t other()
{
	const char *path = getenv("FAKE_OTHER");
	unsigned long long v = 0;
	FILE *f = path ? fopen(path, "r") : nullptr;
	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

cudaError_t cudaSetDevice(int) { return cudaSuccess; }

cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	auto it = live.find(p);
	if (it == live.end())
		return cudaErrorInvalidValue;
	used -= it->second;
	live.erase(it);
	free(p);
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size)
{
	size_t r = (size + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
	if (++calls % 37 == 0)
		r += 2 * MiB;
	if (used + other() + r > total())
		return cudaErrorMemoryAllocation;
	*p = malloc(1);
	live[*p] = r;
	used += r;
	return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
	size_t u = used + other();
	*t = total();
	*f = u > *t ? 0 : *t - u;
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "simulated error" : "no error"; }
const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorSimulated" : "cudaSuccess"; }
