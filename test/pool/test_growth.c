/* test_growth.c — VPMM_REMAP=pressure (growth.c): the pool grows without
 * remapping while the device has room, makes its handles finer as the room
 * shrinks, and remaps at the limit, where the driver refuses to create.
 * The room is what the host driver's capacity, another tenant
 * (vpmm_host_set_tenant) and VPMM_LIMIT leave. */
#include <time.h>

#include "pool_test.h"

#define PAGE (64 * PT_KiB)
#define DEVICE_PAGES 16384 /* 1 GiB of 64 KiB pages */

/* The suite's device and pool: 1 GiB, handles of up to 64 MiB, no loop
 * rule; the tests that need more set it on top. */
static struct pt_setup growth_setup(enum vpmm_remap_policy remap, size_t limit_pages)
{
	return (struct pt_setup){ .capacity = DEVICE_PAGES * PAGE,
				  .va_pages = 4 * DEVICE_PAGES,
				  .handle_pages = 1024, /* VPMM_HANDLE_SIZE 64 MiB */
				  .no_loop_growth = true,
				  .remap = remap,
				  .limit_pages = limit_pages };
}

static void open_growth(struct pt *t, enum vpmm_remap_policy remap, size_t limit_pages)
{
	struct pt_setup su = growth_setup(remap, limit_pages);
	pt_open(t, &su);
}

/* A pool of `n` allocations of `each` pages, live, then every `stride`-th
 * one freed: free memory in pieces of `each` pages between live ones.
 * Returns the live pointers' array (owned by the caller). */
static CUdeviceptr *scatter(struct pt *t, CUstream s, size_t n, size_t each, size_t stride)
{
	CUdeviceptr *p = calloc(n, sizeof *p);
	cr_assert_not_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = PT_MALLOC(t, each, s);
	for (size_t i = 0; i < n; i += stride) {
		PT_FREE(t, p[i], s);
		p[i] = 0;
	}
	return p;
}

static void unscatter(struct pt *t, CUstream s, CUdeviceptr *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			PT_FREE(t, p[i], s);
	free(p);
}

/* Handles created by one malloc of `pages`, and what else it did. */
struct grown {
	uint64_t created, remapped, room_growths, refusals;
	CUdeviceptr ptr;
};

static struct grown grow_once(struct pt *t, size_t pages, CUstream s)
{
	struct vpmm_stats a = pt_stats(t), b;
	struct grown g;
	g.ptr = PT_MALLOC(t, pages, s);
	b = pt_stats(t);
	g.created = b.handles_created - a.handles_created;
	g.remapped = b.handles_remapped - a.handles_remapped;
	g.room_growths = b.room_growths - a.room_growths;
	g.refusals = b.growth_refusals - a.growth_refusals;
	return g;
}

/* With room, a request no free range fits grows by one handle and remaps
 * nothing, though free pages lie scattered; VPMM_REMAP=always remaps them. */
Test(growth, room_grows_without_remapping)
{
	for (int always = 0; always < 2; always++) {
		struct pt t;
		open_growth(&t, always ? VPMM_REMAP_ALWAYS : VPMM_REMAP_PRESSURE, 0);
		CUstream s = vpmm_host_stream_create(t.drv);
		/* 200 x 8 pages, one in 100 freed: 1 % of the pool is free
		 * in pieces of 8 pages, under the spare share once grown. */
		CUdeviceptr *p = scatter(&t, s, 200, 8, 100);
		struct grown g = grow_once(&t, 16, s);
		if (always) {
			cr_expect_gt(g.remapped, 0, "always: the scattered pages were not remapped");
			cr_expect_eq(g.room_growths, 0);
		} else {
			cr_expect_eq(g.remapped, 0, "pressure: %llu handles remapped with room",
				     (unsigned long long)g.remapped);
			cr_expect_eq(g.room_growths, 1);
			cr_expect_eq(g.created, 1, "one handle for the growth, made %llu",
				     (unsigned long long)g.created);
			cr_expect_gt(pt_stats(&t).headroom, 0);
		}
		PT_FREE(&t, g.ptr, s);
		unscatter(&t, s, p, 200);
		pt_close(&t);
	}
}

/* Room or not, a pool holding more than its spare share (1 %) free remaps:
 * the free pages are used before the device gives more. Half of the pool
 * free, and 1.5 % of it (3 pieces of 8 pages in 1 600). */
Test(growth, free_share_over_the_spare_remaps)
{
	static const size_t n[2] = {100, 200}, stride[2] = {2, 67};
	for (int k = 0; k < 2; k++) {
		struct pt t;
		open_growth(&t, VPMM_REMAP_PRESSURE, 0);
		CUstream s = vpmm_host_stream_create(t.drv);
		CUdeviceptr *p = scatter(&t, s, n[k], 8, stride[k]);
		struct vpmm_stats before = pt_stats(&t);
		struct grown g = grow_once(&t, 16, s);
		cr_expect_gt(g.remapped, 0, "case %d: nothing remapped", k);
		cr_expect_eq(g.room_growths, 0, "case %d", k);
		cr_expect_eq(pt_stats(&t).mapped, before.mapped,
			     "case %d: the pool grew instead of remapping", k);
		PT_FREE(&t, g.ptr, s);
		unscatter(&t, s, p, n[k]);
		pt_close(&t);
	}
}

/* On a device mostly empty, a defragmentation (the pool holds more than its
 * spare share free) creates what the free pages lack in handles of up to
 * 1/64 of the pool, where the split rule would make them finer. */
Test(growth, a_defragmentation_on_an_empty_device_makes_pool_sized_handles)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr *p = scatter(&t, s, 100, 8, 2); /* 800 pages, 400 free */
	/* 600 pages: the 400 free are remapped, 200 created in handles of
	 * 8 pages (800 / 64 = 12.5, a power of two of pages). */
	struct grown g = grow_once(&t, 600, s);
	cr_expect_eq(g.room_growths, 0);
	cr_expect_eq(g.remapped, 50, "remapped %llu handles", (unsigned long long)g.remapped);
	cr_expect_eq(g.created, 25, "made %llu handles", (unsigned long long)g.created);
	PT_FREE(&t, g.ptr, s);
	unscatter(&t, s, p, 100);
	pt_close(&t);
}

/* As another tenant takes the device, the handles of a growth get finer:
 * at most 1/256 of the room (a power of two of pages) once 16 allocations
 * are live, so that what live memory strands in them stays small against
 * what is left. */
Test(growth, handles_get_finer_as_the_room_shrinks)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a[16];
	for (int i = 0; i < 16; i++)
		a[i] = PT_MALLOC(&t, 4, s);
	/* The device free but for 64 pages: handles up to a power of two
	 * within (16384 - 64) / 256 pages, 32. */
	struct grown big = grow_once(&t, 256, s);
	cr_expect_eq(big.room_growths, 1);
	cr_expect_eq(big.created, 8, "256 pages in handles of 32: made %llu",
		     (unsigned long long)big.created);
	/* A tenant leaves 1024 pages: handles of 4 pages; 64 pages (1/16
	 * of the room) still grow without remapping. The device's free
	 * memory is read again after GROWTH_READ_NS (100 ms). */
	struct vpmm_host_live l;
	vpmm_host_live(t.drv, &l);
	vpmm_host_set_tenant(t.drv, DEVICE_PAGES * PAGE - l.handle_bytes - 1024 * PAGE);
	nanosleep(&(struct timespec){ .tv_nsec = 110 * 1000 * 1000 }, NULL);
	struct grown fine = grow_once(&t, 64, s);
	cr_expect_eq(fine.room_growths, 1);
	cr_expect_eq(fine.remapped, 0);
	cr_expect_eq(fine.created, 16, "64 pages in handles of 4: made %llu",
		     (unsigned long long)fine.created);
	cr_expect_leq(pt_stats(&t).headroom, 1024 * PAGE);
	PT_FREE(&t, fine.ptr, s);
	PT_FREE(&t, big.ptr, s);
	for (int i = 0; i < 16; i++)
		PT_FREE(&t, a[i], s);
	pt_close(&t);
}

/* A pool of few live allocations grows in coarser handles: each can strand
 * at most two handles, so with n live the bound is 1/(32 (n + 1)) of the
 * room, down to 1/256 from 7 live on. The device free but for the live
 * pages (about 64: 16320 left), or with 1024 pages left. */
Test(growth, few_live_allocations_allow_coarser_handles)
{
	static const struct {
		int live;
		size_t room_pages, grow, handles;
	} c[] = {
		{ 1, 0, 256, 2 },    /* 16320 / 64: 255, handles of 128 */
		{ 3, 0, 256, 4 },    /* 16321 / 128: 127, handles of 64 */
		{ 5, 0, 256, 4 },    /* 16324 / 192: 85, handles of 64 */
		{ 6, 0, 256, 4 },    /* 16324 / 224: 72, handles of 64 */
		{ 7, 0, 256, 8 },    /* 16321 / 256: 63, handles of 32 */
		{ 1, 1024, 64, 4 },  /* 1024 / 64: 16 */
		{ 7, 1024, 64, 16 }, /* 1024 / 256: 4, as for more live */
	};
	for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
		struct pt t;
		open_growth(&t, VPMM_REMAP_PRESSURE, 0);
		CUstream s = vpmm_host_stream_create(t.drv);
		CUdeviceptr a[7];
		for (int i = 0; i < c[k].live; i++)
			a[i] = PT_MALLOC(&t, 64 / c[k].live, s);
		if (c[k].room_pages) {
			struct vpmm_host_live l;
			vpmm_host_live(t.drv, &l);
			vpmm_host_set_tenant(t.drv, DEVICE_PAGES * PAGE - l.handle_bytes -
							    c[k].room_pages * PAGE);
			nanosleep(&(struct timespec){ .tv_nsec = 110 * 1000 * 1000 }, NULL);
		}
		struct grown g = grow_once(&t, c[k].grow, s);
		cr_expect_eq(g.room_growths, 1, "case %zu", k);
		cr_expect_eq(g.created, c[k].handles, "case %zu: %zu pages beside %d live: "
			     "made %llu handles, not %zu", k, c[k].grow, c[k].live,
			     (unsigned long long)g.created, c[k].handles);
		PT_FREE(&t, g.ptr, s);
		for (int i = 0; i < c[k].live; i++)
			PT_FREE(&t, a[i], s);
		pt_close(&t);
	}
}

/* Less room than 16 times the request: a defragmentation serves it. */
Test(growth, shrinking_room_remaps)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr *p = scatter(&t, s, 200, 8, 100); /* 1 % free: the spare share */
	struct vpmm_host_live l;
	vpmm_host_live(t.drv, &l);
	/* 200 pages left: under 16 x 16. */
	vpmm_host_set_tenant(t.drv, DEVICE_PAGES * PAGE - l.handle_bytes - 200 * PAGE);
	nanosleep(&(struct timespec){ .tv_nsec = 110 * 1000 * 1000 }, NULL);
	struct grown g = grow_once(&t, 16, s);
	cr_expect_eq(g.room_growths, 0);
	cr_expect_gt(g.remapped, 0);
	PT_FREE(&t, g.ptr, s);
	unscatter(&t, s, p, 200);
	pt_close(&t);
}

/* The device fills between two reads of its free memory: the growth the
 * pool planned is refused by the driver, and the request is served by
 * remapping the free pages instead; later growths wait for the next read. */
Test(growth, refused_growth_falls_back_to_remapping)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr *p = scatter(&t, s, 200, 8, 100); /* 1 % free: a growth */
	/* The pool read the device's free memory at its last growth; now
	 * another process takes all of it. */
	vpmm_host_set_tenant(t.drv, DEVICE_PAGES * PAGE);
	struct grown g = grow_once(&t, 16, s);
	cr_expect_eq(g.refusals, 1, "the refused growth was not counted");
	cr_expect_eq(g.room_growths, 0);
	cr_expect_gt(g.remapped, 0, "the request was not served from the free pages");
	/* Until the next read, the pool counts no room: no growth tried.
	 * Two pieces of 8 pages apart, neither fits 16: remapped, with no
	 * create (one would be refused again). */
	unsigned long creates = vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE);
	PT_FREE(&t, p[1], s);
	PT_FREE(&t, p[3], s);
	p[1] = p[3] = 0;
	struct grown again = grow_once(&t, 16, s);
	cr_expect_eq(again.refusals, 0);
	cr_expect_gt(again.remapped, 0);
	cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE), creates);
	PT_FREE(&t, again.ptr, s);
	PT_FREE(&t, g.ptr, s);
	/* Nothing left anywhere: a clean out of memory, the pool intact. */
	CUdeviceptr q = 0;
	cr_expect_eq(vpmm_pool_malloc(t.pool, 64 * PAGE, s, &q), -ENOMEM);
	PT_CHECK(&t);
	vpmm_host_set_tenant(t.drv, 0);
	unscatter(&t, s, p, 200);
	pt_close(&t);
}

/* VPMM_LIMIT bounds the room as the device does: with the limit near,
 * the pool remaps; far from it, it grows. */
Test(growth, the_limit_is_room_too)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 1800); /* 1800 pages */
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr *p = scatter(&t, s, 200, 8, 100); /* 1600 mapped, 16 free */
	struct grown g = grow_once(&t, 16, s);       /* 200 pages of room < 16 x 16 */
	cr_expect_eq(g.room_growths, 0);
	cr_expect_gt(g.remapped, 0);
	cr_expect_leq(pt_stats(&t).headroom, 200 * PAGE);
	PT_FREE(&t, g.ptr, s);
	unscatter(&t, s, p, 200);
	pt_close(&t);
}

/* The device's free memory is read at most once per 100 ms on the growth
 * path, and at most once a second on a malloc served from free memory (for
 * the placement: place.c), never more. */
Test(growth, free_memory_is_read_rarely)
{
	struct pt t;
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CUdeviceptr p[200];
	for (int i = 0; i < 200; i++) /* 200 growths */
		p[i] = PT_MALLOC(&t, 1 + i % 3, s);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	unsigned long reads = vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	cr_expect_geq(reads, 1);
	cr_expect_leq(reads, 1 + (unsigned long)(ms / 100), "%lu reads in %.0f ms", reads, ms);
	for (int i = 0; i < 200; i++) /* reuse: no growth */
		PT_FREE(&t, p[i], s);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 200; i++)
		p[i] = PT_MALLOC(&t, 1 + i % 3, s);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	unsigned long more = vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO) - reads;
	cr_expect_leq(more, 1 + (unsigned long)(ms / 1000), "%lu reads in 200 reusing mallocs, %.0f ms",
		      more, ms);
	for (int i = 0; i < 200; i++)
		PT_FREE(&t, p[i], s);
	pt_close(&t);
}

/* The pool's clock (vpmm_pool_set_clock), as vpmm-replay sets it to the
 * log's time. */
static uint64_t test_clock(void *arg)
{
	return *(const uint64_t *)arg;
}

/* The same rule on the pool's clock, exactly: one read for any number of
 * growths within 100 ms of it, the next once the clock has moved 100 ms. */
Test(growth, free_memory_reads_follow_the_pools_clock)
{
	struct pt t;
	uint64_t now = 5000000000ull; /* 5 s */
	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	vpmm_pool_set_clock(t.pool, test_clock, &now);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[50];
	for (int i = 0; i < 50; i++) /* growths, the clock standing */
		p[i] = PT_MALLOC(&t, 1 + i % 3, s);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 1);
	now += 99999999; /* 100 ms less 1 ns */
	CUdeviceptr q = PT_MALLOC(&t, 3, s);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 1,
		     "read again before 100 ms of the pool's clock");
	now += 1;
	CUdeviceptr r = PT_MALLOC(&t, 3, s);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 2,
		     "not read again 100 ms later on the pool's clock");
	vpmm_pool_set_clock(t.pool, NULL, NULL); /* the host's: seconds on */
	CUdeviceptr u = PT_MALLOC(&t, 3, s);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 3,
		     "the host's clock, restored, did not count");
	PT_FREE(&t, q, s);
	PT_FREE(&t, r, s);
	PT_FREE(&t, u, s);
	for (int i = 0; i < 50; i++)
		PT_FREE(&t, p[i], s);
	pt_close(&t);
}

/* Parked allocations count as live until a flush gives them back: frees
 * that reached a stream's cache and then the pool leave the count as it
 * was before their mallocs. 17 allocations freed into 16-entry caches and
 * flushed by a trim, then one live: a growth of 256 pages is two handles
 * (16320 / 64: 255, handles of 128), not eight (1/256, as for 17 live). */
Test(growth, flushed_parked_allocations_are_not_live)
{
	struct pt t;
	struct pt_setup su = growth_setup(VPMM_REMAP_PRESSURE, 0);
	su.front_entries = 16;
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a[17];
	for (int i = 0; i < 17; i++)
		a[i] = PT_MALLOC(&t, 4, s);
	for (int i = 0; i < 17; i++)
		PT_FREE(&t, a[i], s);
	cr_assert_eq(pt_stats(&t).parked, 16 * 4 * PAGE,
		     "not 16 entries parked: the case tests nothing");
	pt_settle(&t);
	cr_assert_geq(vpmm_pool_trim(t.pool, 0), 0);
	cr_assert_eq(pt_stats(&t).parked, 0, "the trim left parked entries");
	CUdeviceptr one = PT_MALLOC(&t, 64, s);
	struct grown g = grow_once(&t, 256, s);
	cr_expect_eq(g.room_growths, 1);
	cr_expect_eq(g.created, 2, "256 pages beside one live allocation: made %llu handles",
		     (unsigned long long)g.created);
	PT_FREE(&t, g.ptr, s);
	PT_FREE(&t, one, s);
	pt_close(&t);
}

/* A defragmentation's handles are never finer than the split rule makes
 * them: 1/64 of a pool the growth outweighs is a page or a few. VPMM_PAGES
 * mapped up front into the empty pool, and a large request on a small pool
 * holding more than its spare share free, are made of handles of what the
 * room allows (1/32 of it with nothing live, 512 pages here; 1/192 with 5
 * allocations live, 64 pages), not of one page each. */
Test(growth, a_defragmentation_is_never_finer_than_the_split_rule)
{
	struct pt t;
	struct pt_setup su = growth_setup(VPMM_REMAP_PRESSURE, 0);
	su.initial_pages = 512;
	pt_open(&t, &su);
	/* 512 pages in handles of up to 16384 / 32 = 512 pages. */
	cr_expect_eq(pt_stats(&t).handles_created, 1, "512 pages up front: made %llu handles",
		     (unsigned long long)pt_stats(&t).handles_created);
	pt_close(&t);

	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr *p = scatter(&t, s, 10, 8, 2); /* 80 pages, half free */
	/* At most 600 pages lacking, in handles of a power of two within
	 * (16384 - 80) / 192 pages: 64. */
	struct grown g = grow_once(&t, 600, s);
	cr_expect_eq(g.room_growths, 0);
	cr_expect_leq(g.created, (600 + 63) / 64, "600 pages on an 80-page pool: made %llu handles",
		      (unsigned long long)g.created);
	PT_FREE(&t, g.ptr, s);
	unscatter(&t, s, p, 10);
	pt_close(&t);
}

/* The device's free memory cannot be read (cuMemGetInfo fails: no context,
 * an error): the pool knows nothing of the room and grows as
 * VPMM_REMAP=always does, until the next read finds the room again. */
Test(growth, unread_free_memory_grows_as_always)
{
	struct pt t;
	uint64_t always_created;
	open_growth(&t, VPMM_REMAP_ALWAYS, 0);
	CUstream s = vpmm_host_stream_create(t.drv);
	struct grown a = grow_once(&t, 600, s);
	always_created = a.created;
	PT_FREE(&t, a.ptr, s);
	pt_close(&t);

	open_growth(&t, VPMM_REMAP_PRESSURE, 0);
	s = vpmm_host_stream_create(t.drv);
	vpmm_host_fail(t.drv, VPMM_OP_MEM_INFO, 1, CUDA_ERROR_INVALID_CONTEXT);
	struct grown g = grow_once(&t, 600, s);
	cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 1);
	cr_expect_eq(g.room_growths, 0);
	cr_expect_eq(g.created, always_created, "600 pages, free memory unread: %llu handles, "
		     "always makes %llu", (unsigned long long)g.created,
		     (unsigned long long)always_created);
	/* Read again after GROWTH_READ_NS: room, one handle. */
	nanosleep(&(struct timespec){ .tv_nsec = 110 * 1000 * 1000 }, NULL);
	struct grown again = grow_once(&t, 16, s);
	cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), 2);
	cr_expect_eq(again.room_growths, 1);
	cr_expect_eq(again.created, 1);
	PT_FREE(&t, again.ptr, s);
	PT_FREE(&t, g.ptr, s);
	pt_close(&t);
}

/* With room, the first growth of an empty pool is one handle, as cudaMalloc
 * would make it; later growths are made of handles of GROWTH_COARSE_MAX
 * (64 MiB) at most, so that a request placed at a free region's start
 * strands little of a handle. 2 MiB pages, handles of up to 1 GiB, 256 GiB
 * of device: room for handles of 1 GiB whatever the live count (1/256 of
 * the room), so that only the 64 MiB bound makes the second growth's. */
Test(growth, room_handles_are_coarse_up_to_64_mib)
{
	struct pt t;
	struct pt_setup su = { .granularity = 2 * PT_MiB, .capacity = 256 * PT_GiB,
			       .unbacked = true, .va_pages = 4096,
			       .handle_pages = 512, .no_loop_growth = true };
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);
	struct grown g = grow_once(&t, 512, s); /* 1 GiB into an empty pool */
	cr_expect_eq(g.room_growths, 1);
	cr_expect_eq(g.created, 1, "first growth: %llu handles", (unsigned long long)g.created);
	g = grow_once(&t, 512, s); /* 1 GiB more: 16 handles of 64 MiB */
	cr_expect_eq(g.room_growths, 1);
	cr_expect_eq(g.created, 16, "second growth: %llu handles", (unsigned long long)g.created);
	pt_close(&t);
	/* A first growth above the largest power of two within it (1.5 GiB)
	 * is one handle too, where the split rule alone makes two. */
	su.capacity = 1024 * PT_GiB;
	su.handle_pages = 1024;
	pt_open(&t, &su);
	s = vpmm_host_stream_create(t.drv);
	g = grow_once(&t, 768, s);
	cr_expect_eq(g.created, 1, "1.5 GiB into an empty pool: %llu handles",
		     (unsigned long long)g.created);
	pt_close(&t);
}

/* A request more than the device holds free fails at once, under either
 * policy: no handle made and released (a 2 PiB request on the replay's
 * 1 PiB device took 87 s, a larger one ran out of host memory for the
 * handles' records), counted as a refusal; a request that fits is served
 * after it. Once the device's answer is GROWTH_READ_NS old, one that
 * another tenant's memory makes too large fails the same way (within it,
 * the driver refuses it, a handle at a time, as before). */
Test(growth, a_request_the_device_cannot_hold_fails_at_once)
{
	for (int always = 0; always < 2; always++) {
		struct pt t;
		open_growth(&t, always ? VPMM_REMAP_ALWAYS : VPMM_REMAP_PRESSURE, 0);
		CUstream s = vpmm_host_stream_create(t.drv);
		CUdeviceptr p = 0;
		uint64_t creates = vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE);
		cr_expect_eq(vpmm_pool_malloc(t.pool, 2 * DEVICE_PAGES * PAGE, s, &p), -ENOMEM);
		cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE), creates,
			     "always %d: handles made for a request twice the device", always);
		cr_expect_eq(pt_stats(&t).growth_refusals, 1, "always %d", always);
		struct grown g = grow_once(&t, DEVICE_PAGES / 2, s);
		cr_expect_geq(g.created, 1);
		vpmm_host_set_tenant(t.drv, DEVICE_PAGES / 4 * PAGE);
		nanosleep(&(struct timespec){ .tv_nsec = 110 * 1000 * 1000 }, NULL);
		creates = vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE);
		cr_expect_eq(vpmm_pool_malloc(t.pool, DEVICE_PAGES / 2 * PAGE, s, &p), -ENOMEM);
		cr_expect_eq(vpmm_host_calls(t.drv, VPMM_OP_MEM_CREATE), creates, "always %d",
			     always);
		/* asked once for both refusals' 100 ms, not once a growth */
		uint64_t asked = vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO);
		cr_expect_eq(vpmm_pool_malloc(t.pool, DEVICE_PAGES / 2 * PAGE, s, &p), -ENOMEM);
		cr_expect_leq(vpmm_host_calls(t.drv, VPMM_OP_MEM_INFO), asked + (always ? 0 : 1),
			      "always %d: the device asked again at once", always);
		cr_expect_eq(vpmm_pool_check(t.pool, stderr), 0);
		PT_FREE(&t, g.ptr, s);
		pt_close(&t);
	}
}
