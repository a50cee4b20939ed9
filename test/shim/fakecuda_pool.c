/* fakecuda_pool.c — the fake's memory pools: each device's default pool,
 * pools the program makes (cuMemPoolCreate), which one is current
 * (cuDeviceSetMemPool, cuMemSetMemPool; destroying the current one makes
 * the default current), and their attributes: used and reserved bytes of
 * the plain allocations made from them (fakecuda_mem.c charges them),
 * peaks reset by setting them to 0, a release threshold (0 by default, as
 * the driver's: freed bytes are released at once) and trimming.
 *
 * Owns: the pools. Calls fakecuda_ctx.c and fakecuda.c.
 */
#include "fakecuda.h"

#include <stdlib.h>

static struct fake_pool defaults[MAX_DEV];
static struct fake_pool *current[MAX_DEV]; /* NULL: the default */
#define MADE_MAX 16
static struct fake_pool *made[MADE_MAX];

static void defaults_init(void)
{
	for (int d = 0; d < MAX_DEV; d++)
		defaults[d].device = d;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

struct fake_pool *fake_pool_of(CUmemoryPool pool)
{
	pthread_once(&once, defaults_init);
	for (int d = 0; d < MAX_DEV; d++)
		if ((void *)pool == (void *)&defaults[d])
			return &defaults[d];
	for (int i = 0; i < MADE_MAX; i++)
		if (made[i] && !made[i]->destroyed && (void *)pool == (void *)made[i])
			return made[i];
	return NULL;
}

struct fake_pool *fake_pool_current(void)
{
	struct fake_ctx *c = fake_current();
	int d = c ? c->device : 0;
	pthread_once(&once, defaults_init);
	return current[d] ? current[d] : &defaults[d];
}

void fake_pool_charge(struct fake_pool *p, size_t n, bool add)
{
	if (add) {
		p->used += n;
		if (p->used > p->reserved)
			p->reserved = p->used;
	} else {
		p->used -= n;
		if (p->reserved > p->used + p->threshold)
			p->reserved = p->used + p->threshold;
	}
	if (p->used > p->used_high)
		p->used_high = p->used;
	if (p->reserved > p->reserved_high)
		p->reserved_high = p->reserved;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	NEED_INIT();
	if (!pool || dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&once, defaults_init);
	*pool = (CUmemoryPool)(void *)&defaults[dev];
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	NEED_INIT();
	if (!pool || dev < 0 || dev >= fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&once, defaults_init);
	pthread_mutex_lock(&fake_lock);
	*pool = (CUmemoryPool)(void *)(current[dev] ? current[dev] : &defaults[dev]);
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	NEED_INIT();
	struct fake_pool *p = fake_pool_of(pool);
	if (!p || dev < 0 || dev >= fake_ndev || p->device != dev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	current[dev] = p->made ? p : NULL;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
			 CUmemoryPool pool)
{
	if (!location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	return cuDeviceSetMemPool(location->id, pool);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	NEED_INIT();
	if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    props->location.id < 0 || props->location.id >= fake_ndev)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_pool *p = calloc(1, sizeof *p);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->device = props->location.id;
	p->made = true;
	pthread_mutex_lock(&fake_lock);
	for (int i = 0; i < MADE_MAX; i++)
		if (!made[i]) {
			made[i] = p;
			pthread_mutex_unlock(&fake_lock);
			*pool = (CUmemoryPool)(void *)p;
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&fake_lock);
	free(p);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The pool is kept, marked (its allocations may still name it). */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	NEED_INIT();
	struct fake_pool *p = fake_pool_of(pool);
	if (!p || !p->made)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	if (current[p->device] == p)
		current[p->device] = NULL;
	p->destroyed = true;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	NEED_INIT();
	struct fake_pool *p = fake_pool_of(pool);
	if (!p || !value)
		return CUDA_ERROR_INVALID_VALUE;
	cuuint64_t *v = value;
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fake_lock);
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = p->threshold; break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = p->used; break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = p->used_high; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = p->reserved; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = p->reserved_high; break;
	default: *(int *)value = 1; break;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	NEED_INIT();
	struct fake_pool *p = fake_pool_of(pool);
	if (!p || !value)
		return CUDA_ERROR_INVALID_VALUE;
	cuuint64_t v = *(cuuint64_t *)value;
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fake_lock);
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		p->threshold = v;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		if (v)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->used_high = p->used;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		if (v)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->reserved_high = p->reserved;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		r = CUDA_ERROR_INVALID_VALUE;
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	NEED_INIT();
	fake_count("cuMemPoolTrimTo");
	struct fake_pool *p = fake_pool_of(pool);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_lock);
	if (p->reserved > keep)
		p->reserved = keep > p->used ? keep : p->used;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}
