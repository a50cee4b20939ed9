/* share.c — the pool's memory seen from outside its own device and process:
 * peers granted access to every page (vpmm_pool_grant), and the physical
 * handles under an allocation, for another process to import
 * (vpmm_pool_pieces; the shim's ipc_export.c and ipc_import.c move them).
 *
 * Why a grant waits for no busy region: a defragmentation copies the access
 * list before it drops the lock to map, and trimming unmaps with the lock
 * dropped. With no region busy and the lock held, every live and free region
 * is mapped and stays so, and every later mapping copies the new list.
 * Grants are rare (once per peer, at start-up), so waiting is cheap.
 *
 * Calls small.c (the slab under an address) and the tree; reads regions and
 * mappings (region.h, handle.h). Lock held.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "handle.h"
#include "pool.h"
#include "region.h"
#include "small.h"

/* How long a grant waits for the pool's busy regions to come back. */
#define GRANT_WAIT_NS 10000000000ull
#define GRANT_POLL_NS 100000l

static CUresult counted_access(vpmm_pool *p, CUdeviceptr va, size_t size)
{
	p->st.driver_calls++;
	p->driver_calls[VPMM_OP_SET_ACCESS]++;
	return p->drv->set_access(p->drv, va, size, p->access, (int)p->naccess);
}

/* Lock held, no region busy. Live and free regions are mapped whole pages
 * at a time between holes, zombies and chunk edges: each run of them is one
 * set_access. */
static CUresult grant_all_locked(vpmm_pool *p)
{
	CUdeviceptr start = 0, end = 0;
	unsigned chunk = 0;
	for (struct vpi_tnode *n = vpi_tree_first(&p->regions); n; n = vpi_tree_next(n)) {
		const struct region *r = REG(n, by_va);
		bool mapped = r->kind == R_LIVE || r->kind == R_FREE;
		if (mapped && end == r->va && chunk == r->chunk && end != start) {
			end += r->size;
			continue;
		}
		if (end != start) {
			CUresult cr = counted_access(p, start, end - start);
			if (cr != CUDA_SUCCESS)
				return cr;
		}
		start = end = mapped ? r->va : 0;
		if (mapped) {
			end += r->size;
			chunk = r->chunk;
		}
	}
	return end != start ? counted_access(p, start, end - start) : CUDA_SUCCESS;
}

int vpmm_pool_grant(vpmm_pool *p, int device)
{
	if (!p || device < 0)
		return -EINVAL;
	struct timespec t0, now, nap = {0, GRANT_POLL_NS};
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t waited = 0;
	int rc = 0;
	vpi_mutex_lock(&p->lock);
	for (;;) {
		/* Looked at again after every wait: another grant may have
		 * added this device, or taken the last slot, meanwhile. */
		for (unsigned i = 0; i < p->naccess; i++)
			if (p->access[i] == device)
				goto out; /* already granted: every mapping has it */
		if (p->naccess == VPMM_MAX_ACCESS) {
			rc = -EINVAL;
			goto out;
		}
		if (!p->busy)
			break;
		if (waited > GRANT_WAIT_NS) {
			rc = -EAGAIN;
			goto out;
		}
		vpi_mutex_unlock(&p->lock);
		nanosleep(&nap, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		vpi_mutex_lock(&p->lock);
		waited = (uint64_t)(now.tv_sec - t0.tv_sec) * 1000000000ull +
			 (uint64_t)(now.tv_nsec - t0.tv_nsec);
	}
	p->access[p->naccess++] = device;
	CUresult r = grant_all_locked(p);
	if (r != CUDA_SUCCESS) {
		/* Later mappings must not fail for a device the driver refuses;
		 * the ranges granted so far keep the (harmless) extra access. */
		p->naccess--;
		p->last_result = r;
		rc = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
out:
	vpi_mutex_unlock(&p->lock);
	return rc;
}

size_t vpmm_pool_access(vpmm_pool *p, int *out, size_t cap)
{
	if (!p)
		return 0;
	vpi_mutex_lock(&p->lock);
	size_t n = p->naccess;
	for (size_t i = 0; i < n && i < cap; i++)
		out[i] = p->access[i];
	vpi_mutex_unlock(&p->lock);
	return n;
}

int vpmm_pool_pieces(vpmm_pool *p, CUdeviceptr ptr, size_t first,
		     struct vpmm_piece *out, size_t cap, struct vpmm_extent *ext)
{
	if (!p || !ext)
		return -EINVAL;
	int rc = -EINVAL;
	vpi_mutex_lock(&p->lock);
	struct region probe = {.va = ptr};
	struct region *r = REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
	if (!r || r->kind != R_LIVE || ptr >= r->va + r->size ||
	    (!r->small && vpi_claimed(r)))
		goto out;
	CUdeviceptr base = r->va;
	size_t size = r->size;
	if (r->small && vpi_small_find_locked(p, r, ptr, &base, &size) != 0)
		goto out;
	/* The home mapping holding base: zombies never overlap live memory,
	 * so the nearest mapping at or below base is it. */
	struct mapping mp = {.va = base};
	struct mapping *m = MAP(vpi_tree_floor(&p->maps, &mp.by_va));
	if (!m || m->va + m->handle->size <= base)
		goto out; /* a broken map; vpmm_pool_check() would say so */
	ext->base = base;
	ext->size = size;
	ext->offset = base - m->va;
	ext->npieces = 0;
	for (; m && m->va < base + size; m = MAP(vpi_tree_next(&m->by_va))) {
		size_t i = ext->npieces++;
		if (i >= first && i - first < cap)
			out[i - first] = (struct vpmm_piece){m->handle->cu, m->handle->size};
	}
	rc = (int)(ext->npieces > first ? (ext->npieces - first < cap ? ext->npieces - first : cap) : 0);
out:
	vpi_mutex_unlock(&p->lock);
	return rc;
}
