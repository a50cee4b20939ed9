/* driver_host.c — the host driver: a GPU imitated on host memory (or on
 * nothing at all, in unbacked mode), for tests and replay without a GPU.
 *
 * Owns: the driver object's creation and destruction, its table of
 * operations (filled by driver_host_mem.c and driver_host_stream.c) and its
 * one context. No global state: a test may make as many drivers as it likes.
 * Calls driver_host_mem.c, driver_host_stream.c and driver_host_base.c; the
 * files of the host driver and their layers are listed in driver_host_int.h.
 */
#include "driver_host_int.h"

#include <stdlib.h>
#include <unistd.h>

#define HOST_DEFAULT_GRANULARITY ((size_t)2 << 20)
#define HOST_DEFAULT_CAPACITY ((size_t)1 << 40)
/* Unbacked VAs start high so that they never look like small integers or
 * host pointers a test might confuse them with. */
#define HOST_UNBACKED_BASE ((uintptr_t)1 << 44)

/* One context per host driver, standing for the device's: any thread may
 * bind it. A reset (vpmm_host_ctx_reset) keeps its handle and gives it a
 * new id, as the primary context's reset does. */
static CUresult host_ctx_current(vpmm_driver *d, CUcontext *out)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_CTX_CURRENT);
	if (!out)
		r_ = CUDA_ERROR_INVALID_VALUE;
	else
		*out = (CUcontext)h;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_ctx_id(vpmm_driver *d, CUcontext ctx, unsigned long long *id)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_CTX_ID);
	if (!id || (ctx && ctx != (CUcontext)h))
		r_ = CUDA_ERROR_INVALID_VALUE;
	else if (h->ctx_destroyed)
		r_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	else
		*id = h->ctx_id;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

static CUresult host_ctx_bind(vpmm_driver *d, CUcontext ctx)
{
	struct host_driver *h = host_of(d);
	ENTER(h, VPMM_OP_CTX_BIND);
	if (ctx && ctx != (CUcontext)h)
		r_ = CUDA_ERROR_INVALID_CONTEXT;
out:
	pthread_mutex_unlock(&h->lock);
	return r_;
}

/* Frees the driver and, so that tests leak nothing, whatever it still
 * tracks: reservations (and the mappings inside), memfds, events, streams. */
static void host_destroy(vpmm_driver *d)
{
	struct host_driver *h = host_of(d);
	if (!h)
		return;
	vpi_host_mem_fini(h);
	vpi_host_stream_fini(h);
	pthread_cond_destroy(&h->gate_open);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

struct host_driver *vpi_host_checked(vpmm_driver *d)
{
	return d && d->destroy == host_destroy ? host_of(d) : NULL;
}

CUresult vpmm_driver_host_create(const struct vpmm_host_options *opt,
				 vpmm_driver **out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	struct vpmm_host_options o = { 0 };
	if (opt)
		o = *opt;
	if (!o.granularity)
		o.granularity = HOST_DEFAULT_GRANULARITY;
	if (!o.capacity)
		o.capacity = HOST_DEFAULT_CAPACITY;
	long page = sysconf(_SC_PAGESIZE);
	if (o.granularity < 4096 || (o.granularity & (o.granularity - 1)) ||
	    (!o.unbacked && page > 0 && o.granularity % (size_t)page))
		return CUDA_ERROR_INVALID_VALUE;

	struct host_driver *h = calloc(1, sizeof *h);
	if (!h)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (pthread_mutex_init(&h->lock, NULL) != 0) {
		free(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (pthread_cond_init(&h->gate_open, NULL) != 0) {
		pthread_mutex_destroy(&h->lock);
		free(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h->gran = o.granularity;
	h->capacity = o.capacity;
	h->unbacked = o.unbacked;
	h->next_va = HOST_UNBACKED_BASE;
	h->next_id = 1;
	h->ctx_id = 1;
	h->base = (vpmm_driver){
		.name = "host",
		.ctx_current = host_ctx_current,
		.ctx_bind = host_ctx_bind,
		.ctx_id = host_ctx_id,
		.destroy = host_destroy,
	};
	vpi_host_mem_ops(&h->base);
	vpi_host_stream_ops(&h->base);
	*out = &h->base;
	return CUDA_SUCCESS;
}
