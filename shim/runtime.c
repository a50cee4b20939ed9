/* runtime.c — the runtime's allocation calls under the shim (cudaMalloc,
 * cudaFree, their stream-ordered and per-thread variants, cudaMemGetInfo),
 * each reached from its exported hook in hooks.c, and the real runtime they
 * fall back to.
 *
 * Owns: what a runtime call means to the pool (a zero-size cudaMalloc, the
 * stream of the synchronous calls), the pass-through to the real runtime
 * (found by resolve.c, called with vpmm_tls_inside raised so the driver
 * entry points it reaches go straight to libcuda) and vpmm_runtime_init.
 * May call: alloc.h (the pool's side), resolve.h, process.h, the log.
 */
#include "alloc.h"
#include "process.h"
#include "resolve.h"
#include "runtime.h"
#include "shim.h"

/* ---- the real runtime, for pass-through ------------------------------------------ */

static void *runtime(enum vpmm_rt fn, void *caller)
{
	static bool warned;
	void *p = vpmm_real_runtime(fn, caller);
	if (!p && !warned) {
		warned = true;
		vpmm_log(VPMM_LOG_ERROR, "the real CUDA runtime was not found: runtime calls fail");
	}
	vpmm_count(VPMM_HOOK_passthrough);
	return p;
}

#define RT(type, fn, caller) VPMM_PTR_TO_FN(type, runtime(fn, caller))

typedef cudaError_t (*rt_malloc_t)(void **, size_t);
typedef cudaError_t (*rt_free_t)(void *);
typedef cudaError_t (*rt_malloc_async_t)(void **, size_t, cudaStream_t);
typedef cudaError_t (*rt_free_async_t)(void *, cudaStream_t);
typedef cudaError_t (*rt_mem_info_t)(size_t *, size_t *);

cudaError_t vpmm_runtime_init(void *caller)
{
	rt_free_t f = RT(rt_free_t, VPMM_RT_FREE, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(NULL);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_malloc(enum vpmm_rt fn, void *caller, void **p, size_t n)
{
	rt_malloc_t f = RT(rt_malloc_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, n);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_free(void *caller, void *p)
{
	rt_free_t f = RT(rt_free_t, VPMM_RT_FREE, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_malloc_async(enum vpmm_rt fn, void *caller, void **p,
				     size_t n, cudaStream_t s)
{
	rt_malloc_async_t f = RT(rt_malloc_async_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, n, s);
	vpmm_tls_inside--;
	return e;
}

static cudaError_t real_free_async(enum vpmm_rt fn, void *caller, void *p,
				   cudaStream_t s)
{
	rt_free_async_t f = RT(rt_free_async_t, fn, caller);
	cudaError_t e;
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(p, s);
	vpmm_tls_inside--;
	return e;
}

/* ---- the calls ----------------------------------------------------------------- */


static cudaError_t rt_malloc(enum vpmm_hook h, enum vpmm_rt fn, enum vpmm_via via,
			     void *caller, void **devPtr, size_t size,
			     cudaStream_t s, bool async)
{
	CUdeviceptr p = 0;
	CUresult r;
	vpmm_count(h);
	if (devPtr && !size && !vpmm_tls_inside && vpmm_active()) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	if (devPtr && vpmm_do_malloc(&p, size, async ? s : VPMM_NO_STREAM, via, -1,
				     caller, &r)) {
		if (r == CUDA_SUCCESS)
			*devPtr = (void *)(uintptr_t)p;
		return (cudaError_t)r;
	}
	return async ? real_malloc_async(fn, caller, devPtr, size, s)
		     : real_malloc(fn, caller, devPtr, size);
}

static cudaError_t rt_free(enum vpmm_hook h, enum vpmm_rt fn, enum vpmm_via via,
			   void *caller, void *devPtr, cudaStream_t s, bool async)
{
	CUresult r;
	vpmm_count(h);
	if (vpmm_do_free((CUdeviceptr)(uintptr_t)devPtr, async ? s : VPMM_NO_STREAM,
			 via, &r))
		return (cudaError_t)r;
	return async ? real_free_async(fn, caller, devPtr, s) : real_free(caller, devPtr);
}

cudaError_t vpmm_cudaMalloc(void **devPtr, size_t size, void *caller)
{
	return rt_malloc(VPMM_HOOK_cudaMalloc, VPMM_RT_MALLOC, VPMM_VIA_RUNTIME,
			 caller, devPtr, size, NULL, false);
}

cudaError_t vpmm_cudaFree(void *devPtr, void *caller)
{
	return rt_free(VPMM_HOOK_cudaFree, VPMM_RT_FREE, VPMM_VIA_RUNTIME,
		       caller, devPtr, NULL, false);
}

cudaError_t vpmm_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s, void *caller)
{
	return rt_malloc(VPMM_HOOK_cudaMallocAsync, VPMM_RT_MALLOC_ASYNC,
			 VPMM_VIA_RUNTIME, caller, devPtr,
			 size, s, true);
}

cudaError_t vpmm_cudaFreeAsync(void *devPtr, cudaStream_t s, void *caller)
{
	return rt_free(VPMM_HOOK_cudaFreeAsync, VPMM_RT_FREE_ASYNC, VPMM_VIA_RUNTIME,
		       caller, devPtr, s, true);
}

cudaError_t vpmm_cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s,
				      void *caller)
{
	return rt_malloc(VPMM_HOOK_cudaMallocAsync_ptsz, VPMM_RT_MALLOC_ASYNC_PTSZ,
			 VPMM_VIA_RUNTIME_PTSZ, caller, devPtr,
			 size, s, true);
}

cudaError_t vpmm_cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s, void *caller)
{
	return rt_free(VPMM_HOOK_cudaFreeAsync_ptsz, VPMM_RT_FREE_ASYNC_PTSZ,
		       VPMM_VIA_RUNTIME_PTSZ, caller, devPtr,
		       s, true);
}

cudaError_t vpmm_cudaMemGetInfo(size_t *free_bytes, size_t *total, void *caller)
{
	rt_mem_info_t f;
	cudaError_t e;
	vpmm_count(VPMM_HOOK_cudaMemGetInfo);
	f = RT(rt_mem_info_t, VPMM_RT_MEM_GET_INFO, caller);
	if (!f)
		return cudaErrorInitializationError;
	vpmm_tls_inside++;
	e = f(free_bytes, total);
	vpmm_tls_inside--;
	if (e == cudaSuccess && free_bytes && total)
		vpmm_add_reusable(free_bytes, *total);
	return e;
}
