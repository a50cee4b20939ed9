/* fakecuda.c — a stand-in libcuda.so.1 for the shim's CI tests, built on the
 * host driver (backed host memory behaves as device memory: the test
 * programs read and write what they allocate).
 *
 * It implements what libvpmm.so, the cuda driver layer and the fake runtime
 * call, with the real driver's conventions where the shim depends on them:
 *  - cuGetProcAddress(_v2) picks a variant by base name, version and
 *    per-thread flag, and "cuGetProcAddress" itself is one of the names;
 *    a v1 cuMemAlloc/cuMemFree/cuMemGetInfo exists below version 3020;
 *  - contexts: one primary context per device, a per-thread current context
 *    and push/pop stack; calls that need a context fail with
 *    CUDA_ERROR_INVALID_CONTEXT without one and CONTEXT_IS_DESTROYED after
 *    cuDevicePrimaryCtxReset_v2;
 *  - cuMemGetAddressRange and the range attributes answer one mapping (one
 *    handle) for VMM memory, as the real driver does;
 *  - plain allocations (cuMemAlloc_v2, cuMemAllocAsync) are host memory that
 *    the fake tracks, so foreign pointers are rejected with INVALID_VALUE.
 * Test controls (exported, names no hook wraps): fakecuda_calls(),
 * fakecuda_set_capturing(), fakecuda_mem_info().
 *
 * Environment: FAKECUDA_CAPACITY (bytes, default 256M), FAKECUDA_GRANULARITY
 * (default 64K), FAKECUDA_DEVICES (default 2).
 *
 * Linked -Bsymbolic: the addresses it hands out must be its own functions
 * even though libvpmm.so exports the same names ahead of it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver_host.h"
#include "vpmm.h"

/* cuda.h maps these names to their current versions; here they are the
 * old variants the fake also offers. */
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#define API __attribute__((visibility("default")))
#define MAX_DEV 8

/* ---- state -------------------------------------------------------------------- */

struct fake_ctx {
	int device;
	bool destroyed;
	unsigned gen; /* bumped when the context is reset or destroyed */
	int refs;     /* a primary context's retains: the last release ends it */
	struct fake_ctx *made_before; /* the program's contexts, all kept */
};

/* The context an event or a stream was made in, and its generation then:
 * handles of a context that was since reset or destroyed are dead. */
struct owned {
	void *handle;
	struct fake_ctx *ctx;
	unsigned gen;
	struct owned *next;
};

struct plain {
	uintptr_t va;
	size_t size;
	struct plain *next;
};

struct mapping {
	uintptr_t va;
	size_t size;
	struct mapping *next;
};

struct stream_ctx {
	CUstream s;
	struct fake_ctx *ctx;
	unsigned gen;
	struct stream_ctx *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static vpmm_driver *D;
static size_t capacity, plain_bytes;
static int ndev;
static struct fake_ctx ctxs[MAX_DEV];
static struct plain *plains;
static struct mapping *mappings;
static struct stream_ctx *stream_ctxs;
static struct owned *events_owned;

static __thread struct fake_ctx *stack[8];
static __thread int depth; /* stack[depth - 1] is current */
static __thread CUstreamCaptureMode capture_mode;

/* ---- call counts ------------------------------------------------------------------ */

static const char *const counted[] = {
	"cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2",
	"cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemFreeAsync",
	"cuMemFreeAsync_ptsz", "cuMemGetInfo_v2", "cuMemGetAddressRange_v2",
	"cuPointerGetAttribute", "cuPointerGetAttributes", "cuCtxSynchronize",
	"cuStreamSynchronize", "cuMemCreate", "cuMemMap", "cuGetProcAddress_v2",
	"cuGetProcAddress",
	"no_context", /* driver work done with no current context */
};
#define NCOUNTED (sizeof counted / sizeof counted[0])
static unsigned long counts[NCOUNTED];

static void count(const char *name)
{
	for (size_t i = 0; i < NCOUNTED; i++)
		if (!strcmp(counted[i], name)) {
			__atomic_add_fetch(&counts[i], 1, __ATOMIC_RELAXED);
			return;
		}
}

API unsigned long fakecuda_calls(const char *name);
unsigned long fakecuda_calls(const char *name)
{
	for (size_t i = 0; i < NCOUNTED; i++)
		if (!strcmp(counted[i], name))
			return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
	return ~0UL;
}

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
	if (D)
		return CUDA_SUCCESS;
	capacity = env_size("FAKECUDA_CAPACITY", (size_t)256 << 20);
	o.granularity = env_size("FAKECUDA_GRANULARITY", (size_t)64 << 10);
	o.capacity = capacity;
	o.unbacked = false;
	ndev = (int)env_size("FAKECUDA_DEVICES", 2);
	if (ndev < 1 || ndev > MAX_DEV)
		ndev = 2;
	for (int i = 0; i < ndev; i++)
		ctxs[i].device = i;
	return vpmm_driver_host_create(&o, &D);
}

#define NEED_INIT()                                                           \
	do {                                                                  \
		if (!D)                                                       \
			return CUDA_ERROR_NOT_INITIALIZED;                    \
	} while (0)

static struct fake_ctx *current(void)
{
	return depth ? stack[depth - 1] : NULL;
}

/* Counts driver work done with no current context: the real driver refuses
 * some of it, and the shim is meant to set one up first. */
static void note_context(void)
{
	if (!current())
		count("no_context");
}

/* The current context's state as a CUresult: SUCCESS, INVALID_CONTEXT or
 * CONTEXT_IS_DESTROYED. */
static CUresult ctx_state(void)
{
	struct fake_ctx *c = current();
	if (!D)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	return c->destroyed ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_SUCCESS;
}

/* ---- init, devices, contexts --------------------------------------------------------- */

API CUresult cuInit(unsigned int flags);
API CUresult cuDriverGetVersion(int *v);
API CUresult cuDeviceGet(CUdevice *dev, int ordinal);
API CUresult cuDeviceGetCount(int *n);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
API CUresult cuCtxGetCurrent(CUcontext *pctx);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxGetDevice(CUdevice *dev);
API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
API CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
API CUresult cuCtxSynchronize(void);
API CUresult cuCtxSynchronize_v2(CUcontext ctx);

CUresult cuInit(unsigned int flags)
{
	CUresult r;
	(void)flags;
	pthread_mutex_lock(&lock);
	r = init_locked();
	pthread_mutex_unlock(&lock);
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
	if (!dev || ordinal < 0 || ordinal >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
	NEED_INIT();
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = ndev;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	NEED_INIT();
	if (!pctx || dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	ctxs[dev].destroyed = false;
	ctxs[dev].refs++;
	pthread_mutex_unlock(&lock);
	*pctx = (CUcontext)&ctxs[dev];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	NEED_INIT();
	if (dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	*flags = 0;
	*active = ctxs[dev].refs > 0 && !ctxs[dev].destroyed;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/* As on the real driver, the last release destroys the primary context
 * (its streams and events with it); a later retain makes it afresh. */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = CUDA_SUCCESS;
	NEED_INIT();
	if (dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	if (ctxs[dev].refs <= 0) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (--ctxs[dev].refs == 0) {
		ctxs[dev].destroyed = true;
		ctxs[dev].gen++;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	NEED_INIT();
	if (dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	ctxs[dev].destroyed = true;
	ctxs[dev].gen++;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/* Contexts the program makes itself: current once made (pushed), dead once
 * destroyed (and popped if current), as on the real driver. Never freed:
 * a stale handle must stay readable here; listed, so that a leak checker
 * sees them held. */
static struct fake_ctx *made_ctxs;

API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
API CUresult cuCtxDestroy_v2(CUcontext ctx);

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct fake_ctx *c;
	(void)flags;
	NEED_INIT();
	if (!pctx || dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth == 8 || !(c = calloc(1, sizeof *c)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->device = dev;
	pthread_mutex_lock(&lock);
	c->made_before = made_ctxs;
	made_ctxs = c;
	pthread_mutex_unlock(&lock);
	stack[depth++] = c;
	*pctx = (CUcontext)c;
	return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	NEED_INIT();
	if (!c || c->destroyed)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	c->destroyed = true;
	c->gen++;
	pthread_mutex_unlock(&lock);
	if (current() == c)
		depth--;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = (CUcontext)current();
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
	CUresult r = ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	*dev = current()->device;
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
	count("cuCtxSynchronize");
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->destroyed)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	vpmm_host_complete_all(D);
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
	NEED_INIT();
	return sync_ctx(current());
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	NEED_INIT();
	return sync_ctx(ctx ? (struct fake_ctx *)ctx : current());
}

/* ---- streams and events ---------------------------------------------------------------- */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags);
API CUresult cuStreamDestroy_v2(CUstream s);
API CUresult cuStreamSynchronize(CUstream s);
API CUresult cuStreamSynchronize_ptsz(CUstream s);
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st);
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
API CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx);
API CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *pctx);
API CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags);
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags);
API CUresult cuEventCreate(CUevent *ev, unsigned int flags);
API CUresult cuEventRecord(CUevent ev, CUstream s);
API CUresult cuEventRecord_ptsz(CUevent ev, CUstream s);
API CUresult cuEventQuery(CUevent ev);
API CUresult cuEventSynchronize(CUevent ev);
API CUresult cuEventDestroy_v2(CUevent ev);
API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
API void fakecuda_set_capturing(CUstream s, int on);

static CUstream ptds(CUstream s)
{
	return s ? s : CU_STREAM_PER_THREAD;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	struct stream_ctx *sc;
	CUresult r = ctx_state();
	(void)flags;
	if (r != CUDA_SUCCESS)
		return r;
	if (!s || !(sc = calloc(1, sizeof *sc)))
		return CUDA_ERROR_INVALID_VALUE;
	*s = vpmm_host_stream_create(D);
	if (!*s) {
		free(sc);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	sc->s = *s;
	sc->ctx = current();
	sc->gen = sc->ctx->gen;
	pthread_mutex_lock(&lock);
	sc->next = stream_ctxs;
	stream_ctxs = sc;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s)
{
	(void)s;
	NEED_INIT();
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s)
{
	NEED_INIT();
	count("cuStreamSynchronize");
	vpmm_host_stream_complete(D, s);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	return cuStreamSynchronize(ptds(s));
}

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	bool cap = false;
	CUresult r;
	NEED_INIT();
	if (!st)
		return CUDA_ERROR_INVALID_VALUE;
	r = D->stream_capturing(D, s, &cap);
	*st = cap ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	return r;
}

CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st)
{
	return cuStreamIsCapturing(ptds(s), st);
}

CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
		*pctx = (CUcontext)current();
		return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
	}
	pthread_mutex_lock(&lock);
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s) {
			*pctx = (CUcontext)sc->ctx;
			pthread_mutex_unlock(&lock);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&lock);
	return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *pctx)
{
	return cuStreamGetCtx(ptds(s), pctx);
}

/* Events and stream work need a current context, as on the real driver. */
CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
	CUresult r = ctx_state();
	note_context();
	(void)flags;
	return r != CUDA_SUCCESS ? r : D->stream_wait(D, s, ev);
}

CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags)
{
	return cuStreamWaitEvent(ptds(s), ev, flags);
}

/* Whether `ev` is an event of a context that still exists, and which. */
static bool event_alive(CUevent ev, struct fake_ctx **ctx)
{
	bool alive = false;
	pthread_mutex_lock(&lock);
	for (struct owned *o = events_owned; o; o = o->next)
		if (o->handle == (void *)ev) {
			alive = !o->ctx->destroyed && o->ctx->gen == o->gen;
			if (ctx)
				*ctx = o->ctx;
			break;
		}
	pthread_mutex_unlock(&lock);
	return alive;
}

/* The context of stream `s` (the current one for the default streams);
 * NULL when it is dead or unknown. */
static struct fake_ctx *stream_ctx_of(CUstream s)
{
	struct fake_ctx *c = NULL;
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return current();
	pthread_mutex_lock(&lock);
	for (struct stream_ctx *sc = stream_ctxs; sc; sc = sc->next)
		if (sc->s == s) {
			if (!sc->ctx->destroyed && sc->ctx->gen == sc->gen)
				c = sc->ctx;
			break;
		}
	pthread_mutex_unlock(&lock);
	return c;
}

CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
	CUresult r = ctx_state();
	struct owned *o;
	note_context();
	(void)flags;
	if (r != CUDA_SUCCESS)
		return r;
	if (!(o = calloc(1, sizeof *o)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = D->event_create(D, ev);
	if (r != CUDA_SUCCESS) {
		free(o);
		return r;
	}
	o->handle = (void *)*ev;
	o->ctx = current();
	o->gen = o->ctx->gen;
	pthread_mutex_lock(&lock);
	o->next = events_owned;
	events_owned = o;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/* As on the real driver, an event is recorded only on a stream of its own
 * context, and a context's events die with it. */
CUresult cuEventRecord(CUevent ev, CUstream s)
{
	CUresult r = ctx_state();
	struct fake_ctx *ec = NULL;
	note_context();
	if (r != CUDA_SUCCESS)
		return r;
	if (!event_alive(ev, &ec) || stream_ctx_of(s) != ec)
		return CUDA_ERROR_INVALID_HANDLE;
	return D->event_record(D, ev, s);
}

CUresult cuEventRecord_ptsz(CUevent ev, CUstream s)
{
	return cuEventRecord(ev, ptds(s));
}

CUresult cuEventQuery(CUevent ev)
{
	note_context();
	NEED_INIT();
	if (!event_alive(ev, NULL))
		return CUDA_ERROR_INVALID_HANDLE;
	return D->event_query(D, ev);
}

CUresult cuEventSynchronize(CUevent ev)
{
	note_context();
	NEED_INIT();
	if (!event_alive(ev, NULL))
		return CUDA_ERROR_INVALID_HANDLE;
	return D->event_sync(D, ev);
}

CUresult cuEventDestroy_v2(CUevent ev)
{
	note_context();
	NEED_INIT();
	pthread_mutex_lock(&lock);
	for (struct owned **o = &events_owned; *o; o = &(*o)->next)
		if ((*o)->handle == (void *)ev) {
			struct owned *dead = *o;
			*o = dead->next;
			free(dead);
			break;
		}
	pthread_mutex_unlock(&lock);
	return D->event_destroy(D, ev);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old = capture_mode;
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

void fakecuda_set_capturing(CUstream s, int on)
{
	vpmm_host_set_capturing(D, s, on != 0);
}

/* Test control: the nth next call of driver operation `op` (enum vpmm_op)
 * fails with `result` (0 disarms). */
API void fakecuda_fail(int op, unsigned long nth, int result);
void fakecuda_fail(int op, unsigned long nth, int result)
{
	vpmm_host_fail(D, (enum vpmm_op)op, nth, (CUresult)result);
}

/* ---- virtual memory ----------------------------------------------------------------------- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags flags);
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
				 CUdeviceptr addr, unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle h);
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
		      CUmemGenericAllocationHandle h, unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr p, size_t size);
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
			    size_t count);
API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					  CUmemAllocationHandleType type,
					  unsigned long long flags);

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags flags)
{
	(void)flags;
	NEED_INIT();
	return D->granularity(D, prop ? prop->location.id : 0, g);
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
			     CUdeviceptr addr, unsigned long long flags)
{
	(void)align;
	(void)addr;
	(void)flags;
	NEED_INIT();
	note_context();
	return D->va_reserve(D, size, p);
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	NEED_INIT();
	return D->va_free(D, p, size);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	(void)flags;
	NEED_INIT();
	note_context();
	count("cuMemCreate");
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	return D->mem_create(D, prop->location.id, size, h);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	NEED_INIT();
	return D->mem_release(D, h);
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
		  CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct mapping *m;
	CUresult r;
	(void)flags;
	NEED_INIT();
	note_context();
	count("cuMemMap");
	if (offset)
		return CUDA_ERROR_NOT_SUPPORTED;
	m = calloc(1, sizeof *m);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = D->map(D, p, size, h);
	if (r != CUDA_SUCCESS) {
		free(m);
		return r;
	}
	m->va = (uintptr_t)p;
	m->size = size;
	pthread_mutex_lock(&lock);
	m->next = mappings;
	mappings = m;
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	CUresult r;
	NEED_INIT();
	note_context();
	r = D->unmap(D, p, size);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&lock);
	for (struct mapping **m = &mappings; *m;) {
		if ((*m)->va >= (uintptr_t)p && (*m)->va < (uintptr_t)p + size) {
			struct mapping *dead = *m;
			*m = dead->next;
			free(dead);
		} else {
			m = &(*m)->next;
		}
	}
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
			size_t n)
{
	int devs[MAX_DEV];
	NEED_INIT();
	note_context();
	if (!desc || !n || n > MAX_DEV)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++)
		devs[i] = desc[i].location.id;
	return D->set_access(D, p, size, devs, (int)n);
}

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
				      CUmemAllocationHandleType type,
				      unsigned long long flags)
{
	(void)type;
	(void)flags;
	NEED_INIT();
	return D->export_fd(D, h, (int *)out);
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					    CUmemAllocationHandleType type);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					CUmemAllocationHandleType type)
{
	NEED_INIT();
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	return D->import_fd(D, (int)(uintptr_t)os, h);
}

/* ---- IPC and peers ------------------------------------------------------------------------- */

/* The fake has no IPC of its own: like the real driver on VMM memory, it
 * refuses every pointer; a handle it did not make is invalid. What the
 * tests check is that the shim answers for pool memory and passes the rest
 * through. */
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p);
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
API CUresult cuIpcCloseMemHandle(CUdeviceptr p);
API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
API int fakecuda_accessible(CUdeviceptr p, int device);

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	(void)h;
	(void)p;
	NEED_INIT();
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	(void)p;
	(void)h;
	(void)flags;
	NEED_INIT();
	return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	(void)p;
	NEED_INIT();
	return CUDA_ERROR_INVALID_VALUE;
}

static bool peer_on[MAX_DEV][MAX_DEV]; /* [accessor][owner], under lock */

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	CUresult r = ctx_state();
	struct fake_ctx *p = (struct fake_ctx *)peer, *me = current();
	if (r != CUDA_SUCCESS)
		return r;
	if (flags || !p || p < ctxs || p >= ctxs + ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->device == me->device)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	bool was = peer_on[me->device][p->device];
	peer_on[me->device][p->device] = true;
	pthread_mutex_unlock(&lock);
	return was ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
}

/* Test control: whether device `device` may access p (mapped memory). */
int fakecuda_accessible(CUdeviceptr p, int device)
{
	return D && vpmm_host_accessible(D, p, device);
}

/* ---- plain allocations ---------------------------------------------------------------------- */

API CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize);
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
API CUresult cuMemFree(unsigned int dptr);
API CUresult cuMemFree_v2(CUdeviceptr dptr);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s);
API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total);
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p);
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p);
API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *a, void **data,
				    CUdeviceptr p);
API void fakecuda_mem_info(size_t *free_bytes, size_t *total);

static CUresult plain_alloc(CUdeviceptr *dptr, size_t size)
{
	struct plain *pl;
	void *mem;
	CUresult r = ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	if (size > capacity - plain_bytes) {
		pthread_mutex_unlock(&lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&lock);
	mem = aligned_alloc(256, (size + 255) / 256 * 256);
	pl = malloc(sizeof *pl);
	if (!mem || !pl) {
		free(mem);
		free(pl);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pl->va = (uintptr_t)mem;
	pl->size = size;
	pthread_mutex_lock(&lock);
	plain_bytes += size;
	pl->next = plains;
	plains = pl;
	pthread_mutex_unlock(&lock);
	*dptr = (CUdeviceptr)pl->va;
	return CUDA_SUCCESS;
}

static CUresult plain_free(CUdeviceptr dptr)
{
	CUresult r = ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&lock);
	for (struct plain **p = &plains; *p; p = &(*p)->next)
		if ((*p)->va == (uintptr_t)dptr) {
			struct plain *dead = *p;
			*p = dead->next;
			plain_bytes -= dead->size;
			pthread_mutex_unlock(&lock);
			free((void *)dead->va);
			free(dead);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&lock);
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
	CUdeviceptr p;
	CUresult r;
	count("cuMemAlloc");
	r = plain_alloc(&p, bytesize);
	if (r == CUDA_SUCCESS)
		*dptr = (unsigned int)p; /* the v1 ABI: truncated, never used */
	if (r == CUDA_SUCCESS)
		plain_free(p);
	return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	count("cuMemAlloc_v2");
	return plain_alloc(dptr, bytesize);
}

CUresult cuMemFree(unsigned int dptr)
{
	(void)dptr;
	count("cuMemFree");
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	count("cuMemFree_v2");
	return plain_free(dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	(void)s;
	count("cuMemAllocAsync");
	return plain_alloc(dptr, bytesize);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	(void)s;
	count("cuMemAllocAsync_ptsz");
	return plain_alloc(dptr, bytesize);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	(void)s;
	count("cuMemFreeAsync");
	return plain_free(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	(void)s;
	count("cuMemFreeAsync_ptsz");
	return plain_free(dptr);
}

void fakecuda_mem_info(size_t *free_bytes, size_t *total)
{
	struct vpmm_host_live live;
	vpmm_host_live(D, &live);
	pthread_mutex_lock(&lock);
	*total = capacity;
	*free_bytes = capacity - live.handle_bytes - plain_bytes;
	pthread_mutex_unlock(&lock);
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
	(void)free_bytes;
	(void)total;
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r = ctx_state();
	count("cuMemGetInfo_v2");
	if (r != CUDA_SUCCESS)
		return r;
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	fakecuda_mem_info(free_bytes, total);
	return CUDA_SUCCESS;
}

/* The plain allocation or the single mapping holding p. */
static bool range_of(CUdeviceptr p, uintptr_t *base, size_t *size)
{
	bool found = false;
	pthread_mutex_lock(&lock);
	for (struct plain *pl = plains; pl && !found; pl = pl->next)
		if ((uintptr_t)p >= pl->va && (uintptr_t)p < pl->va + pl->size) {
			*base = pl->va;
			*size = pl->size;
			found = true;
		}
	for (struct mapping *m = mappings; m && !found; m = m->next)
		if ((uintptr_t)p >= m->va && (uintptr_t)p < m->va + m->size) {
			*base = m->va;
			*size = m->size;
			found = true;
		}
	pthread_mutex_unlock(&lock);
	return found;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p)
{
	uintptr_t base;
	size_t size;
	count("cuMemGetAddressRange_v2");
	NEED_INIT();
	if (!range_of(p, &base, &size))
		return CUDA_ERROR_NOT_FOUND;
	if (pbase)
		*pbase = (CUdeviceptr)base;
	if (psize)
		*psize = size;
	return CUDA_SUCCESS;
}

static CUresult attr(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	uintptr_t base;
	size_t size;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	if (!range_of(p, &base, &size))
		return CUDA_ERROR_INVALID_VALUE;
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)base;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	count("cuPointerGetAttribute");
	NEED_INIT();
	return attr(data, a, p);
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *a, void **data,
				CUdeviceptr p)
{
	count("cuPointerGetAttributes");
	NEED_INIT();
	if (!a || !data)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned int i = 0; i < n; i++) {
		CUresult r = attr(data[i], a[i], p);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
			      cuuint64_t flags);

typedef void (*fn_t)(void);

struct proc {
	const char *name;
	int version; /* first version of this variant */
	bool ptsz;
	fn_t fn;
};

#define P(name, ver, fn) {name, ver, false, (fn_t)fn}
#define PT(name, ver, fn) {name, ver, true, (fn_t)fn}
static const struct proc procs[] = {
	P("cuGetProcAddress", 11030, cuGetProcAddress),
	P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
	P("cuInit", 2000, cuInit),
	P("cuDriverGetVersion", 2020, cuDriverGetVersion),
	P("cuDeviceGet", 2000, cuDeviceGet),
	P("cuDeviceGetCount", 2000, cuDeviceGetCount),
	P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
	P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
	P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	P("cuCtxGetDevice", 2000, cuCtxGetDevice),
	P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	P("cuCtxSynchronize", 2000, cuCtxSynchronize),
	P("cuCtxCreate", 3020, cuCtxCreate_v2),
	P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	P("cuStreamCreate", 2000, cuStreamCreate),
	P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	P("cuStreamSynchronize", 2000, cuStreamSynchronize),
	PT("cuStreamSynchronize", 2000, cuStreamSynchronize_ptsz),
	P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
	PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
	P("cuStreamGetCtx", 9020, cuStreamGetCtx),
	PT("cuStreamGetCtx", 9020, cuStreamGetCtx_ptsz),
	P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
	PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent_ptsz),
	P("cuEventCreate", 2000, cuEventCreate),
	P("cuEventRecord", 2000, cuEventRecord),
	PT("cuEventRecord", 2000, cuEventRecord_ptsz),
	P("cuEventQuery", 2000, cuEventQuery),
	P("cuEventSynchronize", 2000, cuEventSynchronize),
	P("cuEventDestroy", 4000, cuEventDestroy_v2),
	P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
	P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	P("cuMemAddressReserve", 10020, cuMemAddressReserve),
	P("cuMemAddressFree", 10020, cuMemAddressFree),
	P("cuMemCreate", 10020, cuMemCreate),
	P("cuMemRelease", 10020, cuMemRelease),
	P("cuMemMap", 10020, cuMemMap),
	P("cuMemUnmap", 10020, cuMemUnmap),
	P("cuMemSetAccess", 10020, cuMemSetAccess),
	P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
	P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
	P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
	P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
	P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
	P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
	P("cuMemAlloc", 2000, cuMemAlloc),
	P("cuMemAlloc", 3020, cuMemAlloc_v2),
	P("cuMemFree", 2000, cuMemFree),
	P("cuMemFree", 3020, cuMemFree_v2),
	P("cuMemGetInfo", 2000, cuMemGetInfo),
	P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
	P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
	P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
	P("cuMemAllocAsync", 11020, cuMemAllocAsync),
	PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
	P("cuMemFreeAsync", 11020, cuMemFreeAsync),
	PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
};
#undef P
#undef PT

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	bool named = false;
	bool want_ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
		const struct proc *p = &procs[i];
		if (strcmp(p->name, symbol))
			continue;
		named = true;
		if (p->version > version)
			continue;
		if (p->ptsz && !want_ptsz)
			continue;
		if (!best || p->version > best->version ||
		    (p->version == best->version && p->ptsz))
			best = p;
	}
	if (!best) {
		*pfn = NULL;
		if (status)
			*status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
					: CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	*pfn = (void *)(uintptr_t)best->fn;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
			     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	count("cuGetProcAddress_v2");
	return lookup(symbol, pfn, version, flags, status);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	count("cuGetProcAddress");
	return lookup(symbol, pfn, version, flags, NULL);
}
