/* pool_test.h — what every pool test shares: a pool over the host driver, the
 * invariant check after every step, layout and state snapshots for "nothing
 * changed" assertions, and the leak check at the end. */
#ifndef POOL_TEST_H
#define POOL_TEST_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "driver_host.h"
#include "vpmm.h"

#define PT_KiB ((size_t)1 << 10)
#define PT_MiB ((size_t)1 << 20)
#define PT_GiB ((size_t)1 << 30)

struct pt {
	vpmm_driver *drv;
	vpmm_pool *pool;
	size_t page; /* the pool's page size */
	size_t unit; /* unit of the layout string */
	char layout[8192];
};

/* One description of a test pool; zeroes mean "the test does not care". */
struct pt_setup {
	size_t granularity;   /* host driver granularity (default 64 KiB) */
	size_t page_size;     /* the pool's page (0: the granularity) */
	size_t capacity;      /* host driver capacity in bytes (0 = its default) */
	bool unbacked;
	size_t va_pages;      /* VA chunk in pages (default 1024) */
	size_t initial_pages;
	size_t limit_pages;   /* cfg.limit in pages */
	enum vpmm_defrag_policy defrag;
	enum vpmm_remap_policy remap; /* default: the library's (pressure) */
	size_t unit;          /* layout unit (default: one page) */
	bool keep_event_interval; /* keep the default event interval, else
				   * use event_interval_ns (0: every free
				   * records an event) */
	uint64_t event_interval_ns;
	size_t small_max;     /* sub-page classes up to this (0: whole pages) */
	size_t grain;         /* allocation unit (0: the page) */
	unsigned front_entries; /* per-stream caches (0: off, every free reaches
				 * the structures under test) */
	size_t handle_pages;  /* largest handle in pages (0: one page a handle) */
	unsigned growth_split; /* with handle_pages (0: the default) */
	bool no_loop_growth;  /* a repeating loop's defragmentations remap */
	bool background;      /* a thread of the pool unmaps zombies */
	bool release;         /* the thread also trims free memory past */
	size_t release_pages; /* this many pages (VPMM_RELEASE_THRESHOLD) */
};

/* The pool must hold after every operation: a macro so the failure names
 * the line of the operation. */
#define PT_CHECK(t)                                                           \
	do {                                                                  \
		size_t pt_bad_ = vpmm_pool_check((t)->pool, stderr);          \
		cr_assert_eq(pt_bad_, 0,                                      \
			     "%s:%d: vpmm_pool_check found %zu broken invariants " \
			     "(layout %s)",                                   \
			     __FILE__, __LINE__, pt_bad_, pt_layout(t));      \
	} while (0)

static inline const char *pt_layout(struct pt *t)
{
	size_t n = vpmm_pool_layout(t->pool, t->layout, sizeof t->layout, t->unit);
	cr_assert_lt(n, sizeof t->layout, "layout longer than the test buffer");
	return t->layout;
}

#define PT_LAYOUT_IS(t, expect)                                               \
	do {                                                                  \
		const char *pt_got_ = pt_layout(t);                           \
		cr_assert_str_eq(pt_got_, (expect),                           \
				 "%s:%d: layout: expected \"%s\", got \"%s\"",  \
				 __FILE__, __LINE__, (const char *)(expect),   \
				 pt_got_);                                    \
	} while (0)

static inline void pt_open(struct pt *t, const struct pt_setup *s)
{
	struct vpmm_host_options ho = {
		.granularity = s->granularity ? s->granularity : 64 * PT_KiB,
		.capacity = s->capacity,
		.unbacked = s->unbacked,
	};
	memset(t, 0, sizeof *t);
	CUresult r = vpmm_driver_host_create(&ho, &t->drv);
	cr_assert_eq(r, CUDA_SUCCESS, "vpmm_driver_host_create: %d", (int)r);

	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.page_size = s->page_size ? s->page_size : ho.granularity;
	cfg.va_size = (s->va_pages ? s->va_pages : 1024) * cfg.page_size;
	cfg.initial_pages = s->initial_pages;
	cfg.limit = s->limit_pages * cfg.page_size;
	cfg.defrag = s->defrag;
	cfg.remap = s->remap;
	cfg.small_max = s->small_max; /* default 0: whole pages, the page-level
				       * rules under test */
	cfg.front_entries = s->front_entries;
	cfg.grain = s->grain;
	cfg.handle_size = s->handle_pages * cfg.page_size; /* 0: one page a
							   * handle, the finest
							   * unit of remapping */
	if (s->growth_split)
		cfg.growth_split = s->growth_split;
	if (s->no_loop_growth)
		cfg.loop_growth = 0;
	if (s->background)
		cfg.background = true;
	if (s->release) {
		cfg.release = true;
		cfg.release_threshold = s->release_pages * cfg.page_size;
	}
	if (!s->keep_event_interval)
		cfg.event_interval_ns = s->event_interval_ns;
	int rc = vpmm_pool_create(&cfg, t->drv, &t->pool);
	cr_assert_eq(rc, 0, "vpmm_pool_create: %d", rc);
	t->page = vpmm_pool_page_size(t->pool);
	cr_assert_eq(t->page, cfg.page_size, "page size %zu, configured %zu",
		     t->page, cfg.page_size);
	t->unit = s->unit ? s->unit : t->page;
	PT_CHECK(t);
}

/* Destroy the pool and require the driver to hold nothing any more. */
static inline void pt_close(struct pt *t)
{
	PT_CHECK(t);
	vpmm_pool_destroy(t->pool);
	t->pool = NULL;
	struct vpmm_host_live l;
	vpmm_host_live(t->drv, &l);
	cr_expect_eq(l.handles, 0, "leak: %zu handles alive after destroy", l.handles);
	cr_expect_eq(l.handle_bytes, 0, "leak: %zu handle bytes after destroy",
		     l.handle_bytes);
	cr_expect_eq(l.reservations, 0, "leak: %zu VA reservations after destroy",
		     l.reservations);
	cr_expect_eq(l.mappings, 0, "leak: %zu mappings after destroy", l.mappings);
	cr_expect_eq(l.events, 0, "leak: %zu events after destroy", l.events);
	t->drv->destroy(t->drv);
	t->drv = NULL;
}

static inline CUdeviceptr pt_malloc_at(struct pt *t, size_t bytes, CUstream s,
				       int line)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(t->pool, bytes, s, &p);
	cr_assert_eq(rc, 0, "line %d: malloc(%zu bytes) = %d (layout %s)", line,
		     bytes, rc, pt_layout(t));
	cr_assert_neq(p, 0, "line %d: malloc returned 0", line);
	cr_assert_eq(p % t->page, 0, "line %d: %#llx not page aligned", line,
		     (unsigned long long)p);
	size_t bad = vpmm_pool_check(t->pool, stderr);
	cr_assert_eq(bad, 0, "line %d: check after malloc: %zu broken (layout %s)",
		     line, bad, pt_layout(t));
	return p;
}

static inline void pt_free_at(struct pt *t, CUdeviceptr p, CUstream s, int line)
{
	int rc = vpmm_pool_free(t->pool, p, s);
	cr_assert_eq(rc, 0, "line %d: free(%#llx) = %d (layout %s)", line,
		     (unsigned long long)p, rc, pt_layout(t));
	size_t bad = vpmm_pool_check(t->pool, stderr);
	cr_assert_eq(bad, 0, "line %d: check after free: %zu broken (layout %s)",
		     line, bad, pt_layout(t));
}

/* Sizes in pages, the way the tests think. */
#define PT_MALLOC(t, pages, s) pt_malloc_at((t), (size_t)(pages) * (t)->page, (s), __LINE__)
#define PT_MALLOC_BYTES(t, bytes, s) pt_malloc_at((t), (bytes), (s), __LINE__)
#define PT_FREE(t, p, s) pt_free_at((t), (p), (s), __LINE__)

static inline struct vpmm_stats pt_stats(struct pt *t)
{
	struct vpmm_stats st;
	memset(&st, 0, sizeof st);
	vpmm_pool_stats(t->pool, &st);
	return st;
}

/* Everything that must be the same after an operation that failed. */
struct pt_snap {
	char layout[8192];
	struct vpmm_stats st;
	struct vpmm_host_live live;
};

static inline void pt_snap(struct pt *t, struct pt_snap *s)
{
	memset(s, 0, sizeof *s);
	strcpy(s->layout, pt_layout(t));
	s->st = pt_stats(t);
	vpmm_host_live(t->drv, &s->live);
}

static inline void pt_assert_unchanged_at(struct pt *t, const struct pt_snap *s,
					  const char *what, int line)
{
	struct pt_snap n;
	pt_snap(t, &n);
	cr_assert_str_eq(n.layout, s->layout,
			 "line %d, %s: layout changed: \"%s\" -> \"%s\"", line, what,
			 s->layout, n.layout);
#define PT_GAUGE(f)                                                           \
	cr_assert_eq(n.st.f, s->st.f, "line %d, %s: stats." #f " %llu -> %llu", \
		     line, what, (unsigned long long)s->st.f,                 \
		     (unsigned long long)n.st.f);
	PT_GAUGE(live)
	PT_GAUGE(mapped)
	PT_GAUGE(reusable)
	PT_GAUGE(holes)
	PT_GAUGE(zombies)
	PT_GAUGE(reserved)
#undef PT_GAUGE
#define PT_LIVE(f)                                                            \
	cr_assert_eq(n.live.f, s->live.f, "line %d, %s: driver live." #f      \
		     " %zu -> %zu", line, what, s->live.f, n.live.f);
	PT_LIVE(handles)
	PT_LIVE(handle_bytes)
	PT_LIVE(reservations)
	PT_LIVE(mappings)
#undef PT_LIVE
	/* An event recorded to close a stream's epoch may stay (it only orders
	 * work conservatively and is counted in events_recorded); nothing else. */
	uint64_t recorded = n.st.events_recorded - s->st.events_recorded;
	cr_assert_leq(n.live.events, s->live.events + recorded,
		      "line %d, %s: driver live.events %zu -> %zu with %llu events "
		      "recorded", line, what, s->live.events, n.live.events,
		      (unsigned long long)recorded);
	size_t bad = vpmm_pool_check(t->pool, stderr);
	cr_assert_eq(bad, 0, "line %d, %s: check: %zu broken", line, what, bad);
}
#define PT_UNCHANGED(t, s, what) pt_assert_unchanged_at((t), (s), (what), __LINE__)

/* What a synchronous free does around its synchronisation: every stream's
 * frees join an epoch an event closes, the device completes all of its
 * work, and the completed events settle them. */
static inline void pt_synchronise(struct pt *t)
{
	cr_assert_geq(vpmm_pool_poll(t->pool, true), 0);
	vpmm_host_complete_all(t->drv);
	cr_assert_geq(vpmm_pool_poll(t->pool, false), 0);
}

/* Complete every stream's work and reclaim the zombies it released. */
static inline int pt_settle(struct pt *t)
{
	vpmm_host_complete_all(t->drv);
	int n = vpmm_pool_reclaim(t->pool);
	cr_assert_geq(n, 0, "reclaim: %d", n);
	PT_CHECK(t);
	return n;
}

/* The region containing `va` (its kind, stream, settled flag). */
static inline bool pt_region_at(struct pt *t, CUdeviceptr va,
				struct vpmm_region_info *out)
{
	struct vpmm_region_info r[512];
	size_t n = vpmm_pool_regions(t->pool, r, 512);
	cr_assert_leq(n, 512, "too many regions for the test buffer");
	for (size_t i = 0; i < n; i++) {
		if (va >= r[i].va && va < r[i].va + r[i].size) {
			*out = r[i];
			return true;
		}
	}
	return false;
}

#endif
