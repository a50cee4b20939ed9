/* mempool.c — CUDA's memory pools under the shim: which pool the program
 * made current for a device (cuDeviceSetMemPool, cuMemSetMemPool), and
 * what the device's default pool answers while libvpmm serves its
 * stream-ordered allocations. Each entry point is reached from its exported
 * hook (hooks.c), directly or through a cuGetProcAddress or dlsym answer
 * (the runtime's cudaDeviceSetMemPool and cudaMemPool* come here so).
 *
 * Decisions, and why:
 *  - A program that makes a pool of its own current for a device
 *    (cudaMemPoolCreate, then cudaDeviceSetMemPool) chose that pool's
 *    properties (its own release threshold, IPC, access): its
 *    cudaMallocAsync/cuMemAllocAsync on that device then go to CUDA whole,
 *    until it makes the default pool current again or destroys its pool
 *    (which makes the default current, as the driver does).
 *    cudaMallocFromPoolAsync is never hooked: the program named a pool.
 *    Frees of such memory reach CUDA because the pool owns no address of
 *    it (alloc.c).
 *  - The default pool's attributes are libvpmm's pool plus CUDA's own
 *    default pool (which still serves allocations captured into graphs):
 *    USED_MEM_* the pool's live bytes, RESERVED_MEM_* its mapped bytes, the
 *    peaks the sum of both peaks (exact when one of them is empty, else
 *    an upper bound). The pool serves cudaMalloc too, so this counts what
 *    cudaMalloc took as well. Setting USED_MEM_HIGH or RESERVED_MEM_HIGH
 *    (to 0, the only value the driver takes) restarts the pool's peak of
 *    live or mapped bytes (vpmm-dump shows the same peaks). PyTorch's
 *    backend:cudaMallocAsync reads and resets exactly these.
 *  - RELEASE_THRESHOLD answers and sets the pool's (VPMM_RELEASE_THRESHOLD;
 *    UINT64_MAX: keep every page, as with the variable unset). Set while
 *    VPMM_RELEASE_THRESHOLD is given, it only reaches CUDA's pool: the
 *    environment wins.
 *  - cuMemPoolTrimTo on the default pool trims libvpmm's pool too, to at
 *    most min_bytes_to_keep mapped bytes: it synchronises the pool's
 *    context (free when the program synchronised first, as CUDA's trim
 *    needs to release anything), so that frees on streams settle and go.
 *  - The other attributes and pools are CUDA's alone.
 *
 * May call: devices.h (the pools, their contexts), process.h, resolve.h,
 * the log.
 */
#include <stdatomic.h>
#include <stdint.h>

#include "devices.h"
#include "mempool.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"

/* Per device: the pool the program made current (0: the default one), and
 * the default pool's handle once read (0: not yet). */
static _Atomic uintptr_t chosen[VPMM_MAX_DEVICES];
static _Atomic uintptr_t defaults[VPMM_MAX_DEVICES];

static bool device_ok(int dev)
{
	return dev >= 0 && dev < VPMM_MAX_DEVICES;
}

static CUmemoryPool default_pool(int dev)
{
	uintptr_t v = atomic_load_explicit(&defaults[dev], memory_order_relaxed);
	CUmemoryPool p = NULL;
	if (v)
		return (CUmemoryPool)v;
	if (!vpmm_real.device_default_mempool ||
	    vpmm_real.device_default_mempool(&p, (CUdevice)dev) != CUDA_SUCCESS || !p)
		return NULL;
	atomic_store_explicit(&defaults[dev], (uintptr_t)p, memory_order_relaxed);
	return p;
}

bool vpmm_mempool_chosen(int dev)
{
	return device_ok(dev) && atomic_load_explicit(&chosen[dev], memory_order_relaxed);
}

/* The real call made `pool` current for `dev`. */
static void made_current(int dev, CUmemoryPool pool)
{
	if (!device_ok(dev))
		return;
	uintptr_t now = pool == default_pool(dev) ? 0 : (uintptr_t)pool;
	uintptr_t before = atomic_exchange(&chosen[dev], now);
	if (now && !before)
		VPMM_LOGF(VPMM_LOG_INFO,
			  "device %d: the program made a memory pool of its own current: its stream-ordered allocations go to CUDA",
			  dev);
	else if (!now && before)
		VPMM_LOGF(VPMM_LOG_INFO,
			  "device %d: the default memory pool is current again: the pool serves stream-ordered allocations",
			  dev);
}

CUresult vpmm_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuDeviceSetMemPool);
	VPMM_REAL_CALL(r, device_set_mempool, dev, pool);
	if (r == CUDA_SUCCESS)
		made_current((int)dev, pool);
	return r;
}

CUresult vpmm_cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			      CUmemoryPool pool)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemSetMemPool);
	VPMM_REAL_CALL(r, mem_set_mempool, location, type, pool);
	/* Device memory's current pool: the one the pool stands in for. */
	if (r == CUDA_SUCCESS && location && location->type == CU_MEM_LOCATION_TYPE_DEVICE &&
	    type == CU_MEM_ALLOCATION_TYPE_PINNED)
		made_current(location->id, pool);
	return r;
}

CUresult vpmm_cuMemPoolDestroy(CUmemoryPool pool)
{
	CUresult r;
	vpmm_count(VPMM_HOOK_cuMemPoolDestroy);
	VPMM_REAL_CALL(r, mempool_destroy, pool);
	/* Destroying a device's current pool makes its default one current. */
	for (int d = 0; r == CUDA_SUCCESS && pool && d < VPMM_MAX_DEVICES; d++)
		if (atomic_load(&chosen[d]) == (uintptr_t)pool)
			made_current(d, default_pool(d));
	return r;
}

/* The device whose default pool `pool` is, while libvpmm serves that
 * device; -1 otherwise. */
static int served_default(CUmemoryPool pool)
{
	if (!pool || vpmm_tls_inside || !vpmm_active())
		return -1;
	int n = vpmm_device_count();
	for (int d = 0; d < n; d++)
		if (vpmm_device_pool(d, NULL) && default_pool(d) == pool)
			return d;
	return -1;
}

CUresult vpmm_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct vpmm_stats s;
	CUresult r;
	int d;
	vpmm_count(VPMM_HOOK_cuMemPoolGetAttribute);
	VPMM_REAL_CALL(r, mempool_get_attr, pool, attr, value);
	if (r != CUDA_SUCCESS || !value || (d = served_default(pool)) < 0)
		return r;
	vpmm_pool *p = vpmm_device_pool(d, NULL);
	cuuint64_t *v = value;
	vpmm_pool_stats(p, &s);
	switch (attr) {
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*v += s.live;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*v += s.live_peak;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*v += s.mapped;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		*v += s.mapped_peak;
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: {
		size_t t = vpmm_pool_release_threshold(p, NULL);
		*v = t == SIZE_MAX ? UINT64_MAX : (cuuint64_t)t;
		break;
	}
	default:
		break;
	}
	return r;
}

CUresult vpmm_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	CUresult r;
	int d;
	vpmm_count(VPMM_HOOK_cuMemPoolSetAttribute);
	VPMM_REAL_CALL(r, mempool_set_attr, pool, attr, value);
	if (r != CUDA_SUCCESS || !value || (d = served_default(pool)) < 0)
		return r;
	vpmm_pool *p = vpmm_device_pool(d, NULL);
	switch (attr) {
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		vpmm_pool_reset_peaks(p, true, false);
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		vpmm_pool_reset_peaks(p, false, true);
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: {
		cuuint64_t v = *(cuuint64_t *)value;
		size_t t = v >= SIZE_MAX ? SIZE_MAX : (size_t)v;
		if (vpmm_process_config()->release)
			VPMM_LOGF(VPMM_LOG_INFO,
				  "device %d: the default pool's release threshold is VPMM_RELEASE_THRESHOLD's; %llu reaches CUDA's pool only",
				  d, (unsigned long long)v);
		else
			vpmm_pool_release_threshold(p, &t);
		break;
	}
	default:
		break;
	}
	return r;
}

CUresult vpmm_cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep)
{
	struct vpmm_stats s;
	bool pushed;
	CUresult r;
	int d;
	vpmm_count(VPMM_HOOK_cuMemPoolTrimTo);
	VPMM_REAL_CALL(r, mempool_trim, pool, min_bytes_to_keep);
	if (r != CUDA_SUCCESS || (d = served_default(pool)) < 0)
		return r;
	vpmm_pool *p = vpmm_device_pool(d, NULL);
	vpmm_pool_stats(p, &s);
	/* mapped = live + reusable: keep what leaves at most the bytes asked */
	size_t keep = min_bytes_to_keep > s.live ? min_bytes_to_keep - (size_t)s.live : 0;
	if (vpmm_push_pool_ctx(d, &pushed) == CUDA_SUCCESS) {
		/* Frees on streams settle with events recorded now and the
		 * context synchronised (the program synchronised first, as it
		 * must for CUDA's trim to release anything: this costs no
		 * wait then), and the trim takes them. */
		vpmm_pool_poll(p, true);
		if (vpmm_real.ctx_synchronize)
			vpmm_real.ctx_synchronize();
		vpmm_pool_poll(p, false);
		vpmm_pool_trim(p, keep);
		vpmm_pop_ctx(pushed);
	}
	return r;
}
