/* fakecuda_mem.c — the fake's memory: the VMM calls (on the host driver),
 * IPC handles (refused, as the real driver does for VMM memory), plain
 * allocations (host memory the fake tracks, so foreign pointers are
 * rejected), cuMemGetInfo, and the address-range queries, which answer one
 * mapping (one handle) for VMM memory as the real driver does.
 *
 * Owns: the lists of plain allocations and of mappings. Calls
 * fakecuda_pool.c (stream-ordered allocations charge their pool),
 * fakecuda_ctx.c, fakecuda.c and the host driver.
 */
#include "fakecuda.h"

#include <stdbool.h>
#include <stdlib.h>

struct plain {
	uintptr_t va;
	size_t size;
	struct fake_pool *pool; /* stream-ordered: the pool it came from */
	struct plain *next;
};

struct mapping {
	uintptr_t va;
	size_t size;
	CUmemGenericAllocationHandle h;
	struct mapping *next;
};

static size_t plain_bytes;
static struct plain *plains;
static struct mapping *mappings;

/* ---- virtual memory ----------------------------------------------------------------------- */

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags flags)
{
	(void)flags;
	NEED_INIT();
	return fake_drv->granularity(fake_drv, prop ? prop->location.id : 0, g);
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
			     CUdeviceptr addr, unsigned long long flags)
{
	(void)align;
	(void)addr;
	(void)flags;
	NEED_INIT();
	fake_note_context();
	return fake_drv->va_reserve(fake_drv, size, p);
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	NEED_INIT();
	return fake_drv->va_free(fake_drv, p, size);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	(void)flags;
	NEED_INIT();
	fake_ctx_other_work();
	fake_note_context();
	fake_count("cuMemCreate");
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	return fake_drv->mem_create(fake_drv, prop->location.id, size, h);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	NEED_INIT();
	fake_ctx_other_work();
	return fake_drv->mem_release(fake_drv, h);
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
		  CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct mapping *m;
	CUresult r;
	(void)flags;
	NEED_INIT();
	fake_ctx_other_work();
	fake_note_context();
	fake_count("cuMemMap");
	if (offset)
		return CUDA_ERROR_NOT_SUPPORTED;
	m = calloc(1, sizeof *m);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = fake_drv->map(fake_drv, p, size, h);
	if (r != CUDA_SUCCESS) {
		free(m);
		return r;
	}
	m->va = (uintptr_t)p;
	m->size = size;
	m->h = h;
	pthread_mutex_lock(&fake_lock);
	m->next = mappings;
	mappings = m;
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	CUresult r;
	NEED_INIT();
	fake_ctx_other_work();
	fake_note_context();
	r = fake_drv->unmap(fake_drv, p, size);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&fake_lock);
	for (struct mapping **m = &mappings; *m;) {
		if ((*m)->va >= (uintptr_t)p && (*m)->va < (uintptr_t)p + size) {
			struct mapping *dead = *m;
			*m = dead->next;
			free(dead);
		} else {
			m = &(*m)->next;
		}
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
			size_t n)
{
	int devs[MAX_DEV];
	NEED_INIT();
	fake_ctx_other_work();
	fake_note_context();
	if (!desc || !n || n > MAX_DEV)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++)
		devs[i] = desc[i].location.id;
	return fake_drv->set_access(fake_drv, p, size, devs, (int)n);
}

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
				      CUmemAllocationHandleType type,
				      unsigned long long flags)
{
	(void)type;
	(void)flags;
	NEED_INIT();
	return fake_drv->export_fd(fake_drv, h, (int *)out);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					CUmemAllocationHandleType type)
{
	NEED_INIT();
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	return fake_drv->import_fd(fake_drv, (int)(uintptr_t)os, h);
}
/* ---- IPC and peers ------------------------------------------------------------------------- */

/* The fake has no IPC of its own: like the real driver on VMM memory, it
 * refuses every pointer; a handle it did not make is invalid. What the
 * tests check is that the shim answers for pool memory and passes the rest
 * through. */

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

/* Test control: whether device `device` may access p (mapped memory). */
int fakecuda_accessible(CUdeviceptr p, int device)
{
	return fake_drv && vpmm_host_accessible(fake_drv, p, device);
}
/* ---- plain allocations ---------------------------------------------------------------------- */

static CUresult plain_alloc(CUdeviceptr *dptr, size_t size, struct fake_pool *pool)
{
	struct plain *pl;
	void *mem;
	CUresult r = fake_ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	if (size > fake_capacity - plain_bytes) {
		pthread_mutex_unlock(&fake_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&fake_lock);
	mem = aligned_alloc(256, (size + 255) / 256 * 256);
	pl = malloc(sizeof *pl);
	if (!mem || !pl) {
		free(mem);
		free(pl);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pl->va = (uintptr_t)mem;
	pl->size = size;
	pl->pool = pool;
	pthread_mutex_lock(&fake_lock);
	plain_bytes += size;
	if (pool)
		fake_pool_charge(pool, size, true);
	pl->next = plains;
	plains = pl;
	pthread_mutex_unlock(&fake_lock);
	*dptr = (CUdeviceptr)pl->va;
	return CUDA_SUCCESS;
}

static CUresult plain_free(CUdeviceptr dptr)
{
	CUresult r = fake_ctx_state();
	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&fake_lock);
	for (struct plain **p = &plains; *p; p = &(*p)->next)
		if ((*p)->va == (uintptr_t)dptr) {
			struct plain *dead = *p;
			*p = dead->next;
			plain_bytes -= dead->size;
			if (dead->pool)
				fake_pool_charge(dead->pool, dead->size, false);
			pthread_mutex_unlock(&fake_lock);
			free((void *)dead->va);
			free(dead);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&fake_lock);
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
	CUdeviceptr p;
	CUresult r;
	fake_count("cuMemAlloc");
	r = plain_alloc(&p, bytesize, NULL);
	if (r == CUDA_SUCCESS)
		*dptr = (unsigned int)p; /* the v1 ABI: truncated, never used */
	if (r == CUDA_SUCCESS)
		plain_free(p);
	return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	fake_count("cuMemAlloc_v2");
	if (fake_capture_check() != CUDA_SUCCESS)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	return plain_alloc(dptr, bytesize, NULL);
}

CUresult cuMemFree(unsigned int dptr)
{
	(void)dptr;
	fake_count("cuMemFree");
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	fake_count("cuMemFree_v2");
	if (fake_capture_check() != CUDA_SUCCESS)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	return plain_free(dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	(void)s;
	fake_count("cuMemAllocAsync");
	return plain_alloc(dptr, bytesize, fake_pool_current());
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
	(void)s;
	fake_count("cuMemAllocAsync_ptsz");
	return plain_alloc(dptr, bytesize, fake_pool_current());
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				 CUstream s)
{
	(void)s;
	fake_count("cuMemAllocFromPoolAsync");
	NEED_INIT();
	struct fake_pool *p = fake_pool_of(pool);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	return plain_alloc(dptr, bytesize, p);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	(void)s;
	fake_count("cuMemFreeAsync");
	return plain_free(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	(void)s;
	fake_count("cuMemFreeAsync_ptsz");
	return plain_free(dptr);
}

void fakecuda_mem_info(size_t *free_bytes, size_t *total)
{
	struct vpmm_host_live live;
	vpmm_host_live(fake_drv, &live);
	pthread_mutex_lock(&fake_lock);
	*total = fake_capacity;
	*free_bytes = fake_capacity - live.handle_bytes - plain_bytes;
	pthread_mutex_unlock(&fake_lock);
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
	(void)free_bytes;
	(void)total;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* Answers given so far (under fake_lock): FAKECUDA_FREE_DRIFT's other
 * process has grown by the drift before each later one. */
static unsigned long info_answers;

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r = fake_ctx_state();
	unsigned long before;
	fake_count("cuMemGetInfo_v2");
	if (r != CUDA_SUCCESS)
		return r;
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	fakecuda_mem_info(free_bytes, total);
	pthread_mutex_lock(&fake_lock);
	before = info_answers++;
	pthread_mutex_unlock(&fake_lock);
	if (before && fake_free_drift > *free_bytes / before)
		*free_bytes = 0;
	else
		*free_bytes -= fake_free_drift * before;
	return CUDA_SUCCESS;
}

/* What holds an address, as the driver knows it. */
struct found {
	uintptr_t base;
	size_t size;
	bool mapped;                    /* a mapping of a handle, not plain */
	CUmemGenericAllocationHandle h; /* the mapping's handle */
	struct fake_pool *pool;         /* a plain allocation's pool */
};

/* The plain allocation or the single mapping holding p. */
static bool find(CUdeviceptr p, struct found *f)
{
	bool found = false;
	pthread_mutex_lock(&fake_lock);
	for (struct plain *pl = plains; pl && !found; pl = pl->next)
		if ((uintptr_t)p >= pl->va && (uintptr_t)p < pl->va + pl->size) {
			*f = (struct found){pl->va, pl->size, false, 0, pl->pool};
			found = true;
		}
	for (struct mapping *m = mappings; m && !found; m = m->next)
		if ((uintptr_t)p >= m->va && (uintptr_t)p < m->va + m->size) {
			*f = (struct found){m->va, m->size, true, m->h, NULL};
			found = true;
		}
	pthread_mutex_unlock(&fake_lock);
	return found;
}

/* Test control: the mapping (one handle) holding p, as the driver sees it:
 * 0 when p is in none. */
int fakecuda_mapping_of(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
	struct found f;
	if (!find(p, &f) || !f.mapped)
		return 0;
	*base = (CUdeviceptr)f.base;
	*size = f.size;
	return 1;
}

static bool range_of(CUdeviceptr p, uintptr_t *base, size_t *size)
{
	struct found f;
	if (!find(p, &f))
		return false;
	*base = f.base;
	*size = f.size;
	return true;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p)
{
	uintptr_t base;
	size_t size;
	fake_count("cuMemGetAddressRange_v2");
	NEED_INIT();
	if (!range_of(p, &base, &size))
		return CUDA_ERROR_NOT_FOUND;
	if (pbase)
		*pbase = (CUdeviceptr)base;
	if (psize)
		*psize = size;
	return CUDA_SUCCESS;
}

/* The driver's answers: a mapping is one handle's (its base and size;
 * exportable as a file descriptor, not by legacy IPC), a plain allocation
 * its own (legacy IPC, no handle types). Booleans and masks are ints. */
static CUresult attr(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	struct found f;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	if (!find(p, &f))
		return CUDA_ERROR_INVALID_VALUE;
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)f.base;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		*(size_t *)data = f.size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = !f.mapped;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = 1;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		*(int *)data = f.mapped ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
		*(void **)data = f.pool;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* cuPointerGetAttributes' null value for a pointer it does not know. */
static void unknown(void *data, CUpointer_attribute a)
{
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
	case CU_POINTER_ATTRIBUTE_MAPPED:
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		*(int *)data = 0;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = -2;
		break;
	default:
		*(uint64_t *)data = 0;
		break;
	}
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	fake_count("cuPointerGetAttribute");
	NEED_INIT();
	return attr(data, a, p);
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *a, void **data,
				CUdeviceptr p)
{
	fake_count("cuPointerGetAttributes");
	NEED_INIT();
	if (!a || !data)
		return CUDA_ERROR_INVALID_VALUE;
	uintptr_t base;
	size_t size;
	bool known = range_of(p, &base, &size);
	for (unsigned int i = 0; i < n; i++) {
		if (!data[i])
			continue;
		if (!known) {
			unknown(data[i], a[i]); /* not an error, unlike the single query */
			continue;
		}
		CUresult r = attr(data[i], a[i], p);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}

/* The handle mapped at addr (no reference counted: the tests never release
 * it); plain allocations have none. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
	struct found f;
	fake_count("cuMemRetainAllocationHandle");
	NEED_INIT();
	if (!h || !find((CUdeviceptr)(uintptr_t)addr, &f) || !f.mapped)
		return CUDA_ERROR_INVALID_VALUE;
	*h = f.h;
	return CUDA_SUCCESS;
}
