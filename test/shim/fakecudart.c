/* fakecudart.c — a stand-in libcudart.so for the shim's CI tests.
 *
 * It reaches the driver the way the real runtimes do (docs/cuda.md):
 * dlopen("libcuda.so.1"), dlsym(h, "cuGetProcAddress_v2"), then
 * "cuGetProcAddress" through that, and every entry point through the answer,
 * legacy and per-thread. Semantics the shim relies on, kept from the real
 * runtime: lazy initialisation with the primary context of the thread's
 * device made current; cudaFree(NULL) initialises; size 0 gives NULL;
 * cudaFree synchronises the context; stream capture through the driver's
 * entry points (cudaStreamBeginCapture and cudaStreamEndCapture, and
 * their _ptsz forms); after exit's teardown (an atexit
 * handler that resets the primary contexts) calls return
 * cudaErrorCudartUnloading.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <cuda.h>

#define API __attribute__((visibility("default")))

typedef int cudaError_t;
typedef CUstream cudaStream_t;
enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorCudartUnloading = 4,
	cudaErrorInsufficientDriver = 35,
};

#define MAX_DEV 8

static struct {
	CUresult (*gpa)(const char *, void **, int, cuuint64_t,
			CUdriverProcAddressQueryResult *);
	CUresult (*init)(unsigned int);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*reset)(CUdevice);
	CUresult (*set_current)(CUcontext);
	CUresult (*get_current)(CUcontext *);
	CUresult (*ctx_sync)(void);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
	CUresult (*mem_get_info)(size_t *, size_t *);
	CUresult (*stream_create)(CUstream *, unsigned int);
	CUresult (*stream_sync)(CUstream);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*get_export_table)(const void **, const CUuuid *);
	CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
	CUresult (*begin_capture_ptsz)(CUstream, CUstreamCaptureMode);
	CUresult (*end_capture)(CUstream, CUgraph *);
	CUresult (*end_capture_ptsz)(CUstream, CUgraph *);
	CUresult (*exchange_mode)(CUstreamCaptureMode *);
} d;

/* The driver's private table, as the CUDA 13 runtime's cudaDeviceReset
 * reaches the reset: no name the shim could hook. */
struct export_table {
	size_t size;
	CUresult (*primary_reset)(CUdevice);
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t load_error;
static bool unloading;
static bool retained[MAX_DEV];
static __thread int rt_device;
static bool remake[MAX_DEV]; /* reset: the next call makes the context again */

static void teardown(void)
{
	unloading = true;
	for (int i = 0; i < MAX_DEV; i++)
		if (retained[i])
			d.reset(i);
}

#define GET(field, name, ver, flags)                                          \
	do {                                                                  \
		void *p_ = NULL;                                              \
		CUdriverProcAddressQueryResult st_;                           \
		if (d.gpa(name, &p_, ver, flags, &st_) != CUDA_SUCCESS || !p_) \
			goto fail;                                            \
		field = (__typeof__(field))(uintptr_t)p_;                     \
	} while (0)

static void load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	CUresult (*gpa0)(const char *, void **, int, cuuint64_t,
			 CUdriverProcAddressQueryResult *);
	void *p = NULL;
	CUdriverProcAddressQueryResult st;
	const cuuint64_t ptsz = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	if (!h)
		goto fail;
	gpa0 = (__typeof__(gpa0))(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
	if (!gpa0 || gpa0("cuGetProcAddress", &p, 12000, 0, &st) != CUDA_SUCCESS || !p)
		goto fail;
	d.gpa = (__typeof__(d.gpa))(uintptr_t)p;
	GET(d.init, "cuInit", 12000, 0);
	GET(d.retain, "cuDevicePrimaryCtxRetain", 12000, 0);
	GET(d.reset, "cuDevicePrimaryCtxReset", 12000, 0);
	GET(d.set_current, "cuCtxSetCurrent", 12000, 0);
	GET(d.get_current, "cuCtxGetCurrent", 12000, 0);
	GET(d.ctx_sync, "cuCtxSynchronize", 12000, 0);
	GET(d.mem_alloc, "cuMemAlloc", 3020, 0);
	GET(d.mem_free, "cuMemFree", 3020, 0);
	GET(d.alloc_async, "cuMemAllocAsync", 12000, 0);
	GET(d.alloc_async_ptsz, "cuMemAllocAsync", 12000, ptsz);
	GET(d.free_async, "cuMemFreeAsync", 12000, 0);
	GET(d.free_async_ptsz, "cuMemFreeAsync", 12000, ptsz);
	GET(d.mem_get_info, "cuMemGetInfo", 12000, 0);
	GET(d.stream_create, "cuStreamCreate", 12000, 0);
	GET(d.stream_sync, "cuStreamSynchronize", 12000, 0);
	GET(d.stream_destroy, "cuStreamDestroy", 4000, 0);
	GET(d.get_export_table, "cuGetExportTable", 3000, 0);
	GET(d.begin_capture, "cuStreamBeginCapture", 12000, 0);
	GET(d.begin_capture_ptsz, "cuStreamBeginCapture", 12000, ptsz);
	GET(d.end_capture, "cuStreamEndCapture", 12000, 0);
	GET(d.end_capture_ptsz, "cuStreamEndCapture", 12000, ptsz);
	GET(d.exchange_mode, "cuThreadExchangeStreamCaptureMode", 12000, 0);
	if (d.init(0) != CUDA_SUCCESS)
		goto fail;
	atexit(teardown);
	return;
fail:
	load_error = cudaErrorInsufficientDriver;
}

/* The runtime's lazy initialisation: the thread's device's primary context
 * made current when none is. */
static cudaError_t ready(void)
{
	CUcontext c = NULL;
	pthread_once(&once, load);
	if (load_error)
		return load_error;
	if (unloading)
		return cudaErrorCudartUnloading;
	d.get_current(&c);
	if (!c || remake[rt_device]) {
		remake[rt_device] = false;
		CUresult r = d.retain(&c, rt_device);
		if (r != CUDA_SUCCESS)
			return (cudaError_t)r;
		retained[rt_device] = true;
		d.set_current(c);
	}
	return cudaSuccess;
}

API cudaError_t cudaMalloc(void **p, size_t n);
API cudaError_t cudaFree(void *p);
API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
API cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
API cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s);
API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
API cudaError_t cudaMemGetInfo(size_t *f, size_t *t);
API cudaError_t cudaSetDevice(int dev);
API cudaError_t cudaGetDevice(int *dev);
API cudaError_t cudaStreamCreate(cudaStream_t *s);
API cudaError_t cudaStreamSynchronize(cudaStream_t s);
API cudaError_t cudaStreamDestroy(cudaStream_t s);
API cudaError_t cudaDeviceSynchronize(void);
API cudaError_t cudaDeviceReset(void);
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
API cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
API cudaError_t cudaStreamEndCapture(cudaStream_t s, CUgraph *g);
API cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);
API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode);
API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, CUgraph *g);

enum how { SYNC, ASYNC, ASYNC_PTSZ };

static cudaError_t alloc(enum how how, void **p, size_t n, cudaStream_t s)
{
	CUdeviceptr dp = 0;
	CUresult r;
	cudaError_t e = ready(); /* loads d */
	if (e)
		return e;
	if (!p)
		return cudaErrorInvalidValue;
	if (!n) {
		*p = NULL;
		return cudaSuccess;
	}
	r = how == SYNC    ? d.mem_alloc(&dp, n)
	    : how == ASYNC ? d.alloc_async(&dp, n, s)
			   : d.alloc_async_ptsz(&dp, n, s);
	if (r == CUDA_SUCCESS)
		*p = (void *)(uintptr_t)dp;
	return (cudaError_t)r;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	return alloc(SYNC, p, n, NULL);
}

cudaError_t cudaFree(void *p)
{
	cudaError_t e = ready();
	if (e || !p)
		return e;
	d.ctx_sync();
	return (cudaError_t)d.mem_free((CUdeviceptr)(uintptr_t)p);
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
	return alloc(ASYNC, p, n, s);
}

cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{
	return alloc(ASYNC_PTSZ, p, n, s);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.free_async((CUdeviceptr)(uintptr_t)p, s);
}

cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.free_async_ptsz((CUdeviceptr)(uintptr_t)p, s);
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.mem_get_info(f, t);
}

cudaError_t cudaSetDevice(int dev)
{
	CUcontext c;
	CUresult r;
	cudaError_t e;
	if (dev < 0 || dev >= MAX_DEV)
		return cudaErrorInvalidValue;
	rt_device = dev;
	if ((e = ready()))
		return e;
	r = d.retain(&c, dev);
	if (r != CUDA_SUCCESS)
		return (cudaError_t)r;
	retained[dev] = true;
	return (cudaError_t)d.set_current(c);
}

cudaError_t cudaGetDevice(int *dev)
{
	*dev = rt_device;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.stream_create(s, 0);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.stream_sync(s);
}

/* Through cuGetProcAddress, as the real runtime: the shim's hook. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.stream_destroy(s);
}

cudaError_t cudaDeviceSynchronize(void)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.ctx_sync();
}

/* Through the private table, not cuDevicePrimaryCtxReset: the shim does not
 * hear of it. The thread's context stays current, destroyed, until the next
 * call makes it again under the same handle (a new cuCtxGetId). */
cudaError_t cudaDeviceReset(void)
{
	static const CUuuid id = {{0}};
	const struct export_table *t = NULL;
	cudaError_t e = ready();
	if (e)
		return e;
	if (d.get_export_table((const void **)&t, &id) != CUDA_SUCCESS || !t)
		return cudaErrorInvalidValue;
	CUresult r = t->primary_reset(rt_device);
	if (r == CUDA_SUCCESS)
		remake[rt_device] = true;
	return (cudaError_t)r;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.stream_create(s, flags);
}

/* The capture calls reach the driver through cuGetProcAddress, as the real
 * runtime's do: the shim's hooks. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.begin_capture(s, (CUstreamCaptureMode)mode);
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, CUgraph *g)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.end_capture(s, g);
}

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.begin_capture_ptsz(s, (CUstreamCaptureMode)mode);
}

cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, CUgraph *g)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.end_capture_ptsz(s, g);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
	cudaError_t e = ready();
	if (e)
		return e;
	return (cudaError_t)d.exchange_mode((CUstreamCaptureMode *)mode);
}
