// torch_async_alloc.cu — the CUDA pool (cudaMallocAsync, everything kept)
// behind PyTorch's CUDAPluggableAllocator: what the pluggable interface itself
// costs, beside libvpmm behind the same interface (scripts/gpu-shim.sh).
#include <cuda_runtime.h>
#include <sys/types.h>

static void keep_everything(int device)
{
	static bool done;
	if (done)
		return;
	cudaMemPool_t pool;
	unsigned long long keep = ~0ull;
	if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
		cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
	done = true;
}

extern "C" void *async_malloc(ssize_t size, int device, cudaStream_t s)
{
	void *p = nullptr;
	keep_everything(device);
	return cudaMallocAsync(&p, (size_t)size, s) == cudaSuccess ? p : nullptr;
}

extern "C" void async_free(void *p, ssize_t size, int device, cudaStream_t s)
{
	(void)size;
	(void)device;
	cudaFreeAsync(p, s);
}
