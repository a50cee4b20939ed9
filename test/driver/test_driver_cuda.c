/* test_driver_cuda.c — the cuda driver's wiring, without a GPU: a resolver
 * hands it fake entry points that record how they are called. */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

#define OK(expr) cr_assert_eq((expr), CUDA_SUCCESS, "%s", #expr)

/* What the fakes saw. Criterion runs each test in its own process, so file
 * state does not leak between tests. */
static struct {
	CUstreamCaptureMode mode;          /* this thread's capture mode */
	unsigned exchanges;
	CUstreamCaptureMode mode_in_call;  /* seen by the last VMM fake */
	CUdeviceptr va;
	size_t size, offset;
	CUmemGenericAllocationHandle handle;
	unsigned long long flags;
	CUmemAllocationProp prop;
	CUmemAllocationGranularity_flags gran_option;
	unsigned mem_creates;
	bool refuse_shareable;
	CUmemAccessDesc access[4];
	size_t naccess;
	unsigned event_flags;
	CUstream stream;
	CUcontext ctx;
	CUevent event;
	const char *last;
	const char *missing; /* the resolver's answer for this name is NULL */
	char asked[64][48];
	int nasked;
} fk = { .mode = CU_STREAM_CAPTURE_MODE_GLOBAL };

#define FAKE_HANDLE 0x4242ULL
#define FAKE_EVENT ((CUevent)(uintptr_t)0xe7e7)

static CUresult f_DeviceGet(CUdevice *dev, int ordinal)
{
	*dev = ordinal + 100; /* shows whether location.id went through here */
	return CUDA_SUCCESS;
}
static CUresult f_CtxGetDevice(CUdevice *dev)
{
	*dev = 7;
	return CUDA_SUCCESS;
}
static CUresult f_MemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					      CUmemAllocationGranularity_flags option)
{
	fk.last = "cuMemGetAllocationGranularity";
	fk.prop = *prop;
	fk.gran_option = option;
	*g = 2 << 20;
	return CUDA_SUCCESS;
}
static CUresult f_MemAddressReserve(CUdeviceptr *va, size_t size, size_t align,
				    CUdeviceptr addr, unsigned long long flags)
{
	fk.last = "cuMemAddressReserve";
	fk.mode_in_call = fk.mode;
	fk.size = size;
	*va = 0x7000000000ULL;
	return CUDA_SUCCESS;
}
static CUresult f_MemAddressFree(CUdeviceptr va, size_t size)
{
	fk.last = "cuMemAddressFree";
	fk.mode_in_call = fk.mode;
	fk.va = va;
	fk.size = size;
	return CUDA_SUCCESS;
}
static CUresult f_MemCreate(CUmemGenericAllocationHandle *h, size_t size,
			    const CUmemAllocationProp *prop, unsigned long long flags)
{
	fk.last = "cuMemCreate";
	fk.mode_in_call = fk.mode;
	fk.mem_creates++;
	fk.prop = *prop;
	fk.size = size;
	if (fk.refuse_shareable && prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED;
	*h = FAKE_HANDLE;
	return CUDA_SUCCESS;
}
static CUresult f_MemRelease(CUmemGenericAllocationHandle h)
{
	fk.last = "cuMemRelease";
	fk.mode_in_call = fk.mode;
	fk.handle = h;
	return CUDA_SUCCESS;
}
static CUresult f_MemMap(CUdeviceptr va, size_t size, size_t offset,
			 CUmemGenericAllocationHandle h, unsigned long long flags)
{
	fk.last = "cuMemMap";
	fk.mode_in_call = fk.mode;
	fk.va = va;
	fk.size = size;
	fk.offset = offset;
	fk.handle = h;
	fk.flags = flags;
	return CUDA_SUCCESS;
}
static CUresult f_MemUnmap(CUdeviceptr va, size_t size)
{
	fk.last = "cuMemUnmap";
	fk.mode_in_call = fk.mode;
	fk.va = va;
	fk.size = size;
	return CUDA_ERROR_INVALID_VALUE; /* errors pass through unchanged */
}
static CUresult f_MemSetAccess(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc,
			       size_t count)
{
	fk.last = "cuMemSetAccess";
	fk.mode_in_call = fk.mode;
	fk.va = va;
	fk.size = size;
	fk.naccess = count;
	memcpy(fk.access, desc, (count < 4 ? count : 4) * sizeof *desc);
	return CUDA_SUCCESS;
}
static CUresult f_EventCreate(CUevent *ev, unsigned int flags)
{
	fk.last = "cuEventCreate";
	fk.event_flags = flags;
	*ev = FAKE_EVENT;
	return CUDA_SUCCESS;
}
static CUresult f_EventRecord(CUevent ev, CUstream s)
{
	fk.last = "cuEventRecord";
	fk.event = ev;
	fk.stream = s;
	return CUDA_SUCCESS;
}
static CUresult f_EventQuery(CUevent ev)
{
	fk.last = "cuEventQuery";
	fk.event = ev;
	return CUDA_ERROR_NOT_READY;
}
static CUresult f_EventSynchronize(CUevent ev)
{
	fk.last = "cuEventSynchronize";
	fk.event = ev;
	return CUDA_SUCCESS;
}
static CUresult f_EventDestroy(CUevent ev)
{
	fk.last = "cuEventDestroy_v2";
	fk.event = ev;
	return CUDA_SUCCESS;
}
static CUresult f_StreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
	fk.last = "cuStreamWaitEvent";
	fk.stream = s;
	fk.event = ev;
	fk.flags = flags;
	return CUDA_SUCCESS;
}
static CUresult f_StreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	fk.last = "cuStreamIsCapturing";
	fk.stream = s;
	*st = s == (CUstream)(uintptr_t)0x5 ? CU_STREAM_CAPTURE_STATUS_ACTIVE
					    : CU_STREAM_CAPTURE_STATUS_NONE;
	return CUDA_SUCCESS;
}
static CUresult f_MemGetInfo(size_t *fr, size_t *total)
{
	fk.last = "cuMemGetInfo_v2";
	*fr = 3;
	*total = 4;
	return CUDA_SUCCESS;
}
static CUresult f_MemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					     CUmemAllocationHandleType type,
					     unsigned long long flags)
{
	fk.last = "cuMemExportToShareableHandle";
	fk.handle = h;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fk.refuse_shareable)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)out = 99;
	return CUDA_SUCCESS;
}
static CUresult f_MemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					       CUmemAllocationHandleType type)
{
	fk.last = "cuMemImportFromShareableHandle";
	cr_assert_eq(fk.mode, CU_STREAM_CAPTURE_MODE_RELAXED, "import outside relaxed mode");
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || (int)(uintptr_t)os != 99)
		return CUDA_ERROR_INVALID_VALUE;
	*h = 0x1234;
	return CUDA_SUCCESS;
}
static CUresult f_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old = fk.mode;
	fk.mode = *mode;
	*mode = old;
	fk.exchanges++;
	return CUDA_SUCCESS;
}

static CUresult f_CtxGetCurrent(CUcontext *ctx)
{
	fk.last = "cuCtxGetCurrent";
	*ctx = (CUcontext)(uintptr_t)0xc7;
	return CUDA_SUCCESS;
}
static CUresult f_CtxSetCurrent(CUcontext ctx)
{
	fk.last = "cuCtxSetCurrent";
	fk.ctx = ctx;
	return CUDA_SUCCESS;
}

static CUresult f_CtxGetId(CUcontext ctx, unsigned long long *id)
{
	fk.last = "cuCtxGetId";
	fk.ctx = ctx;
	*id = 7;
	return CUDA_SUCCESS;
}

typedef void (*fake_fn)(void); /* the generic function pointer type */
#define FAKE(name, fn) { name, (fake_fn)fn }
static const struct {
	const char *name;
	fake_fn fn;
} fakes[] = {
	FAKE("cuDeviceGet", f_DeviceGet),
	FAKE("cuCtxGetDevice", f_CtxGetDevice),
	FAKE("cuMemGetAllocationGranularity", f_MemGetAllocationGranularity),
	FAKE("cuMemAddressReserve", f_MemAddressReserve),
	FAKE("cuMemAddressFree", f_MemAddressFree),
	FAKE("cuMemCreate", f_MemCreate),
	FAKE("cuMemRelease", f_MemRelease),
	FAKE("cuMemMap", f_MemMap),
	FAKE("cuMemUnmap", f_MemUnmap),
	FAKE("cuMemSetAccess", f_MemSetAccess),
	FAKE("cuEventCreate", f_EventCreate),
	FAKE("cuEventRecord", f_EventRecord),
	FAKE("cuEventQuery", f_EventQuery),
	FAKE("cuEventSynchronize", f_EventSynchronize),
	FAKE("cuEventDestroy_v2", f_EventDestroy),
	FAKE("cuStreamWaitEvent", f_StreamWaitEvent),
	FAKE("cuStreamIsCapturing", f_StreamIsCapturing),
	FAKE("cuMemGetInfo_v2", f_MemGetInfo),
	FAKE("cuMemExportToShareableHandle", f_MemExportToShareableHandle),
	FAKE("cuMemImportFromShareableHandle", f_MemImportFromShareableHandle),
	FAKE("cuThreadExchangeStreamCaptureMode", f_ThreadExchangeStreamCaptureMode),
	FAKE("cuCtxGetCurrent", f_CtxGetCurrent),
	FAKE("cuCtxSetCurrent", f_CtxSetCurrent),
	FAKE("cuCtxGetId", f_CtxGetId), /* optional: last */
};
#define NFAKES (sizeof fakes / sizeof fakes[0])
#define NREQUIRED (NFAKES - 1)

static void *resolver(const char *name, void *arg)
{
	cr_assert_eq(arg, &fk, "the resolver's argument is passed through");
	if (fk.nasked < 64)
		snprintf(fk.asked[fk.nasked++], sizeof fk.asked[0], "%s", name);
	if (fk.missing && strcmp(name, fk.missing) == 0)
		return NULL;
	for (size_t i = 0; i < NFAKES; i++)
		if (strcmp(name, fakes[i].name) == 0) {
			void *p;
			memcpy(&p, &fakes[i].fn, sizeof p);
			return p;
		}
	return NULL;
}

static vpmm_driver *make(void)
{
	vpmm_driver *d = NULL;
	OK(vpmm_driver_cuda_create(resolver, &fk, &d));
	cr_assert_not_null(d);
	return d;
}

/* A VMM call ran in relaxed capture mode and the thread's mode came back. */
static void assert_relaxed(const char *fn)
{
	cr_assert_str_eq(fk.last, fn);
	cr_assert_eq(fk.mode_in_call, CU_STREAM_CAPTURE_MODE_RELAXED, "%s", fn);
	cr_assert_eq(fk.mode, CU_STREAM_CAPTURE_MODE_GLOBAL, "%s left the mode changed", fn);
	fk.mode_in_call = CU_STREAM_CAPTURE_MODE_GLOBAL;
}

Test(driver, cuda_missing_symbol_fails)
{
	for (size_t i = 0; i < NREQUIRED; i++) {
		vpmm_driver *d = NULL;
		fk.missing = fakes[i].name;
		cr_assert_eq(vpmm_driver_cuda_create(resolver, &fk, &d), CUDA_ERROR_NOT_FOUND,
			     "created without %s", fk.missing);
		cr_assert_null(d);
	}
}

Test(driver, cuda_resolves_the_versioned_names)
{
	vpmm_driver *d = make();
	cr_assert_eq(fk.nasked, (int)NFAKES, "asked for %d names", fk.nasked);
	for (int i = 0; i < fk.nasked; i++) {
		cr_assert_null(strstr(fk.asked[i], "_ptsz"), "%s", fk.asked[i]);
		cr_assert_str_neq(fk.asked[i], "cuMemGetInfo");
		cr_assert_str_neq(fk.asked[i], "cuEventDestroy");
	}
	d->destroy(d);
}

Test(driver, cuda_calls_reach_the_entry_points)
{
	vpmm_driver *d = make();
	cr_assert_str_eq(d->name, "cuda");

	size_t g = 0;
	OK(d->granularity(d, 1, &g));
	cr_assert_eq(g, 2u << 20);
	cr_assert_eq(fk.prop.type, CU_MEM_ALLOCATION_TYPE_PINNED);
	cr_assert_eq(fk.prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
	cr_assert_eq(fk.prop.location.id, 101);
	cr_assert_eq(fk.gran_option, CU_MEM_ALLOC_GRANULARITY_MINIMUM);

	CUdeviceptr va = 0;
	OK(d->va_reserve(d, 1ULL << 40, &va));
	assert_relaxed("cuMemAddressReserve");
	cr_assert_eq(va, 0x7000000000ULL);
	cr_assert_eq(fk.size, 1ULL << 40);

	CUmemGenericAllocationHandle h = 0;
	OK(d->mem_create(d, 0, 4 << 20, &h));
	assert_relaxed("cuMemCreate");
	cr_assert_eq(h, FAKE_HANDLE);
	cr_assert_eq(fk.size, 4u << 20);
	cr_assert_eq(fk.prop.type, CU_MEM_ALLOCATION_TYPE_PINNED);
	cr_assert_eq(fk.prop.location.id, 100);
	cr_assert_eq(fk.prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	OK(d->mem_create(d, -1, 4 << 20, &h)); /* the current device */
	cr_assert_eq(fk.prop.location.id, 7);

	OK(d->map(d, 0x7000200000ULL, 4 << 20, h));
	assert_relaxed("cuMemMap");
	cr_assert_eq(fk.va, 0x7000200000ULL);
	cr_assert_eq(fk.size, 4u << 20);
	cr_assert_eq(fk.offset, 0);
	cr_assert_eq(fk.handle, FAKE_HANDLE);
	cr_assert_eq(fk.flags, 0);

	int devs[2] = { 0, 3 };
	OK(d->set_access(d, 0x7000200000ULL, 4 << 20, devs, 2));
	assert_relaxed("cuMemSetAccess");
	cr_assert_eq(fk.naccess, 2);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(fk.access[i].location.type, CU_MEM_LOCATION_TYPE_DEVICE);
		cr_assert_eq(fk.access[i].location.id, 100 + devs[i]);
		cr_assert_eq(fk.access[i].flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	}
	cr_assert_eq(d->set_access(d, 0x7000200000ULL, 4 << 20, devs, 0),
		     CUDA_ERROR_INVALID_VALUE);

	cr_assert_eq(d->unmap(d, 0x7000200000ULL, 4 << 20), CUDA_ERROR_INVALID_VALUE);
	assert_relaxed("cuMemUnmap");
	cr_assert_eq(fk.size, 4u << 20);

	OK(d->mem_release(d, h));
	assert_relaxed("cuMemRelease");
	OK(d->va_free(d, va, 1ULL << 40));
	assert_relaxed("cuMemAddressFree");
	cr_assert_eq(fk.va, va);

	CUevent ev = NULL;
	OK(d->event_create(d, &ev));
	cr_assert_eq(ev, FAKE_EVENT);
	cr_assert_eq(fk.event_flags, CU_EVENT_DISABLE_TIMING);
	CUstream s = (CUstream)(uintptr_t)0x5;
	OK(d->event_record(d, ev, s));
	cr_assert_str_eq(fk.last, "cuEventRecord");
	cr_assert_eq(fk.stream, s);
	cr_assert_eq(d->event_query(d, ev), CUDA_ERROR_NOT_READY);
	cr_assert_str_eq(fk.last, "cuEventQuery");
	OK(d->event_sync(d, ev));
	cr_assert_str_eq(fk.last, "cuEventSynchronize");
	fk.flags = 77;
	OK(d->stream_wait(d, CU_STREAM_PER_THREAD, ev));
	cr_assert_str_eq(fk.last, "cuStreamWaitEvent");
	cr_assert_eq(fk.stream, CU_STREAM_PER_THREAD);
	cr_assert_eq(fk.flags, 0);
	bool cap = false;
	OK(d->stream_capturing(d, s, &cap));
	cr_assert(cap);
	OK(d->stream_capturing(d, (CUstream)0, &cap));
	cr_assert_not(cap);
	OK(d->event_destroy(d, ev));
	cr_assert_str_eq(fk.last, "cuEventDestroy_v2");
	cr_assert_eq(fk.event, FAKE_EVENT);

	size_t fr = 0, total = 0;
	OK(d->mem_info(d, &fr, &total));
	cr_assert_eq(fr, 3);
	cr_assert_eq(total, 4);

	int fd = -1;
	OK(d->export_fd(d, h, &fd));
	cr_assert_eq(fd, 99);
	cr_assert_eq(fk.mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
	CUmemGenericAllocationHandle imp = 0;
	OK(d->import_fd(d, fd, &imp));
	cr_assert_str_eq(fk.last, "cuMemImportFromShareableHandle");
	cr_assert_eq(imp, 0x1234);
	cr_assert_eq(fk.mode, CU_STREAM_CAPTURE_MODE_GLOBAL, "capture mode not restored");
	cr_assert_eq(d->import_fd(d, -1, &imp), CUDA_ERROR_INVALID_VALUE);

	CUcontext ctx = NULL;
	OK(d->ctx_current(d, &ctx));
	cr_assert_str_eq(fk.last, "cuCtxGetCurrent");
	cr_assert_eq(ctx, (CUcontext)(uintptr_t)0xc7);
	OK(d->ctx_bind(d, ctx));
	cr_assert_str_eq(fk.last, "cuCtxSetCurrent");
	cr_assert_eq(fk.ctx, ctx);
	unsigned long long id = 0;
	fk.ctx = NULL;
	OK(d->ctx_id(d, NULL, &id)); /* NULL: the current context's */
	cr_assert_str_eq(fk.last, "cuCtxGetId");
	cr_assert_eq(fk.ctx, (CUcontext)(uintptr_t)0xc7);
	cr_assert_eq(id, 7);
	d->destroy(d);
}

/* A driver older than cuCtxGetId works; only the reset check is off. */
Test(driver, cuda_without_context_ids)
{
	vpmm_driver *d = NULL;
	fk.missing = "cuCtxGetId";
	OK(vpmm_driver_cuda_create(resolver, &fk, &d));
	unsigned long long id = 0;
	cr_assert_eq(d->ctx_id(d, NULL, &id), CUDA_ERROR_NOT_SUPPORTED);
	d->destroy(d);
	fk.missing = NULL;
}

Test(driver, cuda_falls_back_to_plain_handles)
{
	vpmm_driver *d = make();
	fk.refuse_shareable = true;
	CUmemGenericAllocationHandle h = 0;
	OK(d->mem_create(d, 0, 2 << 20, &h));
	cr_assert_eq(fk.mem_creates, 2);
	cr_assert_eq(fk.prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
	cr_assert_eq(fk.mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
	/* Remembered: the next handle is made plain at once. */
	OK(d->mem_create(d, 0, 2 << 20, &h));
	cr_assert_eq(fk.mem_creates, 3);
	int fd = -1;
	cr_assert_eq(d->export_fd(d, h, &fd), CUDA_ERROR_NOT_SUPPORTED);
	cr_assert_eq(fd, -1);
	d->destroy(d);
}

Test(driver, cuda_without_resolver_uses_libcuda)
{
	/* With libcuda present the driver loads; without it the error says so. */
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	vpmm_driver *d = NULL;
	CUresult r = vpmm_driver_cuda_create(NULL, NULL, &d);
	if (lib) {
		dlclose(lib);
		cr_assert_eq(r, CUDA_SUCCESS);
		cr_assert_not_null(d);
		d->destroy(d);
	} else {
		cr_assert_eq(r, CUDA_ERROR_NOT_FOUND);
		cr_assert_null(d);
	}
}
