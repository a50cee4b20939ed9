/* test_rollback.c — a malloc that fails leaves the pool as it was: the same
 * regions, the same gauges, the same driver objects, and the same request
 * succeeds once the fault is gone. Every call of every driver operation made
 * by a defragmenting malloc is failed in turn (host driver fault injection);
 * out-of-memory also comes from a small device and from cfg.limit. */
#include "pool_test.h"

struct ctx {
	struct pt t;
	CUstream a, b;
	size_t target; /* pages of the malloc under test */
	CUstream on;   /* its stream */
};

/* A new VA chunk, harvest from the caller's stream and (behind a wait) from
 * another stream, and new pages:
 *   [-4 a][-4 b][1][~2][2][3], then +10 on a. */
static void build_chunk(struct ctx *c)
{
	struct pt_setup su = { .va_pages = 16 };
	pt_open(&c->t, &su);
	struct pt *t = &c->t;
	c->a = vpmm_host_stream_create(t->drv);
	c->b = vpmm_host_stream_create(t->drv);
	CUdeviceptr a = PT_MALLOC(t, 4, c->a);
	CUdeviceptr b = PT_MALLOC(t, 4, c->b);
	PT_MALLOC(t, 1, c->a);
	CUdeviceptr x = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 2, c->a);
	PT_LAYOUT_IS(t, "[4][4][1][2][2][*3]");
	PT_FREE(t, x, c->a);
	PT_MALLOC(t, 3, c->a);
	PT_FREE(t, a, c->a);
	PT_FREE(t, b, c->b);
	PT_LAYOUT_IS(t, "[-4][-4][1][~2][2][3]");
	c->target = 10;
	c->on = c->a;
}

/* The allocation starts at a free region in front of the hole, harvests the
 * caller's other region and creates one page: [-3][1][-2][*26], then +6. */
static void build_prefix(struct ctx *c)
{
	struct pt_setup su = { .va_pages = 32 };
	pt_open(&c->t, &su);
	struct pt *t = &c->t;
	c->a = vpmm_host_stream_create(t->drv);
	c->b = vpmm_host_stream_create(t->drv);
	CUdeviceptr a = PT_MALLOC(t, 3, c->a);
	PT_MALLOC(t, 1, c->a);
	CUdeviceptr b = PT_MALLOC(t, 2, c->a);
	PT_FREE(t, a, c->a);
	PT_FREE(t, b, c->a);
	PT_LAYOUT_IS(t, "[-3][1][-2][*26]");
	c->target = 6;
	c->on = c->a;
}

/* Settled initial pages harvested and grown into a fresh chunk:
 * [-2 settled][2][-2 settled][2], then +8 on b. */
static void build_settled(struct ctx *c)
{
	struct pt_setup su = { .va_pages = 8, .initial_pages = 8 };
	pt_open(&c->t, &su);
	struct pt *t = &c->t;
	c->a = vpmm_host_stream_create(t->drv);
	c->b = vpmm_host_stream_create(t->drv);
	CUdeviceptr x = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 2, c->a);
	CUdeviceptr y = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 2, c->a);
	PT_FREE(t, x, c->a);
	PT_FREE(t, y, c->a);
	vpmm_host_complete_all(t->drv);
	PT_LAYOUT_IS(t, "[-2][2][-2][2]");
	c->target = 8;
	c->on = c->b;
}

/* The allocation ends in a free region behind a hole, created into the
 * end of the hole: [*3][-2][1][4][*22], then +3. */
static void build_suffix(struct ctx *c)
{
	struct pt_setup su = { .va_pages = 32 };
	pt_open(&c->t, &su);
	struct pt *t = &c->t;
	c->a = vpmm_host_stream_create(t->drv);
	c->b = vpmm_host_stream_create(t->drv);
	CUdeviceptr x = PT_MALLOC(t, 3, c->a);
	CUdeviceptr y = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 1, c->a);
	PT_FREE(t, x, c->a);
	PT_MALLOC(t, 4, c->a);
	pt_settle(t);
	PT_FREE(t, y, c->a);
	PT_LAYOUT_IS(t, "[*3][-2][1][4][*22]");
	c->target = 3;
	c->on = c->a;
}

/* A long event interval: the second free joins the open epoch, so the
 * malloc on b must close it (create and record an event) and wait for both:
 * [-2][1][-2][1][*26], both freed on a, then +4 on b. */
static void build_epoch(struct ctx *c)
{
	struct pt_setup su = { .va_pages = 32,
			       .event_interval_ns = 10ull * 1000 * 1000 * 1000 };
	pt_open(&c->t, &su);
	struct pt *t = &c->t;
	c->a = vpmm_host_stream_create(t->drv);
	c->b = vpmm_host_stream_create(t->drv);
	CUdeviceptr x = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 1, c->a);
	CUdeviceptr y = PT_MALLOC(t, 2, c->a);
	PT_MALLOC(t, 1, c->a);
	PT_FREE(t, x, c->a);
	PT_FREE(t, y, c->a);
	PT_LAYOUT_IS(t, "[-2][1][-2][1][*26]");
	c->target = 4;
	c->on = c->b;
}

typedef void (*builder)(struct ctx *);

/* Driver calls per operation made by the target malloc, fault free. */
static void measure(builder build, unsigned long calls[VPMM_OP_COUNT])
{
	struct ctx c;
	build(&c);
	unsigned long before[VPMM_OP_COUNT];
	for (int op = 0; op < VPMM_OP_COUNT; op++)
		before[op] = vpmm_host_calls(c.t.drv, (enum vpmm_op)op);
	PT_MALLOC(&c.t, c.target, c.on);
	for (int op = 0; op < VPMM_OP_COUNT; op++)
		calls[op] = vpmm_host_calls(c.t.drv, (enum vpmm_op)op) - before[op];
	pt_close(&c.t);
}

/* Operations whose failure must fail the malloc. The others may be
 * absorbed (an event recorded only to learn of completion sooner, a query),
 * but then the malloc must succeed consistently. */
static bool must_fail(enum vpmm_op op)
{
	switch (op) {
	case VPMM_OP_VA_RESERVE:
	case VPMM_OP_MEM_CREATE:
	case VPMM_OP_MAP:
	case VPMM_OP_SET_ACCESS:
	case VPMM_OP_STREAM_WAIT:
		return true;
	default:
		return false;
	}
}

/* Operations with a test of their own below. */
static bool named(enum vpmm_op op)
{
	return must_fail(op) || op == VPMM_OP_EVENT_CREATE || op == VPMM_OP_EVENT_RECORD;
}

static void inject_one(builder build, enum vpmm_op op, unsigned long nth,
		       CUresult code)
{
	struct ctx c;
	build(&c);
	struct pt *t = &c.t;
	struct pt_snap snap;
	pt_snap(t, &snap);
	const char *name = vpmm_op_name(op);
	unsigned long c0 = vpmm_host_calls(t->drv, op);
	vpmm_host_fail(t->drv, op, nth, code);
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, c.target * t->page, c.on, &p);
	unsigned long c1 = vpmm_host_calls(t->drv, op);
	vpmm_host_fail(t->drv, op, 0, CUDA_SUCCESS);
	cr_assert_geq(c1 - c0, nth, "%s #%lu: the malloc made only %lu calls this time",
		      name, nth, c1 - c0);
	int want = code == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	char what[96];
	snprintf(what, sizeof what, "%s #%lu failing with %d", name, nth, (int)code);

	/* An out-of-memory failure may be recovered by the pool's last resort
	 * (wait for every stream's frees, return empty slabs, plan once more):
	 * then the first attempt's rollback shows in the checks of the else
	 * branch and in the leak check at the end. */
	bool recovered = rc == 0 && code == CUDA_ERROR_OUT_OF_MEMORY;
	if ((must_fail(op) && !recovered) || rc != 0) {
		cr_assert_eq(rc, want, "%s: malloc returned %d, expected %d", what, rc, want);
		cr_assert_eq(vpmm_pool_last_result(t->pool), code,
			     "%s: last_result %d", what, (int)vpmm_pool_last_result(t->pool));
		PT_UNCHANGED(t, &snap, what);
		cr_assert_eq(pt_stats(t).failures, snap.st.failures + 1,
			     "%s: failures not counted", what);
		pt_malloc_at(t, c.target * t->page, c.on, __LINE__);
	} else {
		size_t bad = vpmm_pool_check(t->pool, stderr);
		cr_assert_eq(bad, 0, "%s absorbed, but check finds %zu", what, bad);
		CUdeviceptr base; size_t sz;
		cr_assert_eq(vpmm_pool_find(t->pool, p, &base, &sz), 0, "%s", what);
		cr_assert_eq(sz, c.target * t->page, "%s", what);
	}
	pt_settle(t);
	pt_close(t);
}

/* Fail each call of `op` made by the target malloc in turn. */
static void sweep(builder build, const char *scen, enum vpmm_op op, CUresult code)
{
	unsigned long calls[VPMM_OP_COUNT];
	measure(build, calls);
	if (calls[op] == 0)
		cr_skip_test("the %s malloc makes no %s call", scen, vpmm_op_name(op));
	for (unsigned long nth = 1; nth <= calls[op]; nth++)
		inject_one(build, op, nth, code);
	cr_log_info("%s: failed each of %lu %s calls", scen, calls[op], vpmm_op_name(op));
}

#define FAULT(scen, name, op, code)                                            \
	Test(rollback, scen##_##name) { sweep(build_##scen, #scen, op, code); }

/* The other operations the malloc calls (queries, capture checks, ...). */
#define FAULT_OTHERS(scen)                                                     \
	Test(rollback, scen##_every_other_op) {                                 \
		unsigned long calls[VPMM_OP_COUNT];                             \
		measure(build_##scen, calls);                                   \
		unsigned long n = 0;                                            \
		for (int op = 0; op < VPMM_OP_COUNT; op++) {                    \
			if (named((enum vpmm_op)op))                            \
				continue;                                       \
			for (unsigned long k = 1; k <= calls[op]; k++, n++)     \
				inject_one(build_##scen, (enum vpmm_op)op, k,   \
					   CUDA_ERROR_UNKNOWN);                 \
		}                                                               \
		cr_log_info(#scen ": %lu other calls failed in turn", n);       \
	}

#define OOM CUDA_ERROR_OUT_OF_MEMORY
#define BAD CUDA_ERROR_UNKNOWN

FAULT(chunk, va_reserve, VPMM_OP_VA_RESERVE, BAD)
FAULT(chunk, va_reserve_oom, VPMM_OP_VA_RESERVE, OOM)
FAULT(chunk, mem_create_oom, VPMM_OP_MEM_CREATE, OOM)
FAULT(chunk, mem_create_other, VPMM_OP_MEM_CREATE, CUDA_ERROR_INVALID_VALUE)
FAULT(chunk, map, VPMM_OP_MAP, BAD)
FAULT(chunk, set_access, VPMM_OP_SET_ACCESS, BAD)
FAULT(chunk, stream_wait, VPMM_OP_STREAM_WAIT, BAD)
FAULT_OTHERS(chunk)

FAULT(prefix, mem_create_oom, VPMM_OP_MEM_CREATE, OOM)
FAULT(prefix, mem_create_other, VPMM_OP_MEM_CREATE, CUDA_ERROR_INVALID_VALUE)
FAULT(prefix, map, VPMM_OP_MAP, BAD)
FAULT(prefix, set_access, VPMM_OP_SET_ACCESS, BAD)
FAULT_OTHERS(prefix)

FAULT(suffix, mem_create_oom, VPMM_OP_MEM_CREATE, OOM)
FAULT(suffix, mem_create_other, VPMM_OP_MEM_CREATE, CUDA_ERROR_INVALID_VALUE)
FAULT(suffix, map, VPMM_OP_MAP, BAD)
FAULT(suffix, set_access, VPMM_OP_SET_ACCESS, BAD)
FAULT_OTHERS(suffix)

FAULT(settled, va_reserve, VPMM_OP_VA_RESERVE, BAD)
FAULT(settled, mem_create_oom, VPMM_OP_MEM_CREATE, OOM)
FAULT(settled, map, VPMM_OP_MAP, BAD)
FAULT(settled, set_access, VPMM_OP_SET_ACCESS, BAD)
FAULT_OTHERS(settled)

FAULT(epoch, event_create, VPMM_OP_EVENT_CREATE, BAD)
FAULT(epoch, event_record, VPMM_OP_EVENT_RECORD, BAD)
FAULT(epoch, stream_wait, VPMM_OP_STREAM_WAIT, BAD)
FAULT(epoch, map, VPMM_OP_MAP, BAD)
FAULT(epoch, set_access, VPMM_OP_SET_ACCESS, BAD)
FAULT_OTHERS(epoch)

/* The scenarios themselves, fault free: what the sweeps roll back from. */
Test(rollback, scenarios_succeed_as_designed)
{
	struct ctx c;
	build_chunk(&c);
	unsigned long w0 = vpmm_host_stream_wait_count(c.t.drv, c.a);
	struct vpmm_stats s0 = pt_stats(&c.t);
	PT_MALLOC(&c.t, c.target, c.a);
	struct vpmm_stats s1 = pt_stats(&c.t);
	cr_assert_eq(s1.reserved, 32 * c.t.page, "no second chunk");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 8);
	cr_assert_eq(s1.pages_created - s0.pages_created, 2);
	cr_assert_eq(vpmm_host_stream_wait_count(c.t.drv, c.a), w0 + 1);
	pt_settle(&c.t);
	pt_close(&c.t);

	build_prefix(&c);
	s0 = pt_stats(&c.t);
	CUdeviceptr p = PT_MALLOC(&c.t, c.target, c.a);
	s1 = pt_stats(&c.t);
	PT_LAYOUT_IS(&c.t, "[~3][1][6][*22]");
	struct vpmm_region_info r0;
	vpmm_pool_regions(c.t.pool, &r0, 1);
	cr_assert_eq(p, r0.va + 4 * c.t.page, "+6 does not start at the free [-2]");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 3);
	cr_assert_eq(s1.pages_created - s0.pages_created, 1);
	pt_close(&c.t);

	build_suffix(&c);
	s0 = pt_stats(&c.t);
	p = PT_MALLOC(&c.t, c.target, c.a);
	s1 = pt_stats(&c.t);
	PT_LAYOUT_IS(&c.t, "[*2][3][1][4][*22]");
	vpmm_pool_regions(c.t.pool, &r0, 1);
	cr_assert_eq(p, r0.va + 2 * c.t.page, "+3 does not end with the free [-2]");
	cr_assert_eq(s1.pages_remapped, s0.pages_remapped);
	cr_assert_eq(s1.pages_created - s0.pages_created, 1);
	pt_close(&c.t);

	build_settled(&c);
	s0 = pt_stats(&c.t);
	PT_MALLOC(&c.t, c.target, c.b);
	s1 = pt_stats(&c.t);
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 4);
	cr_assert_eq(s1.pages_created - s0.pages_created, 4);
	cr_assert_eq(s1.reserved, 16 * c.t.page);
	pt_close(&c.t);

	build_epoch(&c);
	s0 = pt_stats(&c.t);
	PT_MALLOC(&c.t, c.target, c.on);
	s1 = pt_stats(&c.t);
	PT_LAYOUT_IS(&c.t, "[~2][1][~2][1][4][*22]");
	cr_assert_eq(s1.pages_remapped - s0.pages_remapped, 4);
	cr_assert_eq(s1.pages_created, s0.pages_created);
	cr_assert_gt(vpmm_host_stream_wait_count(c.t.drv, c.b), 0);
	cr_assert_gt(s1.events_recorded, s0.events_recorded,
		     "the joined epoch was not closed by an event");
	/* b cannot pass its wait for a's work: the zombies stay. */
	vpmm_host_stream_complete(c.t.drv, c.b);
	cr_assert_eq(vpmm_pool_reclaim(c.t.pool), 0);
	pt_settle(&c.t);
	PT_LAYOUT_IS(&c.t, "[*2][1][*2][1][4][*22]");
	pt_close(&c.t);
}

/* ---- out of memory from the device or the limit ---------------------------- */

static void oom_nothing_free(struct pt_setup *su)
{
	struct pt t;
	pt_open(&t, su);
	CUstream s = vpmm_host_stream_create(t.drv);
	PT_MALLOC(&t, 6, s);
	struct pt_snap snap;
	pt_snap(&t, &snap);
	CUdeviceptr p = 0;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 4 * t.page, s, &p), -ENOMEM);
	/* A limit may refuse before asking the driver; the device says why. */
	if (su->capacity)
		cr_assert_eq(vpmm_pool_last_result(t.pool), CUDA_ERROR_OUT_OF_MEMORY);
	PT_UNCHANGED(&t, &snap, "4 pages on a device with 2 left");
	cr_assert_eq(pt_stats(&t).failures, snap.st.failures + 1);
	PT_MALLOC(&t, 2, s);
	pt_snap(&t, &snap);
	cr_assert_eq(vpmm_pool_malloc(t.pool, t.page, s, &p), -ENOMEM);
	PT_UNCHANGED(&t, &snap, "1 page on a full device");
	pt_close(&t);
}

Test(oom, device_capacity_nothing_free)
{
	struct pt_setup su = { .va_pages = 64, .capacity = 8 * 64 * PT_KiB };
	oom_nothing_free(&su);
}

Test(oom, pool_limit_nothing_free)
{
	struct pt_setup su = { .va_pages = 64, .limit_pages = 8 };
	oom_nothing_free(&su);
}

/* The harvest succeeds, the growth does not: the harvested pages go back to
 * where they were, still free. */
static void oom_after_harvest(struct pt_setup *su)
{
	struct pt t;
	pt_open(&t, su);
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 3, s);
	PT_MALLOC(&t, 3, s);
	PT_FREE(&t, a, s);
	PT_LAYOUT_IS(&t, "[-3][3][*58]");
	struct pt_snap snap;
	pt_snap(&t, &snap);
	CUdeviceptr p = 0;
	cr_assert_eq(vpmm_pool_malloc(t.pool, 6 * t.page, s, &p), -ENOMEM);
	PT_UNCHANGED(&t, &snap, "6 pages: 3 harvested + 3 new on a device with 2 left");
	PT_LAYOUT_IS(&t, "[-3][3][*58]");
	/* 3 harvested + 2 new fits exactly. */
	PT_MALLOC(&t, 5, s);
	PT_LAYOUT_IS(&t, "[~3][3][5][*53]");
	pt_settle(&t);
	pt_close(&t);
}

Test(oom, device_capacity_after_harvest)
{
	struct pt_setup su = { .va_pages = 64, .capacity = 8 * 64 * PT_KiB };
	oom_after_harvest(&su);
}

Test(oom, pool_limit_after_harvest)
{
	struct pt_setup su = { .va_pages = 64, .limit_pages = 8 };
	oom_after_harvest(&su);
}

Test(oom, pool_limit_after_harvest_policy_all)
{
	struct pt_setup su = { .va_pages = 64, .limit_pages = 8,
			       .defrag = VPMM_DEFRAG_ALL };
	oom_after_harvest(&su);
}

/* Initial pages beyond the device: create fails and leaves nothing behind. */
Test(oom, create_with_too_many_initial_pages)
{
	struct vpmm_host_options ho = { .granularity = 64 * PT_KiB,
					.capacity = 4 * 64 * PT_KiB };
	vpmm_driver *d;
	cr_assert_eq(vpmm_driver_host_create(&ho, &d), CUDA_SUCCESS);
	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.page_size = 64 * PT_KiB;
	cfg.va_size = 64 * cfg.page_size;
	cfg.initial_pages = 8;
	vpmm_pool *pool = (vpmm_pool *)0x1;
	int rc = vpmm_pool_create(&cfg, d, &pool);
	cr_assert_eq(rc, -ENOMEM, "create: %d", rc);
	struct vpmm_host_live l;
	vpmm_host_live(d, &l);
	cr_assert_eq(l.handles, 0, "%zu handles left", l.handles);
	cr_assert_eq(l.reservations, 0, "%zu reservations left", l.reservations);
	cr_assert_eq(l.mappings, 0, "%zu mappings left", l.mappings);
	cr_assert_eq(l.events, 0, "%zu events left", l.events);
	d->destroy(d);
}
