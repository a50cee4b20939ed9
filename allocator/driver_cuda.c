/* driver_cuda.c — the real driver: libcuda.so.1 loaded at run time.
 *
 * Owns: resolving the driver entry points (once, at creation) and turning the
 * driver layer's calls into libcuda calls. cuda.h supplies types only; there
 * is no link-time dependency on libcuda, so the library loads on machines
 * without a GPU and the shim can hand in a resolver that bypasses its own
 * hooks.
 *
 * Devices: a negative device means the device of the calling thread's
 * current context.
 */
#include "driver.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cuda_fns {
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*CtxGetDevice)(CUdevice *);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
						CUmemAllocationGranularity_flags);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
				      unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t,
			      const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			   unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
					       CUmemAllocationHandleType,
					       unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
						 CUmemAllocationHandleType);
	CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxSetCurrent)(CUcontext);
	/* Optional (CUDA 12.0 and later): NULL where the driver lacks it. */
	CUresult (*CtxGetId)(CUcontext, unsigned long long *);
};

/* The exported names, spelled out: cuda.h #defines several of the plain
 * names to versioned ones (cuMemGetInfo -> cuMemGetInfo_v2, cuEventDestroy ->
 * cuEventDestroy_v2), and, in per-thread-default-stream builds, others to
 * _ptsz variants we do not want: the plain ones take the stream as given. */
static const struct {
	const char *name;
	size_t offset;
} cuda_syms[] = {
#define SYM(field, name) { name, offsetof(struct cuda_fns, field) }
	SYM(DeviceGet, "cuDeviceGet"),
	SYM(CtxGetDevice, "cuCtxGetDevice"),
	SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
	SYM(MemAddressReserve, "cuMemAddressReserve"),
	SYM(MemAddressFree, "cuMemAddressFree"),
	SYM(MemCreate, "cuMemCreate"),
	SYM(MemRelease, "cuMemRelease"),
	SYM(MemMap, "cuMemMap"),
	SYM(MemUnmap, "cuMemUnmap"),
	SYM(MemSetAccess, "cuMemSetAccess"),
	SYM(EventCreate, "cuEventCreate"),
	SYM(EventRecord, "cuEventRecord"),
	SYM(EventQuery, "cuEventQuery"),
	SYM(EventSynchronize, "cuEventSynchronize"),
	SYM(EventDestroy, "cuEventDestroy_v2"),
	SYM(StreamWaitEvent, "cuStreamWaitEvent"),
	SYM(StreamIsCapturing, "cuStreamIsCapturing"),
	SYM(MemGetInfo, "cuMemGetInfo_v2"),
	SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
	SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
	SYM(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
	SYM(CtxGetCurrent, "cuCtxGetCurrent"),
	SYM(CtxSetCurrent, "cuCtxSetCurrent"),
#undef SYM
};
/* Entry points a driver may lack: the one feature needing each is off then. */
static const size_t cuda_optional[] = {offsetof(struct cuda_fns, CtxGetId)};
static const char *const cuda_optional_names[] = {"cuCtxGetId"};

_Static_assert(sizeof(void *) == sizeof(CUresult (*)(void)),
	       "entry points are stored through object pointers");

struct cuda_driver {
	vpmm_driver base; /* first: a vpmm_driver * is a struct cuda_driver * */
	void *lib;        /* dlopen handle; NULL with a caller's resolver */
	struct cuda_fns fn;
	/* Set once cuMemCreate refused shareable handles (some containers and
	 * systems do): later handles are made without, and cannot be exported. */
	atomic_bool no_shareable;
};

static struct cuda_driver *cuda_of(vpmm_driver *d)
{
	return (struct cuda_driver *)d;
}

/* The CUdevice for a device ordinal, or the current context's device. */
static CUresult cuda_device(struct cuda_driver *c, int ordinal, CUdevice *dev)
{
	if (ordinal < 0)
		return c->fn.CtxGetDevice(dev);
	return c->fn.DeviceGet(dev, ordinal);
}

/* While another thread captures a stream in CU_STREAM_CAPTURE_MODE_GLOBAL
 * (the default), libcuda refuses "potentially unsafe" calls — the VMM calls
 * among them — on every thread whose own mode is global, and the refusal
 * also invalidates that capture. The pool's VMM work is not stream work and
 * does not belong to any graph, so it must neither fail nor break a capture
 * it knows nothing of: these calls run with this thread's mode switched to
 * relaxed, and the previous mode is put back afterwards. If the exchange
 * fails (no context yet), the call runs as it is. */
struct capture_guard {
	CUstreamCaptureMode mode;
	bool swapped;
};

static void relax_begin(struct cuda_driver *c, struct capture_guard *g)
{
	g->mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	g->swapped = c->fn.ThreadExchangeStreamCaptureMode(&g->mode) == CUDA_SUCCESS;
}

static void relax_end(struct cuda_driver *c, struct capture_guard *g)
{
	if (g->swapped)
		c->fn.ThreadExchangeStreamCaptureMode(&g->mode);
}

static void pinned_prop(CUmemAllocationProp *prop, CUdevice dev,
			CUmemAllocationHandleType handle_type)
{
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	prop->requestedHandleTypes = handle_type;
}

static CUresult cuda_granularity(vpmm_driver *d, int device, size_t *out)
{
	struct cuda_driver *c = cuda_of(d);
	CUdevice dev;
	CUresult r = cuda_device(c, device, &dev);
	if (r != CUDA_SUCCESS)
		return r;
	CUmemAllocationProp prop;
	pinned_prop(&prop, dev, CU_MEM_HANDLE_TYPE_NONE);
	return c->fn.MemGetAllocationGranularity(out, &prop,
						 CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

static CUresult cuda_va_reserve(vpmm_driver *d, size_t size, CUdeviceptr *out)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemAddressReserve(out, size, 0, 0, 0);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_va_free(vpmm_driver *d, CUdeviceptr va, size_t size)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemAddressFree(va, size);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_mem_create(vpmm_driver *d, int device, size_t size,
				CUmemGenericAllocationHandle *out)
{
	struct cuda_driver *c = cuda_of(d);
	CUdevice dev;
	CUresult r = cuda_device(c, device, &dev);
	if (r != CUDA_SUCCESS)
		return r;
	CUmemAllocationProp prop;
	struct capture_guard g;
	relax_begin(c, &g);
	if (!atomic_load_explicit(&c->no_shareable, memory_order_relaxed)) {
		pinned_prop(&prop, dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		r = c->fn.MemCreate(out, size, &prop, 0);
		if (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE)
			goto done;
	}
	pinned_prop(&prop, dev, CU_MEM_HANDLE_TYPE_NONE);
	r = c->fn.MemCreate(out, size, &prop, 0);
	/* Only a plain handle that works proves the shareable kind was the
	 * problem (and not, say, a bad size). */
	if (r == CUDA_SUCCESS)
		atomic_store_explicit(&c->no_shareable, true, memory_order_relaxed);
done:
	relax_end(c, &g);
	return r;
}

static CUresult cuda_mem_release(vpmm_driver *d, CUmemGenericAllocationHandle h)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemRelease(h);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_map(vpmm_driver *d, CUdeviceptr va, size_t size,
			 CUmemGenericAllocationHandle h)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemMap(va, size, 0, h, 0);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_unmap(vpmm_driver *d, CUdeviceptr va, size_t size)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemUnmap(va, size);
	relax_end(c, &g);
	return r;
}

#define CUDA_ACCESS_STACK 16

static CUresult cuda_set_access(vpmm_driver *d, CUdeviceptr va, size_t size,
				const int *devices, int ndevices)
{
	struct cuda_driver *c = cuda_of(d);
	if (!devices || ndevices <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemAccessDesc stack[CUDA_ACCESS_STACK];
	CUmemAccessDesc *desc = stack;
	if (ndevices > CUDA_ACCESS_STACK) {
		desc = calloc((size_t)ndevices, sizeof *desc);
		if (!desc)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult r = CUDA_SUCCESS;
	for (int i = 0; i < ndevices && r == CUDA_SUCCESS; i++) {
		CUdevice dev;
		r = cuda_device(c, devices[i], &dev);
		memset(&desc[i], 0, sizeof desc[i]);
		desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		desc[i].location.id = dev;
		desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	if (r == CUDA_SUCCESS) {
		struct capture_guard g;
		relax_begin(c, &g);
		r = c->fn.MemSetAccess(va, size, desc, (size_t)ndevices);
		relax_end(c, &g);
	}
	if (desc != stack)
		free(desc);
	return r;
}

static CUresult cuda_event_create(vpmm_driver *d, CUevent *out)
{
	return cuda_of(d)->fn.EventCreate(out, CU_EVENT_DISABLE_TIMING);
}

static CUresult cuda_event_record(vpmm_driver *d, CUevent ev, CUstream s)
{
	return cuda_of(d)->fn.EventRecord(ev, s);
}

/* Querying or waiting for an event is also refused during another thread's
 * global-mode capture; relaxed mode lets it through for events recorded
 * outside any capture (the only ones the pool asks about). */
static CUresult cuda_event_query(vpmm_driver *d, CUevent ev)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.EventQuery(ev);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_event_sync(vpmm_driver *d, CUevent ev)
{
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.EventSynchronize(ev);
	relax_end(c, &g);
	return r;
}

static CUresult cuda_event_destroy(vpmm_driver *d, CUevent ev)
{
	return cuda_of(d)->fn.EventDestroy(ev);
}

static CUresult cuda_stream_wait(vpmm_driver *d, CUstream s, CUevent ev)
{
	return cuda_of(d)->fn.StreamWaitEvent(s, ev, CU_EVENT_WAIT_DEFAULT);
}

static CUresult cuda_stream_capturing(vpmm_driver *d, CUstream s,
				      bool *capturing)
{
	if (!capturing)
		return CUDA_ERROR_INVALID_VALUE;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult r = cuda_of(d)->fn.StreamIsCapturing(s, &st);
	/* An invalidated capture is still a capture until it is ended: work
	 * issued to the stream does not run. */
	if (r == CUDA_SUCCESS)
		*capturing = st != CU_STREAM_CAPTURE_STATUS_NONE;
	return r;
}

static CUresult cuda_mem_info(vpmm_driver *d, size_t *free_bytes,
			      size_t *total_bytes)
{
	return cuda_of(d)->fn.MemGetInfo(free_bytes, total_bytes);
}

static CUresult cuda_ctx_current(vpmm_driver *d, CUcontext *out)
{
	return cuda_of(d)->fn.CtxGetCurrent(out);
}

static CUresult cuda_ctx_bind(vpmm_driver *d, CUcontext ctx)
{
	return cuda_of(d)->fn.CtxSetCurrent(ctx);
}

static CUresult cuda_ctx_id(vpmm_driver *d, CUcontext ctx, unsigned long long *id)
{
	struct cuda_driver *c = cuda_of(d);
	if (!c->fn.CtxGetId)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!ctx) {
		CUresult r = c->fn.CtxGetCurrent(&ctx);
		if (r != CUDA_SUCCESS)
			return r;
		if (!ctx)
			return CUDA_ERROR_INVALID_CONTEXT;
	}
	return c->fn.CtxGetId(ctx, id);
}

static CUresult cuda_export_fd(vpmm_driver *d, CUmemGenericAllocationHandle h,
			       int *fd)
{
	struct cuda_driver *c = cuda_of(d);
	if (!fd)
		return CUDA_ERROR_INVALID_VALUE;
	int out = -1;
	CUresult r = c->fn.MemExportToShareableHandle(
		&out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r == CUDA_SUCCESS)
		*fd = out;
	/* After the fallback, a refusal means a handle made without the
	 * shareable type (those made before still export). */
	else if (atomic_load_explicit(&c->no_shareable, memory_order_relaxed))
		r = CUDA_ERROR_NOT_SUPPORTED;
	return r;
}

static CUresult cuda_import_fd(vpmm_driver *d, int fd, CUmemGenericAllocationHandle *out)
{
	if (fd < 0 || !out)
		return CUDA_ERROR_INVALID_VALUE;
	struct cuda_driver *c = cuda_of(d);
	struct capture_guard g;
	relax_begin(c, &g);
	CUresult r = c->fn.MemImportFromShareableHandle(
		out, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	relax_end(c, &g);
	return r;
}

static void cuda_destroy(vpmm_driver *d)
{
	struct cuda_driver *c = cuda_of(d);
	if (!c)
		return;
	if (c->lib)
		dlclose(c->lib);
	free(c);
}

static void *dl_resolve(const char *name, void *lib)
{
	return dlsym(lib, name);
}

CUresult vpmm_driver_cuda_create(vpmm_cuda_resolver resolver, void *arg,
				 vpmm_driver **out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	struct cuda_driver *c = calloc(1, sizeof *c);
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!resolver) {
		c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
		if (!c->lib) {
			free(c);
			return CUDA_ERROR_NOT_FOUND;
		}
		resolver = dl_resolve;
		arg = c->lib;
	}
	for (size_t i = 0; i < sizeof cuda_syms / sizeof cuda_syms[0]; i++) {
		void *p = resolver(cuda_syms[i].name, arg);
		if (!p) {
			cuda_destroy(&c->base);
			return CUDA_ERROR_NOT_FOUND;
		}
		/* ISO C has no cast from object to function pointer; a byte
		 * copy is what dlsym's users do (the sizes are asserted). */
		memcpy((char *)&c->fn + cuda_syms[i].offset, &p, sizeof p);
	}
	for (size_t i = 0; i < sizeof cuda_optional / sizeof cuda_optional[0]; i++) {
		void *p = resolver(cuda_optional_names[i], arg);
		memcpy((char *)&c->fn + cuda_optional[i], &p, sizeof p);
	}
	atomic_init(&c->no_shareable, false);
	c->base = (vpmm_driver){
		.name = "cuda",
		.granularity = cuda_granularity,
		.va_reserve = cuda_va_reserve,
		.va_free = cuda_va_free,
		.mem_create = cuda_mem_create,
		.mem_release = cuda_mem_release,
		.map = cuda_map,
		.unmap = cuda_unmap,
		.set_access = cuda_set_access,
		.event_create = cuda_event_create,
		.event_record = cuda_event_record,
		.event_query = cuda_event_query,
		.event_sync = cuda_event_sync,
		.event_destroy = cuda_event_destroy,
		.stream_wait = cuda_stream_wait,
		.stream_capturing = cuda_stream_capturing,
		.mem_info = cuda_mem_info,
		.export_fd = cuda_export_fd,
		.import_fd = cuda_import_fd,
		.ctx_current = cuda_ctx_current,
		.ctx_bind = cuda_ctx_bind,
		.ctx_id = cuda_ctx_id,
		.destroy = cuda_destroy,
	};
	*out = &c->base;
	return CUDA_SUCCESS;
}
