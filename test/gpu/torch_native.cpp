/* torch_native.cpp — PyTorch's own caching allocator behind the pluggable
 * interface, so that test/gpu/torch_timed.c can put its clock around it
 * (shim_torch.py mode native-timed): native's time inside a training step,
 * measured the way the pool's is, where before it could only be guessed.
 *
 * native_capture() must run before change_current_allocator(): it keeps the
 * allocator that c10 holds then (native's). The swap refuses an initialised
 * allocator, and CUDA's lazy init then initialises the pluggable one, so
 * the kept one is initialised at its first malloc.
 * native_malloc/native_free have the pluggable interface's signatures and
 * call the kept allocator's raw_alloc_with_stream/raw_delete, which do what
 * a tensor's allocation and deleter do (the block and its pointer map). */
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cstdio>
#include <mutex>
#include <sys/types.h>

namespace alloc = c10::cuda::CUDACachingAllocator;

static alloc::CUDAAllocator *native;
static std::once_flag init_once;

extern "C" __attribute__((visibility("default"))) int native_capture(void)
{
	if (native)
		return 0;
	alloc::CUDAAllocator *a = alloc::get();
	if (!a) {
		std::fprintf(stderr, "torch_native: no allocator to keep\n");
		return -1;
	}
	native = a;
	return 0;
}

extern "C" __attribute__((visibility("default"))) void *native_malloc(ssize_t size, int device,
								     cudaStream_t stream)
{
	(void)device; /* the current device, as for a tensor */
	if (!native)
		return nullptr;
	try {
		std::call_once(init_once, [] {
			if (!native->initialized())
				native->init(c10::cuda::device_count());
		});
		return native->raw_alloc_with_stream(size, stream);
	} catch (const std::exception &e) {
		/* out of memory: the pluggable interface reports a null pointer */
		std::fprintf(stderr, "torch_native: %s\n", e.what());
		return nullptr;
	}
}

extern "C" __attribute__((visibility("default"))) void native_free(void *ptr, ssize_t size,
								  int device, cudaStream_t stream)
{
	(void)size;
	(void)device;
	(void)stream;
	if (!native || !ptr)
		return;
	try {
		native->raw_delete(ptr);
	} catch (const std::exception &e) {
		/* a pointer native never gave out: said, not thrown into torch */
		std::fprintf(stderr, "torch_native: %s\n", e.what());
	}
}
