/* pressure.c — the pool near its limit while the device keeps its own time.
 *
 * Each round draws, from the round's seed: a workload per thread (LLM
 * serving, training with a new sequence length every iteration, MoE,
 * scratch on several streams; workloads.c), 1-8 threads with 1-4 streams
 * each, every setting that changes the pool's policy (growth split 0/1/16,
 * handle size, defrag lacking/all, remap under pressure/always, loop
 * growth, stream caches 0/16, grain, event interval 0/50 us, the background
 * reclaimer, sub-page classes, release), and a limit of 1.00-1.10 times the
 * live peak (the scripts' own on one thread; on several, a draw between the
 * largest thread's and their sum, since their peaks need not meet): as
 * VPMM_LIMIT (cfg.limit), as another process holding all of the device but
 * that margin, or as one whose hold moves within it at random moments.
 * The host driver plays the device (host_device.h): work completes while
 * the pool waits or has its lock dropped, the tenant moves, driver calls
 * yield and sleep, and the program's other work (trims, reclaims, polls,
 * allocations of its own) runs inside the calls the pool makes with its
 * lock dropped. Big sizes (1 MiB - 512 MiB) run on the unbacked driver;
 * backed rounds scale them by 1/32 and every live allocation carries a
 * pattern checked at its free.
 *
 * Allowed: -ENOMEM. Not allowed: a crash, a broken invariant
 * (vpmm_pool_check after each op, or every 8 on long rounds, and at the
 * end), a lost pattern, any other error, mapping past cfg.limit, a leak in
 * the driver, a free split (snapshot.h) that disagrees with the free
 * regions at an out-of-memory answer. Out-of-memory answers for a request that the pool's wholly
 * free pages plus what the driver could still give would have held are
 * counted ("avoidable"), not failed.
 *
 * A plain program (so that it runs under ThreadSanitizer too):
 *   pressure [--seconds S] [--rounds N] [--seed X] [--round K] [--quick]
 *            [--verbose]
 * runs rounds 0.. until N rounds or S seconds; --round K runs round K
 * alone; --quick makes rounds shorter; --verbose prints a line a round.
 * A failure prints the round, its seed and its settings.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host_device.h"
#include "snapshot.h"
#include "vpmm.h"
#include "workloads.h"

#define MAXT 8
#define MAXS 4

enum limit_mode { L_LIMIT, L_TENANT, L_TENANT_MOVES, L_COUNT };
static const char *const limit_names[L_COUNT] = {"limit", "tenant", "tenant-moves"};

struct round {
	unsigned k;
	uint64_t seed;
	bool backed;
	unsigned nthreads, nstreams[MAXT];
	enum workload wl[MAXT];
	unsigned sync_permille, cross_permille;
	enum limit_mode mode;
	double factor, factor_hi;
	size_t unit, page, live, capacity, tenant_lo, tenant_hi;
	size_t check_every;
	struct vpmm_config cfg;
	struct vpmm_host_device_opts dev;
};

struct thread {
	pthread_t th;
	struct run *run;
	unsigned idx;
	struct script sc;
	CUstream s[MAXS];
	CUdeviceptr *ptr; /* [id]; 0: not live (never made, or refused) */
	uint64_t rng;
	unsigned long mallocs, enomem, avoidable;
};

/* The program's other work, run inside the pool's driver calls while its
 * lock is dropped (host_device.h, "interlude"): trims, reclaims, polls,
 * and allocations of its own on a stream of its own. */
#define INTERLUDE_LIVE 16
struct interlude {
	pthread_mutex_t mu; /* one at a time: a busy one is skipped */
	uint64_t rng;
	CUstream s;
	CUdeviceptr p[INTERLUDE_LIVE];
	size_t size[INTERLUDE_LIVE];
	uint64_t tag[INTERLUDE_LIVE];
	unsigned n;
	uint64_t next_tag;
};

struct run {
	struct round *r;
	vpmm_driver *drv;
	vpmm_pool *pool;
	struct thread t[MAXT];
	struct interlude il;
	atomic_int failed;
};

static char round_text[512]; /* for the crash handler */
static uint64_t g_seed = 0x9e55u;
static bool verbose; /* --verbose: a line per round */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t rnd(uint64_t *s)
{
	return mix(*s += 0x632be59bd9b4e019ull);
}

static size_t pick(uint64_t *s, size_t n)
{
	return (size_t)(rnd(s) % n);
}

static void fail(struct run *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct run *R, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "pressure: FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n  in %s\n", round_text);
	va_end(ap);
	atomic_store(&R->failed, 1);
}

/* ---- a crash names its round ---------------------------------------------------- */

static struct sigaction old_act[32];

static void on_crash(int sig)
{
	static const char head[] = "pressure: CRASH in ";
	ssize_t w = write(2, head, sizeof(head) - 1);
	w = write(2, round_text, strlen(round_text));
	w = write(2, "\n", 1);
	(void)w;
	sigaction(sig, &old_act[sig], NULL); /* a fault comes again, to it */
	if (sig == SIGABRT)
		raise(sig);
}

static void catch_crashes(void)
{
	const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_crash;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, &old_act[sigs[i]]);
}

/* ---- drawing a round ------------------------------------------------------------ */

static size_t round_up(size_t x, size_t to)
{
	return (x + to - 1) / to * to;
}

/* What the pool takes for a request: sub-grain ones are rounded (roughly)
 * by their class, the rest to whole grains. */
static size_t pool_bytes(size_t size, void *arg)
{
	const struct round *r = arg;
	return round_up(size, size < r->cfg.grain ? 512 : r->cfg.grain);
}

static void draw_config(struct round *r, uint64_t *s)
{
	struct vpmm_config *c = &r->cfg;
	static const unsigned splits[] = {0, 1, 16};
	static const size_t handle_pages[] = {1, 4, 32, 512};
	vpmm_config_default(c);
	c->page_size = r->page;
	c->growth_split = splits[pick(s, 3)];
	c->handle_size = handle_pages[pick(s, 4)] * r->page;
	c->defrag = pick(s, 3) ? VPMM_DEFRAG_LACKING : VPMM_DEFRAG_ALL;
	c->remap = pick(s, 3) ? VPMM_REMAP_PRESSURE : VPMM_REMAP_ALWAYS;
	c->loop_growth = (uint64_t[]){0, 15, 100}[pick(s, 3)];
	c->front_entries = pick(s, 2) ? 16 : 0;
	c->grain = (size_t[]){r->page, r->page / 32, 512}[pick(s, 3)];
	c->event_interval_ns = pick(s, 2) ? 50000 : 0;
	c->background = pick(s, 4) != 0;
	if (pick(s, 3) == 0)
		c->small_max = 0;
	if (pick(s, 5) == 0) {
		c->release = true;
		c->release_threshold = pick(s, (size_t)64) * r->page;
	}
	/* Small chunks: a request may need a chunk of its own. */
	c->va_size = pick(s, 4) ? 64 * r->live : 2 * r->live;
	c->va_size = round_up(c->va_size > 32 * r->page ? c->va_size : 32 * r->page, r->page);
	c->initial_pages = pick(s, 4) ? 0 : pick(s, 16);
}

static void draw_device(struct round *r, uint64_t *s)
{
	struct vpmm_host_device_opts *d = &r->dev;
	memset(d, 0, sizeof(*d));
	d->seed = rnd(s);
	d->complete_one = (unsigned)pick(s, 60);
	d->complete_all = pick(s, 2) ? (unsigned)pick(s, 10) : 0;
	d->yield = (unsigned)pick(s, 400);
	d->sleep = pick(s, 3) ? (unsigned)pick(s, 100) : 0;
	d->sleep_max_us = 5 + (unsigned)pick(s, 60);
	d->interlude = pick(s, 3) ? 20 + (unsigned)pick(s, 300) : 0;
	d->period_us = pick(s, 4) ? 20 + (unsigned)pick(s, 400) : 0;
	if (r->mode == L_TENANT_MOVES) {
		d->tenant_lo = r->tenant_lo;
		d->tenant_hi = r->tenant_hi;
		d->tenant_move = 1 + (unsigned)pick(s, 20);
		d->tenant_create = (unsigned)pick(s, 300);
	}
}

static void describe(const struct round *r)
{
	int n = snprintf(round_text, sizeof(round_text),
			 "round %u (seed %#" PRIx64 "; rerun: pressure --seed %#" PRIx64
			 " --round %u): %s, %u threads:",
			 r->k, r->seed, g_seed, r->k, r->backed ? "backed" : "unbacked",
			 r->nthreads);
	for (unsigned i = 0; i < r->nthreads && n < (int)sizeof(round_text); i++)
		n += snprintf(round_text + n, sizeof(round_text) - (size_t)n, " %s/%u",
			      workload_name(r->wl[i]), r->nstreams[i]);
	const struct vpmm_config *c = &r->cfg;
	if (n < (int)sizeof(round_text))
		snprintf(round_text + n, sizeof(round_text) - (size_t)n,
			 "; %s %.3f-%.3f x %zu units; split %u handle %zu pages %s remap %s loop %" PRIu64
			 " front %u grain %zu interval %" PRIu64 " ns %s small %zu release %s"
			 " va %zu pages; sync %u/1000 cross %u/1000; device: one %u all %u yield %u"
			 " sleep %u thread %u us interlude %u",
			 limit_names[r->mode], r->factor, r->factor_hi, r->live / r->unit,
			 c->growth_split, c->handle_size / r->page,
			 c->defrag == VPMM_DEFRAG_ALL ? "all" : "lacking",
			 c->remap == VPMM_REMAP_ALWAYS ? "always" : "pressure", c->loop_growth,
			 c->front_entries, c->grain, c->event_interval_ns,
			 c->background ? "reclaimer" : "inline", c->small_max,
			 c->release ? "on" : "off", c->va_size / r->page, r->sync_permille,
			 r->cross_permille, r->dev.complete_one, r->dev.complete_all, r->dev.yield,
			 r->dev.sleep, r->dev.period_us, r->dev.interlude);
}

static int draw_round(struct round *r, struct run *R, unsigned k, bool quick)
{
	uint64_t s = mix(g_seed ^ mix(k));
	memset(r, 0, sizeof(*r));
	r->k = k;
	r->seed = s;
	r->backed = pick(&s, 3) == 0;
	/* One unit is 1 MiB, or 1/32 of it on backed memory; a page 2 units. */
	r->unit = r->backed ? (size_t)32 << 10 : (size_t)1 << 20;
	r->page = 2 * r->unit;
	static const unsigned threads[] = {1, 1, 1, 2, 2, 3, 4, 8};
	r->nthreads = threads[pick(&s, 8)];
	size_t budget = (r->backed ? 640 : 512 + pick(&s, 3584)) * r->unit;
	size_t ops = quick ? 600 : 1500 + pick(&s, 2500);
	enum workload same = (enum workload)pick(&s, W_COUNT);
	bool mixed = pick(&s, 3) == 0;
	r->sync_permille = (unsigned[]){0, 0, 20, 1000}[pick(&s, 4)];
	r->cross_permille = pick(&s, 3) ? 0 : 100;
	for (unsigned i = 0; i < r->nthreads; i++) {
		r->wl[i] = mixed ? (enum workload)pick(&s, W_COUNT) : same;
		unsigned most = r->wl[i] == W_SCRATCH ? MAXS : 2;
		if (most > 8 / r->nthreads)
			most = 8 / r->nthreads;
		r->nstreams[i] = 1 + (unsigned)pick(&s, most);
		struct wl_params wp = {
			.kind = r->wl[i],
			.seed = rnd(&s),
			.unit = r->unit,
			.budget = budget / r->nthreads,
			.max_ops = ops / r->nthreads,
			.nstreams = r->nstreams[i],
			.sync_permille = r->sync_permille,
			.cross_permille = r->cross_permille,
		};
		if (workload_make(&wp, &R->t[i].sc))
			return -1;
	}
	/* The config first: the live peak is counted in its grains. */
	r->live = budget; /* for va_size; replaced below */
	draw_config(r, &s);
	/* Threads' peaks need not meet: the concurrent peak lies between the
	 * largest and their sum. */
	size_t sum = 0, most = 0;
	for (unsigned i = 0; i < r->nthreads; i++) {
		size_t pk = script_peak(&R->t[i].sc, pool_bytes, r);
		sum += pk;
		most = pk > most ? pk : most;
	}
	r->live = most + (size_t)((double)(sum - most) * (double)(50 + pick(&s, 51)) / 100.0);
	r->mode = (enum limit_mode)pick(&s, L_COUNT);
	r->factor = 1.0 + (double)pick(&s, 1001) / 10000.0;
	r->factor_hi = r->factor;
	size_t margin = round_up((size_t)((double)r->live * r->factor), r->page);
	r->capacity = margin;
	if (r->mode == L_LIMIT) {
		r->cfg.limit = margin;
		r->capacity = margin + round_up(margin / 2, r->page); /* the driver has more */
	} else {
		double more = (double)margin * (double)pick(&s, 100) / 100.0;
		r->capacity = margin + round_up((size_t)more, r->page);
		r->tenant_lo = r->tenant_hi = r->capacity - margin;
		if (r->mode == L_TENANT_MOVES) {
			/* The tenant gives back up to 1.10 x live, or takes down to 1.00 x. */
			r->factor = 1.0;
			r->factor_hi = 1.1;
			size_t lo = round_up(r->live, r->page);
			size_t hi = round_up((size_t)((double)r->live * 1.1), r->page);
			r->tenant_lo = r->capacity > hi ? r->capacity - hi : 0;
			r->tenant_hi = r->capacity > lo ? r->capacity - lo : 0;
		}
	}
	r->check_every = ops > 2000 || r->nthreads > 2 ? 8 : 1;
	draw_device(r, &s);
	describe(r);
	return 0;
}

/* ---- running it ------------------------------------------------------------------ */

static uint64_t pattern(uint64_t tag, size_t piece, size_t word)
{
	return mix(tag * 31 + piece) ^ word;
}

/* First, middle and last word of every page-sized piece (the whole of a
 * smaller allocation). */
static void stamp(const struct round *r, CUdeviceptr p, size_t n, uint64_t tag, bool check,
		  struct run *R, struct thread *T)
{
	for (size_t i = 0; i * r->page < n; i++) {
		size_t len = n - i * r->page < r->page ? n - i * r->page : r->page;
		size_t words = len / 8;
		uint64_t *w = (uint64_t *)(uintptr_t)(p + i * r->page);
		size_t at[3] = {0, words / 2, words ? words - 1 : 0};
		for (int k = 0; k < 3 && words; k++) {
			uint64_t want = pattern(tag, i, at[k]);
			if (!check) {
				w[at[k]] = want;
			} else if (w[at[k]] != want) {
				fail(R, "thread %d: allocation at %#llx (%zu bytes), piece %zu word %zu: "
				     "%#" PRIx64 ", expected %#" PRIx64, T ? (int)T->idx : -1,
				     (unsigned long long)p, n,
				     i, at[k], w[at[k]], want);
				return;
			}
		}
	}
}

/* Whether the pool's wholly free pages and what the driver may still give
 * would hold `size` bytes: an out-of-memory answer that some arrangement
 * could have avoided. */
static bool avoidable(struct run *R, size_t size)
{
	struct round *r = R->r;
	size_t small = r->cfg.small_max < r->cfg.grain ? r->cfg.small_max : r->cfg.grain - 1;
	/* A sub-grain request takes a slab of at least 8 blocks (small.c). */
	size_t bytes = size <= small ? round_up(8 * size, r->cfg.grain) : pool_bytes(size, r);
	size_t need = round_up(bytes, r->page), have = 0, n;
	struct vpmm_region_info *reg = NULL;
	n = vpmm_pool_regions(R->pool, NULL, 0);
	reg = calloc(n + 64, sizeof(*reg));
	if (!reg)
		return false;
	size_t cap = n + 64;
	n = vpmm_pool_regions(R->pool, reg, cap); /* the count may have grown */
	if (n > cap)
		n = cap;
	for (size_t i = 0; i < n; i++) {
		if (reg[i].kind != VPMM_REGION_FREE)
			continue;
		size_t a = round_up(reg[i].va, r->page);
		size_t b = (reg[i].va + reg[i].size) / r->page * r->page;
		have += b > a ? b - a : 0;
	}
	free(reg);
	struct vpmm_stats st;
	vpmm_pool_stats(R->pool, &st);
	size_t driver = vpmm_host_free_bytes(R->drv);
	if (r->cfg.limit) {
		size_t left = r->cfg.limit > st.mapped ? r->cfg.limit - st.mapped : 0;
		driver = left < driver ? left : driver;
	}
	return need <= have + driver;
}

/* What the out-of-memory line and vpmm-dump say about the free memory
 * (snapshot.c's walk of the handles) against the same snapshot's free
 * regions: every free byte in exactly one handle, whole handles in pages. */
static void check_free_split(struct run *R)
{
	struct vpmm_snapshot sn;
	if (vpmm_pool_snapshot(R->pool, &sn) != 0)
		return; /* the host out of memory: nothing to check */
	uint64_t sum = 0, largest = 0;
	for (size_t i = 0; i < sn.nregions; i++)
		if (sn.regions[i].kind == VPMM_REGION_FREE) {
			sum += sn.regions[i].size;
			if (sn.regions[i].size > largest)
				largest = sn.regions[i].size;
		}
	const struct vpmm_free_split *f = &sn.free_split;
	uint64_t page = sn.stats.page_size;
	if (f->whole + f->stranded != sum || f->largest != largest || f->whole % page ||
	    f->whole_handles > f->whole / page || (f->stranded != 0) != (f->stranded_handles != 0))
		fail(R, "free split: %" PRIu64 " whole in %" PRIu64 " handles + %" PRIu64
			" stranded in %" PRIu64 ", largest %" PRIu64 "; the free regions: %" PRIu64
			", largest %" PRIu64, f->whole, f->whole_handles, f->stranded,
		     f->stranded_handles, f->largest, sum, largest);
	vpmm_snapshot_free(&sn);
}

static void do_op(struct run *R, struct thread *T, const struct op *o)
{
	struct round *r = R->r;
	CUstream s = o->stream == W_NO_STREAM ? VPMM_NO_STREAM : T->s[o->stream];
	size_t size = T->sc.sizes[o->id];
	uint64_t tag = ((uint64_t)T->idx << 32) | o->id;
	if (o->alloc) {
		CUdeviceptr p = 0;
		int rc = vpmm_pool_malloc(R->pool, size, s, &p);
		if (rc == -ENOMEM) {
			T->enomem++;
			T->avoidable += avoidable(R, size);
			check_free_split(R);
			return;
		}
		if (rc) {
			fail(R, "thread %u: malloc(%zu) = %d (CUresult %d)", T->idx, size, rc,
			     (int)vpmm_pool_last_result(R->pool));
			return;
		}
		T->ptr[o->id] = p;
		T->mallocs++;
		if (r->backed)
			stamp(r, p, size, tag, false, R, T);
		return;
	}
	CUdeviceptr p = T->ptr[o->id];
	if (!p)
		return; /* refused */
	T->ptr[o->id] = 0;
	if (r->backed)
		stamp(r, p, size, tag, true, R, T);
	if (s == VPMM_NO_STREAM) { /* cudaFree: the shim's synchronisation */
		vpmm_pool_poll(R->pool, true);
		vpmm_host_complete_all(R->drv);
		vpmm_pool_poll(R->pool, false);
	}
	int rc = vpmm_pool_free(R->pool, p, s);
	if (rc)
		fail(R, "thread %u: free(%#llx) = %d", T->idx, (unsigned long long)p, rc);
}

static void interlude_free(struct run *R, unsigned i)
{
	struct interlude *il = &R->il;
	if (R->r->backed)
		stamp(R->r, il->p[i], il->size[i], il->tag[i], true, R, NULL);
	int rc = vpmm_pool_free(R->pool, il->p[i], il->s);
	if (rc)
		fail(R, "interlude: free(%#llx) = %d", (unsigned long long)il->p[i], rc);
	il->n--;
	il->p[i] = il->p[il->n];
	il->size[i] = il->size[il->n];
	il->tag[i] = il->tag[il->n];
}

static void interlude(void *arg)
{
	struct run *R = arg;
	struct interlude *il = &R->il;
	if (!R->pool || pthread_mutex_trylock(&il->mu))
		return; /* the pool is being made, or another interlude runs */
	uint64_t x = rnd(&il->rng);
	switch (x % 8) {
	case 0:
	case 1:
		vpmm_pool_trim(R->pool, pick(&il->rng, 8) * R->r->page);
		break;
	case 2:
		if (vpmm_pool_reclaim(R->pool) < 0)
			fail(R, "interlude: reclaim failed");
		break;
	case 3:
		vpmm_pool_poll(R->pool, (x >> 8) & 1);
		break;
	default:
		if (il->n && (il->n == INTERLUDE_LIVE || (x >> 8) % 2)) {
			interlude_free(R, (unsigned)pick(&il->rng, il->n));
			break;
		}
		/* 1/50 to 8 units */
		size_t size = (size_t)((double)R->r->unit * (double)(1 + pick(&il->rng, 400)) / 50);
		CUdeviceptr p;
		int rc = vpmm_pool_malloc(R->pool, size, il->s, &p);
		if (rc && rc != -ENOMEM)
			fail(R, "interlude: malloc(%zu) = %d", size, rc);
		if (rc)
			break;
		il->p[il->n] = p;
		il->size[il->n] = size;
		il->tag[il->n] = ((uint64_t)MAXT << 32) | ++il->next_tag;
		if (R->r->backed)
			stamp(R->r, p, size, il->tag[il->n], false, R, NULL);
		il->n++;
	}
	pthread_mutex_unlock(&il->mu);
}

static void *thread_main(void *arg)
{
	struct thread *T = arg;
	struct run *R = T->run;
	struct round *r = R->r;
	for (size_t i = 0; i < T->sc.n && !atomic_load(&R->failed); i++) {
		do_op(R, T, &T->sc.ops[i]);
		uint64_t x = rnd(&T->rng);
		if (x % 997 == 0)
			vpmm_pool_trim(R->pool, pick(&T->rng, 8) * r->page);
		else if (x % 401 == 0 && vpmm_pool_reclaim(R->pool) < 0)
			fail(R, "thread %u: reclaim failed", T->idx);
		else if (x % 307 == 0)
			vpmm_pool_poll(R->pool, (x >> 20) & 1);
		if ((i + 1) % r->check_every == 0) {
			size_t bad = vpmm_pool_check(R->pool, stderr);
			if (bad)
				fail(R, "thread %u: %zu broken invariants after op %zu", T->idx, bad, i);
		}
	}
	if (!atomic_load(&R->failed) && rnd(&T->rng) % 2)
		for (unsigned k = 0; k < r->nstreams[T->idx]; k++)
			vpmm_pool_stream_gone(R->pool, T->s[k]);
	return NULL;
}

struct totals {
	unsigned long rounds, ops, mallocs, enomem, avoidable, avoidable_single;
	uint64_t defrags, remapped, created, completed, tenant_moves, interludes;
};

static int run_round(unsigned k, bool quick, struct totals *tot)
{
	static struct round r;
	static struct run R;
	memset(&R, 0, sizeof(R));
	R.r = &r;
	if (draw_round(&r, &R, k, quick)) {
		fprintf(stderr, "pressure: no host memory for round %u\n", k);
		return -1;
	}
	struct vpmm_host_options ho = {.granularity = r.page, .capacity = r.capacity,
				       .unbacked = !r.backed};
	struct vpmm_host_device *dev = NULL;
	if (vpmm_driver_host_create(&ho, &R.drv) != CUDA_SUCCESS) {
		fail(&R, "no host driver");
		return -1;
	}
	vpmm_host_set_tenant(R.drv, r.tenant_hi);
	for (unsigned i = 0; i < r.nthreads; i++)
		for (unsigned j = 0; j < r.nstreams[i]; j++)
			R.t[i].s[j] = vpmm_host_stream_create(R.drv);
	pthread_mutex_init(&R.il.mu, NULL);
	R.il.rng = mix(r.seed ^ 0x11);
	R.il.s = vpmm_host_stream_create(R.drv);
	r.dev.interlude_fn = interlude;
	r.dev.interlude_arg = &R;
	int rc = vpmm_host_device_start(R.drv, &r.dev, &dev);
	if (rc)
		fail(&R, "model: %d", rc);
	rc = rc ? rc : vpmm_pool_create(&r.cfg, R.drv, &R.pool);
	if (rc && !atomic_load(&R.failed) && !(rc == -ENOMEM && r.cfg.initial_pages))
		fail(&R, "pool_create = %d", rc);
	for (unsigned i = 0; R.pool && i < r.nthreads; i++) {
		struct thread *T = &R.t[i];
		T->run = &R;
		T->idx = i;
		T->rng = mix(r.seed + i);
		T->ptr = calloc(T->sc.nids + 1, sizeof(*T->ptr));
		if (!T->ptr || pthread_create(&T->th, NULL, thread_main, T)) {
			fail(&R, "thread %u did not start", i);
			break;
		}
	}
	for (unsigned i = 0; R.pool && i < r.nthreads; i++)
		if (R.t[i].ptr)
			pthread_join(R.t[i].th, NULL);

	struct vpmm_stats st = {0};
	if (R.pool) {
		/* Every script ended with everything freed; the interlude's go now. */
		vpmm_host_device_quiet(dev, true);
		while (R.il.n)
			interlude_free(&R, 0);
		vpmm_host_complete_all(R.drv);
		if (vpmm_pool_reclaim(R.pool) < 0)
			fail(&R, "reclaim at the end failed");
		size_t bad = vpmm_pool_check(R.pool, stderr);
		if (bad)
			fail(&R, "%zu broken invariants at the end", bad);
		vpmm_pool_stats(R.pool, &st);
		if (!r.cfg.small_max && st.live)
			fail(&R, "%" PRIu64 " bytes live after every free", st.live);
		if (r.cfg.limit && st.mapped_peak > r.cfg.limit)
			fail(&R, "mapped %" PRIu64 " bytes, past the limit of %zu", st.mapped_peak,
			     r.cfg.limit);
		vpmm_pool_destroy(R.pool);
	}
	struct vpmm_host_device_stats ds = {0};
	vpmm_host_device_stop(dev, &ds);
	struct vpmm_host_live l;
	vpmm_host_live(R.drv, &l);
	if (R.pool && (l.handles || l.reservations || l.mappings || l.events))
		fail(&R, "the driver still holds %zu handles, %zu reservations, %zu mappings, "
		     "%zu events", l.handles, l.reservations, l.mappings, l.events);
	R.drv->destroy(R.drv);
	pthread_mutex_destroy(&R.il.mu);
	if (verbose) {
		unsigned long e = 0, a = 0;
		for (unsigned i = 0; i < r.nthreads; i++) {
			e += R.t[i].enomem;
			a += R.t[i].avoidable;
		}
		printf("%lu out of memory, %lu avoidable; %" PRIu64 " defrags; peak mapped "
		       "%.3f x live: %s\n", e, a, st.defrags,
		       (double)st.mapped_peak / (double)r.live, round_text);
	}
	tot->rounds++;
	tot->defrags += st.defrags;
	tot->remapped += st.pages_remapped;
	tot->created += st.pages_created;
	tot->completed += ds.completed;
	tot->tenant_moves += ds.tenant_moves;
	tot->interludes += ds.interludes;
	for (unsigned i = 0; i < r.nthreads; i++) {
		struct thread *T = &R.t[i];
		tot->ops += T->sc.n;
		tot->mallocs += T->mallocs;
		tot->enomem += T->enomem;
		tot->avoidable += T->avoidable;
		if (r.nthreads == 1)
			tot->avoidable_single += T->avoidable;
		free(T->ptr);
		script_free(&T->sc);
	}
	return atomic_load(&R.failed) ? -1 : 0;
}

int main(int argc, char **argv)
{
	double seconds = 30;
	unsigned rounds = 100000, only = UINT32_MAX;
	bool quick = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--quick") || !strcmp(a, "--verbose")) {
			quick |= !strcmp(a, "--quick");
			verbose |= !strcmp(a, "--verbose");
			continue;
		}
		if (!v) {
			fprintf(stderr, "usage: pressure [--seconds S] [--rounds N] [--seed X] "
				"[--round K] [--quick] [--verbose]\n");
			return 2;
		}
		i++;
		if (!strcmp(a, "--seconds"))
			seconds = atof(v);
		else if (!strcmp(a, "--rounds"))
			rounds = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--seed"))
			g_seed = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--round"))
			only = (unsigned)strtoul(v, NULL, 0);
		else
			return 2;
	}
	catch_crashes();
	struct totals tot = {0};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int failed = 0;
	for (unsigned k = only == UINT32_MAX ? 0 : only; k < rounds; k++) {
		if (run_round(k, quick, &tot)) {
			failed = 1;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double el = (double)(t1.tv_sec - t0.tv_sec) +
			    (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
		if (only != UINT32_MAX || el > seconds)
			break;
	}
	printf("pressure: seed %#" PRIx64 ": %lu rounds, %lu ops, %lu mallocs, %lu out of memory "
	       "(%lu avoidable: the free pages and the driver's would have held them; %lu of "
	       "them single-threaded); %" PRIu64 " defrags, %" PRIu64 " pages created, %" PRIu64
	       " remapped; the device completed %" PRIu64 " events, moved its tenant %" PRIu64
	       " times; %" PRIu64 " interludes\n", g_seed, tot.rounds, tot.ops, tot.mallocs,
	       tot.enomem, tot.avoidable, tot.avoidable_single, tot.defrags, tot.created,
	       tot.remapped, tot.completed, tot.tenant_moves, tot.interludes);
	if (!failed && only == UINT32_MAX && (!tot.defrags || !tot.enomem)) {
		fprintf(stderr, "pressure: the run exercised no defragmentation or no out "
			"of memory\n");
		failed = 1;
	}
	return failed;
}
