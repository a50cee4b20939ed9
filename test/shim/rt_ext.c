/* rt_ext.c — libshimext_{a,b}.so: an extension module linked with its own
 * CUDA runtime (the stand-in libcudart, or rt_other.c's), loaded
 * RTLD_LOCAL as Python loads PyTorch's, so the runtime is only in its
 * scope. */
#include <stddef.h>

#define API __attribute__((visibility("default")))

typedef int cudaError_t;
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
API int ext_mem_info(size_t *free_bytes, size_t *total);

int ext_mem_info(size_t *free_bytes, size_t *total)
{
	int e = cudaMemGetInfo(free_bytes, total);
	/* No tail call: that would make our caller cudaMemGetInfo's caller,
	 * and the shim looks the runtime up in the caller's scope. */
	__asm__ volatile("" ::: "memory");
	return e;
}
