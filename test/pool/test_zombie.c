/* test_zombie.c — the old address of a remapped page stays mapped (a zombie)
 * until the event queued with it completes; then a reclaim (explicit, or at
 * the start of the next malloc) unmaps it and it becomes a hole. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

#include "pool_test.h"

static void open64(struct pt *t)
{
	struct pt_setup su = { .va_pages = 64 };
	pt_open(t, &su);
}

/* [2][1], free the 2, +3: the 2 pages move behind the guard. */
static CUdeviceptr make_zombie(struct pt *t, CUstream s, CUdeviceptr *old)
{
	*old = PT_MALLOC(t, 2, s);
	PT_MALLOC(t, 1, s);
	PT_FREE(t, *old, s);
	CUdeviceptr q = PT_MALLOC(t, 3, s);
	PT_LAYOUT_IS(t, "[~2][1][3][*58]");
	return q;
}

Test(zombie, unmapped_only_after_its_event_completes)
{
	struct pt t;
	open64(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUstream other = vpmm_host_stream_create(t.drv);
	CUdeviceptr old;
	make_zombie(&t, s, &old);
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.zombies, 2 * t.page);
	cr_assert_eq(st.mapped, 3 * t.page + t.page,
		     "mapped %llu: a zombie is no extra physical memory",
		     (unsigned long long)st.mapped);
	struct vpmm_region_info r;
	cr_assert(pt_region_at(&t, old, &r));
	cr_assert_eq(r.kind, VPMM_REGION_ZOMBIE);

	int n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_eq(n, 0);
	PT_LAYOUT_IS(&t, "[~2][1][3][*58]");
	vpmm_host_stream_complete(t.drv, other);
	n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_eq(n, 0, "a zombie reclaimed after an unrelated stream completed");
	struct vpmm_host_live l0, l1;
	vpmm_host_live(t.drv, &l0);

	vpmm_host_complete_all(t.drv);
	n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_gt(n, 0);
	PT_LAYOUT_IS(&t, "[*2][1][3][*58]");
	st = pt_stats(&t);
	cr_assert_eq(st.zombies, 0);
	cr_assert_eq(st.holes, 60 * t.page);
	cr_assert_geq(st.zombies_reclaimed, 1);
	vpmm_host_live(t.drv, &l1);
	cr_assert_eq(l1.mappings + 2, l0.mappings,
		     "driver mappings %zu -> %zu: the 2 old pages not unmapped",
		     l0.mappings, l1.mappings);
	cr_assert_eq(l1.handles, l0.handles, "reclaim released physical pages");
	n = vpmm_pool_reclaim(t.pool);
	cr_assert_eq(n, 0, "a second reclaim found more");
	pt_close(&t);
}

Test(zombie, reclaimed_zombie_merges_with_adjacent_holes)
{
	struct pt t;
	open64(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUstream other = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s);
	CUdeviceptr b = PT_MALLOC(&t, 2, s);
	PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a, s);
	PT_MALLOC(&t, 3, s);
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*2][2][1][3][*56]");
	PT_FREE(&t, b, s);
	/* On another stream: b, still pending on s, cannot lend its pages in
	 * place behind the hole (the request would end in it); they move. */
	PT_MALLOC(&t, 4, other);
	PT_LAYOUT_IS(&t, "[*2][~2][1][3][4][*52]");
	pt_settle(&t);
	PT_LAYOUT_IS(&t, "[*4][1][3][4][*52]");
	pt_close(&t);
}

Test(zombie, next_malloc_reclaims_completed_zombies)
{
	struct pt t;
	open64(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr old;
	make_zombie(&t, s, &old);
	vpmm_host_complete_all(t.drv);
	struct vpmm_stats s0 = pt_stats(&t);
	PT_LAYOUT_IS(&t, "[~2][1][3][*58]");
	/* Phase 0 turns the zombie into a 2-page hole, the smallest that fits. */
	CUdeviceptr p = PT_MALLOC(&t, 1, s);
	struct vpmm_stats s1 = pt_stats(&t);
	cr_assert_gt(s1.zombies_reclaimed, s0.zombies_reclaimed);
	cr_assert_eq(p, old);
	PT_LAYOUT_IS(&t, "[1][*1][1][3][*58]");
	pt_close(&t);
}

Test(zombie, reclaimed_per_event)
{
	struct pt t;
	open64(&t);
	CUstream a = vpmm_host_stream_create(t.drv);
	CUstream b = vpmm_host_stream_create(t.drv);
	CUdeviceptr p[4];
	for (int i = 0; i < 4; i++) {
		p[i] = PT_MALLOC(&t, 1, a);
		PT_MALLOC(&t, 1, a);
	}
	PT_FREE(&t, p[0], a);
	PT_FREE(&t, p[1], a);
	PT_FREE(&t, p[2], b);
	PT_FREE(&t, p[3], b);
	PT_LAYOUT_IS(&t, "[-1][1][-1][1][-1][1][-1][1][*56]");
	PT_MALLOC(&t, 2, a);
	PT_LAYOUT_IS(&t, "[~1][1][~1][1][-1][1][-1][1][2][*54]");
	PT_MALLOC(&t, 2, b);
	PT_LAYOUT_IS(&t, "[~1][1][~1][1][~1][1][~1][1][2][2][*52]");
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, a), 0);
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, b), 0);
	vpmm_host_stream_complete(t.drv, a);
	int n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_gt(n, 0);
	PT_LAYOUT_IS(&t, "[*1][1][*1][1][~1][1][~1][1][2][2][*52]");
	vpmm_host_stream_complete(t.drv, b);
	cr_assert_gt(vpmm_pool_reclaim(t.pool), 0);
	PT_CHECK(&t);
	PT_LAYOUT_IS(&t, "[*1][1][*1][1][*1][1][*1][1][2][2][*52]");
	pt_close(&t);
}

/* Remapping moves physical pages, not bytes: the harvested pages come first
 * in the new allocation and carry what was written through the old address;
 * while the old address is a zombie both show the same memory. */
Test(zombie, remapped_pages_are_the_same_memory)
{
	struct pt t;
	open64(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s);
	size_t words = 2 * t.page / sizeof(uint64_t);
	uint64_t *old = (uint64_t *)(uintptr_t)a;
	for (size_t i = 0; i < words; i++)
		old[i] = 0xabcd000000000000ull + i;
	PT_MALLOC(&t, 1, s);
	PT_FREE(&t, a, s);
	CUdeviceptr q = PT_MALLOC(&t, 3, s);
	cr_assert_neq(q, a);
	uint64_t *neu = (uint64_t *)(uintptr_t)q;
	for (size_t i = 0; i < words; i++)
		cr_assert_eq(neu[i], 0xabcd000000000000ull + i,
			     "word %zu of the remapped pages: %#llx", i,
			     (unsigned long long)neu[i]);
	neu[7] = 42;
	cr_assert_eq(old[7], 42, "old and new address are not the same page");
	/* The created third page is usable too. */
	neu[words + 3] = 7;
	cr_assert_eq(neu[words + 3], 7);
	pt_settle(&t);
	cr_assert_eq(neu[0], 0xabcd000000000000ull, "reclaim touched the new mapping");
	pt_close(&t);
}

/* An unmap that fails leaves a zombie that a later reclaim finishes. */
Test(zombie, failed_unmap_is_retried_later)
{
	for (unsigned long nth = 1; nth <= 2; nth++) {
		struct pt t;
		open64(&t);
		CUstream s = vpmm_host_stream_create(t.drv);
		CUdeviceptr old;
		make_zombie(&t, s, &old);
		vpmm_host_complete_all(t.drv);
		vpmm_host_fail(t.drv, VPMM_OP_UNMAP, nth, CUDA_ERROR_UNKNOWN);
		unsigned long c0 = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
		int n = vpmm_pool_reclaim(t.pool);
		PT_CHECK(&t);
		unsigned long c1 = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
		vpmm_host_fail(t.drv, VPMM_OP_UNMAP, 0, CUDA_SUCCESS);
		if (c1 - c0 < nth) {
			/* One unmap for the whole zombie: nth 2 never came. */
			cr_assert_geq(n, 0);
			pt_close(&t);
			continue;
		}
		cr_assert(n == -EIO || n >= 0, "nth %lu: reclaim = %d", nth, n);
		if (n == -EIO)
			cr_assert_eq(vpmm_pool_last_result(t.pool), CUDA_ERROR_UNKNOWN);
		int n2 = vpmm_pool_reclaim(t.pool);
		PT_CHECK(&t);
		cr_assert_geq(n2, 0);
		cr_assert(n > 0 || n2 > 0, "nth %lu: the zombie was never reclaimed", nth);
		PT_LAYOUT_IS(&t, "[*2][1][3][*58]");
		pt_close(&t);
	}
}

struct held_malloc {
	struct pt *t;
	CUstream s;
	CUdeviceptr p;
	int rc;
	bool done; /* atomic */
};

static void *malloc_thread(void *arg)
{
	struct held_malloc *h = arg;
	h->rc = vpmm_pool_malloc(h->t->pool, 4 * h->t->page, h->s, &h->p);
	__atomic_store_n(&h->done, true, __ATOMIC_RELEASE);
	return NULL;
}

/* Polls cond for up to 2 s (a loaded machine may be slow to schedule the
 * pool's thread). */
static bool wait_for(struct pt *t, bool (*cond)(struct pt *, uint64_t), uint64_t arg)
{
	for (int i = 0; i < 2000; i++) {
		if (cond(t, arg))
			return true;
		usleep(1000);
	}
	return cond(t, arg);
}

static bool maps_above(struct pt *t, uint64_t n)
{
	return vpmm_host_calls(t->drv, VPMM_OP_MAP) > n;
}

static bool deferred_at_least(struct pt *t, uint64_t n)
{
	return pt_stats(t).reclaims_deferred >= n;
}

static bool zombies_at_most(struct pt *t, uint64_t n)
{
	return pt_stats(t).zombies <= n;
}

static bool released_at_least(struct pt *t, uint64_t pages)
{
	return pt_stats(t).pages_released >= pages;
}

/* The same, completing the device's work on every look. */
static bool released_at_least_running(struct pt *t, uint64_t pages)
{
	vpmm_host_complete_all(t->drv);
	return released_at_least(t, pages);
}

/* A growth on its own stream, held inside its first map. */
static void hold_a_mapping_caller(struct pt *t, struct held_malloc *h, pthread_t *th)
{
	unsigned long maps = vpmm_host_calls(t->drv, VPMM_OP_MAP);
	vpmm_host_gate(t->drv, VPMM_OP_MAP, true);
	*h = (struct held_malloc){ .t = t, .s = vpmm_host_stream_create(t->drv) };
	cr_assert_eq(pthread_create(th, NULL, malloc_thread, h), 0);
	cr_assert(wait_for(t, maps_above, maps), "the growth never reached its map");
}

static void release_the_caller(struct pt *t, struct held_malloc *h, pthread_t th)
{
	vpmm_host_gate(t->drv, VPMM_OP_MAP, false);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_eq(h->rc, 0, "the held growth failed: %d", h->rc);
	PT_FREE(t, h->p, h->s);
}

/* A pool with the background thread, a zombie whose work is pending, and a
 * caller held inside a map. */
static void zombie_beside_a_mapping_caller(struct pt *t, struct held_malloc *h,
					   pthread_t *th)
{
	struct pt_setup su = { .va_pages = 64, .background = true };
	pt_open(t, &su);
	CUdeviceptr old;
	make_zombie(t, vpmm_host_stream_create(t->drv), &old);
	hold_a_mapping_caller(t, h, th);
}

static bool unmaps_above(struct pt *t, uint64_t n)
{
	return vpmm_host_calls(t->drv, VPMM_OP_UNMAP) > n;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The driver serialises a caller's maps with the thread's unmaps, so the
 * thread leaves a ready zombie alone while a caller is mapping (until
 * VPMM_RECLAIM_DEFER_MAX rounds have passed), and unmaps it once the
 * caller is done. */
Test(zombie, background_thread_waits_for_a_caller_mapping)
{
	struct pt t;
	struct held_malloc h;
	pthread_t th;
	zombie_beside_a_mapping_caller(&t, &h, &th);

	unsigned long unmaps = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	vpmm_host_complete_all(t.drv); /* the zombie is ready */
	cr_assert(wait_for(&t, deferred_at_least, 1),
		  "the thread did not wait for the caller (zombies %llu)",
		  (unsigned long long)pt_stats(&t).zombies);
	/* Unmaps first: one seen there came after every round counted. */
	unsigned long now = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	struct vpmm_stats st = pt_stats(&t);
	if (now != unmaps)
		cr_assert_geq(st.reclaims_deferred, VPMM_RECLAIM_DEFER_MAX,
			      "unmapped beside a caller's map after %llu rounds",
			      (unsigned long long)st.reclaims_deferred);
	else
		cr_assert_eq(st.zombies, 2 * t.page);
	release_the_caller(&t, &h, th);
	cr_assert(wait_for(&t, zombies_at_most, 0),
		  "the zombie stayed after the caller finished");
	cr_assert_eq(pt_stats(&t).zombies_reclaimed, 1);
	pt_close(&t);
}

/* A caller that keeps mapping does not keep the zombies forever: after
 * VPMM_RECLAIM_DEFER_MAX rounds of up to VPMM_RECLAIM_DEFER_NS each, the
 * thread unmaps them regardless. */
Test(zombie, background_thread_waits_only_so_long)
{
	struct pt t;
	struct held_malloc h;
	pthread_t th;
	uint64_t t0 = now_ns();
	zombie_beside_a_mapping_caller(&t, &h, &th);

	unsigned long unmaps = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	vpmm_host_complete_all(t.drv);
	cr_assert(wait_for(&t, zombies_at_most, 0),
		  "the zombie stayed while the caller kept mapping");
	uint64_t waited = now_ns() - t0;
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_geq(st.reclaims_deferred, VPMM_RECLAIM_DEFER_MAX,
		      "unmapped after %llu rounds of waiting, not %d",
		      (unsigned long long)st.reclaims_deferred, VPMM_RECLAIM_DEFER_MAX);
	/* Rounds end early only when a mapping ends, and none did. */
	cr_assert_geq(waited, (uint64_t)VPMM_RECLAIM_DEFER_MAX * VPMM_RECLAIM_DEFER_NS / 2,
		      "%d rounds in %llu ns: the thread did not wait in them",
		      VPMM_RECLAIM_DEFER_MAX, (unsigned long long)waited);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_UNMAP), unmaps + 2,
		     "the 2 old pages not unmapped one by one");
	cr_assert(!__atomic_load_n(&h.done, __ATOMIC_ACQUIRE),
		  "the caller was not held all along");
	release_the_caller(&t, &h, th);
	pt_close(&t);
}

/* With VPMM_RELEASE_THRESHOLD the thread also unmaps free memory past the
 * threshold (a trim), and that waits for a caller's maps as the zombies'
 * unmaps do: here 8 pages freed on a stream while a growth on another is
 * held in its map. Once the caller is done, the trim runs. */
Test(zombie, a_trim_waits_for_a_caller_mapping)
{
	struct pt t;
	struct held_malloc h;
	pthread_t th;
	struct pt_setup su = { .va_pages = 64, .background = true, .release = true };
	pt_open(&t, &su);
	CUstream s1 = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 8, s1);
	hold_a_mapping_caller(&t, &h, &th);
	unsigned long unmaps = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	uint64_t deferred = pt_stats(&t).reclaims_deferred;
	PT_FREE(&t, a, s1);
	vpmm_host_complete_all(t.drv); /* the freed pages may go */
	cr_assert(wait_for(&t, deferred_at_least, deferred + 1),
		  "the thread did not wait for the caller (reusable %llu)",
		  (unsigned long long)pt_stats(&t).reusable);
	unsigned long now = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	struct vpmm_stats st = pt_stats(&t);
	if (now != unmaps)
		cr_assert_geq(st.reclaims_deferred, deferred + VPMM_RECLAIM_DEFER_MAX,
			      "trimmed beside a caller's map after %llu rounds",
			      (unsigned long long)(st.reclaims_deferred - deferred));
	else
		cr_assert_eq(st.pages_released, 0);
	release_the_caller(&t, &h, th);
	/* The trim may have recorded the event it needs on s1 only now: the
	 * device keeps running meanwhile, as a real one would. */
	cr_assert(wait_for(&t, released_at_least_running, 8),
		  "no trim after the caller finished: released %llu, reusable %llu",
		  (unsigned long long)pt_stats(&t).pages_released,
		  (unsigned long long)pt_stats(&t).reusable);
	pt_close(&t);
}

/* A caller that starts mapping while the thread is half way through a
 * zombie: the unmapped half becomes a hole, the rest stays a zombie, and
 * the event they shared goes back (vpmm_pool_check counts an event held by
 * anything but a zombie). */
Test(zombie, a_zombie_deferred_half_way)
{
	struct pt t;
	struct pt_setup su = { .va_pages = 64, .background = true };
	pt_open(&t, &su);
	CUdeviceptr old;
	make_zombie(&t, vpmm_host_stream_create(t.drv), &old);
	unsigned long unmaps = vpmm_host_calls(t.drv, VPMM_OP_UNMAP);
	vpmm_host_gate(t.drv, VPMM_OP_UNMAP, true);
	vpmm_host_complete_all(t.drv);
	cr_assert(wait_for(&t, unmaps_above, unmaps), "the thread never unmapped");
	struct held_malloc h;
	pthread_t th;
	hold_a_mapping_caller(&t, &h, &th); /* while the first unmap waits */
	vpmm_host_gate(t.drv, VPMM_OP_UNMAP, false);
	cr_assert(wait_for(&t, deferred_at_least, 1), "the second unmap was not deferred");
	struct vpmm_stats st = pt_stats(&t);
	cr_assert_eq(st.zombies, t.page, "zombies %llu after half a zombie",
		     (unsigned long long)st.zombies);
	PT_CHECK(&t);
	release_the_caller(&t, &h, th);
	cr_assert(wait_for(&t, zombies_at_most, 0), "the rest stayed a zombie");
	PT_CHECK(&t);
	pt_close(&t);
}

/* The pool's thread takes none of the program's signals: created from
 * whichever thread allocated first, it would otherwise inherit a mask
 * without the signals the program later blocks to sigwait() for them, and
 * the kernel would hand it a SIGTERM with its default action (review). */
Test(zombie, the_background_thread_takes_no_signal)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64, .background = true};
	pt_open(&t, &su);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	cr_assert_eq(pthread_sigmask(SIG_BLOCK, &set, NULL), 0);
	cr_assert_eq(kill(getpid(), SIGUSR1), 0);
	/* Time for a thread that does not block it to take it (and die of
	 * it): taken at once, the signal would go to this thread's wait. */
	struct timespec pause = {0, 300 * 1000 * 1000}, wait = {2, 0};
	nanosleep(&pause, NULL);
	cr_assert_eq(sigtimedwait(&set, NULL, &wait), SIGUSR1,
		     "SIGUSR1 did not stay pending for the thread that blocked it");
	pt_close(&t);
}

/* The context the pool's events live in ends (the shim's
 * vpmm_context_ending: poll, synchronise, poll, drop the events) while a
 * zombie still holds the event of its old address. The driver destroys
 * every event of the context with it, so the pool must destroy them all
 * itself first and never record one again: an event a zombie held went back
 * to the cache once the zombie was unmapped, and the next free recorded it,
 * dead, in the next context (CUDA_ERROR_INVALID_HANDLE, or a crash inside
 * libcuda). */
Test(zombie, context_end_leaves_no_event_to_reuse)
{
	struct pt t;
	open64(&t);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr old;
	CUdeviceptr q = make_zombie(&t, s, &old);
	cr_assert_eq(pt_stats(&t).zombies, 2 * t.page);

	vpmm_pool_poll(t.pool, true);
	vpmm_host_complete_all(t.drv);
	vpmm_pool_poll(t.pool, false);
	vpmm_pool_drop_events(t.pool, NULL, true);
	PT_CHECK(&t);
	struct vpmm_host_live l;
	vpmm_host_live(t.drv, &l);
	cr_assert_eq(l.events, 0, "%zu event(s) of the ended context left to the pool", l.events);

	/* The zombie goes (its work completed with the context), freeing the
	 * event it held, and a stream of the next context gets events made
	 * anew: none of the ended context's comes back from the cache. */
	cr_assert_gt(vpmm_pool_reclaim(t.pool), 0);
	cr_assert_eq(pt_stats(&t).zombies, 0);
	CUstream u = vpmm_host_stream_create(t.drv);
	unsigned long made = vpmm_host_calls(t.drv, VPMM_OP_EVENT_CREATE);
	PT_FREE(&t, q, u);
	cr_assert_geq(vpmm_pool_poll(t.pool, true), 0);
	cr_assert_eq(vpmm_host_calls(t.drv, VPMM_OP_EVENT_CREATE), made + 1,
		     "the free's event came from the cache");
	PT_CHECK(&t);
	pt_close(&t);
}
