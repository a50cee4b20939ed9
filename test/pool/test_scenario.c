/* test_scenario.c — the design's scenario `+10 +1 -10 +4 +11` (GiB, one
 * stream, 1 GiB pages, 64 GiB of VA) in its four cases A–D, which differ only
 * in how many pages were mapped at start, plus the case of an empty pool.
 *
 * Every layout below is derived by hand from the pool's rules
 * (best fit by size then VA; a defrag starts at a usable free region that ends
 * where the hole begins; harvested pages are mapped before new ones). Each
 * string adds up to the 64 GiB chunk. */
#include "pool_test.h"

struct scenario {
	size_t initial;            /* pages mapped at create */
	enum vpmm_defrag_policy defrag;
	const char *step[4];       /* layout after create, +10, +1, -10 */
	const char *after4;        /* after +4 */
	const char *after5;        /* after +11, zombies still there */
	const char *settled;       /* after completing everything + reclaim */
	size_t p4_at, p11_at;      /* where +4 and +11 land, GiB from chunk start */
	unsigned remapped, created; /* pages moved / created by +11 */
	size_t mapped;             /* GiB mapped at the end */
};

static void run(const struct scenario *sc)
{
	struct pt t;
	struct pt_setup su = {
		.granularity = PT_GiB, .unbacked = true, .va_pages = 64,
		.initial_pages = sc->initial, .defrag = sc->defrag, .unit = PT_GiB,
	};
	pt_open(&t, &su);
	CUstream s = vpmm_host_stream_create(t.drv);

	PT_LAYOUT_IS(&t, sc->step[0]);
	struct vpmm_region_info first;
	size_t nreg = vpmm_pool_regions(t.pool, &first, 1);
	cr_assert_geq(nreg, 1, "no region at all");
	CUdeviceptr base = first.va;
	if (sc->initial) {
		cr_assert_eq(first.kind, VPMM_REGION_FREE, "initial pages are not free");
		cr_assert(first.settled, "initial pages are not settled");
	}

	CUdeviceptr p10 = PT_MALLOC(&t, 10, s);
	PT_LAYOUT_IS(&t, sc->step[1]);
	cr_assert_eq(p10, base, "+10 not at the start of the chunk");
	CUdeviceptr p1 = PT_MALLOC(&t, 1, s);
	PT_LAYOUT_IS(&t, sc->step[2]);
	cr_assert_eq(p1, base + 10 * PT_GiB, "+1 not right after +10");
	PT_FREE(&t, p10, s);
	PT_LAYOUT_IS(&t, sc->step[3]);

	CUdeviceptr p4 = PT_MALLOC(&t, 4, s);
	PT_LAYOUT_IS(&t, sc->after4);
	cr_assert_eq(p4, base + sc->p4_at * PT_GiB, "+4 at %llu GiB, expected %zu",
		     (unsigned long long)((p4 - base) / PT_GiB), sc->p4_at);

	struct vpmm_stats b = pt_stats(&t);
	unsigned long waits = vpmm_host_stream_wait_count(t.drv, s);
	CUdeviceptr p11 = PT_MALLOC(&t, 11, s);
	struct vpmm_stats a = pt_stats(&t);
	PT_LAYOUT_IS(&t, sc->after5);
	cr_assert_eq(p11, base + sc->p11_at * PT_GiB, "+11 at %llu GiB, expected %zu",
		     (unsigned long long)((p11 - base) / PT_GiB), sc->p11_at);
	cr_assert_eq(a.pages_remapped - b.pages_remapped, sc->remapped,
		     "+11 remapped %llu pages, expected %u",
		     (unsigned long long)(a.pages_remapped - b.pages_remapped),
		     sc->remapped);
	cr_assert_eq(a.pages_created - b.pages_created, sc->created,
		     "+11 created %llu pages, expected %u",
		     (unsigned long long)(a.pages_created - b.pages_created),
		     sc->created);
	bool defrag = sc->remapped || sc->created;
	cr_assert_eq(a.defrags - b.defrags, defrag ? 1u : 0u, "defrags %llu -> %llu",
		     (unsigned long long)b.defrags, (unsigned long long)a.defrags);
	cr_assert_eq(a.zombies, sc->remapped * PT_GiB, "zombie bytes %llu",
		     (unsigned long long)a.zombies);
	cr_assert_eq(a.live, 16 * PT_GiB, "live %llu", (unsigned long long)a.live);
	cr_assert_eq(a.mapped, sc->mapped * PT_GiB, "mapped %llu GiB, expected %zu",
		     (unsigned long long)(a.mapped / PT_GiB), sc->mapped);
	cr_assert_eq(a.mapped_peak, sc->mapped * PT_GiB, "peak mapped %llu GiB",
		     (unsigned long long)(a.mapped_peak / PT_GiB));
	cr_assert_eq(a.reserved, 64 * PT_GiB, "reserved %llu",
		     (unsigned long long)a.reserved);
	/* One stream: its own pages never need a wait. */
	cr_assert_eq(vpmm_host_stream_wait_count(t.drv, s), waits,
		     "a one-stream defrag made the stream wait");

	/* The zombies' event has not completed: nothing may be unmapped. */
	int n = vpmm_pool_reclaim(t.pool);
	PT_CHECK(&t);
	cr_assert_eq(n, 0, "reclaimed %d ranges before their event completed", n);
	PT_LAYOUT_IS(&t, sc->after5);

	n = pt_settle(&t);
	cr_assert_eq(n > 0, sc->remapped > 0, "reclaimed %d ranges, remapped %u pages",
		     n, sc->remapped);
	PT_LAYOUT_IS(&t, sc->settled);
	a = pt_stats(&t);
	cr_assert_eq(a.zombies, 0, "zombies left after reclaim");
	cr_assert_eq(a.live, 16 * PT_GiB);
	cr_assert_eq(a.mapped, sc->mapped * PT_GiB, "reclaim changed mapped memory");

	CUdeviceptr bse; size_t sz;
	cr_assert_eq(vpmm_pool_find(t.pool, p11 + 5 * PT_GiB, &bse, &sz), 0);
	cr_assert_eq(bse, p11);
	cr_assert_eq(sz, 11 * PT_GiB);

	PT_FREE(&t, p1, s);
	PT_FREE(&t, p4, s);
	PT_FREE(&t, p11, s);
	cr_assert_eq(pt_stats(&t).live, 0);
	pt_close(&t);
}

/* X = 19 free pages after step 2: everything fits, no defrag. */
static const struct scenario case_a = {
	.initial = 30,
	.step = { "[-30][*34]", "[10][-20][*34]", "[10][1][-19][*34]",
		  "[-10][1][-19][*34]" },
	.after4 = "[4][-6][1][-19][*34]",
	.after5 = "[4][-6][1][11][-8][*34]",
	.settled = "[4][-6][1][11][-8][*34]",
	.p4_at = 0, .p11_at = 11, .remapped = 0, .created = 0, .mapped = 30,
};

Test(scenario, case_a_enough_pages_no_defrag)
{
	run(&case_a);
}

Test(scenario, case_a_policy_all_same)
{
	struct scenario sc = case_a;
	sc.defrag = VPMM_DEFRAG_ALL;
	run(&sc);
}

/* X = 9: +4 takes the best fit [-9]; +11 starts at the settled [-5] in front
 * of the hole and harvests the freed 10. */
Test(scenario, case_b_policy_all_remaps_every_free_page)
{
	struct scenario sc = {
		.initial = 20, .defrag = VPMM_DEFRAG_ALL,
		.step = { "[-20][*44]", "[10][-10][*44]", "[10][1][-9][*44]",
			  "[-10][1][-9][*44]" },
		.after4 = "[-10][1][4][-5][*44]",
		.after5 = "[~10][1][4][11][-4][*34]",
		.settled = "[*10][1][4][11][-4][*34]",
		.p4_at = 11, .p11_at = 15, .remapped = 10, .created = 0, .mapped = 20,
	};
	run(&sc);
}

Test(scenario, case_b_policy_lacking_remaps_only_the_shortfall)
{
	struct scenario sc = {
		.initial = 20, .defrag = VPMM_DEFRAG_LACKING,
		.step = { "[-20][*44]", "[10][-10][*44]", "[10][1][-9][*44]",
			  "[-10][1][-9][*44]" },
		.after4 = "[-10][1][4][-5][*44]",
		.after5 = "[~6][-4][1][4][11][*38]",
		.settled = "[*6][-4][1][4][11][*38]",
		.p4_at = 11, .p11_at = 15, .remapped = 6, .created = 0, .mapped = 20,
	};
	run(&sc);
}

/* X = 4: +4 takes [-4] exactly; +11 harvests the 10 and creates 1. */
static const struct scenario case_c = {
	.initial = 15,
	.step = { "[-15][*49]", "[10][-5][*49]", "[10][1][-4][*49]",
		  "[-10][1][-4][*49]" },
	.after4 = "[-10][1][4][*49]",
	.after5 = "[~10][1][4][11][*38]",
	.settled = "[*10][1][4][11][*38]",
	.p4_at = 11, .p11_at = 15, .remapped = 10, .created = 1, .mapped = 16,
};

Test(scenario, case_c_defrag_and_grow_lacking)
{
	run(&case_c);
}

Test(scenario, case_c_defrag_and_grow_all)
{
	struct scenario sc = case_c;
	sc.defrag = VPMM_DEFRAG_ALL;
	run(&sc);
}

/* X = 2: +4 cannot use [-2], takes the front of [-10]; +11 starts at the
 * settled [-2], harvests the [-6] and creates 3. */
static const struct scenario case_d = {
	.initial = 13,
	.step = { "[-13][*51]", "[10][-3][*51]", "[10][1][-2][*51]",
		  "[-10][1][-2][*51]" },
	.after4 = "[4][-6][1][-2][*51]",
	.after5 = "[4][~6][1][11][*42]",
	.settled = "[4][*6][1][11][*42]",
	.p4_at = 0, .p11_at = 11, .remapped = 6, .created = 3, .mapped = 16,
};

Test(scenario, case_d_lacking)
{
	run(&case_d);
}

Test(scenario, case_d_all)
{
	struct scenario sc = case_d;
	sc.defrag = VPMM_DEFRAG_ALL;
	run(&sc);
}

/* X = 0 (empty pool, VPMM_PAGES=0): peak mapped equals peak live, 16 GiB. */
static const struct scenario case_empty = {
	.initial = 0,
	.step = { "[*64]", "[10][*54]", "[10][1][*53]", "[-10][1][*53]" },
	.after4 = "[4][-6][1][*53]",
	.after5 = "[4][~6][1][11][*42]",
	.settled = "[4][*6][1][11][*42]",
	.p4_at = 0, .p11_at = 11, .remapped = 6, .created = 5, .mapped = 16,
};

Test(scenario, empty_pool_lacking)
{
	run(&case_empty);
}

Test(scenario, empty_pool_all)
{
	struct scenario sc = case_empty;
	sc.defrag = VPMM_DEFRAG_ALL;
	run(&sc);
}
