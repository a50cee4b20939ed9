// address.cu — what the driver's queries and CUDA's memory pools answer
// about pool memory, on a real GPU (scripts/gpu-address.sh, part address of
// scripts/gpu-check.sh). Run without the shim it prints the driver's own
// answers (the baseline: what cudaMalloc and cudaMallocAsync memory says);
// with EXPECT_POOL=1 under LD_PRELOAD=libvpmm.so it requires the shim's:
//  - range, MAPPING_BASE_ADDR/MAPPING_SIZE: the allocation's base and size;
//  - IS_LEGACY_CUDA_IPC_CAPABLE true exactly when cudaIpcGetMemHandle works;
//  - ALLOWED_HANDLE_TYPES none, cuMemRetainAllocationHandle refused with
//    CUDA_ERROR_INVALID_VALUE;
//  - freed pool memory: cuPointerGetAttributes answers as the driver does
//    for reserved address space with nothing mapped;
//  - the default pool's used/reserved bytes count cudaMallocAsync memory,
//    their peaks reset, cudaMemPoolTrimTo releases;
//  - a pool the program made current serves cudaMallocAsync (its
//    MEMPOOL_HANDLE is that pool, in both runs), the default current again
//    is the shim's; cudaMallocFromPoolAsync is always CUDA's.
// Exit 0 and "PASS address" when every check held.
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define CU(call)                                                              \
	do {                                                                  \
		CUresult r_ = (call);                                         \
		if (r_ != CUDA_SUCCESS) {                                     \
			fprintf(stderr, "FAIL %s:%d: %s: CUresult %d\n", __FILE__, __LINE__, \
				#call, (int)r_);                              \
			exit(1);                                              \
		}                                                             \
	} while (0)

static const size_t MiB = 1 << 20;

static long long pool_mallocs()
{
	typedef unsigned long long (*fn_t)(const char *);
	fn_t f = (fn_t)dlsym(RTLD_DEFAULT, "vpmm_shim_hook_calls");
	return f ? (long long)f("pool_malloc") : -1;
}

static CUmemoryPool mempool_of(void *p)
{
	CUmemoryPool mp = (CUmemoryPool)(uintptr_t)0x1;
	CU(cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)p));
	return mp;
}

static uint64_t pool_attr(cudaMemPool_t p, cudaMemPoolAttr a)
{
	uint64_t v = 0;
	CK(cudaMemPoolGetAttribute(p, a, &v));
	return v;
}

struct answers {
	CUresult r;
	unsigned memtype;
	int ordinal, mapped, legacy;
	CUdeviceptr mbase;
	size_t msize;
	CUcontext ctx;
};

static answers ask(CUdeviceptr p)
{
	answers a;
	memset(&a, 0x5a, sizeof a);
	CUpointer_attribute w[7] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				    CU_POINTER_ATTRIBUTE_MAPPED, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
				    CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
				    CU_POINTER_ATTRIBUTE_CONTEXT};
	void *d[7] = {&a.memtype, &a.ordinal, &a.mapped, &a.legacy, &a.mbase, &a.msize, &a.ctx};
	a.legacy = a.mapped = 0; // booleans the driver may write narrower
	a.r = cuPointerGetAttributes(7, w, d, p);
	return a;
}

static void show(const char *what, const answers &a)
{
	printf("%-22s r=%d memtype=%u ordinal=%d mapped=%d legacy=%d mapping=%#llx+%zu ctx=%p\n", what,
	       (int)a.r, a.memtype, a.ordinal, a.mapped & 0xff, a.legacy & 0xff,
	       (unsigned long long)a.mbase, a.msize, (void *)a.ctx);
}

int main()
{
	const char *e = getenv("EXPECT_POOL");
	bool pool = e && *e == '1';
	char *a, *b;
	CK(cudaSetDevice(0));
	CK(cudaFree(0));

	// ---- one allocation's answers
	long long m0 = pool_mallocs();
	CK(cudaMalloc(&a, MiB));
	CK(cudaMalloc(&b, 3 * MiB));
	if (pool)
		REQUIRE(pool_mallocs() >= m0 + 2);
	CUdeviceptr base = 0, mbase = 0, in = (CUdeviceptr)b + MiB;
	size_t size = 0, msize = 0;
	CU(cuMemGetAddressRange(&base, &size, in));
	CU(cuPointerGetAttribute(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, in));
	CU(cuPointerGetAttribute(&msize, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, in));
	printf("range %#llx+%zu mapping %#llx+%zu (allocation %p+%zu)\n", (unsigned long long)base,
	       size, (unsigned long long)mbase, msize, (void *)b, 3 * MiB);
	REQUIRE(base == (CUdeviceptr)b && size >= 3 * MiB);
	if (pool)
		REQUIRE(mbase == base && msize == size);

	int legacy = 0;
	CU(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, (CUdeviceptr)b));
	cudaIpcMemHandle_t ih;
	cudaError_t ie = cudaIpcGetMemHandle(&ih, b);
	cudaGetLastError();
	printf("legacy IPC capable %d, cudaIpcGetMemHandle %d\n", legacy, (int)ie);
	REQUIRE((legacy != 0) == (ie == cudaSuccess));

	unsigned long long types = 0;
	CU(cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, (CUdeviceptr)b));
	CUmemGenericAllocationHandle h = 0;
	CUresult rr = cuMemRetainAllocationHandle(&h, b + MiB);
	printf("allowed handle types %#llx, cuMemRetainAllocationHandle %d\n", types, (int)rr);
	if (rr == CUDA_SUCCESS)
		CU(cuMemRelease(h));
	if (pool) {
		REQUIRE((types & 0xff) == 0);
		REQUIRE(rr == CUDA_ERROR_INVALID_VALUE);
	}
	int rdma = -1, ordinal = -1;
	unsigned long long buffer_id = 0;
	CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)b));
	cuPointerGetAttribute(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, (CUdeviceptr)b);
	cuPointerGetAttribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)b);
	printf("ordinal %d, gpudirect rdma %d, buffer id %llu, mempool %p\n", ordinal, rdma,
	       buffer_id, (void *)mempool_of(b));
	REQUIRE(ordinal == 0);
	if (pool)
		REQUIRE(mempool_of(b) == NULL);

	// ---- freed: as address space with nothing mapped
	CK(cudaFree(b));
	CUdeviceptr va = 0;
	CU(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
	answers none = ask(va + MiB), freed = ask(in);
	show("reserved, unmapped:", none);
	show("freed allocation:", freed);
	if (pool) {
		REQUIRE(freed.r == none.r && freed.memtype == none.memtype &&
			freed.ordinal == none.ordinal && (freed.mapped & 0xff) == (none.mapped & 0xff) &&
			(freed.legacy & 0xff) == (none.legacy & 0xff) && freed.mbase == none.mbase &&
			freed.msize == none.msize && freed.ctx == none.ctx);
		unsigned mt = 0;
		CUresult r1 = cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, in);
		CUresult r2 = cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + MiB);
		printf("memory type, single query: freed %d, unmapped %d\n", (int)r1, (int)r2);
		REQUIRE(r1 == r2);
	}
	CU(cuMemAddressFree(va, 4 * MiB));
	CK(cudaFree(a));

	// ---- the default pool, as PyTorch's cudaMallocAsync backend reads it
	cudaMemPool_t def;
	void *p, *q;
	CK(cudaDeviceGetDefaultMemPool(&def, 0));
	uint64_t keep = UINT64_MAX;
	CK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
	CK(cudaMallocAsync(&p, 64 * MiB, 0));
	CK(cudaStreamSynchronize(0));
	uint64_t used = pool_attr(def, cudaMemPoolAttrUsedMemCurrent),
		 reserved = pool_attr(def, cudaMemPoolAttrReservedMemCurrent);
	printf("default pool: used %llu reserved %llu, mempool of the allocation %p (default %p)\n",
	       (unsigned long long)used, (unsigned long long)reserved, (void *)mempool_of(p), (void *)def);
	REQUIRE(used >= 64 * MiB && reserved >= used);
	CK(cudaFreeAsync(p, 0));
	CK(cudaDeviceSynchronize());
	REQUIRE(pool_attr(def, cudaMemPoolAttrUsedMemCurrent) == 0);
	REQUIRE(pool_attr(def, cudaMemPoolAttrUsedMemHigh) >= 64 * MiB);
	uint64_t zero = 0;
	CK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero));
	REQUIRE(pool_attr(def, cudaMemPoolAttrUsedMemHigh) == 0);
	CK(cudaMemPoolTrimTo(def, 0));
	reserved = pool_attr(def, cudaMemPoolAttrReservedMemCurrent);
	printf("after trim: reserved %llu\n", (unsigned long long)reserved);
	REQUIRE(reserved < 64 * MiB);
	CK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReservedMemHigh, &zero));
	REQUIRE(pool_attr(def, cudaMemPoolAttrReservedMemHigh) == reserved);

	// ---- a pool of the program's own
	cudaMemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = cudaMemAllocationTypePinned;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = 0;
	cudaMemPool_t mine;
	CK(cudaMemPoolCreate(&mine, &props));
	CK(cudaDeviceSetMemPool(0, mine));
	m0 = pool_mallocs();
	CK(cudaMallocAsync(&p, 8 * MiB, 0));
	REQUIRE(mempool_of(p) == (CUmemoryPool)mine);
	REQUIRE(pool_mallocs() == m0);
	REQUIRE(pool_attr(mine, cudaMemPoolAttrUsedMemCurrent) >= 8 * MiB);
	CK(cudaMemsetAsync(p, 0x5a, 8 * MiB, 0));
	unsigned char back[16];
	CK(cudaMemcpyAsync(back, (char *)p + 8 * MiB - 16, 16, cudaMemcpyDeviceToHost, 0));
	CK(cudaStreamSynchronize(0));
	REQUIRE(back[0] == 0x5a && back[15] == 0x5a);
	CK(cudaFreeAsync(p, 0));
	CK(cudaDeviceSetMemPool(0, def));
	CK(cudaMallocAsync(&p, 8 * MiB, 0));
	printf("default current again: mempool %p, pool mallocs %lld -> %lld\n", (void *)mempool_of(p),
	       m0, pool_mallocs());
	if (pool)
		REQUIRE(mempool_of(p) == NULL && pool_mallocs() == m0 + 1);
	else
		REQUIRE(mempool_of(p) == (CUmemoryPool)def);
	CK(cudaMallocFromPoolAsync(&q, 8 * MiB, mine, 0));
	REQUIRE(mempool_of(q) == (CUmemoryPool)mine);
	CK(cudaFreeAsync(q, 0));
	CK(cudaFreeAsync(p, 0));
	CK(cudaDeviceSynchronize());
	CK(cudaMemPoolDestroy(mine));
	printf("PASS address\n");
	return 0;
}
