/* test_share.c — the pool's memory seen from elsewhere: a peer granted
 * access reaches every page, also those mapped or remapped later; the
 * handles under an allocation, imported by a second driver (as another
 * process would), show the same bytes. */
#include <pthread.h>

#include "pool_test.h"

/* The pool's list of devices with access holds this many. */
#define VPMM_MAX_ACCESS_TEST 32

static void open64(struct pt *t, size_t small_max)
{
	struct pt_setup su = {.va_pages = 64, .small_max = small_max};
	pt_open(t, &su);
}

/* Every page of [va, va + size) accessible by `device`. */
static void assert_accessible_at(struct pt *t, CUdeviceptr va, size_t size, int device,
				 int line)
{
	for (CUdeviceptr at = va; at < va + size; at += t->page)
		cr_assert(vpmm_host_accessible(t->drv, at, device),
			  "line %d: page %#llx not accessible by device %d (layout %s)", line,
			  (unsigned long long)at, device, pt_layout(t));
}
#define ASSERT_ACCESSIBLE(t, va, pages, dev)                                          \
	assert_accessible_at((t), (va), (size_t)(pages) * (t)->page, (dev), __LINE__)

Test(share, grant_reaches_mapped_and_later_pages)
{
	struct pt t;
	open64(&t, 0);
	CUdeviceptr a = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	CUdeviceptr b = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	cr_assert(!vpmm_host_accessible(t.drv, b, 1), "device 1 had access before the grant");
	int before[4];
	cr_assert_eq(vpmm_pool_access(t.pool, before, 4), 1);

	cr_assert_eq(vpmm_pool_grant(t.pool, 1), 0);
	PT_CHECK(&t);
	ASSERT_ACCESSIBLE(&t, b, 1, 1);
	ASSERT_ACCESSIBLE(&t, a, 2, 1); /* free pages too: they are handed out later */

	/* A request the free pages cannot hold: a's two pages are remapped
	 * next to new ones. Every page of it must reach device 1. */
	struct vpmm_stats s0 = pt_stats(&t);
	CUdeviceptr c = PT_MALLOC(&t, 5, VPMM_NO_STREAM);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_gt(s1.pages_remapped, s0.pages_remapped, "the test meant to remap pages");
	cr_assert_gt(s1.pages_created, s0.pages_created, "the test meant to map new pages");
	ASSERT_ACCESSIBLE(&t, c, 5, 1);
	ASSERT_ACCESSIBLE(&t, c, 5, before[0]);

	int acc[4];
	cr_assert_eq(vpmm_pool_grant(t.pool, 1), 0, "a second grant is harmless");
	cr_assert_eq(vpmm_pool_access(t.pool, acc, 4), 2);
	cr_assert_eq(acc[0], before[0]);
	cr_assert_eq(acc[1], 1);

	PT_FREE(&t, b, VPMM_NO_STREAM);
	PT_FREE(&t, c, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

Test(share, refused_grant_changes_nothing)
{
	struct pt t;
	open64(&t, 0);
	CUdeviceptr a = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_grant(t.pool, -3), -EINVAL);
	/* The host driver knows devices 0..63, as a driver knows its GPUs. */
	cr_assert_eq(vpmm_pool_grant(t.pool, 64), -EIO);
	cr_assert_eq(vpmm_pool_last_result(t.pool), CUDA_ERROR_INVALID_DEVICE);
	vpmm_host_fail(t.drv, VPMM_OP_SET_ACCESS, 1, CUDA_ERROR_UNKNOWN);
	cr_assert_eq(vpmm_pool_grant(t.pool, 2), -EIO);
	int acc[4];
	cr_assert_eq(vpmm_pool_access(t.pool, acc, 4), 1, "a refused device stayed listed");
	/* Later mappings still work: they do not ask for the refused device. */
	CUdeviceptr b = PT_MALLOC(&t, 3, VPMM_NO_STREAM);
	cr_assert(!vpmm_host_accessible(t.drv, b, 2));
	PT_FREE(&t, a, VPMM_NO_STREAM);
	PT_FREE(&t, b, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

/* Grants that wait together for a defragmentation mapping (regions busy)
 * each look again once it is done: the device is listed once, and the last
 * slot of the list goes to one of them. */
struct grant_call {
	vpmm_pool *pool;
	int device, rc;
};

static void *grant_thread(void *arg)
{
	struct grant_call *g = arg;
	g->rc = vpmm_pool_grant(g->pool, g->device);
	return NULL;
}

struct held_growth {
	struct pt *t;
	CUdeviceptr p;
	int rc;
};

static void *growth_thread(void *arg)
{
	struct held_growth *h = arg;
	h->rc = vpmm_pool_malloc(h->t->pool, 4 * h->t->page, VPMM_NO_STREAM, &h->p);
	return NULL;
}

/* Returns the growth's allocation. */
static CUdeviceptr grant_together(struct pt *t, int d0, int d1, int rc[2])
{
	unsigned long maps = vpmm_host_calls(t->drv, VPMM_OP_MAP);
	vpmm_host_gate(t->drv, VPMM_OP_MAP, true);
	struct held_growth h = {.t = t};
	pthread_t th, gt[2];
	cr_assert_eq(pthread_create(&th, NULL, growth_thread, &h), 0);
	for (int i = 0; i < 2000 && vpmm_host_calls(t->drv, VPMM_OP_MAP) == maps; i++)
		usleep(1000);
	cr_assert_gt(vpmm_host_calls(t->drv, VPMM_OP_MAP), maps, "the growth never mapped");
	struct grant_call g[2] = {{t->pool, d0, 1}, {t->pool, d1, 1}};
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&gt[i], NULL, grant_thread, &g[i]), 0);
	usleep(200000); /* both are waiting: the growth's regions are busy */
	vpmm_host_gate(t->drv, VPMM_OP_MAP, false);
	cr_assert_eq(pthread_join(th, NULL), 0);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(pthread_join(gt[i], NULL), 0);
		rc[i] = g[i].rc;
	}
	cr_assert_eq(h.rc, 0, "the held growth failed: %d", h.rc);
	return h.p;
}

Test(share, grants_waiting_together)
{
	struct pt t;
	open64(&t, 0);
	int rc[2], acc[VPMM_MAX_ACCESS_TEST];
	CUdeviceptr g1 = grant_together(&t, 1, 1, rc);
	cr_assert(rc[0] == 0 && rc[1] == 0, "grants: %d %d", rc[0], rc[1]);
	cr_assert_eq(vpmm_pool_access(t.pool, acc, VPMM_MAX_ACCESS_TEST), 2,
		     "device 1 listed twice");
	/* One slot left: one grant gets it, the other is refused. */
	size_t n = 2;
	for (int d = 2; n + 1 < VPMM_MAX_ACCESS_TEST; d++, n++)
		cr_assert_eq(vpmm_pool_grant(t.pool, d), 0);
	CUdeviceptr g2 = grant_together(&t, 40, 41, rc);
	cr_assert((rc[0] == 0 && rc[1] == -EINVAL) || (rc[0] == -EINVAL && rc[1] == 0),
		  "grants for the last slot: %d %d", rc[0], rc[1]);
	cr_assert_eq(vpmm_pool_access(t.pool, acc, VPMM_MAX_ACCESS_TEST), VPMM_MAX_ACCESS_TEST);
	CUdeviceptr a = PT_MALLOC(&t, 3, VPMM_NO_STREAM);
	ASSERT_ACCESSIBLE(&t, a, 3, rc[0] ? 41 : 40);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	PT_FREE(&t, g1, VPMM_NO_STREAM);
	PT_FREE(&t, g2, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

/* What another process does with the pieces: import each, map them back to
 * back in its own reservation. */
struct imported {
	vpmm_driver *drv;
	CUdeviceptr va;
	size_t len;
	CUmemGenericAllocationHandle h[8];
	size_t n;
};

static void import_pieces(struct pt *t, const struct vpmm_piece *pc, size_t n,
			  struct imported *im)
{
	struct vpmm_host_options ho = {.granularity = t->page};
	cr_assert_eq(vpmm_driver_host_create(&ho, &im->drv), CUDA_SUCCESS);
	cr_assert_leq(n, 8);
	im->len = 0;
	for (size_t i = 0; i < n; i++)
		im->len += pc[i].size;
	cr_assert_eq(im->drv->va_reserve(im->drv, im->len, &im->va), CUDA_SUCCESS);
	CUdeviceptr at = im->va;
	for (size_t i = 0; i < n; i++) {
		int fd = -1;
		cr_assert_eq(t->drv->export_fd(t->drv, pc[i].handle, &fd), CUDA_SUCCESS);
		cr_assert_eq(im->drv->import_fd(im->drv, fd, &im->h[i]), CUDA_SUCCESS);
		close(fd);
		cr_assert_eq(im->drv->map(im->drv, at, pc[i].size, im->h[i]), CUDA_SUCCESS);
		/* the mapping holds the memory: drop the handle as the shim does */
		cr_assert_eq(im->drv->mem_release(im->drv, im->h[i]), CUDA_SUCCESS);
		at += pc[i].size;
	}
	im->n = n;
	int dev = 0;
	cr_assert_eq(im->drv->set_access(im->drv, im->va, im->len, &dev, 1), CUDA_SUCCESS);
}

static void unimport(struct imported *im)
{
	cr_assert_eq(im->drv->unmap(im->drv, im->va, im->len), CUDA_SUCCESS);
	cr_assert_eq(im->drv->va_free(im->drv, im->va, im->len), CUDA_SUCCESS);
	struct vpmm_host_live l;
	vpmm_host_live(im->drv, &l);
	cr_assert_eq(l.handles + l.mappings + l.reservations, 0, "the importer leaked");
	cr_assert_eq(l.handle_bytes, 0, "imported memory counted as the importer's own");
	im->drv->destroy(im->drv);
}

Test(share, pieces_show_the_same_bytes_elsewhere)
{
	struct pt t;
	open64(&t, 0);
	/* An allocation over two handles at a new address: a's page remapped
	 * next to a new one. */
	CUdeviceptr a = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	CUdeviceptr b = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	PT_FREE(&t, a, VPMM_NO_STREAM);
	CUdeviceptr c = PT_MALLOC(&t, 2, VPMM_NO_STREAM);
	cr_assert_neq(c, a);

	struct vpmm_piece pc[8];
	struct vpmm_extent ext;
	int n = vpmm_pool_pieces(t.pool, c + 123, 0, pc, 8, &ext);
	cr_assert_eq(n, 2, "pieces: %d", n);
	cr_assert_eq(ext.base, c, "an inner pointer names its allocation");
	cr_assert_eq(ext.size, 2 * t.page);
	cr_assert_eq(ext.offset, 0);
	cr_assert_eq(ext.npieces, 2);
	cr_assert_eq(pc[0].size + pc[1].size, 2 * t.page);

	struct vpmm_piece one;
	cr_assert_eq(vpmm_pool_pieces(t.pool, c, 1, &one, 1, &ext), 1, "second piece alone");
	cr_assert_eq(one.handle, pc[1].handle);
	cr_assert_eq(vpmm_pool_pieces(t.pool, c, 2, &one, 1, &ext), 0, "past the last piece");

	struct imported im;
	import_pieces(&t, pc, 2, &im);
	unsigned char *mine = (unsigned char *)(uintptr_t)c;
	unsigned char *theirs = (unsigned char *)(uintptr_t)(im.va + ext.offset);
	for (size_t i = 0; i < ext.size; i += 4099)
		mine[i] = (unsigned char)(i * 7 + 1);
	cr_assert_eq(memcmp(mine, theirs, ext.size), 0, "the importer sees other bytes");
	theirs[ext.size - 1] = 0xa5;
	cr_assert_eq(mine[ext.size - 1], 0xa5, "the importer's write did not reach the pool");
	unimport(&im);

	/* Freed, or never handed out: no pieces. */
	PT_FREE(&t, b, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_pieces(t.pool, b, 0, pc, 8, &ext), -EINVAL);
	cr_assert_eq(vpmm_pool_pieces(t.pool, 0x1000, 0, pc, 8, &ext), -EINVAL);
	PT_FREE(&t, c, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

Test(share, small_block_inside_a_page)
{
	struct pt t;
	open64(&t, 16 * PT_KiB);
	CUdeviceptr x = PT_MALLOC_BYTES(&t, 4096, VPMM_NO_STREAM);
	CUdeviceptr y = 0;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 4096, VPMM_NO_STREAM, &y), 0);
	struct vpmm_piece pc[2];
	struct vpmm_extent ext;
	cr_assert_eq(vpmm_pool_pieces(t.pool, y, 0, pc, 2, &ext), 1);
	cr_assert_eq(ext.base, y);
	cr_assert_eq(ext.size, 4096);
	cr_assert_eq(ext.offset, y % t.page, "offset %zu of a block at %#llx", ext.offset,
		     (unsigned long long)y);
	cr_assert_eq(pc[0].size, t.page);
	PT_FREE(&t, x, VPMM_NO_STREAM);
	PT_FREE(&t, y, VPMM_NO_STREAM);
	pt_settle(&t);
	pt_close(&t);
}

Test(share, import_refuses_what_is_no_handle)
{
	struct pt t;
	open64(&t, 0);
	CUmemGenericAllocationHandle h;
	cr_assert_eq(t.drv->import_fd(t.drv, -1, &h), CUDA_ERROR_INVALID_VALUE);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	cr_assert_eq(t.drv->import_fd(t.drv, fds[0], &h), CUDA_ERROR_INVALID_HANDLE);
	close(fds[0]);
	close(fds[1]);
	pt_close(&t);
}
