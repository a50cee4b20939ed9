/* drv_prog.c — an unmodified driver-API program: interposition path 2 (dlopen
 * libcuda, dlsym "cuGetProcAddress_v2", everything through cuGetProcAddress,
 * as the static runtime, CuPy and PyTorch do), plain dlsym of entry points,
 * and direct calls to libcuda's exports (it is linked with the fake
 * libcuda.so.1). `drv_prog SCENARIO`; see shimtest.h. */
#include <pthread.h>

#include "shimtest.h"

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t,
			  CUdriverProcAddressQueryResult *);

#define P ((size_t)64 << 10)

void *scope_lookup_next(void); /* libshimscope.so */
/* drv_ends.c: contexts that end where the pool cannot settle first */
void primary_reset_sticky(void);
void destroy_refused(void);
void destroy_refused_primary(void);
void free_without_context(void);
#define PTSZ CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

static void *get(gpa_t gpa, const char *name, int version, cuuint64_t flags)
{
	void *p = NULL;
	CUdriverProcAddressQueryResult st;
	CHECK_EQ(gpa(name, &p, version, flags, &st), CUDA_SUCCESS);
	CHECK(p);
	return p;
}

#define GET(var, ...) ((var) = (__typeof__(var))(uintptr_t)get(__VA_ARGS__))
#define FN(p) ((void *)(uintptr_t)(p))

static void gpa_path(void)
{
	bool pool = expect_pool();
	const char *wrapped = pool ? "libvpmm" : "libcuda";
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	gpa_t gpa0, gpa;
	void *gpa_v1, *none = NULL;
	CUresult (*init)(unsigned);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*set_current)(CUcontext);
	CUresult (*get_current)(CUcontext *);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_alloc_v1)(unsigned int *, unsigned int);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*attr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*attrs)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
	CUdriverProcAddressQueryResult st;
	CUcontext ctx;
	CUdeviceptr p, q, a, base = 0, abase = 0;
	size_t size = 0, asize = 0, f, t, ff, ft;
	unsigned int p32, memtype = 0;

	CHECK(h);
	gpa0 = (gpa_t)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
	CHECK(fn_in(FN(gpa0), wrapped));
	GET(gpa, gpa0, "cuGetProcAddress", 12000, 0);
	CHECK(fn_in(FN(gpa), wrapped));
	gpa_v1 = get(gpa, "cuGetProcAddress", 11030, 0);
	CHECK(fn_in(gpa_v1, wrapped));
	CHECK(gpa_v1 != FN(gpa));

	GET(init, gpa, "cuInit", 12000, 0);
	GET(retain, gpa, "cuDevicePrimaryCtxRetain", 12000, 0);
	GET(set_current, gpa, "cuCtxSetCurrent", 12000, 0);
	GET(get_current, gpa, "cuCtxGetCurrent", 12000, PTSZ);
	GET(mem_alloc, gpa, "cuMemAlloc", 12000, 0);
	GET(mem_alloc_v1, gpa, "cuMemAlloc", 2000, 0);
	GET(mem_free, gpa, "cuMemFree", 12000, 0);
	GET(alloc_async, gpa, "cuMemAllocAsync", 12000, 0);
	GET(alloc_async_ptsz, gpa, "cuMemAllocAsync", 12000, PTSZ);
	GET(free_async, gpa, "cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	GET(free_async_ptsz, gpa, "cuMemFreeAsync", 12000, PTSZ);
	GET(mem_info, gpa, "cuMemGetInfo", 12000, 0);
	GET(range, gpa, "cuMemGetAddressRange", 12000, 0);
	GET(attr, gpa, "cuPointerGetAttribute", 12000, 0);
	GET(attrs, gpa, "cuPointerGetAttributes", 12000, 0);
	/* wrapped where they should be, untouched elsewhere */
	CHECK(fn_in(FN(init), "libcuda") && fn_in(FN(get_current), "libcuda"));
	CHECK(fn_in(FN(mem_alloc_v1), "libcuda"));
	CHECK(fn_in(FN(mem_alloc), wrapped) && fn_in(FN(mem_free), wrapped));
	CHECK(fn_in(FN(alloc_async), wrapped) && fn_in(FN(alloc_async_ptsz), wrapped));
	CHECK(FN(alloc_async) != FN(alloc_async_ptsz));
	CHECK(fn_in(FN(free_async), wrapped) && fn_in(FN(free_async_ptsz), wrapped));
	CHECK(FN(free_async) != FN(free_async_ptsz));
	CHECK(fn_in(FN(mem_info), wrapped) && fn_in(FN(range), wrapped));
	CHECK(fn_in(FN(attr), wrapped) && fn_in(FN(attrs), wrapped));
	CHECK_EQ(gpa("cuNoSuchEntryPoint", &none, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
	CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

	CHECK_EQ(init(0), 0);
	CHECK_EQ(retain(&ctx, 0), 0);
	CHECK_EQ(set_current(ctx), 0);
	controls_init();

	CHECK_EQ(mem_alloc(&p, 3 * P + 10), 0);
	touch((void *)(uintptr_t)p, 3 * P + 10, 11);
	if (pool) {
		CHECK_EQ(pool_stats(0).mallocs, 1);
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 0);
	}

	/* the allocation's range, not one mapping's */
	CHECK_EQ(range(&base, &size, p + P + 5), 0);
	CHECK_EQ(base, p);
	CHECK_EQ(size, pool ? 4 * P : 3 * P + 10);
	CHECK_EQ(attr(&abase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 2 * P), 0);
	CHECK_EQ(attr(&asize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 2 * P), 0);
	CHECK_EQ(abase, p);
	CHECK_EQ(asize, size);
	{
		CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
						CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
						CU_POINTER_ATTRIBUTE_RANGE_SIZE};
		void *data[3] = {&memtype, &abase, &asize};
		abase = 0;
		asize = 0;
		CHECK_EQ(attrs(3, which, data, p + 3 * P), 0);
		CHECK_EQ(memtype, CU_MEMORYTYPE_DEVICE);
		CHECK_EQ(abase, p);
		CHECK_EQ(asize, size);
	}
	if (pool) {
		CHECK_EQ(fake_calls("cuMemGetAddressRange_v2"), 0);
		CHECK_EQ(fake_calls("cuPointerGetAttribute"), 0);
		CHECK_EQ(fake_calls("cuPointerGetAttributes"), 1);
		/* other attributes pass through */
		CHECK_EQ(attr(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), 0);
		CHECK_EQ(fake_calls("cuPointerGetAttribute"), 1);

		/* Pool memory with no allocation there, freed or never handed
		 * out (a slab's other blocks): no range, as for a pointer the
		 * driver does not know, not the pool's mapping. */
		CUdeviceptr gone, block;
		CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
						CU_POINTER_ATTRIBUTE_RANGE_SIZE};
		void *data[2] = {&abase, &asize};
		CHECK_EQ(mem_alloc(&block, 1000), 0);
		CHECK_EQ(mem_alloc(&gone, 2 * P), 0);
		CHECK_EQ(mem_free(gone), 0);
		for (int i = 0; i < 3; i++) {
			CUdeviceptr at = i == 0 ? gone : i == 1 ? gone + P : block + 1024;
			base = 1;
			size = 1;
			CHECK_EQ(range(&base, &size, at), CUDA_ERROR_NOT_FOUND);
			CHECK(base == 1 && size == 1);
			CHECK_EQ(attr(&abase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at),
				 CUDA_ERROR_INVALID_VALUE);
			CHECK_EQ(attr(&asize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at),
				 CUDA_ERROR_INVALID_VALUE);
			abase = 1;
			asize = 1;
			CHECK_EQ(attrs(2, which, data, at), 0);
			CHECK(abase == 0 && asize == 0);
		}
		CHECK_EQ(range(&base, &size, block + 10), 0);
		CHECK(base == block && size >= 1000);
		CHECK_EQ(mem_free(block), 0);
		CHECK_EQ(fake_calls("cuMemGetAddressRange_v2"), 0);
		CHECK_EQ(fake_calls("cuPointerGetAttribute"), 1);
	}

	/* an old version's entry point passes through untouched */
	CHECK_EQ(mem_alloc_v1(&p32, 1000), 0);
	CHECK_EQ(fake_calls("cuMemAlloc"), 1);

	/* no context: the driver's own answer */
	CHECK_EQ(set_current(NULL), 0);
	CHECK_EQ(mem_alloc(&q, P), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_EQ(set_current(ctx), 0);
	/* size 0 and NULL: the driver's own answers */
	CHECK_EQ(mem_alloc(&q, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(mem_free(0), 0);
	CHECK_EQ(mem_free(p), 0);

	CHECK_EQ(alloc_async_ptsz(&a, P, NULL), 0);
	CHECK_EQ(free_async_ptsz(a, NULL), 0);
	CHECK_EQ(alloc_async(&a, P, NULL), 0);
	touch((void *)(uintptr_t)a, P, 12);
	CHECK_EQ(free_async(a, NULL), 0);

	CHECK_EQ(mem_info(&f, &t), 0);
	st_fake_mem_info(&ff, &ft);
	if (pool) {
		struct vpmm_stats s = pool_stats(0);
		CHECK_EQ(s.mallocs, 5); /* 3, and the 2 of the no-range checks */
		CHECK_EQ(s.frees, 5);
		CHECK_EQ(f, ff + s.reusable);
		CHECK_EQ(fake_calls("cuMemAllocAsync") + fake_calls("cuMemAllocAsync_ptsz"), 0);
		CHECK_EQ(fake_calls("cuMemFreeAsync") + fake_calls("cuMemFreeAsync_ptsz"), 0);
		CHECK_EQ(hook_calls("cuMemAllocAsync_ptsz"), 1);
		CHECK_EQ(hook_calls("cuMemFreeAsync_ptsz"), 1);
		CHECK_EQ(hook_calls("cuMemAllocAsync"), 1);
		CHECK_EQ(hook_calls("cuMemFreeAsync"), 1);
		CHECK_EQ(hook_calls("cuMemGetInfo_v2"), 1);
		CHECK(hook_calls("proc_wrapped") >= 12);
		CHECK_EQ(hook_calls("dlsym_wrapped"), 1);
	} else {
		CHECK_EQ(f, ff);
		CHECK_EQ(fake_calls("cuMemAllocAsync_ptsz"), 1);
		CHECK_EQ(fake_calls("cuMemFreeAsync_ptsz"), 1);
	}
}

static void dlsym_path(void)
{
	bool pool = expect_pool();
	const char *wrapped = pool ? "libvpmm" : "libcuda";
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	CHECK(h);
	controls_init();
	/* Preloaded but disabled, RTLD_DEFAULT finds our export first; it
	 * passes calls through. */
	CHECK(fn_in(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), wrapped) ||
	      (!pool && fn_in(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "libvpmm")));
	CHECK(fn_in(dlsym(h, "cuMemFree_v2"), wrapped));
	CHECK(fn_in(dlsym(h, "cuMemAllocAsync_ptsz"), wrapped));
	CHECK(fn_in(dlsym(h, "cuGetProcAddress"), wrapped));
	CHECK(fn_in(dlsym(h, "cuCtxGetCurrent"), "libcuda"));
	CHECK(fn_in(dlsym(h, "cuMemAlloc"), "libcuda")); /* v1 */
	dlerror();
	CHECK(dlsym(h, "no_such_symbol") == NULL);
	CHECK(dlerror() != NULL);

	/* Lookups relative to the caller keep their meaning: RTLD_NEXT from
	 * the program is the object after the program, and from a library
	 * the object after that library. */
	CHECK(dlsym(RTLD_NEXT, "dlsym") == dlsym(RTLD_DEFAULT, "dlsym"));
	CHECK(fn_in(scope_lookup_next(), "libshimscopedep"));
	if (pool)
		CHECK_EQ(hook_calls("dlsym_wrapped"), 4);
}

/* Calls straight to libcuda's exports, as a program linked with -lcuda. */
static void linked(void)
{
	CUcontext ctx;
	CUdeviceptr p;
	void *fn = NULL;
	CUdriverProcAddressQueryResult st;

	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(ctx), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc_v2(&p, 2 * P), 0);
	touch((void *)(uintptr_t)p, 2 * P, 13);

	CHECK_EQ(cuMemFree_v2(p), 0);
	CHECK_EQ(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &st), 0);
	if (expect_pool()) {
		CHECK_EQ(pool_stats(0).mallocs, 1);
		CHECK_EQ(pool_stats(0).frees, 1);
		CHECK_EQ(hook_calls("cuMemAlloc_v2"), 1);
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 0);
		CHECK(fn_in(fn, "libvpmm"));
		if (getenv("SHIMTEST_PAGE")) { /* VPMM_PAGE_SIZE reached the pool */
			size_t page = strtoull(getenv("SHIMTEST_PAGE"), NULL, 0), size = 0;
			CHECK_EQ(pool_stats(0).page_size, page);
			CHECK_EQ(cuMemAlloc_v2(&p, page + 1), 0);
			CHECK_EQ(cuMemGetAddressRange_v2(NULL, &size, p), 0);
			/* Rounded to the pool's grain: 64 KiB, or the page if smaller. */
			size_t grain = page < 65536 ? page : 65536;
			CHECK_EQ(size, (page + 1 + grain - 1) / grain * grain);
			CHECK_EQ(cuMemFree_v2(p), 0);
		}
	} else {
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 1);
		CHECK(fn_in(fn, "libcuda"));
	}
}

/* The program's own handles (cuMemCreate, however reached) pass through to
 * libcuda, and the shim says once that the pool does not serve them. */
static void own(void)
{
	bool pool = expect_pool();
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			   unsigned long long);
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc access = {.location = prop.location,
				  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle mine[2], none;
	CUdriverProcAddressQueryResult st;
	CUcontext ctx;
	CUdeviceptr p, va;
	void *fn = NULL;
	size_t g = 0;

	CHECK(h);
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(ctx), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc_v2(&p, P), 0);
	CHECK_EQ(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), 0);
	CHECK(g > 0);
	CHECK_EQ(cuGetProcAddress_v2("cuMemCreate", &fn, 12000, 0, &st), 0);
	CHECK(fn_in(fn, pool ? "libvpmm" : "libcuda"));
	create = (__typeof__(create))(uintptr_t)dlsym(h, "cuMemCreate");
	CHECK(fn_in(FN(create), pool ? "libvpmm" : "libcuda"));

	/* the driver's own error, and no handle: nothing to say yet */
	CHECK_EQ(create(&none, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(create(&none, g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(cuMemCreate(&mine[0], 2 * g, &prop, 0), 0);
	CHECK_EQ(create(&mine[1], g, &prop, 0), 0);
	CHECK_EQ(cuMemAddressReserve(&va, 3 * g, 0, 0, 0), 0);
	CHECK_EQ(cuMemMap(va, 2 * g, 0, mine[0], 0), 0);
	CHECK_EQ(cuMemMap(va + 2 * g, g, 0, mine[1], 0), 0);
	CHECK_EQ(cuMemSetAccess(va, 3 * g, &access, 1), 0);
	touch((void *)(uintptr_t)va, 3 * g, 14);
	CHECK_EQ(cuMemUnmap(va, 3 * g), 0);
	CHECK_EQ(cuMemRelease(mine[0]), 0);
	CHECK_EQ(cuMemRelease(mine[1]), 0);
	CHECK_EQ(cuMemAddressFree(va, 3 * g), 0);

	touch((void *)(uintptr_t)p, P, 15);
	CHECK_EQ(cuMemFree_v2(p), 0);
	if (pool) {
		struct vpmm_stats s = pool_stats(0);
		CHECK_EQ(hook_calls("cuMemCreate"), 4);
		CHECK_EQ(s.mallocs, 1);
		CHECK_EQ(fake_calls("cuMemCreate"), 4 + s.handles_created);
	} else {
		CHECK_EQ(fake_calls("cuMemCreate"), 4);
	}
}

/* A stream with a free pending on it, destroyed from a thread that has no
 * current context (cuStreamDestroy needs none): its last event is recorded
 * in the pool's context, and the memory it freed serves later requests of
 * every kind. Before, the record failed and every later allocation on the
 * device failed with CUDA_ERROR_INVALID_CONTEXT (review). */
static CUstream doomed;
static CUresult destroyed = CUDA_ERROR_UNKNOWN;

static void *destroy_doomed(void *arg)
{
	CUcontext none = (CUcontext)1;
	(void)arg;
	CHECK_EQ(cuCtxGetCurrent(&none), 0);
	CHECK(none == NULL);
	destroyed = cuStreamDestroy(doomed);
	return NULL;
}

static void destroy_elsewhere(void)
{
	CUcontext ctx;
	CUdeviceptr p, q, x[4];
	pthread_t t;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(ctx), 0);
	controls_init();
	CHECK_EQ(cuStreamCreate(&doomed, 0), 0);
	CHECK_EQ(cuMemAllocAsync(&p, 4 * P, doomed), 0);
	CHECK_EQ(cuMemFreeAsync(p, doomed), 0);
	CHECK_EQ(pthread_create(&t, NULL, destroy_doomed, NULL), 0);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(destroyed, 0);
	CHECK_EQ(cuCtxSynchronize(), 0);
	const size_t sizes[4] = {P, 4 * P, 16 * P, 64 * P};
	for (int i = 0; i < 4; i++)
		CHECK_EQ(cuMemAlloc(&x[i], sizes[i]), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(cuMemFree(x[i]), 0);
	CUstream s2;
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	CHECK_EQ(cuMemAllocAsync(&q, 4 * P, s2), 0);
	CHECK_EQ(cuMemFreeAsync(q, s2), 0);
	CHECK_EQ(cuStreamDestroy(s2), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* ---- contexts that come and go (review) ------------------------------------- */


/* Device 1's memory freed on a stream of device 0 (the stream-ordered
 * allocator allows it). The pool of device 1 records that free's event in
 * device 0's context; once it completed, that event must not be recorded
 * on device 1's streams, which the driver refuses. */
static void cross_stream(void)
{
	CUcontext c0, c1;
	CUstream s0, s1;
	CUdeviceptr p, q;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	CHECK_EQ(cuStreamCreate(&s1, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAllocAsync(&p, 4 * P, s1), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuMemFreeAsync(p, s0), 0);
	CHECK_EQ(cuStreamSynchronize(s0), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&q, 4 * P, s1), 0);
		touch((void *)(uintptr_t)q, 4 * P, (unsigned char)i);
		CHECK_EQ(cuMemFreeAsync(q, s1), 0);
		CHECK_EQ(cuStreamSynchronize(s1), 0);
	}
	if (expect_pool())
		CHECK_EQ(pool_stats(1).failures, 0);
}

/* Device 1's memory freed on the legacy default stream while device 0 is
 * current: that is device 0's default stream, not device 1's, so the free
 * is not ordered before device 1's default-stream work. Device 1 must not
 * reuse it in place before device 0's stream reached the free, and the
 * events of device 0's context must not reach device 1's streams. */
static void cross_default_stream(void)
{
	CUcontext c0, c1;
	CUstream s1;
	CUevent ev;
	CUdeviceptr p, q;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	CHECK_EQ(cuStreamCreate(&s1, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAllocAsync(&p, 4 * P, NULL), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuEventCreate(&ev, 0), 0);
	CHECK_EQ(cuEventRecord(ev, NULL), 0); /* device 0's work, still queued */
	CHECK_EQ(cuMemFreeAsync(p, NULL), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	CHECK_EQ(cuMemAllocAsync(&q, 4 * P, NULL), 0);
	if (q == p) /* reused at once: only once device 0's stream got there */
		CHECK_EQ(cuEventQuery(ev), 0);
	CHECK_EQ(cuMemFreeAsync(q, NULL), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&q, 4 * P, s1), 0);
		CHECK_EQ(cuMemFreeAsync(q, s1), 0);
		CHECK_EQ(cuStreamSynchronize(s1), 0);
		CHECK_EQ(cuMemAllocAsync(&q, 2 * P, NULL), 0);
		CHECK_EQ(cuMemFreeAsync(q, NULL), 0);
		CHECK_EQ(cuStreamSynchronize(NULL), 0);
	}
	if (expect_pool())
		CHECK_EQ(pool_stats(1).failures, 0);
}

/* n allocations of 4 pages on s, each freed on s at once, and s
 * synchronised after each when `sync`: the pool goes on serving a stream
 * after whatever the scenario did to its context. */
static void churn(CUstream s, int n, bool sync)
{
	CUdeviceptr q;
	for (int i = 0; i < n; i++) {
		CHECK_EQ(cuMemAllocAsync(&q, 4 * P, s), 0);
		CHECK_EQ(cuMemFreeAsync(q, s), 0);
		if (sync)
			CHECK_EQ(cuStreamSynchronize(s), 0);
	}
}

/* Stream-ordered work in a context the program made itself, on a device
 * whose pool lives in the primary context: events made for the one
 * context's streams must not end up recorded on the other's. */
static void user_context(void)
{
	CUcontext c0, uc, popped;
	CUstream s0, us;
	CUdeviceptr p;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc(&p, P), 0); /* the pool, in the primary context */
	CHECK_EQ(cuMemFree(p), 0);
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0); /* pushed */
	CHECK_EQ(cuStreamCreate(&us, 0), 0);
	churn(us, 4, true);
	CHECK_EQ(cuCtxPopCurrent(&popped), 0);
	CHECK(popped == uc);
	churn(s0, 8, true);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* The pool made in a context the program created and then destroyed: the
 * device goes on in its primary context, and a synchronous free must still
 * synchronise the device's work, as cuMemFree does. */
static void context_destroyed(void)
{
	CUcontext c0, uc;
	CUstream s;
	CUevent ev;
	CUdeviceptr p, b;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc(&p, P), 0); /* the pool, in uc */
	CHECK_EQ(cuMemFree(p), 0);
	CHECK_EQ(cuCtxDestroy(uc), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	churn(s, 4, false);
	CHECK_EQ(cuMemAlloc(&b, 2 * P), 0);
	CHECK_EQ(cuEventCreate(&ev, 0), 0);
	CHECK_EQ(cuEventRecord(ev, s), 0); /* work still queued on s */
	CHECK_EQ(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
	long long fences = hook_calls("fence_free");
	CHECK_EQ(cuMemFree(b), 0);
	const char *mode = getenv("VPMM_SYNC_FREE");
	if (expect_pool() && mode && !strcmp(mode, "device")) /* the fake's cuMemFree does not sync */
		CHECK_EQ(cuEventQuery(ev), 0);
	else if (expect_pool()) /* fenced in the primary context: no failure */
		CHECK_EQ(hook_calls("fence_free"), fences + 1);
	CHECK_EQ(cuMemAlloc(&b, 8 * P), 0);
	CHECK_EQ(cuMemFree(b), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* The program's last release of the primary context ends it (its streams
 * and events with it) while the pool lives in it; the program retains it
 * again and goes on. */
static void primary_released(void)
{
	CUcontext c0, again;
	CUstream s, s2;
	CUdeviceptr a, x;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	controls_init();
	churn(s, 4, false);
	CHECK_EQ(cuStreamSynchronize(s), 0);
	CHECK_EQ(cuMemAllocAsync(&a, 2 * P, s), 0);
	CHECK_EQ(cuMemFreeAsync(a, s), 0);
	CHECK_EQ(cuCtxSetCurrent(NULL), 0);
	CHECK_EQ(cuDevicePrimaryCtxRelease(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&again, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(again), 0);
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	churn(s2, 8, true);
	CHECK_EQ(cuMemAlloc(&x, 6 * P), 0);
	CHECK_EQ(cuMemFree(x), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* cudaDeviceReset's driver call with pool memory and pool events about:
 * the context's events and streams die with it, the pool's memory does not
 * (cuMemCreate memory outlives contexts), and the device goes on. */
static void primary_reset(void)
{
	CUcontext c0, again;
	CUstream s, s2;
	CUdeviceptr a, x;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	controls_init();
	churn(s, 4, false);
	CHECK_EQ(cuMemAllocAsync(&a, 2 * P, s), 0);
	CHECK_EQ(cuMemFreeAsync(a, s), 0); /* pending on s at the reset */
	CHECK_EQ(cuDevicePrimaryCtxReset(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&again, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(again), 0);
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&x, 4 * P, s2), 0);
		touch((void *)(uintptr_t)x, 4 * P, (unsigned char)i);
		CHECK_EQ(cuMemFreeAsync(x, s2), 0);
		CHECK_EQ(cuStreamSynchronize(s2), 0);
	}
	CHECK_EQ(cuMemAlloc(&x, 6 * P), 0);
	CHECK_EQ(cuMemFree(x), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* A stream of device 1 destroyed while device 0 is current (cuStreamDestroy
 * takes any stream): its last event must be recorded in its own context,
 * else the frees pending on it never settle. */
static void destroy_other_device(void)
{
	CUcontext c0, c1;
	CUstream s1, t1;
	CUdeviceptr p, q;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	CHECK_EQ(cuStreamCreate(&s1, 0), 0);
	CHECK_EQ(cuStreamCreate(&t1, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAllocAsync(&p, 8 * P, s1), 0);
	CHECK_EQ(cuMemFreeAsync(p, s1), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamDestroy(s1), 0);
	CHECK_EQ(cuCtxSetCurrent(c1), 0);
	CHECK_EQ(cuCtxSynchronize(), 0);
	uint64_t mapped = pool_stats(1).mapped;
	CHECK_EQ(cuMemAllocAsync(&q, 8 * P, t1), 0); /* the memory s1 freed */
	CHECK_EQ(cuMemFreeAsync(q, t1), 0);
	if (expect_pool()) {
		CHECK_EQ(pool_stats(1).mapped, mapped);
		CHECK_EQ(pool_stats(1).failures, 0);
	}
}

/* ---- review 2: the default stream of a context the program made ----------- */

/* The default stream names the current context's own: with a context the
 * program made current, it is that context's stream, not the one of the
 * primary context the pool lives in. Events made there must not reach the
 * pool's streams, and a free there must not be reused in place by the
 * primary context's default stream before the user context got there. */
static void user_context_default(void)
{
	CUcontext c0, uc, popped;
	CUstream s0;
	CUevent ev;
	CUdeviceptr p, q;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc(&p, P), 0); /* the pool, in the primary context */
	CHECK_EQ(cuMemFree(p), 0);
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0); /* pushed */
	churn(NULL, 4, true);
	CHECK_EQ(cuMemAllocAsync(&p, 4 * P, NULL), 0);
	CHECK_EQ(cuEventCreate(&ev, 0), 0);
	CHECK_EQ(cuEventRecord(ev, NULL), 0); /* the user context's work, queued */
	CHECK_EQ(cuMemFreeAsync(p, NULL), 0);
	CHECK_EQ(cuCtxPopCurrent(&popped), 0);
	CHECK(popped == uc);
	CHECK_EQ(cuMemAllocAsync(&q, 4 * P, NULL), 0);
	if (q == p) /* reused at once: only once the user context got there */
		CHECK_EQ(cuEventQuery(ev), 0);
	CHECK_EQ(cuMemFreeAsync(q, NULL), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&q, 4 * P, s0), 0);
		CHECK_EQ(cuMemFreeAsync(q, s0), 0);
		CHECK_EQ(cuStreamSynchronize(s0), 0);
		CHECK_EQ(cuMemAllocAsync(&q, 2 * P, NULL), 0);
		CHECK_EQ(cuMemFreeAsync(q, NULL), 0);
		CHECK_EQ(cuStreamSynchronize(NULL), 0);
	}
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

/* A program of its own contexts only: destroying its context must not make
 * the device's primary context for it (cuDevicePrimaryCtxGetState says
 * whether one is active; the runtime and PyTorch ask it). */
static void no_primary_made(void)
{
	CUcontext uc, uc2, popped;
	CUstream s, s2;
	CUdeviceptr p;
	unsigned flags;
	int active = -1;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAlloc(&p, P), 0);
	CHECK_EQ(cuMemFree(p), 0);
	CHECK_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), 0);
	CHECK_EQ(active, 0);
	CHECK_EQ(cuCtxDestroy(uc), 0);
	CHECK_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), 0);
	CHECK_EQ(active, 0);
	/* The pool goes on in the program's next context. */
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s, 0), 0);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(cuMemAllocAsync(&p, 4 * P, s), 0);
		CHECK_EQ(cuMemFreeAsync(p, s), 0);
		CHECK_EQ(cuMemAllocAsync(&p, 2 * P, NULL), 0);
		CHECK_EQ(cuMemFreeAsync(p, NULL), 0);
	}
	/* ... and a context made after it is another one's (foreign_stream). */
	CHECK_EQ(cuCtxCreate_v2(&uc2, 0, 0), 0);
	CHECK_EQ(cuStreamCreate(&s2, 0), 0);
	churn(s2, 4, false);
	CHECK_EQ(cuCtxPopCurrent(&popped), 0);
	CHECK(popped == uc2);
	churn(s, 8, true);
	CHECK_EQ(cuMemAlloc(&p, 8 * P), 0);
	CHECK_EQ(cuMemFree(p), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
	CHECK_EQ(cuDevicePrimaryCtxReset(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), 0);
	CHECK_EQ(active, 0);
}

/* Run with VPMM_LIMIT: an allocation on a stream of a context the program
 * made (served as synchronous) that needs the memory the pool's own stream
 * freed: the pool records the covering event on its own stream, so the
 * event must be made in the pool's context, not the caller's. */
static void user_context_waits(void)
{
	CUcontext c0, uc, popped;
	CUstream s0, us;
	CUdeviceptr p, q;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c0), 0);
	CHECK_EQ(cuStreamCreate(&s0, 0), 0);
	controls_init();
	CHECK_EQ(cuMemAllocAsync(&p, 8 * P, s0), 0); /* all VPMM_LIMIT allows */
	CHECK_EQ(cuMemFreeAsync(p, s0), 0);          /* pending on s0 */
	CHECK_EQ(cuCtxCreate_v2(&uc, 0, 0), 0);     /* pushed */
	CHECK_EQ(cuStreamCreate(&us, 0), 0);
	CHECK_EQ(cuMemAllocAsync(&q, 8 * P, us), 0);
	CHECK_EQ(cuMemFreeAsync(q, us), 0);
	CHECK_EQ(cuCtxPopCurrent(&popped), 0);
	churn(s0, 8, false);
	CHECK_EQ(cuStreamSynchronize(s0), 0);
	if (expect_pool())
		CHECK_EQ(pool_stats(0).failures, 0);
}

int main(int argc, char **argv)
{
	static const struct scenario scenarios[] = {
		{"gpa", gpa_path},
		{"dlsym", dlsym_path},
		{"linked", linked},
		{"own", own},
		{"destroy_elsewhere", destroy_elsewhere},
		{"cross_stream", cross_stream},
		{"destroy_other_device", destroy_other_device},
		{"cross_default_stream", cross_default_stream},
		{"user_context", user_context},
		{"context_destroyed", context_destroyed},
		{"primary_reset", primary_reset},
		{"primary_reset_sticky", primary_reset_sticky},
		{"primary_released", primary_released},
		{"user_context_default", user_context_default},
		{"no_primary_made", no_primary_made},
		{"free_without_context", free_without_context},
		{"destroy_refused", destroy_refused},
		{"destroy_refused_primary", destroy_refused_primary},
		{"user_context_waits", user_context_waits},
	};
	return run_scenario(argc, argv, scenarios, sizeof scenarios / sizeof scenarios[0]);
}
