/* fakecuda_ctx.c — the fake's init, devices and contexts: one primary
 * context per device, contexts the program makes, a per-thread current
 * context and push/pop stack, peer access between devices.
 *
 * Owns: the thread's context stack, the contexts the program made, the peer
 * table. Calls fakecuda.c and the host driver's controls.
 */
#include "fakecuda.h"

#include <stdbool.h>
#include <stdlib.h>

#include "vpmm.h"

static __thread struct fake_ctx *stack[8];
static unsigned long long last_id; /* under fake_lock */
/* A sticky error (a kernel's fault): every synchronisation answers it
 * until the context ends (fakecuda_sticky). */
static CUresult sticky;

void fakecuda_sticky(int result)
{
	sticky = (CUresult)result;
}

/* The next cuCtxDestroy answers this and destroys nothing
 * (fakecuda_refuse_destroy). */
static CUresult destroy_refusal;

void fakecuda_refuse_destroy(int result)
{
	destroy_refusal = (CUresult)result;
}
static __thread int depth; /* stack[depth - 1] is current */

/* ---- setup ----------------------------------------------------------------------- */

static size_t env_size(const char *name, size_t def)
{
	const char *v = getenv(name);
	size_t out;
	if (!v || !*v || vpmm_parse_size(v, &out))
		return def;
	return out;
}

static CUresult init_locked(void)
{
	struct vpmm_host_options o = {0};
	if (fake_drv)
		return CUDA_SUCCESS;
	fake_capacity = env_size("FAKECUDA_CAPACITY", (size_t)256 << 20);
	o.granularity = env_size("FAKECUDA_GRANULARITY", (size_t)64 << 10);
	fake_free_drift = env_size("FAKECUDA_FREE_DRIFT", 0);
	o.capacity = fake_capacity;
	o.unbacked = false;
	fake_ndev = (int)env_size("FAKECUDA_DEVICES", 2);
	if (fake_ndev < 1 || fake_ndev > MAX_DEV)
		fake_ndev = 2;
	for (int i = 0; i < fake_ndev; i++)
		fake_ctxs[i].device = i;
	return vpmm_driver_host_create(&o, &fake_drv);
}

struct fake_ctx *fake_current(void)
{
	return depth ? stack[depth - 1] : NULL;
}

/* Counts driver work done with no current context: the real driver refuses
 * some of it, and the shim is meant to set one up first. */
void fake_note_context(void)
{
	if (!fake_current())
		fake_count("no_context");
}

/* The current context's state as a CUresult: SUCCESS, INVALID_CONTEXT or
 * CONTEXT_IS_DESTROYED (NOT_INITIALIZED before cuInit). */
CUresult fake_ctx_state(void)
{
	struct fake_ctx *c = fake_current();
	if (!fake_drv)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	return c->destroyed ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_SUCCESS;
}

/* ---- init, devices, contexts --------------------------------------------------------- */

CUresult cuInit(unsigned int flags)
{
	CUresult r;
	(void)flags;
	pthread_mutex_lock(&fake_lock);
	r = init_locked();
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	NEED_INIT();
	if (!dev || ordinal < 0 || ordinal >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
	NEED_INIT();
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = fake_ndev;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	NEED_INIT();
	if (!pctx || dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	if (fake_ctxs[dev].destroyed || !fake_ctxs[dev].id)
		fake_ctxs[dev].id = ++last_id; /* made (again) */
	fake_ctxs[dev].destroyed = false;
	fake_ctxs[dev].refs++;
	pthread_mutex_unlock(&fake_lock);
	*pctx = (CUcontext)&fake_ctxs[dev];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	NEED_INIT();
	if (dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	*flags = 0;
	*active = fake_ctxs[dev].refs > 0 && !fake_ctxs[dev].destroyed;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

/* As on the real driver, the last release destroys the primary context
 * (its streams and events with it); a later retain makes it afresh. */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = CUDA_SUCCESS;
	NEED_INIT();
	if (dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	if (fake_ctxs[dev].refs <= 0) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (--fake_ctxs[dev].refs == 0) {
		fake_ctx_end(&fake_ctxs[dev], true); /* the shim hooks no release */
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

static CUresult primary_reset(CUdevice dev, bool unseen)
{
	NEED_INIT();
	if (dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	fake_ctx_end(&fake_ctxs[dev], unseen);
	sticky = CUDA_SUCCESS;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	return primary_reset(dev, false);
}

static CUresult private_reset(CUdevice dev)
{
	return primary_reset(dev, true);
}

/* The private table the CUDA 13 runtime resets the device through: the
 * same reset as cuDevicePrimaryCtxReset, reached by no exported name, so
 * no hook of the shim's sees it. Any table id answers it. */
struct fake_export_table {
	size_t size;
	CUresult (*primary_reset)(CUdevice);
};
static const struct fake_export_table export_table = {sizeof export_table, private_reset};

CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
	if (!table || !id)
		return CUDA_ERROR_INVALID_VALUE;
	*table = &export_table;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	CUresult r = CUDA_SUCCESS;
	NEED_INIT();
	if (!id)
		return CUDA_ERROR_INVALID_VALUE;
	if (!c && !(c = fake_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&fake_lock);
	fake_ctx_checked();
	if (c->destroyed)
		r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	else
		*id = c->id;
	pthread_mutex_unlock(&fake_lock);
	return r;
}

/* Contexts the program makes itself: current once made (pushed), dead once
 * destroyed (and popped if current), as on the real driver. Never freed:
 * a stale handle must stay readable here; listed, so that a leak checker
 * sees them held. */
static struct fake_ctx *made_ctxs;

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct fake_ctx *c;
	(void)flags;
	NEED_INIT();
	if (!pctx || dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth == 8 || !(c = calloc(1, sizeof *c)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->device = dev;
	pthread_mutex_lock(&fake_lock);
	c->id = ++last_id;
	c->made_before = made_ctxs;
	made_ctxs = c;
	pthread_mutex_unlock(&fake_lock);
	stack[depth++] = c;
	*pctx = (CUcontext)c;
	return CUDA_SUCCESS;
}

/* The later forms: their parameters (execution affinity, green
 * partitions) change nothing here. */
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
			CUdevice dev)
{
	(void)params, (void)n;
	return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			CUdevice dev)
{
	(void)params;
	return cuCtxCreate_v2(pctx, flags, dev);
}

/* A green context: a handle and nothing behind it (the shim only has to
 * hear of it; its resources and its default stream change nothing here). */
CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
			  unsigned int flags)
{
	static char greens[8];
	static int ngreen;
	(void)desc, (void)flags;
	NEED_INIT();
	if (!phCtx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	int k = ngreen < (int)sizeof greens ? ngreen++ : -1;
	pthread_mutex_unlock(&fake_lock);
	if (k < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*phCtx = (CUgreenCtx)(void *)&greens[k];
	return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	NEED_INIT();
	if (!c || c->destroyed)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (destroy_refusal) {
		CUresult r = destroy_refusal;
		destroy_refusal = CUDA_SUCCESS;
		return r;
	}
	pthread_mutex_lock(&fake_lock);
	fake_ctx_end(c, false);
	pthread_mutex_unlock(&fake_lock);
	if (fake_current() == c)
		depth--;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = (CUcontext)fake_current();
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	NEED_INIT();
	if (!ctx) {
		if (depth)
			depth--;
		return CUDA_SUCCESS;
	}
	if (!depth)
		depth = 1;
	stack[depth - 1] = (struct fake_ctx *)ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev)
{
	CUresult r = fake_ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	*dev = fake_current()->device;
	return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	NEED_INIT();
	if (!ctx || depth == 8)
		return CUDA_ERROR_INVALID_VALUE;
	if (((struct fake_ctx *)ctx)->destroyed)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	stack[depth++] = (struct fake_ctx *)ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	NEED_INIT();
	if (!depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	depth--;
	if (pctx)
		*pctx = (CUcontext)stack[depth];
	return CUDA_SUCCESS;
}

static CUresult sync_ctx(struct fake_ctx *c)
{
	fake_count("cuCtxSynchronize");
	if (fake_capture_check() != CUDA_SUCCESS)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->destroyed)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	if (sticky)
		return sticky;
	vpmm_host_complete_all(fake_drv);
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
	NEED_INIT();
	return sync_ctx(fake_current());
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	NEED_INIT();
	return sync_ctx(ctx ? (struct fake_ctx *)ctx : fake_current());
}

static bool peer_on[MAX_DEV][MAX_DEV]; /* [accessor][owner], under fake_lock */

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	CUresult r = fake_ctx_state();
	struct fake_ctx *p = (struct fake_ctx *)peer, *me = fake_current();
	if (r != CUDA_SUCCESS)
		return r;
	if (flags || !p || p < fake_ctxs || p >= fake_ctxs + fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->device == me->device)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	bool was = peer_on[me->device][p->device];
	peer_on[me->device][p->device] = true;
	pthread_mutex_unlock(&fake_lock);
	return was ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
}

