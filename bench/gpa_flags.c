/* gpa_flags.c — whether cuGetProcAddress answers the entry points the shim
 * wraps (shim/resolve.c) with another function when asked with the
 * per-thread or the legacy flag. The resolver learns every pointer it
 * wraps when libcuda loads; a pointer it did not learn passes through
 * unwrapped, so an entry point without a _ptsz variant must come back the
 * same under every flag, or be learned under each. Prints one line a name.
 * Owns nothing but this question; calls the CUDA driver only.
 * Build: gcc -O2 -o gpa_flags bench/gpa_flags.c -I/usr/local/cuda/include -lcuda
 */
#include <cuda.h>
#include <stdio.h>
int main(void)
{
	static const char *names[] = {"cuCtxCreate", "cuCtxDestroy", "cuDevicePrimaryCtxReset",
		"cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy", "cuMemCreate",
		"cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuMemGetAddressRange", "cuPointerGetAttribute",
		"cuPointerGetAttributes", "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle",
		"cuCtxEnablePeerAccess", "cuMemRetainAllocationHandle", "cuDeviceSetMemPool",
		"cuMemPoolDestroy", "cuMemPoolGetAttribute", "cuMemPoolSetAttribute", "cuMemPoolTrimTo",
		"cuGreenCtxStreamCreate", "cuMemAllocAsync", "cuStreamBeginCapture", "cuCtxSynchronize",
		"cuGreenCtxCreate", "cuMemSetMemPool", NULL};
	int v = 0;
	cuInit(0);
	cuDriverGetVersion(&v);
	for (int i = 0; names[i]; i++) {
		void *a = NULL, *b = NULL, *c = NULL;
		CUdriverProcAddressQueryResult q;
		cuGetProcAddress(names[i], &a, v, 0, &q);
		cuGetProcAddress(names[i], &b, v, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q);
		cuGetProcAddress(names[i], &c, v, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q);
		printf("%-28s default %p, legacy flag: %s, per-thread flag: %s\n", names[i], a,
		       b == a ? "same" : "another", c == a ? "same" : "another");
	}
	return 0;
}
