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

// The floor of the interface: an exact-size cache over cudaMalloc that
// never gives memory back (one stream, as the step uses). A hit costs a hash
// lookup, so a step through it measures what PyTorch spends around each
// call of any pluggable allocator.
#include <mutex>
#include <unordered_map>
#include <vector>

static std::mutex cache_lock;
static std::unordered_map<size_t, std::vector<void *>> cache_free_lists;
static std::unordered_map<void *, size_t> cache_sizes;

extern "C" void *cache_malloc(ssize_t size, int device, cudaStream_t s)
{
	(void)device;
	(void)s;
	size_t n = size > 0 ? ((size_t)size + 511) & ~(size_t)511 : 512;
	std::lock_guard<std::mutex> g(cache_lock);
	auto &l = cache_free_lists[n];
	if (!l.empty()) {
		void *p = l.back();
		l.pop_back();
		return p;
	}
	void *p = nullptr;
	if (cudaMalloc(&p, n) != cudaSuccess)
		return nullptr;
	cache_sizes[p] = n;
	return p;
}

extern "C" void cache_free(void *p, ssize_t size, int device, cudaStream_t s)
{
	(void)size;
	(void)device;
	(void)s;
	std::lock_guard<std::mutex> g(cache_lock);
	auto it = cache_sizes.find(p);
	if (it != cache_sizes.end())
		cache_free_lists[it->second].push_back(p);
}
