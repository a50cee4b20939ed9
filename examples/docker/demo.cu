// demo.cu — a CUDA program that knows nothing of libvpmm: it allocates and
// frees device memory, then asks the process whether a pool served it
// (vpmm_shim_stats_json, found with dlsym: present only when libvpmm.so is
// preloaded). Built by the Dockerfile beside it.
#include <cstdio>
#include <cuda_runtime.h>
#include <dlfcn.h>

int main()
{
	void *p[8];
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < 8; i++)
			if (cudaMalloc(&p[i], (size_t)(i + 1) << 20) != cudaSuccess) {
				std::printf("cudaMalloc failed\n");
				return 1;
			}
		for (int i = 0; i < 8; i++)
			cudaFree(p[i]);
	}
	typedef long (*stats_fn)(int, char *, size_t);
	stats_fn stats = (stats_fn)dlsym(RTLD_DEFAULT, "vpmm_shim_stats_json");
	char buf[4096];
	if (stats && stats(0, buf, sizeof buf) >= 0)
		std::printf("served by libvpmm's pool: %s\n", buf);
	else
		std::printf("no libvpmm pool in this process (not preloaded?)\n");
	return 0;
}
