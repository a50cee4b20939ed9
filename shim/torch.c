/* torch.c — PyTorch's CUDAPluggableAllocator under the shim: what the
 * exported vpmm_torch_malloc and vpmm_torch_free (hooks.c, declared in
 * vpmm/vpmm.h) do.
 *
 * Owns: the pair's semantics (stream-ordered on the given stream, on the
 * given device, no device synchronisation) and its pass-through to the
 * driver's own stream-ordered allocator, so that the pair stays symmetric
 * for what the pool does not serve. May call: alloc.h, streams.h,
 * resolve.h, the log.
 */
#include <sys/types.h>

#include "alloc.h"
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

/* ---- the pair ----------------------------------------------------- */

/* Stream-ordered on `stream`, no device synchronisation. What the pool
 * cannot serve goes to the driver's own stream-ordered allocator
 * (torch_real), so the pair stays symmetric. */
void *vpmm_pluggable_malloc(ssize_t size, int device, cudaStream_t stream)
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
	return r == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
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
