/* query_prog.c — an unmodified program asking the driver about its memory
 * and about CUDA's memory pools, through cuGetProcAddress (as the runtime,
 * NCCL and PyTorch do) and the runtime's stream-ordered calls (linked with
 * the fake libcudart.so). `query_prog SCENARIO`; see shimtest.h.
 *
 * address: the range, the mapping, IPC capability and handle types of an
 *          allocation, the allocation handle refused, and a freed
 *          allocation answering as unknown memory;
 * mempool: the default pool's attributes and trimming, a pool of the
 *          program's own made current (its allocations CUDA's), and
 *          cudaMallocFromPoolAsync.
 * Every check holds with the shim and without it (plain allocations of the
 * fake driver): the shim's answers are what the driver gives memory it
 * made whole.
 */
#include "shimtest.h"

typedef int cudaError_t;
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, CUstream s);
cudaError_t cudaFreeAsync(void *p, CUstream s);
cudaError_t cudaDeviceSynchronize(void);

#define P ((size_t)64 << 10)
#define M ((size_t)1 << 20)

static struct {
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*attr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*attrs)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
	CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
	CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*default_pool)(CUmemoryPool *, CUdevice);
	CUresult (*set_pool)(CUdevice, CUmemoryPool);
	CUresult (*mem_set_pool)(CUmemLocation *, CUmemAllocationType, CUmemoryPool);
	CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*pool_destroy)(CUmemoryPool);
	CUresult (*get_attr)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*set_attr)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*trim)(CUmemoryPool, size_t);
} d;

#define GET(field, name, ver)                                                 \
	do {                                                                  \
		void *p_ = NULL;                                              \
		CUdriverProcAddressQueryResult st_;                           \
		CHECK_EQ(gpa(name, &p_, ver, 0, &st_), CUDA_SUCCESS);         \
		CHECK(p_);                                                    \
		d.field = (__typeof__(d.field))(uintptr_t)p_;                 \
	} while (0)

/* The runtime initialises (the primary context current), then every entry
 * point through cuGetProcAddress. */
static void setup(void)
{
	CUresult (*gpa0)(const char *, void **, int, cuuint64_t,
			 CUdriverProcAddressQueryResult *);
	CUresult (*gpa)(const char *, void **, int, cuuint64_t,
			CUdriverProcAddressQueryResult *);
	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CHECK(h);
	LOOKUP(gpa0, h, "cuGetProcAddress_v2");
	CHECK(gpa0);
	gpa = gpa0;
	GET(mem_alloc, "cuMemAlloc", 12000);
	GET(mem_free, "cuMemFree", 12000);
	GET(alloc_async, "cuMemAllocAsync", 12000);
	GET(free_async, "cuMemFreeAsync", 12000);
	GET(from_pool, "cuMemAllocFromPoolAsync", 12000);
	GET(range, "cuMemGetAddressRange", 12000);
	GET(attr, "cuPointerGetAttribute", 12000);
	GET(attrs, "cuPointerGetAttributes", 12000);
	GET(retain, "cuMemRetainAllocationHandle", 12000);
	GET(ipc_get, "cuIpcGetMemHandle", 12000);
	GET(default_pool, "cuDeviceGetDefaultMemPool", 12000);
	GET(set_pool, "cuDeviceSetMemPool", 12000);
	GET(mem_set_pool, "cuMemSetMemPool", 13000);
	GET(pool_create, "cuMemPoolCreate", 12000);
	GET(pool_destroy, "cuMemPoolDestroy", 12000);
	GET(get_attr, "cuMemPoolGetAttribute", 12000);
	GET(set_attr, "cuMemPoolSetAttribute", 12000);
	GET(trim, "cuMemPoolTrimTo", 12000);
}

/* ---- address ------------------------------------------------------------------------ */

/* Which part of a scenario runs: all of it, or the one named. */
static const char *part;
static bool runs(const char *name)
{
	return !part || !strcmp(part, name);
}

static void address(void)
{
	bool pool = expect_pool();
	const char *sock = getenv("VPMM_SOCKET");
	bool exportable = !pool || !sock || strcmp(sock, "off") != 0;
	CUdeviceptr a, b, base = 0, mbase = 0;
	size_t size = 0, msize = 0;
	int legacy = 0x7f7f7f7f, types = 0x7f7f7f7f;
	CUmemGenericAllocationHandle h = 0;

	setup();
	/* Two neighbours: with VPMM_PAGES the pool maps its first pages at
	 * start, and b lies on a handle that a's page begins. */
	CHECK_EQ(d.mem_alloc(&a, P), 0);
	CHECK_EQ(d.mem_alloc(&b, 3 * P), 0);
	if (pool) {
		int (*mapping_of)(CUdeviceptr, CUdeviceptr *, size_t *);
		LOOKUP(mapping_of, dlopen("libcuda.so.1", RTLD_NOW), "fakecuda_mapping_of");
		CHECK(mapping_of && mapping_of(b + P, &mbase, &msize));
		CHECK(mbase < b);
	}

	CHECK_EQ(d.range(&base, &size, b + P), 0);
	CHECK_EQ(base, b);
	CHECK_EQ(size, 3 * P);
	if (runs("mapping")) {
		/* the mapping: the allocation, not the handle under it */
		CHECK_EQ(d.attr(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, b + P), 0);
		CHECK_EQ(d.attr(&msize, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, b + P), 0);
		CHECK_EQ(mbase, b);
		CHECK_EQ(msize, 3 * P);
	}
	if (runs("ipc")) {
		/* legacy IPC exactly where cudaIpcGetMemHandle works */
		CHECK_EQ(d.attr(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b), 0);
		CHECK_EQ(legacy, exportable);
		CUipcMemHandle ih;
		if (pool)
			CHECK_EQ(d.ipc_get(&ih, b) == CUDA_SUCCESS, exportable);
	}
	if (runs("retain")) {
		/* no handle to retain, none to export */
		CHECK_EQ(d.attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, b), 0);
		CHECK_EQ(types, 0);
		CHECK_EQ(d.retain(&h, (void *)(uintptr_t)(b + P)), CUDA_ERROR_INVALID_VALUE);
		CHECK_EQ(d.retain(&h, (void *)(uintptr_t)a), CUDA_ERROR_INVALID_VALUE);
	}
	if (runs("mapping")) {
		CUpointer_attribute which[4] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
						CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
						CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
						CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES};
		void *data[4] = {&mbase, &msize, &legacy, &types};
		mbase = msize = 0;
		legacy = types = 0x7f7f7f7f;
		CHECK_EQ(d.attrs(4, which, data, b + 2 * P), 0);
		CHECK_EQ(mbase, b);
		CHECK_EQ(msize, 3 * P);
		CHECK_EQ(legacy, exportable);
		CHECK_EQ(types, 0);
	}

	/* Freed: unknown memory, not the pool's mapping that stays there. */
	CHECK_EQ(d.mem_free(b), 0);
	if (runs("freed")) {
		unsigned int memtype = 7;
		int ordinal = 7, mapped = 7;
		CUpointer_attribute which[6] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
						CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
						CU_POINTER_ATTRIBUTE_MAPPED,
						CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
						CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
						CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
		void *data[6] = {&memtype, &ordinal, &mapped, &mbase, &msize, &legacy};
		legacy = 7;
		CHECK_EQ(d.attrs(6, which, data, b + P), 0);
		CHECK_EQ(memtype, 0);
		CHECK_EQ(ordinal, -2);
		CHECK_EQ(mapped, 0);
		CHECK_EQ(mbase, 0);
		CHECK_EQ(msize, 0);
		CHECK_EQ(legacy, 0);
		CHECK_EQ(d.attr(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, b + P),
			 CUDA_ERROR_INVALID_VALUE);
		CHECK_EQ(d.attr(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, b),
			 CUDA_ERROR_INVALID_VALUE);
		CHECK_EQ(d.range(&base, &size, b), CUDA_ERROR_NOT_FOUND);
	}
	CHECK_EQ(d.mem_free(a), 0);
	printf("address ok\n");
}

/* ---- mempool ------------------------------------------------------------------------ */

static cuuint64_t pool_attr(CUmemoryPool p, CUmemPool_attribute a)
{
	cuuint64_t v = 0x7f7f7f7f;
	CHECK_EQ(d.get_attr(p, a, &v), 0);
	return v;
}

static void set_pool_attr(CUmemoryPool p, CUmemPool_attribute a, cuuint64_t v)
{
	CHECK_EQ(d.set_attr(p, a, &v), 0);
}

/* A stream-ordered allocation through the driver and one through the
 * runtime: CUDA's (cuda) or the pool's; freed again. */
static void both_served(bool cuda)
{
	CUdeviceptr p;
	void *q;
	long long fake0 = fake_calls("cuMemAllocAsync");
	unsigned long long served0 = pool_stats(0).mallocs;
	CHECK_EQ(d.alloc_async(&p, M, NULL), 0);
	CHECK_EQ(cudaMallocAsync(&q, M, NULL), 0);
	CHECK_EQ(fake_calls("cuMemAllocAsync") - fake0, cuda ? 2 : 0);
	CHECK_EQ(pool_stats(0).mallocs - served0, cuda ? 0 : 2);
	CHECK_EQ(cudaFreeAsync(q, NULL), 0);
	CHECK_EQ(d.free_async(p, NULL), 0);
	CHECK_EQ(cudaDeviceSynchronize(), 0);
}

static void mempool(void)
{
	bool pool = expect_pool();
	CUmemoryPool def, mine, other;
	CUdeviceptr p;
	CUmemPoolProps props;
	CUmemLocation dev0 = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};

	setup();
	CHECK_EQ(d.default_pool(&def, 0), 0);

	/* The default pool counts what cudaMallocAsync took. */
	CHECK_EQ(d.alloc_async(&p, M, NULL), 0);
	CHECK_EQ(fake_calls("cuMemAllocAsync"), pool ? 0 : 1);
	if (runs("attrs")) {
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), M);
		CHECK(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= M);
	}
	CHECK_EQ(d.free_async(p, NULL), 0);
	CHECK_EQ(cudaDeviceSynchronize(), 0);
	if (runs("attrs")) {
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH), M);
		set_pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);
	}
	/* trimmed to nothing: nothing reserved */
	if (runs("trim")) {
		CHECK_EQ(d.trim(def, 0), 0);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
		if (pool)
			CHECK_EQ(pool_stats(0).mapped, 0);
		CHECK(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= M);
		set_pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0);
	}

	/* The release threshold: the pool keeps every page unless told. */
	if (runs("threshold")) {
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
			 pool ? UINT64_MAX : 0);
		set_pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 4 * M);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 4 * M);
		set_pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
	}

	if (!runs("chosen"))
		goto from_pool;
	both_served(!pool);
	/* A pool of the program's own, current: CUDA's whole. */
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location = dev0;
	CHECK_EQ(d.pool_create(&mine, &props), 0);
	CHECK_EQ(d.set_pool(0, mine), 0);
	both_served(true);
	{
		void *q;
		CHECK_EQ(cudaMallocAsync(&q, M, NULL), 0);
		CHECK_EQ(pool_attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), M);
		CHECK_EQ(cudaFreeAsync(q, NULL), 0);
		CHECK_EQ(pool_attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	}
	/* The default current again: served by the pool again. */
	CHECK_EQ(d.set_pool(0, def), 0);
	both_served(!pool);
	/* The same through cuMemSetMemPool. */
	CHECK_EQ(d.mem_set_pool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, mine), 0);
	both_served(true);
	CHECK_EQ(d.mem_set_pool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, def), 0);
	both_served(!pool);
	/* Destroying the current pool makes the default current. */
	CHECK_EQ(d.pool_create(&other, &props), 0);
	CHECK_EQ(d.set_pool(0, other), 0);
	both_served(true);
	CHECK_EQ(d.pool_destroy(other), 0);
	both_served(!pool);
	CHECK_EQ(d.pool_destroy(mine), 0);
from_pool:
	/* cudaMallocFromPoolAsync names its pool: always CUDA's, and so is
	 * the free. */
	{
		unsigned long long served0 = pool_stats(0).mallocs, freed0 = pool_stats(0).frees;
		CHECK_EQ(d.from_pool(&p, M, def, NULL), 0);
		CHECK_EQ(fake_calls("cuMemAllocFromPoolAsync"), 1);
		CHECK_EQ(pool_stats(0).mallocs, served0);
		CHECK_EQ(d.free_async(p, NULL), 0);
		CHECK_EQ(pool_stats(0).frees, freed0);
		CHECK_EQ(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	}
	printf("mempool ok\n");
}

/* `query_prog address[:PART]` or `mempool[:PART]`: PART one of mapping,
 * ipc, retain, freed (address), attrs, trim, threshold, chosen (mempool);
 * the whole scenario without. */
int main(int argc, char **argv)
{
	char name[64];
	if (argc != 2 || strlen(argv[1]) >= sizeof name) {
		fprintf(stderr, "usage: %s address|mempool[:PART]\n", argv[0]);
		return 2;
	}
	strcpy(name, argv[1]);
	char *colon = strchr(name, ':');
	if (colon) {
		*colon = '\0';
		part = colon + 1;
	}
	if (!strcmp(name, "address"))
		address();
	else if (!strcmp(name, "mempool"))
		mempool();
	else {
		fprintf(stderr, "usage: %s address|mempool[:PART]\n", argv[0]);
		return 2;
	}
	return 0;
}
