/* preload_prog.c — an unmodified CUDA program (linked with the stand-in
 * libcudart of test/shim) for the dump suite to run under
 * LD_PRELOAD=libvpmm.so: allocates a known set, says "ready", holds it until
 * its standard input closes, then frees everything and exits 0. Pages are the
 * stand-in driver's granularity, 64 KiB. */
#include <stdio.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);

#define PAGE ((size_t)64 << 10)

int main(void)
{
	void *a, *b, *c;
	cudaStream_t s;
	int bad = 0;
	bad |= cudaFree(NULL);
	bad |= cudaStreamCreate(&s);
	bad |= cudaMalloc(&a, 3 * PAGE);
	bad |= cudaMalloc(&b, PAGE);
	bad |= cudaMallocAsync(&c, 5 * PAGE - 100, s);
	bad |= cudaFree(a);
	if (bad) {
		printf("failed\n");
		return 1;
	}
	printf("ready\n"); /* live: b (1 page) and c (5 pages); peak 9 pages */
	fflush(stdout);
	char buf[16];
	while (read(0, buf, sizeof(buf)) > 0)
		;
	bad |= cudaFree(b);
	bad |= cudaFreeAsync(c, s);
	return bad ? 1 : 0;
}
