/* torch.c — PyTorch's CUDAPluggableAllocator under the shim: what the
 * exported vpmm_torch_malloc and vpmm_torch_free (hooks.c, declared in
 * vpmm/vpmm.h) do.
 *
 * Owns: the pair's semantics (stream-ordered on the given stream, on the
 * given device, no device synchronisation), its pass-through to the
 * driver's own stream-ordered allocator, so that the pair stays symmetric
 * for what the pool does not serve, and how a failed allocation reaches
 * PyTorch, with what the pool holds and where its free memory lies
 * (vpmm_oom_describe). May call: alloc.h, oom.h, streams.h, resolve.h, the log.
 *
 * A failed allocation is thrown, not returned. PyTorch's pluggable
 * allocator takes whatever pointer comes back as the tensor's memory, NULL
 * included, so a NULL became a tensor at address 0 and the next kernel died
 * with an illegal address, killing the context (seen under a second process
 * holding the device). So when the caller is PyTorch (the calling code
 * is in a library named libtorch* or libc10*, where PyTorch's allocator
 * interface lives) and the process has the C++ runtime, the failure is
 * thrown as a std::runtime_error whose message says out of memory, from
 * the outermost frame, after every lock and context scope is released;
 * PyTorch turns it into a Python RuntimeError. Any other caller gets NULL:
 * a throw with no C++ frame to catch it ends the process (an
 * AddressSanitizer runtime brings the C++ runtime into C programs). The
 * runtime's entry points are looked up at the failure, by name, so the
 * library links no C++ runtime.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "alloc.h"
#include "oom.h"
#include "resolve.h"
#include "shim.h"
#include "streams.h"
#include "torch.h"

/* What the pool does not serve for the pluggable allocator (a capturing
 * stream, the shim disabled) goes to the driver's own stream-ordered
 * allocator, in a context of the device as the pool would use. */
static CUresult torch_real(CUdeviceptr *inout, size_t size, int device, CUstream stream)
{
	struct vpmm_ctx_scope sc = {false};
	CUresult r;
	vpmm_resolve();
	if (!vpmm_real.alloc_async || !vpmm_real.free_async || !vpmm_real.ctx_get_current ||
	    !vpmm_real.ctx_push || !vpmm_real.ctx_pop)
		return CUDA_ERROR_NOT_INITIALIZED;
	vpmm_count(VPMM_HOOK_passthrough);
	r = vpmm_enter_device(device, &sc);
	if (r != CUDA_SUCCESS)
		return r;
	r = size ? vpmm_real.alloc_async(inout, size, stream)
		 : vpmm_real.free_async(*inout, stream);
	vpmm_leave(&sc);
	return r;
}

/* ---- failures ----------------------------------------------------- */

/* The library holding the code at `ra` when it is PyTorch's (libtorch*,
 * libc10*), NULL otherwise. */
static const char *pytorch_library(void *ra)
{
	Dl_info di;
	const char *base;
	if (!ra || !dladdr(ra, &di) || !di.dli_fname)
		return NULL;
	base = strrchr(di.dli_fname, '/');
	base = base ? base + 1 : di.dli_fname;
	return !strncmp(base, "libtorch", 8) || !strncmp(base, "libc10", 6) ? di.dli_fname
									       : NULL;
}

/* Throws std::runtime_error(msg) with the C++ runtime that `lib` (already
 * loaded) uses; returns when there is none. The runtime is looked up
 * through lib's own handle, since a library loaded RTLD_LOCAL, as Python
 * loads PyTorch's, keeps its dependencies out of the global scope. The
 * object is made by the runtime's own constructor (first argument `this`,
 * by the Itanium C++ ABI); 64 bytes is more than the object's two
 * pointers on every ABI in use. */
static void throw_runtime_error(const char *lib, const char *msg)
{
	void *(*alloc_exc)(size_t);
	void (*throw_exc)(void *, void *, void (*)(void *));
	void (*ctor)(void *, const char *);
	void (*dtor)(void *);
	void *type, *e;
	void *h;
	if (!vpmm_real_dlsym_fn || !(h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)))
		return;
#define CXX_ENTRY(var, name) ((var) = (__typeof__(var))(uintptr_t)vpmm_real_dlsym_fn(h, name))
	CXX_ENTRY(alloc_exc, "__cxa_allocate_exception");
	CXX_ENTRY(throw_exc, "__cxa_throw");
	CXX_ENTRY(ctor, "_ZNSt13runtime_errorC1EPKc");
	CXX_ENTRY(dtor, "_ZNSt13runtime_errorD1Ev");
#undef CXX_ENTRY
	type = vpmm_real_dlsym_fn(h, "_ZTISt13runtime_error");
	dlclose(h); /* lib stays: PyTorch's code is running */
	if (!alloc_exc || !throw_exc || !ctor || !dtor || !type)
		return;
	e = alloc_exc(64);
	ctor(e, msg);
	throw_exc(e, type, dtor);
}

/* ---- the pair ----------------------------------------------------- */

/* Stream-ordered on `stream`, no device synchronisation. What the pool
 * cannot serve goes to the driver's own stream-ordered allocator
 * (torch_real), so the pair stays symmetric. */
void *vpmm_pluggable_malloc(ssize_t size, int device, cudaStream_t stream, void *caller)
{
	CUdeviceptr p = 0;
	CUresult r;
	vpmm_count(VPMM_HOOK_vpmm_torch_malloc);
	if (size <= 0)
		return NULL;
	if (!vpmm_do_malloc(&p, (size_t)size, stream, VPMM_VIA_TORCH, device, NULL, &r))
		r = torch_real(&p, (size_t)size, device, stream);
	/* The pool's own out-of-memory line is already out; anything else
	 * (a device that does not exist, no driver) says so here, since
	 * PyTorch sees only NULL. */
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY)
		vpmm_log(VPMM_LOG_ERROR, "vpmm_torch_malloc(%zd, device %d): CUresult %d", size,
			 device, (int)r);
	if (r == CUDA_SUCCESS)
		return (void *)(uintptr_t)p;
	const char *lib = pytorch_library(caller);
	if (!lib || r != CUDA_ERROR_OUT_OF_MEMORY)
		vpmm_oom_forget(); /* not described: no later failure may take it */
	if (!lib)
		return NULL;
	char msg[512], state[384];
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		vpmm_oom_describe(device, (size_t)size, state, sizeof state);
		snprintf(msg, sizeof msg,
			 "vpmm: CUDA out of memory: tried to allocate %zd bytes on device %d%s",
			 size, device, state);
	} else {
		snprintf(msg, sizeof msg,
			 "vpmm: allocation of %zd bytes on device %d failed (CUresult %d)", size,
			 device, (int)r);
	}
	throw_runtime_error(lib, msg);
	return NULL;
}

void vpmm_pluggable_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
	CUresult r;
	(void)size;
	vpmm_count(VPMM_HOOK_vpmm_torch_free);
	if (!ptr)
		return;
	if (!vpmm_do_free(p, stream, VPMM_VIA_TORCH, &r))
		r = torch_real(&p, 0, device, stream);
	if (r != CUDA_SUCCESS)
		vpmm_log(VPMM_LOG_ERROR, "vpmm_torch_free(%p): CUresult %d", ptr, (int)r);
}
