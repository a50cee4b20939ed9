/* rt_other.c — libshimrtother.so: a second CUDA runtime, unlike the
 * stand-in libcudart, for unloaded_runtime_prog: its cudaMemGetInfo reports
 * a total no device has, so a caller can tell whose answer it got. */
#include <stddef.h>

#define API __attribute__((visibility("default")))
#define OTHER_TOTAL 67890

typedef int cudaError_t;
API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
API cudaError_t cudaMalloc(void **p, size_t n);
API cudaError_t cudaFree(void *p);

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	*free_bytes = 12345;
	*total = OTHER_TOTAL;
	return 0;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	(void)n;
	*p = NULL;
	return 2;
}

cudaError_t cudaFree(void *p)
{
	(void)p;
	return 0;
}
