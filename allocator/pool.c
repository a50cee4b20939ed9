/* pool.c — the pool's operations: malloc in three phases, free with
 * stream-ordered reuse, defragmentation by remapping whole physical handles
 * into a hole, and the reclaim of zombies.
 *
 * Structures and invariants: pool_internal.h. The checker and the region map:
 * check.c. Every driver call goes through DRV() so it is counted.
 *
 * Stream order without an event per free: a free is tagged with its stream's
 * open epoch; an event is recorded only to close an epoch (on the free path at
 * most once per cfg.event_interval_ns, or SOLE_RECORD_NS while one stream is
 * the only taker; or when another stream, a trim or a defragmentation needs
 * to know). Memory whose epoch completed is "settled":
 * any stream may take it without waiting.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "options.h"
#include "pool_internal.h"

#define DRV(p, op, fn, ...)                                                   \
	((p)->st.driver_calls++, (p)->driver_calls[op]++,                     \
	 (p)->drv->fn((p)->drv, __VA_ARGS__))

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cu_errno(CUresult r)
{
	return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

/* ---- comparators ---------------------------------------------------------- */

static int cmp_u64(uint64_t a, uint64_t b)
{
	return a < b ? -1 : a > b;
}

static int region_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	return cmp_u64(vpi_container_of(a, struct region, by_va)->va,
		       vpi_container_of(b, struct region, by_va)->va);
}

static int region_by_size(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	const struct region *x = vpi_container_of(a, struct region, by_size);
	const struct region *y = vpi_container_of(b, struct region, by_size);
	int c = cmp_u64(x->size, y->size);
	return c ? c : cmp_u64(x->va, y->va);
}

static int mapping_by_va(const struct vpi_tnode *a, const struct vpi_tnode *b)
{
	return cmp_u64(vpi_container_of(a, struct mapping, by_va)->va,
		       vpi_container_of(b, struct mapping, by_va)->va);
}

#define REG(n, member) ((n) ? vpi_container_of(n, struct region, member) : NULL)
#define MAP(n) ((n) ? vpi_container_of(n, struct mapping, by_va) : NULL)

static struct region *region_next(struct region *r)
{
	return REG(vpi_tree_next(&r->by_va), by_va);
}

static struct region *region_prev(struct region *r)
{
	return REG(vpi_tree_prev(&r->by_va), by_va);
}

bool vpi_region_beside_free_locked(struct region *r, const struct stream *s)
{
	struct region *side[2] = {region_prev(r), region_next(r)};
	bool mine = false, other = false;
	for (int i = 0; i < 2; i++) {
		struct region *n = side[i];
		if (!n || n->kind != R_FREE || n->chunk != r->chunk ||
		    (i ? r->va + r->size != n->va : n->va + n->size != r->va))
			continue;
		if (n->stream && n->stream != s)
			other = true;
		else
			mine = true;
	}
	/* Between free memory s may place in and memory pending on another
	 * stream, r given back would join the two in that stream's order: s
	 * could lose the very place it was after (found by a review). Beside
	 * the other stream's alone, r joins it; on scratch_streams that
	 * packed better than keeping r (docs/design.md). */
	return (mine || other) && !(mine && other);
}

/* ---- metadata allocation ---------------------------------------------------- */

/* Region structs are taken from a cache that is filled before an operation
 * mutates anything, so a host allocation failure can never strike halfway. */
static int reserve_regions(vpmm_pool *p, unsigned n)
{
	unsigned have = 0;
	for (struct region *r = p->region_cache; r && have < n; r = r->next)
		have++;
	for (; have < n; have++) {
		/* Cache lines of its own: front.c flips `parked` of live
		 * regions from any thread without the lock. */
		struct region *r = aligned_alloc(64, (sizeof(*r) + 63) & ~(size_t)63);
		if (!r)
			return -ENOMEM;
		r->claim = VPMM_CLAIMED;
		r->next = p->region_cache;
		p->region_cache = r;
	}
	return 0;
}

static struct region *region_new(vpmm_pool *p, enum rkind kind, CUdeviceptr va,
				 size_t size, unsigned chunk)
{
	struct region *r = p->region_cache; /* reserve_regions() guaranteed one */
	p->region_cache = r->next;
	/* The claim survives: a stale lock-free free may still read it. */
	memset(r, 0, offsetof(struct region, claim));
	__atomic_fetch_or(&r->claim, VPMM_CLAIMED, __ATOMIC_RELEASE);
	r->kind = kind;
	r->va = va;
	r->size = size;
	r->chunk = chunk;
	vpi_tree_insert(&p->regions, &r->by_va);
	p->st.regions++;
	return r;
}

static void region_delete(vpmm_pool *p, struct region *r)
{
	vpi_tree_remove(&p->regions, &r->by_va);
	p->st.regions--;
	r->next = p->region_cache;
	p->region_cache = r;
}

/* ---- gauges ----------------------------------------------------------------- */

#define GAUGE_ADD(p, g, n)                                                    \
	do {                                                                  \
		(p)->st.g += (n);                                             \
		if ((p)->st.g > (p)->st.g##_peak)                             \
			(p)->st.g##_peak = (p)->st.g;                         \
	} while (0)
#define GAUGE_SUB(p, g, n) ((p)->st.g -= (n))

/* ---- streams and events ------------------------------------------------------- */

static unsigned stream_slot(const vpmm_pool *p, CUstream h)
{
	return vpi_hash_bits((uint64_t)(uintptr_t)h, (unsigned)__builtin_ctz(p->stream_hash_size));
}

static int stream_hash_grow(vpmm_pool *p)
{
	unsigned n = p->stream_hash_size ? p->stream_hash_size * 2 : 16;
	struct stream **t = calloc(n, sizeof(*t));
	if (!t)
		return -ENOMEM;
	free(p->stream_hash);
	p->stream_hash = t;
	p->stream_hash_size = n;
	for (struct stream *s = p->streams; s; s = s->next) {
		unsigned i = stream_slot(p, s->handle);
		s->hash_next = t[i];
		t[i] = s;
	}
	return 0;
}

/* The stream record of `h`, created on first sight; NULL if the host is out
 * of memory. VPMM_NO_STREAM has no record (callers pass NULL). */
struct stream *vpi_stream_get_locked(vpmm_pool *p, CUstream h)
{
	struct stream *s = p->last_stream;
	if (s && s->handle == h)
		return s;
	if (p->stream_hash_size)
		for (s = p->stream_hash[stream_slot(p, h)]; s; s = s->hash_next)
			if (s->handle == h)
				return p->last_stream = s;
	if (p->nstreams + 1 > p->stream_hash_size / 2 && stream_hash_grow(p))
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->handle = h;
	if (pthread_mutex_init(&s->front.lock, NULL)) {
		free(s);
		return NULL;
	}
	s->id = __atomic_fetch_add(&p->nstreams, 1, __ATOMIC_RELEASE);
	s->epoch = 1;
	vpi_tree_init(&s->free_by_size, region_by_size, s->id + 1);
	struct stream **tail = &p->streams;
	while (*tail)
		tail = &(*tail)->next;
	*tail = s;
	unsigned i = stream_slot(p, h);
	s->hash_next = p->stream_hash[i];
	p->stream_hash[i] = s;
	return p->last_stream = s;
}

/* Unlinks ev from p->events (it is being destroyed). */
static void event_forget(vpmm_pool *p, struct event *ev)
{
	for (struct event **e = &p->events; *e; e = &(*e)->all_next)
		if (*e == ev) {
			*e = ev->all_next;
			return;
		}
}

static void event_unref(vpmm_pool *p, struct event *ev)
{
	if (ev && --ev->refs == 0) {
		if (ev->gone) { /* its driver event died with its context */
			event_forget(p, ev);
			free(ev);
			return;
		}
		ev->next = p->event_cache;
		p->event_cache = ev;
	}
}

/* Record an event on s that closes its open epoch. */
static int close_epoch(vpmm_pool *p, struct stream *s, struct event **out)
{
	struct event *ev = p->event_cache;
	bool fresh = !ev;
	CUresult r;
	if (ev) {
		p->event_cache = ev->next;
	} else {
		ev = calloc(1, sizeof(*ev));
		if (!ev)
			return -ENOMEM;
		r = DRV(p, VPMM_OP_EVENT_CREATE, event_create, &ev->ev);
		if (r != CUDA_SUCCESS) {
			free(ev);
			p->last_result = r;
			return cu_errno(r);
		}
	}
	/* The epoch moves before the record: a lock-free free that reads the
	 * old epoch did so before this record was issued, so the event covers
	 * its work (front.c). If the record fails, the next event covers both. */
	uint64_t e = __atomic_fetch_add(&s->epoch, 1, __ATOMIC_SEQ_CST);
	r = DRV(p, VPMM_OP_EVENT_RECORD, event_record, ev->ev, s->handle);
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		if (fresh) {
			/* It may be what failed (made in a context the stream is
			 * not of): not cached, so it cannot fail every record. */
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
			free(ev);
		} else {
			ev->next = p->event_cache;
			p->event_cache = ev;
		}
		return cu_errno(r);
	}
	if (fresh) {
		ev->all_next = p->events;
		p->events = ev;
	}
	ev->stream = s;
	ev->epoch = e;
	ev->refs = 1;
	ev->done = false;
	ev->next = NULL;
	if (s->ev_tail)
		s->ev_tail->next = ev;
	else
		s->ev_head = ev;
	s->ev_tail = ev;
	if (p->cfg.event_interval_ns)
		s->last_record_ns = now_ns();
	p->st.events_recorded++;
	if (out)
		*out = ev;
	return 0;
}

/* close_epoch(), unless another thread is capturing s: our event would join
 * its graph. -EBUSY then, and the epoch stays open. */
static int close_epoch_uncaptured(vpmm_pool *p, struct stream *s)
{
	bool capturing = false;
	DRV(p, VPMM_OP_STREAM_CAPTURING, stream_capturing, s->handle, &capturing);
	return capturing ? -EBUSY : close_epoch(p, s, NULL);
}

/* The first event of s that completes after every free of `epoch`; NULL when
 * that epoch is already known complete. Records one if none covers it yet. */
static int cover_event(vpmm_pool *p, struct stream *s, uint64_t epoch,
		       struct event **out)
{
	*out = NULL;
	if (epoch <= s->done)
		return 0;
	for (struct event *ev = s->ev_head; ev; ev = ev->next)
		if (ev->epoch >= epoch) {
			*out = ev;
			return 0;
		}
	if (s->dead) /* its last record failed: nothing can cover this */
		return -EIO;
	return close_epoch(p, s, out);
}

/* ---- free-region and hole indexes -------------------------------------------- */

static void fifo_unlink(struct stream *s, struct region *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		s->fifo_head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		s->fifo_tail = r->prev;
	r->prev = r->next = NULL;
}

/* Keep the fifo sorted by epoch; new frees carry the largest epoch, so the
 * walk from the tail is O(1) in the common case. */
static void fifo_insert(struct stream *s, struct region *r)
{
	struct region *after = s->fifo_tail;
	while (after && after->epoch > r->epoch)
		after = after->prev;
	r->prev = after;
	r->next = after ? after->next : s->fifo_head;
	if (r->next)
		r->next->prev = r;
	else
		s->fifo_tail = r;
	if (after)
		after->next = r;
	else
		s->fifo_head = r;
}

static void free_index(vpmm_pool *p, struct region *r)
{
	if (r->stream) {
		vpi_tree_insert(&r->stream->free_by_size, &r->by_size);
		fifo_insert(r->stream, r);
	} else {
		vpi_tree_insert(&p->settled, &r->by_size);
	}
}

static void free_unindex(vpmm_pool *p, struct region *r)
{
	if (r->stream) {
		vpi_tree_remove(&r->stream->free_by_size, &r->by_size);
		fifo_unlink(r->stream, r);
	} else {
		vpi_tree_remove(&p->settled, &r->by_size);
	}
}

/* Free neighbours merge when one may absorb the other's stream order: same
 * stream, or one side settled (its memory has no pending work). */
static bool free_mergeable(const struct region *a, const struct region *b)
{
	return a && b && a->kind == R_FREE && b->kind == R_FREE &&
	       a->chunk == b->chunk && a->va + a->size == b->va &&
	       (a->stream == b->stream || !a->stream || !b->stream);
}

/* r (FREE, in the regions tree, in no index) absorbs `other`, its neighbour. */
static void free_absorb(vpmm_pool *p, struct region *r, struct region *other)
{
	free_unindex(p, other);
	if (other->va < r->va)
		r->va = other->va; /* order in the tree is unchanged: other goes */
	r->size += other->size;
	if (other->stream) {
		if (!r->stream || other->epoch > r->epoch)
			r->epoch = other->epoch;
		r->stream = other->stream;
	}
	if (other->seq > r->seq)
		r->seq = other->seq;
	region_delete(p, other);
}

/* Index a FREE region, merging it with mergeable neighbours. Returns the
 * region that holds its memory afterwards. */
static struct region *free_insert(vpmm_pool *p, struct region *r)
{
	struct region *n;
	/* A loop: after a defragmentation the left neighbour may itself have a
	 * free neighbour that waited for it (see defrag()). */
	while (free_mergeable(n = region_prev(r), r))
		free_absorb(p, r, n);
	while (free_mergeable(r, n = region_next(r)))
		free_absorb(p, r, n);
	free_index(p, r);
	return r;
}

static bool hole_mergeable(const struct region *a, const struct region *b)
{
	return a && b && a->kind == R_HOLE && b->kind == R_HOLE &&
	       a->chunk == b->chunk && a->va + a->size == b->va;
}

static void hole_insert(vpmm_pool *p, struct region *r)
{
	struct region *n = region_prev(r);
	if (hole_mergeable(n, r)) {
		vpi_tree_remove(&p->holes, &n->by_size);
		r->va = n->va;
		r->size += n->size;
		region_delete(p, n);
	}
	n = region_next(r);
	if (hole_mergeable(r, n)) {
		vpi_tree_remove(&p->holes, &n->by_size);
		r->size += n->size;
		region_delete(p, n);
	}
	vpi_tree_insert(&p->holes, &r->by_size);
}

/* ---- learning that work completed ------------------------------------------- */

static void settle_stream(vpmm_pool *p, struct stream *s)
{
	while (s->fifo_head && s->fifo_head->epoch <= s->done) {
		struct region *r = s->fifo_head;
		free_unindex(p, r);
		p->settled_count++;
		r->stream = NULL;
		r->epoch = 0;
		free_insert(p, r);
	}
}

/* Query s's events oldest first; what completed settles. */
static void poll_stream(vpmm_pool *p, struct stream *s)
{
	bool moved = false;
	while (s->ev_head) {
		struct event *ev = s->ev_head;
		CUresult r = ev->done ? CUDA_SUCCESS
				      : DRV(p, VPMM_OP_EVENT_QUERY, event_query, ev->ev);
		if (r != CUDA_SUCCESS) {
			if (r != CUDA_ERROR_NOT_READY)
				p->last_result = r;
			break;
		}
		s->ev_head = ev->next;
		if (!s->ev_head)
			s->ev_tail = NULL;
		s->done = ev->epoch;
		ev->done = true;
		event_unref(p, ev);
		moved = true;
	}
	if (moved)
		settle_stream(p, s);
}

/* ---- mappings ---------------------------------------------------------------- */

static struct mapping *mapping_ceil(vpmm_pool *p, CUdeviceptr va)
{
	struct mapping probe = {.va = va};
	return MAP(vpi_tree_ceil(&p->maps, &probe.by_va));
}

static struct mapping *mapping_next(struct mapping *m)
{
	return MAP(vpi_tree_next(&m->by_va));
}

/* ---- the slab map ------------------------------------------------------------ */

/* Placement asks, for a page of free memory, which slab lies over it; the
 * map answers in O(1) where the tree of mappings takes O(log n) (a dozen
 * lookups per region looked at). Reserved like the page map: untouched
 * pages of it cost nothing. */
static int smap_create(vpmm_pool *p, struct chunk *c)
{
	size_t bytes = c->size / p->page * sizeof(struct mapping *);
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	c->smap = m;
	return 0;
}

static void smap_destroy(vpmm_pool *p, struct chunk *c)
{
	if (c->smap)
		munmap(c->smap, c->size / p->page * sizeof(struct mapping *));
	c->smap = NULL;
}

/* m becomes the home of its pages (home), or stops being it. */
static void smap_set(vpmm_pool *p, unsigned chunk, struct mapping *m, bool home)
{
	struct chunk *c = &p->chunks[chunk];
	struct mapping **e = &c->smap[(m->va - c->va) / p->page];
	for (size_t i = 0; i < m->slab->size / p->page; i++)
		e[i] = home ? m : NULL;
}

/* The slab over va, which lies in live or free memory of `chunk`. */
static struct mapping *slab_at(vpmm_pool *p, unsigned chunk, CUdeviceptr va)
{
	struct chunk *c = &p->chunks[chunk];
	return c->smap[(va - c->va) / p->page];
}

/* The first mapping at or after va, which lies in live, free or busy
 * memory of `chunk`: the slab map gives the slab over it at once, where the
 * tree would take a dozen comparisons; a defragmentation asks for each
 * region it looks at and each piece it moves. One step past it is enough
 * because no mapping starts inside a home mapping. Over a page the map
 * leaves empty (holes, zombies) it asks the tree. */
static struct mapping *mapping_from(vpmm_pool *p, unsigned chunk, CUdeviceptr va)
{
	struct mapping *m = slab_at(p, chunk, va);
	if (!m)
		return mapping_ceil(p, va);
	return m->va >= va ? m : mapping_next(m);
}

/* Drop one mapping record; the slab goes with its last mapping. */
static void mapping_forget(vpmm_pool *p, struct mapping *m)
{
	vpi_tree_remove(&p->maps, &m->by_va);
	if (--m->slab->nmaps == 0) {
		DRV(p, VPMM_OP_MEM_RELEASE, mem_release, m->slab->handle);
		free(m->slab);
	}
	free(m);
}

/* `bytes` rounded up to whole pages: what the driver maps. */
static size_t whole_pages(const vpmm_pool *p, size_t bytes)
{
	return (bytes + p->page - 1) / p->page * p->page;
}

/* ---- zombies ------------------------------------------------------------------- */

static void zombie_unlink(vpmm_pool *p, struct region *z)
{
	if (z->prev)
		z->prev->next = z->next;
	else
		p->zombie_head = z->next;
	if (z->next)
		z->next->prev = z->prev;
	else
		p->zombie_tail = z->prev;
	z->prev = z->next = NULL;
}

static void zombie_append(vpmm_pool *p, struct region *z)
{
	z->next = NULL;
	z->prev = p->zombie_tail;
	if (p->zombie_tail)
		p->zombie_tail->next = z;
	else
		p->zombie_head = z;
	p->zombie_tail = z;
}

/* Split r at `at` (r->va < at < end): r keeps the front, a new region of the
 * same kind and class takes the back. r must be out of every index but the
 * address tree, whose order this keeps. Region structs must be reserved. */
static struct region *split_off(vpmm_pool *p, struct region *r, CUdeviceptr at)
{
	struct region *n = region_new(p, r->kind, at, r->va + r->size - at, r->chunk);
	n->was = r->was;
	n->stream = r->stream;
	n->epoch = r->epoch;
	n->seq = r->seq;
	r->size = at - r->va;
	return n;
}

/* Take r out of circulation while the lock is dropped for driver work on it;
 * busy_return() puts it back as it was, merged with its neighbours. */
static void busy_take(vpmm_pool *p, struct region *r)
{
	if (r->kind == R_FREE)
		free_unindex(p, r);
	else if (r->kind == R_HOLE)
		vpi_tree_remove(&p->holes, &r->by_size);
	else if (r->kind == R_ZOMBIE)
		zombie_unlink(p, r);
	r->was = r->kind;
	r->kind = R_BUSY;
	p->busy++;
}

/* A free region coming back: what completed meanwhile is settled. */
static struct region *free_restore(vpmm_pool *p, struct region *r)
{
	if (r->stream && r->epoch <= r->stream->done) {
		r->stream = NULL;
		r->epoch = 0;
	}
	return free_insert(p, r);
}

static void busy_return(vpmm_pool *p, struct region *r)
{
	r->kind = r->was;
	p->busy--;
	if (r->kind == R_FREE)
		free_restore(p, r);
	else if (r->kind == R_HOLE)
		hole_insert(p, r);
	else if (r->kind == R_ZOMBIE)
		zombie_append(p, r);
}

/* ---- zombies ------------------------------------------------------------------- */

static bool zombie_ready(vpmm_pool *p, struct region *z, bool wait)
{
	struct event *ev = z->ev;
	if (!ev || ev->done)
		return true;
	poll_stream(p, ev->stream);
	if (!ev->done && wait) {
		CUresult r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, ev->ev);
		if (r == CUDA_SUCCESS)
			ev->done = true;
		else
			p->last_result = r;
	}
	return ev->done;
}

struct unmap_job {
	struct region *z;
	struct mapping *m;
	CUdeviceptr va;
	size_t size;
	CUresult r;
	bool tried;
};

/* Whether the background thread should leave its unmaps for later: a caller
 * is mapping, and the driver serialises the two (H100, replays: a caller's
 * cuMemMap 1.2-1.7 us alone, 5-6 us beside the thread's unmaps; cuMemCreate
 * 10-12 against 19-26). After VPMM_RECLAIM_DEFER_MAX rounds in a row
 * (VPMM_RECLAIM_DEFER_NS each at most) it unmaps anyway, so that callers
 * mapping back to back cannot starve it. Only the thread writes
 * reclaim_deferrals. */
static bool defer_to_mappers(vpmm_pool *p)
{
	return p->reclaim_deferrals < VPMM_RECLAIM_DEFER_MAX &&
	       __atomic_load_n(&p->mappers, __ATOMIC_RELAXED);
}

/* Phase 0: unmap the zombies whose events completed (all of them, waiting
 * on the CPU, when `wait`); they become holes. The unmapping runs with the
 * lock dropped. With `gave_way` (the background thread), it stops before
 * any unmap while a caller maps, leaves the rest zombies for the next round
 * and says so there. Returns how many ranges were reclaimed. */
static int reclaim_zombies(vpmm_pool *p, bool wait, bool *gave_way)
{
	struct region *batch = NULL, **tail = &batch;
	struct unmap_job *job;
	size_t njobs = 0, k = 0;
	int n = 0;
	bool defer = gave_way != NULL;

	/* Not even a look at the events while a caller maps: queries too
	 * meet its maps in the driver. */
	if (defer && defer_to_mappers(p)) {
		*gave_way = true;
		p->st.reclaims_deferred++;
		return 0;
	}
	for (struct region *z = p->zombie_head, *next; z; z = next) {
		next = z->next;
		if (!zombie_ready(p, z, wait))
			continue;
		busy_take(p, z);
		*tail = z;
		tail = &z->next;
		for (struct mapping *m = mapping_ceil(p, z->va);
		     m && m->va < z->va + z->size; m = mapping_next(m))
			njobs++;
	}
	*tail = NULL;
	if (!batch)
		return 0;
	job = calloc(njobs ? njobs : 1, sizeof(*job));
	if (!job) { /* no room to plan: give them back for the next try */
		for (struct region *z = batch, *next; z; z = next) {
			next = z->next;
			busy_return(p, z);
		}
		return -ENOMEM;
	}
	for (struct region *z = batch; z; z = z->next)
		for (struct mapping *m = mapping_ceil(p, z->va);
		     m && m->va < z->va + z->size; m = mapping_next(m))
			job[k++] = (struct unmap_job){.z = z, .m = m, .va = m->va,
						      .size = m->slab->size};

	/* A zombie stops at its first failed unmap: what is unmapped stays a
	 * prefix, which becomes a hole; the rest remains a zombie. */
	pthread_mutex_unlock(&p->lock);
	bool deferred = false;
	for (k = 0; k < njobs; k++) {
		if (k && job[k - 1].z == job[k].z && job[k - 1].r != CUDA_SUCCESS) {
			job[k].r = job[k - 1].r;
			continue;
		}
		/* mappers is read without the lock: a stale answer costs one
		 * unmap's wait or one round's delay, nothing else. */
		if (defer && (deferred || defer_to_mappers(p))) {
			deferred = true;
			job[k].r = CUDA_ERROR_NOT_READY; /* untried: not an error */
			continue;
		}
		job[k].r = p->drv->unmap(p->drv, job[k].va, job[k].size);
		job[k].tried = true;
	}
	pthread_mutex_lock(&p->lock);
	p->st.reclaims_deferred += deferred;
	if (defer)
		*gave_way = deferred;

	k = 0;
	for (struct region *z = batch, *next; z; z = next) {
		CUdeviceptr ok_to = z->va;
		bool failed = false;
		next = z->next;
		for (; k < njobs && job[k].z == z; k++) {
			p->st.driver_calls += job[k].tried;
			p->driver_calls[VPMM_OP_UNMAP] += job[k].tried;
			if (job[k].r != CUDA_SUCCESS) {
				if (job[k].tried)
					p->last_result = job[k].r;
				failed = true;
			} else if (!failed) {
				ok_to = job[k].va + job[k].size;
			}
			if (job[k].r == CUDA_SUCCESS)
				mapping_forget(p, job[k].m);
		}
		if (failed) {
			/* A failed or deferred unmap keeps the rest a zombie,
			 * ready for the next try (its event completed: no part
			 * needs it); what is unmapped before it becomes a hole. */
			struct region *rest = z;
			event_unref(p, z->ev);
			z->ev = NULL;
			if (ok_to > z->va && reserve_regions(p, 1) == 0) {
				rest = split_off(p, z, ok_to);
				GAUGE_SUB(p, zombies, z->size);
				GAUGE_ADD(p, holes, z->size);
				z->kind = R_HOLE;
				p->busy--;
				p->st.zombies_reclaimed++;
				hole_insert(p, z);
				p->busy++; /* rest is busy too */
			}
			busy_return(p, rest);
			continue;
		}
		event_unref(p, z->ev);
		z->ev = NULL;
		z->kind = R_HOLE;
		p->busy--;
		GAUGE_SUB(p, zombies, z->size);
		GAUGE_ADD(p, holes, z->size);
		p->st.zombies_reclaimed++;
		hole_insert(p, z);
		n++;
	}
	free(job);
	return n;
}

/* ---- chunks ---------------------------------------------------------------------- */

/* Reserve another VA chunk (lock dropped for the driver call) and add it as
 * one hole. */
static int chunk_add(vpmm_pool *p, size_t min, unsigned *index)
{
	min = whole_pages(p, min);
	size_t size = p->cfg.va_size > min ? p->cfg.va_size : min;
	CUdeviceptr va;
	CUresult r;
	int rc;

	pthread_mutex_unlock(&p->lock);
	r = p->drv->va_reserve(p->drv, size, &va);
	pthread_mutex_lock(&p->lock);
	p->st.driver_calls++;
	p->driver_calls[VPMM_OP_VA_RESERVE]++;
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		return cu_errno(r);
	}
	struct chunk *c = &p->chunks[p->nchunks];
	if (p->nchunks < VPMM_MAX_CHUNKS) { /* left by chunk_drop_if_unused() */
		vpi_gmap_destroy(p, c);
		smap_destroy(p, c);
	}
	*c = (struct chunk){.va = va, .size = size};
	rc = p->nchunks == VPMM_MAX_CHUNKS ? -ENOMEM : reserve_regions(p, 1);
	if (!rc)
		rc = vpi_gmap_create(p, c);
	if (!rc && (rc = smap_create(p, c)))
		vpi_gmap_destroy(p, c);
	if (rc) {
		DRV(p, VPMM_OP_VA_FREE, va_free, va, size);
		return rc;
	}
	struct region *hole = region_new(p, R_HOLE, va, size, p->nchunks);
	*index = p->nchunks;
	__atomic_store_n(&p->nchunks, p->nchunks + 1, __ATOMIC_RELEASE);
	vpi_tree_insert(&p->holes, &hole->by_size);
	GAUGE_ADD(p, reserved, size);
	GAUGE_ADD(p, holes, size);
	return 0;
}

/* Give back chunk `index` if it is the last one and nothing but a hole: a
 * failed request leaves no VA behind. */
static void chunk_drop_if_unused(vpmm_pool *p, unsigned index)
{
	struct chunk *c = &p->chunks[index];
	struct region probe = {.va = c->va}, *hole;
	if (index + 1 != p->nchunks)
		return;
	hole = REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
	if (!hole || hole->kind != R_HOLE || hole->va != c->va || hole->size != c->size)
		return;
	vpi_tree_remove(&p->holes, &hole->by_size);
	region_delete(p, hole);
	__atomic_store_n(&p->nchunks, p->nchunks - 1, __ATOMIC_RELEASE);
	/* Its page map stays until the slot is reused or the pool goes: a
	 * lock-free lookup may still be reading it. */
	DRV(p, VPMM_OP_VA_FREE, va_free, c->va, c->size);
	GAUGE_SUB(p, reserved, c->size);
	GAUGE_SUB(p, holes, c->size);
}

/* ---- defragmentation ----------------------------------------------------------------- */

struct harvest {
	struct region *r;     /* free region giving pages */
	CUdeviceptr a, b;     /* the whole slabs taken: [a, b) inside r */
	struct event *ev;     /* what the old VA waits for; NULL = nothing */
};

struct plan {
	struct harvest *h;
	size_t n, cap;
	size_t taken;         /* bytes in h */
	size_t target, room;  /* stop at target bytes; never beyond room */
};

static int plan_push(struct plan *pl, struct harvest h)
{
	if (pl->n == pl->cap) {
		size_t cap = pl->cap ? pl->cap * 2 : 8;
		struct harvest *n = realloc(pl->h, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		pl->h = n;
		pl->cap = cap;
	}
	pl->h[pl->n++] = h;
	return 0;
}

/* Take the slabs lying wholly inside r, lowest address first. A slab that
 * crosses r's edge (part of it live) cannot move: a handle maps whole. */
static int plan_region(vpmm_pool *p, struct plan *pl, struct region *r)
{
	CUdeviceptr end = r->va + r->size, a = 0, b = 0;
	for (struct mapping *m = mapping_from(p, r->chunk, r->va);
	     m && m->va < end && pl->taken < pl->target; m = mapping_next(m)) {
		size_t sz = m->slab->size;
		if (m->va + sz > end || pl->taken + sz > pl->room)
			break;
		if (!b)
			a = m->va;
		b = m->va + sz;
		pl->taken += sz;
	}
	return b ? plan_push(pl, (struct harvest){.r = r, .a = a, .b = b}) : 0;
}

/* VPMM_DEFRAG_ALL: every free slab that fits the hole, the caller's
 * regions first, then settled ones (smallest first), then other streams'
 * (oldest free first); within a region, lowest address first. */
static int plan_harvest_all(vpmm_pool *p, struct plan *pl, struct stream *caller,
			    const struct region *skip, const struct region *skip2)
{
	int rc = 0;
	if (caller)
		for (struct region *r = caller->fifo_head; r && !rc; r = r->next)
			if (r != skip && r != skip2 && pl->taken < pl->target)
				rc = plan_region(p, pl, r);
	for (struct vpi_tnode *n = vpi_tree_first(&p->settled); n && !rc;
	     n = vpi_tree_next(n)) {
		struct region *r = REG(n, by_size);
		if (r != skip && r != skip2 && pl->taken < pl->target)
			rc = plan_region(p, pl, r);
	}
	/* Other streams: oldest free first across all of them (each fifo is in
	 * free order already, so this merges their heads). */
	struct region *cur[64];
	unsigned n = 0;
	for (struct stream *s = p->streams; s; s = s->next) {
		if (s == caller || !s->fifo_head)
			continue;
		if (n == 64) { /* more streams than the merge holds: in turn */
			for (struct region *r = s->fifo_head; r && !rc; r = r->next)
				if (r != skip && r != skip2 && pl->taken < pl->target)
					rc = plan_region(p, pl, r);
			continue;
		}
		cur[n++] = s->fifo_head;
	}
	while (!rc && pl->taken < pl->target) {
		unsigned best = n;
		for (unsigned i = 0; i < n; i++)
			if (cur[i] && (best == n || cur[i]->seq < cur[best]->seq))
				best = i;
		if (best == n)
			break;
		if (cur[best] != skip && cur[best] != skip2)
			rc = plan_region(p, pl, cur[best]);
		cur[best] = cur[best]->next;
	}
	return rc;
}

struct slab_cand { /* a slab a defragmentation may move */
	struct region *r;   /* the free region it lies wholly inside */
	struct mapping *m;
	size_t order;       /* r's rank (harvest order), then address */
	bool others;        /* r is pending on another stream: costs a wait */
	bool take;
};

/* Largest first; the caller's and settled memory before other streams'. */
static int cand_by_size(const void *a, const void *b)
{
	const struct slab_cand *x = *(struct slab_cand *const *)a;
	const struct slab_cand *y = *(struct slab_cand *const *)b;
	if (x->others != y->others)
		return x->others ? 1 : -1;
	if (x->m->slab->size != y->m->slab->size)
		return x->m->slab->size < y->m->slab->size ? 1 : -1;
	return cmp_u64(x->order, y->order);
}

static int cand_push(struct slab_cand **c, size_t *n, size_t *cap, struct region *r,
		     struct mapping *m, bool others)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct slab_cand *t = realloc(*c, nc * sizeof(*t));
		if (!t)
			return -ENOMEM;
		*c = t;
		*cap = nc;
	}
	(*c)[*n] = (struct slab_cand){.r = r, .m = m, .order = *n, .others = others};
	(*n)++;
	return 0;
}

static int cand_region(vpmm_pool *p, struct slab_cand **c, size_t *n, size_t *cap,
		       struct region *r, const struct region *const *skip, bool others)
{
	CUdeviceptr end = r->va + r->size;
	int rc = 0;
	if (r == skip[0] || r == skip[1])
		return 0;
	for (struct mapping *m = mapping_from(p, r->chunk, r->va);
	     m && m->va + m->slab->size <= end && !rc; m = mapping_next(m))
		rc = cand_push(c, n, cap, r, m, others);
	return rc;
}

/* VPMM_DEFRAG_LACKING: which free slabs supply `target` bytes. A slab moved
 * beyond the lack stays free in the new span, behind the allocation and in
 * the same handle as its end: a piece no defragmentation can move again.
 * So the slabs are chosen by size, largest first (fewest handles to remap)
 * among those that still fit the lack; the rest, if any, is covered by the
 * smallest single slab that covers it, before anything is created (a
 * creation grows the pool for good, an overshoot only until the allocation
 * is freed). The caller's and settled memory come before other streams'. */
static int plan_harvest(vpmm_pool *p, struct plan *pl, struct stream *caller,
			const struct region *skip1, const struct region *skip2)
{
	const struct region *skip[2] = {skip1, skip2};
	struct slab_cand *c = NULL, **by = NULL;
	size_t n = 0, cap = 0, lim, i;
	int rc = 0;

	if (p->cfg.defrag == VPMM_DEFRAG_ALL)
		return plan_harvest_all(p, pl, caller, skip1, skip2);
	if (caller)
		for (struct region *r = caller->fifo_head; r && !rc; r = r->next)
			rc = cand_region(p, &c, &n, &cap, r, skip, false);
	for (struct vpi_tnode *t = vpi_tree_first(&p->settled); t && !rc;
	     t = vpi_tree_next(t))
		rc = cand_region(p, &c, &n, &cap, REG(t, by_size), skip, false);
	/* Other streams: oldest free first across all of them, as in
	 * plan_harvest_all(); a wait on each stream is the same price. */
	struct region *cur[64];
	unsigned ns = 0;
	for (struct stream *s = p->streams; s && !rc; s = s->next) {
		if (s == caller || !s->fifo_head)
			continue;
		if (ns == 64) { /* more streams than the merge holds: in turn */
			for (struct region *r = s->fifo_head; r && !rc; r = r->next)
				rc = cand_region(p, &c, &n, &cap, r, skip, true);
			continue;
		}
		cur[ns++] = s->fifo_head;
	}
	while (!rc) {
		unsigned best = ns;
		for (unsigned j = 0; j < ns; j++)
			if (cur[j] && (best == ns || cur[j]->seq < cur[best]->seq))
				best = j;
		if (best == ns)
			break;
		rc = cand_region(p, &c, &n, &cap, cur[best], skip, true);
		cur[best] = cur[best]->next;
	}
	if (!rc && n && !(by = malloc(n * sizeof(*by))))
		rc = -ENOMEM;
	if (rc || !n)
		goto out;
	for (i = 0; i < n; i++)
		by[i] = &c[i];
	qsort(by, n, sizeof(*by), cand_by_size);

	lim = pl->target / p->page * p->page;
	if (lim < pl->target) /* the lack is mapped in whole pages anyway */
		lim += p->page;
	if (lim > pl->room)
		lim = pl->room;
	for (i = 0; i < n && pl->taken < pl->target; i++)
		if (pl->taken + by[i]->m->slab->size <= lim) {
			by[i]->take = true;
			pl->taken += by[i]->m->slab->size;
		}
	if (pl->taken < pl->target) {
		struct slab_cand *best = NULL;
		size_t rest = pl->target - pl->taken;
		for (i = 0; i < n; i++) {
			struct slab_cand *x = by[i];
			if (x->take || x->m->slab->size < rest ||
			    pl->taken + x->m->slab->size > pl->room)
				continue;
			if (!best || x->others < best->others ||
			    (x->others == best->others && x->m->slab->size < best->m->slab->size))
				best = x;
		}
		if (best) {
			best->take = true;
			pl->taken += best->m->slab->size;
		}
	}
	/* One harvest per run of adjacent chosen slabs. Within a region the
	 * runs go highest address first: defrag() splits each off the end of
	 * what is left of the region. */
	for (i = n; i-- > 0 && !rc;) {
		size_t j = i;
		if (!c[i].take)
			continue;
		while (j > 0 && c[j - 1].take && c[j - 1].r == c[i].r &&
		       c[j - 1].m->va + c[j - 1].m->slab->size == c[j].m->va)
			j--;
		rc = plan_push(pl, (struct harvest){.r = c[i].r, .a = c[j].m->va,
						    .b = c[i].m->va + c[i].m->slab->size});
		i = j;
	}
out:
	free(by);
	free(c);
	return rc;
}

/* Order the device (or the CPU, for a caller without a stream) after the
 * work pending on each harvested region; find what each old VA waits for. */
static int plan_events(vpmm_pool *p, struct plan *pl, struct stream *caller)
{
	struct event *waited = NULL;
	for (size_t i = 0; i < pl->n; i++) {
		struct harvest *h = &pl->h[i];
		struct stream *s = h->r->stream;
		int rc;
		if (!s)
			continue;
		rc = cover_event(p, s, h->r->epoch, &h->ev);
		if (rc)
			return rc;
		/* Held across the unlocked driver work, handed to the zombie. */
		if (h->ev)
			h->ev->refs++;
		if (!h->ev || s == caller || h->ev == waited)
			continue;
		CUresult r;
		if (caller) {
			r = DRV(p, VPMM_OP_STREAM_WAIT, stream_wait, caller->handle,
				h->ev->ev);
			p->st.stream_waits += r == CUDA_SUCCESS;
		} else {
			r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, h->ev->ev);
			if (r == CUDA_SUCCESS)
				h->ev->done = true;
		}
		if (r != CUDA_SUCCESS) {
			p->last_result = r;
			return cu_errno(r);
		}
		waited = h->ev;
	}
	return 0;
}

struct fresh { /* a range mapped by this defragmentation */
	CUdeviceptr va;
	struct slab *slab;
	bool created;
	struct mapping *rec; /* preallocated record */
};

/* Largest first; ties in harvest order, the new slabs last. */
static int fresh_by_size(const void *a, const void *b)
{
	const struct fresh *x = *(struct fresh *const *)a;
	const struct fresh *y = *(struct fresh *const *)b;
	if (x->slab->size != y->slab->size)
		return x->slab->size < y->slab->size ? 1 : -1;
	return x < y ? -1 : x > y;
}

static void fresh_free(struct fresh *fr, size_t n, size_t nmove)
{
	if (!fr)
		return;
	for (size_t i = 0; i < n; i++)
		free(fr[i].rec);
	for (size_t i = nmove; i < n; i++)
		free(fr[i].slab);
	free(fr);
}

/* The handle size for a growth of `shortfall` bytes: the largest power of
 * two of pages within shortfall / k, at most handle_size. Each handle costs
 * about as much as a whole cudaMalloc (cuMemSetAccess is per handle), but
 * only whole handles can move: see docs/design.md.
 *
 * k is growth_split once the pool holds much more than the growth, and
 * falls to 1 as the growth outweighs what the pool holds:
 * k = 1 + split * mapped / (mapped + shortfall). A large handle strands
 * memory only once it holds live and free bytes side by side, and what it
 * can strand is measured against the whole pool: in an empty pool the
 * first growth (model weights, a preallocated cache) costs one handle, as
 * cudaMalloc would, and later growths split finer as the pool grows. */
static size_t handle_size_for(const vpmm_pool *p, size_t shortfall)
{
	size_t h = p->page, k = p->cfg.growth_split;
	uint64_t mapped = p->st.mapped;
	if (!k)
		return p->cfg.handle_size;
	if (!shortfall)
		return h;
	/* 128 bits: split * mapped may pass 64; the quotient is below split. */
	__extension__ typedef unsigned __int128 wide;
	k = 1 + (size_t)((wide)k * mapped / ((wide)mapped + shortfall));
	if (k > p->cfg.growth_split)
		k = p->cfg.growth_split;
	while (h * 2 <= shortfall / k && h * 2 <= p->cfg.handle_size)
		h *= 2;
	return h;
}

/* Whether `have` free bytes beside the span spare it a page. When they do
 * not, the request would only start (or end) inside a slab that stays
 * partly live, and leave as much free at the span's far end: no byte saved
 * and one more slab pinned. The first allocation of a PyTorch process (a
 * small tensor in a page of its own) made every later large one straddle
 * that page this way. */
static bool lends_a_page(const vpmm_pool *p, size_t have, size_t need)
{
	return (need - have + p->page - 1) / p->page < (need + p->page - 1) / p->page;
}

static bool lender_ok(const vpmm_pool *p, const struct region *f,
		      const struct region *hole, struct stream *caller, size_t need)
{
	return f && f->kind == R_FREE && f->chunk == hole->chunk && f->size < need &&
	       (!f->stream || f->stream == caller) && lends_a_page(p, f->size, need);
}

/* A free region usable by caller beside a hole lends its bytes: only the
 * rest of `need` is remapped or created, and the partly live slab at its
 * far end gets used instead of left behind (a harvest leaves such pieces
 * beside the hole it makes). The region may lie before the hole (the
 * request starts in it, *after = false) or after it (the request ends in
 * it), and the hole must hold the rest. The largest such region wins;
 * NULL if there is none. */
static struct region *find_lender(vpmm_pool *p, struct stream *caller, size_t need,
				  struct region **hole, bool *after)
{
	struct vpi_tree *idx[2] = {caller ? &caller->free_by_size : NULL, &p->settled};
	struct region *best = NULL;
	for (int i = 0; i < 2; i++) {
		struct vpi_tnode *t = idx[i] ? vpi_tree_last(idx[i]) : NULL;
		for (; t; t = vpi_tree_prev(t)) {
			struct region *f = REG(t, by_size), *h;
			if (best && f->size <= best->size)
				break; /* smaller from here on */
			if (f->size >= need)
				continue;
			if (!lends_a_page(p, f->size, need))
				break; /* nor will any smaller one */
			h = region_next(f);
			if (!(h && h->kind == R_HOLE && h->chunk == f->chunk &&
			      h->size >= need - f->size)) {
				h = region_prev(f);
				if (!(h && h->kind == R_HOLE && h->chunk == f->chunk &&
				      h->size >= need - f->size))
					continue;
			}
			best = f;
			*hole = h;
			*after = h->va < f->va;
			break;
		}
	}
	return best;
}

/* Phase 2. Makes a FREE region of at least `need` bytes usable by `caller`
 * (NULL: by anyone) and returns it.
 *
 * Under the lock it plans, records the events the plan needs and takes every
 * region it touches out of circulation (busy); it drops the lock for the
 * driver work (create, map, set access: tens of microseconds a handle) and
 * takes it again to commit. On failure every busy region goes back as it
 * was; only events recorded and waits inserted remain, which order work
 * conservatively and nothing more. */
static bool loop_cap_allows(const vpmm_pool *p, size_t bytes);

/* With *grow (a loop repeats, loop_repeats()), what the request lacks is
 * created rather than harvested, if the loops' cap allows it; *grow then
 * says whether it was. */
static int defrag(vpmm_pool *p, struct stream *caller, size_t need, bool *grow,
		  struct region **out, CUdeviceptr *at)
{
	struct plan pl = {0};
	struct fresh *fr = NULL, **order = NULL;
	size_t nfr = 0, nmove = 0, nmapped = 0, shortfall, lack, have = 0, off, k;
	size_t calls_create = 0, calls_map = 0, calls_access = 0;
	struct region *hole, *adj, *adj2 = NULL;
	unsigned new_chunk = UINT32_MAX;
	CUresult r = CUDA_SUCCESS;
	int rc;

	/* Where to map: beside a free region that lends its bytes (see
	 * find_lender()), else the smallest hole that fits, after a free
	 * region that lends what it has. */
	struct region probe = {.size = need}, *lender = NULL;
	bool after = false;
	if (p->cfg.defrag != VPMM_DEFRAG_ALL)
		lender = find_lender(p, caller, need, &hole, &after);
	if (lender) {
		adj = after ? NULL : lender;
		adj2 = after ? lender : NULL;
	} else {
		while (!(hole = REG(vpi_tree_ceil(&p->holes, &probe.by_size), by_size))) {
			rc = chunk_add(p, need, &new_chunk);
			if (rc)
				return rc;
		}
		adj = region_prev(hole);
		if (!lender_ok(p, adj, hole, caller, need))
			adj = NULL;
	}
	have = adj ? adj->size : adj2 ? adj2->size : 0;
	lack = need - have;
	if (*grow && !loop_cap_allows(p, whole_pages(p, lack)))
		*grow = false;

	pl.room = hole->size;
	pl.target = *grow ? 0 : p->cfg.defrag == VPMM_DEFRAG_ALL ? SIZE_MAX : lack;
	rc = plan_harvest(p, &pl, caller, adj, adj2);
	if (rc)
		goto out;
	shortfall = pl.taken >= lack ? 0 : lack - pl.taken;
	shortfall = whole_pages(p, shortfall); /* mapped whole */
	if (shortfall && p->cfg.limit &&
	    p->st.mapped + p->inflight + shortfall > p->cfg.limit) {
		p->last_result = CUDA_ERROR_OUT_OF_MEMORY;
		rc = -ENOMEM;
		goto out;
	}
	/* Every struct the commit needs, before the first driver call. */
	size_t hsize = handle_size_for(p, shortfall);
	size_t nnew = (shortfall + hsize - 1) / hsize;
	for (size_t i = 0; i < pl.n; i++)
		for (struct mapping *m = mapping_from(p, pl.h[i].r->chunk, pl.h[i].a);
		     m && m->va < pl.h[i].b; m = mapping_next(m))
			nmove++;
	nfr = nmove + nnew;
	rc = reserve_regions(p, (unsigned)(2 * pl.n + 2));
	fr = rc ? NULL : calloc(nfr, sizeof(*fr));
	order = fr ? malloc(nfr * sizeof(*order)) : NULL;
	if (!order) {
		rc = -ENOMEM;
		goto out;
	}
	for (k = 0; k < nfr; k++) {
		fr[k].rec = malloc(sizeof(*fr[k].rec));
		if (!fr[k].rec || (k >= nmove && !(fr[k].slab = calloc(1, sizeof(struct slab))))) {
			rc = -ENOMEM;
			goto out;
		}
	}
	rc = plan_events(p, &pl, caller);
	if (rc)
		goto out;

	/* Out of circulation: the harvested pieces, the lending neighbour and
	 * the part of the hole that will be mapped (its end when the request
	 * ends in adj2). */
	k = 0;
	for (size_t i = 0; i < pl.n; i++) {
		struct harvest *h = &pl.h[i];
		struct region *src = h->r;
		free_unindex(p, src);
		if (h->b < src->va + src->size)
			free_index(p, split_off(p, src, h->b));
		if (src->va < h->a) {
			struct region *mid = split_off(p, src, h->a);
			free_index(p, src);
			src = mid;
		}
		src->was = R_FREE; /* busy; unindexed above */
		src->kind = R_BUSY;
		p->busy++;
		h->r = src;
		for (struct mapping *m = mapping_from(p, src->chunk, h->a); m && m->va < h->b;
		     m = mapping_next(m))
			fr[k++].slab = m->slab;
	}
	for (size_t left = shortfall; k < nfr; k++) {
		fr[k].slab->size = left < hsize ? left : hsize;
		left -= fr[k].slab->size;
	}
	/* Largest slab first in the span, from where the request starts (from
	 * where it ends, when it ends in adj2): what it leaves free at its other
	 * end lies in the smallest slabs, wholly free ones among them (they can
	 * move again), rather than in part of a large one. */
	for (k = 0; k < nfr; k++)
		order[k] = &fr[k];
	qsort(order, nfr, sizeof(*order), fresh_by_size);
	if (adj)
		busy_take(p, adj);
	if (adj2)
		busy_take(p, adj2);
	vpi_tree_remove(&p->holes, &hole->by_size);
	if (hole->size > pl.taken + shortfall && adj2) {
		/* The request ends in adj2: map the end of the hole. */
		struct region *back = split_off(p, hole, hole->va + hole->size - pl.taken - shortfall);
		vpi_tree_insert(&p->holes, &hole->by_size);
		hole = back;
	} else if (hole->size > pl.taken + shortfall) {
		vpi_tree_insert(&p->holes,
				 &split_off(p, hole, hole->va + pl.taken + shortfall)->by_size);
	}
	off = hole->va;
	for (k = 0; k < nfr; k++) {
		struct fresh *f = order[adj2 ? nfr - 1 - k : k];
		f->va = off;
		off += f->slab->size;
	}
	hole->was = R_HOLE;
	hole->kind = R_BUSY;
	p->busy++;
	p->inflight += shortfall;
	CUdeviceptr base = hole->va;
	int acc[VPMM_MAX_ACCESS];
	unsigned nacc = p->naccess;
	memcpy(acc, p->access, nacc * sizeof acc[0]);

	__atomic_fetch_add(&p->mappers, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&p->lock);
	/* Create the shortfall; map harvested slabs first, new ones after. */
	for (k = nmove; k < nfr; k++) {
		r = p->drv->mem_create(p->drv, p->cfg.device, fr[k].slab->size,
				       &fr[k].slab->handle);
		calls_create++;
		if (r != CUDA_SUCCESS)
			break;
		fr[k].created = true;
	}
	for (k = 0; r == CUDA_SUCCESS && k < nfr; k++) {
		r = p->drv->map(p->drv, fr[k].va, fr[k].slab->size, fr[k].slab->handle);
		calls_map++;
		nmapped += r == CUDA_SUCCESS;
	}
	if (r == CUDA_SUCCESS) {
		r = p->drv->set_access(p->drv, base, off - base, acc, (int)nacc);
		calls_access++;
	}
	if (r != CUDA_SUCCESS) {
		for (k = nmapped; k-- > 0;)
			p->drv->unmap(p->drv, fr[k].va, fr[k].slab->size);
		for (k = nmove; k < nfr; k++)
			if (fr[k].created)
				p->drv->mem_release(p->drv, fr[k].slab->handle);
	}
	__atomic_fetch_sub(&p->mappers, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&p->lock);
	if (p->reclaim_deferrals) /* the background thread waits for us */
		pthread_cond_signal(&p->reclaim_cond);
	p->inflight -= shortfall;
	p->st.driver_calls += calls_create + calls_map + calls_access;
	p->driver_calls[VPMM_OP_MEM_CREATE] += calls_create;
	p->driver_calls[VPMM_OP_MAP] += calls_map;
	p->driver_calls[VPMM_OP_SET_ACCESS] += calls_access;
	if (r != CUDA_SUCCESS) { /* the undo calls above */
		p->st.driver_calls += nmapped;
		p->driver_calls[VPMM_OP_UNMAP] += nmapped;
		for (k = nmove; k < nfr; k++)
			if (fr[k].created) {
				p->st.driver_calls++;
				p->driver_calls[VPMM_OP_MEM_RELEASE]++;
			}
	}

	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		rc = cu_errno(r);
		for (size_t i = 0; i < pl.n; i++)
			busy_return(p, pl.h[i].r);
		if (adj)
			busy_return(p, adj);
		if (adj2)
			busy_return(p, adj2);
		busy_return(p, hole);
		goto out;
	}

	/* Commit: nothing below can fail. */
	size_t mapped_len = off - base, created = 0;
	bool pending = false;
	p->st.handles_remapped += nmove;
	for (k = 0; k < nfr; k++) {
		fr[k].rec->va = fr[k].va;
		fr[k].rec->slab = fr[k].slab;
		fr[k].slab->nmaps++;
		vpi_tree_insert(&p->maps, &fr[k].rec->by_va);
		smap_set(p, hole->chunk, fr[k].rec, true);
		fr[k].rec = NULL;
		if (fr[k].created) {
			created += fr[k].slab->size;
			p->st.handles_created++;
			fr[k].slab = NULL; /* owned by the pool now */
		}
	}
	for (size_t i = 0; i < pl.n; i++) {
		struct region *z = pl.h[i].r;
		pending |= z->stream != NULL;
		p->busy--;
		z->kind = R_ZOMBIE;
		z->stream = NULL;
		z->epoch = 0;
		z->ev = pl.h[i].ev; /* plan_events' reference */
		pl.h[i].ev = NULL;
		zombie_append(p, z);
		for (struct mapping *m = mapping_from(p, z->chunk, z->va);
		     m && m->va < z->va + z->size; m = mapping_next(m))
			smap_set(p, z->chunk, m, false);
		GAUGE_SUB(p, reusable, z->size);
		GAUGE_ADD(p, zombies, z->size);
		p->st.pages_remapped += z->size / p->page;
	}
	if (pl.n)
		pthread_cond_signal(&p->reclaim_cond);
	/* The allocation starts at the lending neighbour, or ends with the one
	 * after the span, else starts at the span (a handle boundary), whatever
	 * the merges below make of them. */
	*at = adj ? adj->va : adj2 ? adj2->va - (need - adj2->size) : base;
	if (adj2) { /* absorbed by the span below, before any other merge */
		p->busy--;
		adj2->kind = R_FREE;
		if (adj2->stream && adj2->epoch <= adj2->stream->done) {
			adj2->stream = NULL;
			adj2->epoch = 0;
		}
		free_index(p, adj2);
	}
	if (adj) {
		/* Indexed alone: it must join the new span first (the request
		 * starts in it); free_insert() below then also merges the span
		 * with a left neighbour freed while the lock was dropped. */
		p->busy--;
		adj->kind = R_FREE;
		if (adj->stream && adj->epoch <= adj->stream->done) {
			adj->stream = NULL;
			adj->epoch = 0;
		}
		free_index(p, adj);
	}
	p->busy--;
	hole->kind = R_FREE;
	hole->stream = caller && pending ? caller : NULL;
	hole->epoch = caller && pending ? caller->epoch : 0;
	GAUGE_SUB(p, holes, mapped_len);
	GAUGE_ADD(p, mapped, created);
	GAUGE_ADD(p, reusable, mapped_len);
	p->st.pages_created += created / p->page;
	/* The request ends in adj2: the span takes it in first. A left
	 * neighbour of another stream that the span merges with afterwards
	 * would give it that stream, and adj2 (the caller's) could not join. */
	if (adj2)
		free_absorb(p, hole, adj2);
	*out = free_insert(p, hole);
	new_chunk = UINT32_MAX;
	rc = 0;
out:
	for (size_t i = 0; i < pl.n; i++)
		event_unref(p, pl.h[i].ev);
	fresh_free(fr, nfr, nmove);
	free(order);
	free(pl.h);
	if (new_chunk != UINT32_MAX)
		chunk_drop_if_unused(p, new_chunk);
	return rc;
}

/* Phase 1, other streams: close their open epochs so completion can be seen,
 * then let what completed settle. */
static void poll_others(vpmm_pool *p, struct stream *caller)
{
	for (struct stream *s = p->streams; s; s = s->next) {
		if (s == caller || !s->fifo_head)
			continue;
		if (!s->dead && s->fifo_tail->epoch == s->epoch)
			close_epoch_uncaptured(p, s);
		poll_stream(p, s);
	}
}

/* ---- giving memory back -------------------------------------------------------- */

struct release_job {
	struct region *r;   /* busy piece holding exactly this slab */
	struct mapping *m;
	CUresult r_unmap;
};

/* Unmap and release settled free slabs until at most `keep` reusable bytes
 * remain. Only slabs wholly inside a settled region with no zombie mapping
 * qualify: nothing can still touch them. Lock held; dropped for the driver
 * work. Returns the bytes given back. */
static size_t trim_locked(vpmm_pool *p, size_t keep)
{
	struct release_job *job = NULL;
	size_t n = 0, cap = 0, want, got = 0;

	vpi_front_flush_locked(p);
	poll_others(p, NULL); /* closes open epochs: completion shows next time */
	if (p->st.reusable <= keep)
		return 0;
	want = p->st.reusable - keep;
	/* Largest settled regions first: they are the least likely to be
	 * reused soon, and free whole slabs. */
	for (struct vpi_tnode *t = vpi_tree_last(&p->settled); t && got < want;) {
		struct region *r = REG(t, by_size);
		struct mapping *m = mapping_ceil(p, r->va);
		t = vpi_tree_prev(t);
		/* The first slab wholly inside r that no zombie still maps. */
		while (m && m->va < r->va + r->size &&
		       (m->slab->nmaps != 1 || m->va + m->slab->size > r->va + r->size))
			m = mapping_next(m);
		if (!m || m->va >= r->va + r->size)
			continue;
		if (reserve_regions(p, 2))
			break;
		if (n == cap) {
			size_t c = cap ? cap * 2 : 16;
			struct release_job *j = realloc(job, c * sizeof(*j));
			if (!j)
				break;
			job = j;
			cap = c;
		}
		/* Split that slab's range off and take it. */
		free_unindex(p, r);
		if (m->va > r->va) {
			struct region *mid = split_off(p, r, m->va);
			free_index(p, r);
			r = mid;
		}
		if (m->slab->size < r->size)
			free_index(p, split_off(p, r, m->va + m->slab->size));
		r->was = R_FREE;
		r->kind = R_BUSY;
		p->busy++;
		job[n++] = (struct release_job){.r = r, .m = m};
		got += m->slab->size;
		t = vpi_tree_last(&p->settled); /* indexes changed: start over */
	}
	if (!n) {
		free(job);
		return 0;
	}
	pthread_mutex_unlock(&p->lock);
	for (size_t i = 0; i < n; i++)
		job[i].r_unmap = p->drv->unmap(p->drv, job[i].m->va, job[i].m->slab->size);
	pthread_mutex_lock(&p->lock);
	got = 0;
	for (size_t i = 0; i < n; i++) {
		struct region *r = job[i].r;
		p->st.driver_calls++;
		p->driver_calls[VPMM_OP_UNMAP]++;
		if (job[i].r_unmap != CUDA_SUCCESS) {
			p->last_result = job[i].r_unmap;
			busy_return(p, r);
			continue;
		}
		got += r->size;
		smap_set(p, r->chunk, job[i].m, false);
		mapping_forget(p, job[i].m); /* releases the handle: last mapping */
		p->busy--;
		r->kind = R_HOLE;
		r->stream = NULL;
		GAUGE_SUB(p, reusable, r->size);
		GAUGE_SUB(p, mapped, r->size);
		if (p->loop_grown > p->st.mapped) /* which pages went is not known */
			p->loop_grown = p->st.mapped;
		GAUGE_ADD(p, holes, r->size);
		p->st.pages_released += r->size / p->page;
		hole_insert(p, r);
	}
	free(job);
	return got;
}

/* The background reclaimer: unmaps zombies off the callers' threads. While
 * some are pending it polls their events every RECLAIM_POLL_NS, and while a
 * caller maps it gives way (defer_to_mappers); otherwise it sleeps until a
 * defragmentation makes new ones. */
#define RECLAIM_POLL_NS 100000
#define RELEASE_POLL_NS 10000000
/* The longest a sole taker's frees wait for an event (vpi_give_locked):
 * a trim past the release threshold looks no more often. */
#define SOLE_RECORD_NS RELEASE_POLL_NS

static void timed_wait(vpmm_pool *p, long ns)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += ns;
	while (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&p->reclaim_cond, &p->lock, &ts);
}

static void *reclaimer_main(void *arg)
{
	vpmm_pool *p = arg;
	/* Driver calls need the pool's context current on this thread too. */
	CUcontext bound = p->ctx;
	p->drv->ctx_bind(p->drv, bound);
	pthread_mutex_lock(&p->lock);
	while (!p->stopping) {
		bool gave_way = false;
		if (p->ctx != bound) { /* vpmm_pool_drop_events moved the pool */
			bound = p->ctx;
			p->drv->ctx_bind(p->drv, bound);
		}
		if (p->zombie_head && reserve_regions(p, 2) == 0)
			reclaim_zombies(p, false, &gave_way);
		if (vpi_small_deferred(p))
			vpi_small_drain_locked(p);
		uint64_t parked = 0, hits, parks;
		if (p->cfg.release)
			vpi_front_counts_locked(p, &parked, &hits, &parks);
		if (p->cfg.release && p->st.reusable + parked > p->cfg.release_threshold) {
			/* A trim unmaps too: it waits for a caller's maps as
			 * the zombies do. */
			if (!gave_way && defer_to_mappers(p)) {
				gave_way = true;
				p->st.reclaims_deferred++;
			} else if (!gave_way) {
				trim_locked(p, p->cfg.release_threshold);
			}
		}
		p->reclaim_deferrals = gave_way ? p->reclaim_deferrals + 1 : 0;
		if (p->stopping)
			break;
		if (p->reclaim_deferrals &&
		    __atomic_load_n(&p->mappers, __ATOMIC_RELAXED)) {
			/* A caller is mapping; its defragmentation wakes us
			 * when it is done. Polling meanwhile would query
			 * events in the driver beside its maps. */
			timed_wait(p, VPMM_RECLAIM_DEFER_NS);
			continue;
		}
		if (p->cfg.release && !p->zombie_head && !vpi_small_deferred(p)) {
			/* Lock-free frees wake nobody: with a release threshold
			 * look again every RELEASE_POLL_NS. */
			timed_wait(p, RELEASE_POLL_NS);
			continue;
		}
		/* Poll while zombies, deferred blocks or free memory beyond the
		 * threshold wait for work to complete. */
		if (p->zombie_head || vpi_small_deferred(p) ||
		    (p->cfg.release && p->st.reusable > p->cfg.release_threshold)) {
			timed_wait(p, RECLAIM_POLL_NS);
		} else {
			pthread_cond_wait(&p->reclaim_cond, &p->lock);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* ---- public operations --------------------------------------------------------- */

int vpmm_pool_create(const struct vpmm_config *cfg, vpmm_driver *drv,
		     vpmm_pool **out)
{
	vpmm_pool *p;
	size_t gran;
	CUresult r;
	int rc;

	if (!cfg || !drv || !out)
		return -EINVAL;
	*out = NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->drv = drv;
	r = DRV(p, VPMM_OP_GRANULARITY, granularity, cfg->device, &gran);
	if (r != CUDA_SUCCESS) {
		rc = cu_errno(r);
		goto fail;
	}
	rc = vpmm_config_check(cfg, gran, NULL, 0);
	if (rc)
		goto fail;
	struct vpmm_units units;
	vpmm_config_units(cfg, gran, &units);
	p->page = units.page;
	p->grain = units.grain;
	p->cfg.page_size = units.page;
	p->cfg.handle_size = units.handle;
	p->cfg.grain = units.grain;
	p->cfg.va_size = whole_pages(p, p->cfg.va_size);
	p->st.page_size = p->page;
	if (p->cfg.front_entries > VPMM_FRONT_MAX)
		p->cfg.front_entries = VPMM_FRONT_MAX;
	if (p->cfg.loop_growth > VPMM_LOOP_GROWTH_MAX)
		p->cfg.loop_growth = VPMM_LOOP_GROWTH_MAX;
	p->access[0] = cfg->device;
	p->naccess = 1;
	p->chunks = calloc(VPMM_MAX_CHUNKS, sizeof(*p->chunks));
	if (!p->chunks) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = -ENOMEM;
	if (pthread_mutex_init(&p->lock, NULL))
		goto fail;
	vpi_front_pool_init(p);
	if (pthread_cond_init(&p->reclaim_cond, NULL)) {
		pthread_mutex_destroy(&p->lock);
		goto fail;
	}
	rc = 0;
	vpi_tree_init(&p->regions, region_by_va, 1);
	vpi_tree_init(&p->settled, region_by_size, 2);
	vpi_tree_init(&p->holes, region_by_size, 3);
	vpi_tree_init(&p->maps, mapping_by_va, 4);

	struct region *first;
	CUdeviceptr at;
	unsigned chunk;
	pthread_mutex_lock(&p->lock);
	rc = reserve_regions(p, 4);
	if (!rc)
		rc = vpi_small_init(p);
	if (!rc)
		rc = chunk_add(p, p->cfg.va_size, &chunk);
	if (!rc && cfg->initial_pages) {
		bool grow = false; /* vpmm_config_check() bounded the product */
		rc = defrag(p, NULL, cfg->initial_pages * p->page, &grow, &first, &at);
	}
	pthread_mutex_unlock(&p->lock);
	if (!rc && cfg->background &&
	    DRV(p, VPMM_OP_CTX_CURRENT, ctx_current, &p->ctx) != CUDA_SUCCESS)
		rc = -EIO;
	if (!rc && cfg->background) {
		/* Every signal blocked: the program's signals are for its own
		 * threads (one that sigwait()s for SIGTERM, say), and this
		 * thread, created from whichever thread allocated first, would
		 * otherwise take them with their default action. */
		sigset_t all, old;
		sigfillset(&all);
		/* Faults are the thread's own: blocked, they kill the process
		 * without the program's crash handler. */
		sigdelset(&all, SIGSEGV);
		sigdelset(&all, SIGBUS);
		sigdelset(&all, SIGFPE);
		sigdelset(&all, SIGILL);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = -pthread_create(&p->reclaimer, NULL, reclaimer_main, p);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		p->reclaimer_running = !rc;
	}
	if (rc) {
		vpmm_pool_destroy(p);
		return rc;
	}
	*out = p;
	return 0;
fail:
	free(p->chunks);
	free(p);
	return rc;
}

void vpmm_pool_destroy(vpmm_pool *p)
{
	if (!p)
		return;
	struct vpi_tnode *n;
	if (p->reclaimer_running) {
		pthread_mutex_lock(&p->lock);
		p->stopping = true;
		pthread_cond_signal(&p->reclaim_cond);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->reclaimer, NULL);
	}
	vpi_small_fini(p);
	while ((n = vpi_tree_first(&p->maps))) {
		struct mapping *m = MAP(n);
		DRV(p, VPMM_OP_UNMAP, unmap, m->va, m->slab->size);
		mapping_forget(p, m);
	}
	for (unsigned i = 0; i < VPMM_MAX_CHUNKS; i++) {
		if (i < p->nchunks)
			DRV(p, VPMM_OP_VA_FREE, va_free, p->chunks[i].va, p->chunks[i].size);
		vpi_gmap_destroy(p, &p->chunks[i]);
		smap_destroy(p, &p->chunks[i]);
	}
	while ((n = vpi_tree_first(&p->regions))) {
		struct region *r = REG(n, by_va);
		vpi_tree_remove(&p->regions, n);
		free(r);
	}
	while (p->region_cache) {
		struct region *r = p->region_cache;
		p->region_cache = r->next;
		free(r);
	}
	for (struct stream *s = p->streams, *next; s; s = next) {
		next = s->next;
		free(s->small_partial);
		vpi_loop_fini(&s->front.loop);
		pthread_mutex_destroy(&s->front.lock);
		free(s);
	}
	/* Zombies and deferred blocks may hold events no list has any more. */
	for (struct event *ev = p->events, *next; ev; ev = next) {
		next = ev->all_next;
		if (!ev->gone)
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
		free(ev);
	}
	free(p->stream_hash);
	free(p->chunks);
	vpi_loop_fini(&p->sync_front.loop);
	pthread_mutex_destroy(&p->sync_front.lock);
	pthread_cond_destroy(&p->reclaim_cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

/* Split the front `need` bytes of free region r off as a live allocation,
 * still claimed: vpmm_pool_malloc() frees it for the program's free, a slab
 * keeps it. */
static struct region *carve_live(vpmm_pool *p, struct region *r, size_t need)
{
	free_unindex(p, r);
	if (r->size > need) {
		struct region *t = region_new(p, R_FREE, r->va + need, r->size - need,
					      r->chunk);
		t->stream = r->stream;
		t->epoch = r->epoch;
		free_index(p, t);
	}
	r->size = need;
	r->kind = R_LIVE;
	r->stream = NULL;
	r->epoch = 0;
	/* A new generation: a free that read r before cannot claim it. */
	__atomic_store_n(&r->claim, (r->claim | VPMM_CLAIMED) + 2, __ATOMIC_RELEASE);
	GAUGE_SUB(p, reusable, need);
	GAUGE_ADD(p, live, need);
	vpi_gmap_publish(p, r, true);
	return r;
}

/* The last resort before an allocation fails: wait on the CPU for every
 * stream's frees, so that free neighbours of different streams merge (a
 * handle lying across two of them can move only then). */
static void settle_all_waiting(vpmm_pool *p)
{
	for (struct stream *s = p->streams; s; s = s->next) {
		struct event *ev = NULL;
		if (!s->fifo_tail || cover_event(p, s, s->fifo_tail->epoch, &ev) || !ev)
			continue;
		vpi_event_wait_locked(p, ev);
	}
}


/* ---- placement ------------------------------------------------------------------ */

/* What placing [x, x + need) inside free region r risks leaving stranded:
 * free memory in a slab that also holds live memory, which no
 * defragmentation can move (a handle moves only whole). Two parts:
 *
 * - Now: every wholly free slab it touches counts whole, since that slab
 *   becomes partly live. The slabs r shares with its neighbours are pinned
 *   already; using their free part costs nothing. (This part less `need`
 *   is exactly the change in stranded bytes.)
 * - Later: a slab its start or its end falls inside (not on a slab
 *   boundary) counts once more. Whatever lies on the other side of that
 *   boundary, once one side is freed the other pins the slab. Half, where
 *   the request lies against r's neighbour: that boundary exists already
 *   (a neighbour that goes first leaves the slab pinned either way).
 *
 * O(1): r is wholly mapped, by the slabs between s1 (over x) and s2 (over
 * its last byte). */
static size_t place_cost(const struct region *r, CUdeviceptr x, size_t need,
			 const struct mapping *s1, const struct mapping *s2)
{
	CUdeviceptr lo = s1->va, hi = s2->va + s2->slab->size, end = r->va + r->size;
	size_t cost = hi - lo;
	if (lo < r->va) /* shared with the left neighbour already */
		cost -= s1->slab->size;
	if (hi > end && (s2 != s1 || lo >= r->va)) /* with the right one */
		cost -= s2->slab->size;
	if (x > lo)
		cost += x == r->va ? s1->slab->size / 2 : s1->slab->size;
	if (x + need < hi)
		cost += x + need == end ? s2->slab->size / 2 : s2->slab->size;
	return cost;
}

/* The cheapest place for `need` bytes in r (need <= r->size) among those
 * where the cost can change: r's two ends, and the request's start or end
 * on the slab boundary nearest either end of r. The slab map finds the
 * slab over any page of r. */
static CUdeviceptr place_in(vpmm_pool *p, const struct region *r, size_t need,
			    size_t *cost)
{
	CUdeviceptr a = r->va, b = r->va + r->size, best = a;
	struct mapping *head = slab_at(p, r->chunk, a);
	struct mapping *first_end = slab_at(p, r->chunk, a + need - 1);
	*cost = place_cost(r, a, need, head, first_end);
	if (need == r->size)
		return a;
	struct mapping *tail = slab_at(p, r->chunk, b - 1);
	struct mapping *last_start = slab_at(p, r->chunk, b - need);
	struct spot { /* a place; its end slabs where known, else NULL */
		CUdeviceptr x;
		struct mapping *s1, *s2;
	} c[5];
	unsigned n = 0;
	c[n++] = (struct spot){b - need, last_start, tail};
	if (head->va < a) /* start on the first boundary */
		c[n++] = (struct spot){head->va + head->slab->size, NULL, NULL};
	/* end on the first boundary it can */
	c[n++] = (struct spot){first_end->va + first_end->slab->size - need, NULL, first_end};
	if (tail->va + tail->slab->size > b) /* end on the last boundary */
		c[n++] = (struct spot){tail->va - need, NULL, NULL};
	/* start on the last boundary it can */
	c[n++] = (struct spot){last_start->va, last_start, NULL};
	for (unsigned i = 0; i < n; i++) {
		size_t k;
		/* Within r; x - a wraps when x lies before a. */
		if (c[i].x - a > r->size - need || c[i].x == best)
			continue;
		k = place_cost(r, c[i].x, need,
			       c[i].s1 ? c[i].s1 : slab_at(p, r->chunk, c[i].x),
			       c[i].s2 ? c[i].s2 : slab_at(p, r->chunk, c[i].x + need - 1));
		if (k < *cost) {
			*cost = k;
			best = c[i].x;
		}
	}
	return best;
}

/* Free regions looked at per request, from the best fit up, the caller's
 * and the settled ones together. 8, 12 and 16 gave the same ratios in the
 * replays (docs/design.md); each region costs a few slab map lookups. */
#define PLACE_SCAN 8

/* Phase 1's choice: of the free regions usable by caller that fit `need`,
 * the smallest few, and in each the cheapest place (place_cost); the
 * cheapest wins, the smaller region on a tie. NULL if none fits. No driver
 * call, and no lock but the pool's. */
static struct region *place_locked(vpmm_pool *p, struct stream *caller, size_t need,
				   CUdeviceptr *at, size_t *cost)
{
	struct region probe = {.size = need}, *best = NULL;
	struct vpi_tnode *t[2] = {
		caller ? vpi_tree_ceil(&caller->free_by_size, &probe.by_size) : NULL,
		vpi_tree_ceil(&p->settled, &probe.by_size)};
	size_t best_cost = SIZE_MAX;
	/* Both indexes merged, smallest first. */
	for (unsigned seen = 0; seen < PLACE_SCAN && (t[0] || t[1]); seen++) {
		int i = !t[0] || (t[1] && region_by_size(t[1], t[0]) < 0);
		struct region *r = REG(t[i], by_size);
		size_t c;
		CUdeviceptr x = place_in(p, r, need, &c);
		t[i] = vpi_tree_next(t[i]);
		if (c < best_cost) { /* a tie keeps the smaller region */
			best = r;
			best_cost = c;
			*at = x;
		}
		if (best_cost <= need) /* nothing stranded now or later */
			break;
	}
	*cost = best_cost;
	return best;
}

/* ---- loops ------------------------------------------------------------------------ */

static struct region *find_region(vpmm_pool *p, CUdeviceptr ptr)
{
	struct region probe = {.va = ptr};
	return REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
}

/* Whether this defragmentation for `need` bytes repeats caller's loop
 * (loop.c), and the pool may grow by what the request lacks instead of
 * remapping memory the loop scatters again by the next step (about 30 us a
 * handle every step, against once): only below the live peak (a request
 * that raises it needs memory the pool never had; growing layer by layer
 * in a loop repeats too) and within VPMM_LIMIT. Records the
 * defragmentation either way. */
static bool loop_repeats(vpmm_pool *p, struct stream *caller, size_t need)
{
	struct front *f = vpi_front_of(p, caller);
	pthread_mutex_lock(&f->lock);
	bool periodic = vpi_loop_repeats(&f->loop, need, p->grain);
	pthread_mutex_unlock(&f->lock);
	if (!periodic || !p->cfg.loop_growth || p->st.live + need > p->st.live_peak)
		return false;
	return !p->cfg.limit || p->st.mapped + p->inflight + need <= p->cfg.limit;
}

/* The free region usable by caller that holds [x, x + need), if any. The
 * caller's own cache may hold the allocation that lies there, parked (in
 * another stream's cache it is not the caller's to give back): then
 * the whole cache goes back to the pool (once a request), so that the
 * mallocs after this one also go through the lock to their places of a
 * step before, instead of taking the newest parked allocation of their size.
 * Giving back only the one allocation let the step's placement drift: over
 * 20 settings of cache entries and loop growth, the PyTorch step's trace
 * still defragmented after 30 steps at 11 of them, against 4 (18 without
 * the places; docs/design.md, "Loops"). */
static struct region *place_at(vpmm_pool *p, struct stream *caller, size_t need,
			       CUdeviceptr x, bool *flushed)
{
	struct region *r = find_region(p, x);
	if (r && r->kind == R_LIVE && !r->small && vpi_claimed(r) &&
	    !*flushed && vpi_front_holds_locked(p, caller, r)) {
		*flushed = true;
		if (vpi_front_flush_stream_locked(p, caller))
			r = find_region(p, x);
	}
	if (!r || r->kind != R_FREE || (r->stream && r->stream != caller) ||
	    x + need > r->va + r->size)
		return NULL;
	return r;
}

/* Whether growing `bytes` more for loops keeps within the cap. The cap is
 * against the rest of the pool, not the live peak: parked allocations count
 * as live until a flush, and in a loop that no longer defragments they stay
 * parked (the step's live peak read 1694 MiB for 1476 of tensors). It
 * counts what the growth creates, not the request: a request that a free
 * neighbour half lends costs the cap half. */
static bool loop_cap_allows(const vpmm_pool *p, size_t bytes)
{
	uint64_t rest = p->st.mapped > p->loop_grown ? p->st.mapped - p->loop_grown : 0;
	return p->loop_grown + bytes <= rest / 100 * p->cfg.loop_growth;
}

/* Phases 0-2 for `need` bytes (whole pages): a live region. Lock held. */
int vpi_take_locked(vpmm_pool *p, struct stream *caller, size_t need,
			  const CUdeviceptr *hint, unsigned nhint, struct region **out)
{
	struct region *r = NULL;
	CUdeviceptr at = 0;
	bool flushed = false;
	int rc = reserve_regions(p, 4);
	if (rc)
		return rc;
	if (p->zombie_head && !p->reclaimer_running)
		reclaim_zombies(p, false, NULL);
	for (unsigned i = 0; i < nhint && !r; i++)
		if ((r = place_at(p, caller, need, hint[i], &flushed))) {
			at = hint[i];
			p->st.loop_hints++;
		}
	size_t cost = 0;
	if (!r)
		r = place_locked(p, caller, need, &at, &cost);
	/* A place that strands memory, or none: the caller's parked
	 * allocations beside free memory join it, and the place is sought
	 * again. Parked, such an allocation keeps a free range from growing,
	 * and the next malloc of its size takes it back in place (docs/
	 * design.md, "Why a cache packs worse"). Only then: a miss that
	 * gave back every such entry emptied the cache of a program cycling
	 * through a few sizes, and the hot path went from 470 to 2 721
	 * instructions a pair (bench/callgrind.sh). */
	if ((!r || cost > need) && vpi_front_release_beside_free_locked(p, caller))
		r = place_locked(p, caller, need, &at, &cost);
	if (!r && vpi_front_flush_locked(p))
		r = place_locked(p, caller, need, &at, &cost);
	if (!r) {
		poll_others(p, caller);
		r = place_locked(p, caller, need, &at, &cost);
	}
	if (!r) {
		bool grow = loop_repeats(p, caller, need);
		uint64_t created = p->st.pages_created;
		rc = defrag(p, caller, need, &grow, &r, &at);
		if (!rc && grow) {
			p->st.loop_growths++;
			p->loop_grown += (p->st.pages_created - created) * p->page;
		} else if (rc == -ENOMEM && grow) {
			/* Past the limit or the device's memory: what the loop
			 * would have grown, remapping still finds. */
			grow = false;
			rc = defrag(p, caller, need, &grow, &r, &at);
		}
		if (rc == -ENOMEM) {
			/* Last resort before failing: empty sub-page slabs go
			 * back, every stream is asked what completed, and if
			 * that freed anything the request is planned again. */
			uint64_t settled = p->settled_count;
			size_t trimmed = vpi_small_trim_locked(p);
			settle_all_waiting(p);
			if (trimmed || settled != p->settled_count) {
				r = place_locked(p, caller, need, &at, &cost);
				grow = false;
				rc = r ? 0 : defrag(p, caller, need, &grow, &r, &at);
			}
		}
		if (rc)
			return rc;
		p->st.defrags++;
	}
	if (at > r->va && reserve_regions(p, 1) == 0) {
		/* Start where the placement or the defragmentation put it. */
		free_unindex(p, r);
		struct region *t = split_off(p, r, at);
		free_index(p, r);
		free_index(p, t);
		r = t;
	}
	*out = carve_live(p, r, need);
	return 0;
}

/* A live region becomes free on `s` (NULL: settled), freed in `epoch` of s
 * (0: now). Lock held. */
void vpi_give_locked(vpmm_pool *p, struct region *r, struct stream *s,
			   uint64_t epoch)
{
	vpi_gmap_publish(p, r, false);
	r->kind = R_FREE;
	__atomic_store_n(&r->small, NULL, __ATOMIC_RELEASE);
	if (s && s->dead && (!epoch || epoch >= s->epoch))
		epoch = s->epoch - 1; /* no work after its last event */
	if (s && epoch && epoch <= s->done)
		s = NULL; /* parked while its work completed: settled */
	r->stream = s;
	r->epoch = s ? (epoch ? epoch : s->epoch) : 0;
	r->seq = ++p->free_seq;
	GAUGE_SUB(p, live, r->size);
	GAUGE_ADD(p, reusable, r->size);
	free_insert(p, r);
	/* Close the epoch now and then, so other streams can learn of
	 * completion without a record of their own; never on every free.
	 * A stream takes its own frees in its order: while it is the only
	 * taker, only a trim (giving memory back) and a taker yet to come
	 * would learn anything, and SOLE_RECORD_NS is soon enough for both.
	 * The 50 us interval there cost a training step 55 driver calls a
	 * step, 0.2-0.3 ms on an H100 (docs/design.md). */
	uint64_t every = p->cfg.event_interval_ns;
	if (every && every < SOLE_RECORD_NS && p->nstreams <= 1 && !p->sync_takes)
		every = SOLE_RECORD_NS;
	if (s && !s->dead && (!every || now_ns() - s->last_record_ns >= every))
		close_epoch(p, s, NULL);
	if (p->cfg.release && p->st.reusable > p->cfg.release_threshold)
		pthread_cond_signal(&p->reclaim_cond);
}

int vpi_cover_locked(vpmm_pool *p, struct stream *s, uint64_t epoch,
			   struct event **out)
{
	return cover_event(p, s, epoch, out);
}

bool vpi_event_done_locked(vpmm_pool *p, struct event *ev)
{
	if (!ev || ev->done)
		return true;
	poll_stream(p, ev->stream);
	return ev->done;
}

bool vpi_event_wait_locked(vpmm_pool *p, struct event *ev)
{
	if (!ev || ev->done)
		return true;
	CUresult r = DRV(p, VPMM_OP_EVENT_SYNC, event_sync, ev->ev);
	if (r != CUDA_SUCCESS) {
		p->last_result = r;
		return false;
	}
	poll_stream(p, ev->stream);
	return ev->done;
}

void vpi_event_unref_locked(vpmm_pool *p, struct event *ev)
{
	event_unref(p, ev);
}

int vpmm_pool_malloc(vpmm_pool *p, size_t size, CUstream stream, CUdeviceptr *out)
{
	struct stream *caller = NULL;
	struct region *r;
	int rc;

	if (!p || !out || !size)
		return -EINVAL;
	if (size > SIZE_MAX - 2 * p->page)
		return -ENOMEM;
	if (p->cfg.front_entries && vpi_front_malloc(p, size, stream, out) == 0)
		return 0;

	pthread_mutex_lock(&p->lock);
	if (stream == VPMM_NO_STREAM)
		p->sync_takes = true;
	else if (!(caller = vpi_stream_get_locked(p, stream))) {
		rc = -ENOMEM;
		goto out;
	}
	/* The sequence of mallocs (loop.c), and where this one's like went
	 * a step or more before. */
	struct front *f = vpi_front_of(p, caller);
	CUdeviceptr hint[VPMM_LOOP_HINTS];
	unsigned nhint = 0;
	bool small = size <= vpi_small_max(p);
	pthread_mutex_lock(&f->lock);
	vpi_loop_init(&f->loop); /* without memory, no loop is seen */
	uint64_t seq = vpi_loop_note(&f->loop, size, 0);
	if (!small)
		nhint = vpi_loop_hints(&f->loop, hint);
	pthread_mutex_unlock(&f->lock);
	if (small) {
		rc = vpi_small_malloc_locked(p, caller, size, out);
	} else {
		rc = vpi_take_locked(p, caller, vpi_grains(p, size),
					   hint, nhint, &r);
		if (!rc) {
			*out = r->va;
			vpi_unclaim(r); /* the program's to free now */
		}
	}
	if (!rc) {
		pthread_mutex_lock(&f->lock);
		vpi_loop_placed(&f->loop, seq, *out);
		pthread_mutex_unlock(&f->lock);
		p->st.mallocs++;
	}
out:
	if (rc)
		p->st.failures++;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

int vpmm_pool_free(vpmm_pool *p, CUdeviceptr ptr, CUstream stream)
{
	struct stream *s = NULL;
	struct region *r;
	int rc = -EINVAL;

	if (!p)
		return rc;
	if (p->cfg.front_entries && vpi_front_free(p, ptr, stream) == 0)
		return 0;
	pthread_mutex_lock(&p->lock);
	r = find_region(p, ptr);
	if (!r || r->kind != R_LIVE || (r->va != ptr && !r->small))
		goto out;
	if (stream != VPMM_NO_STREAM && !(s = vpi_stream_get_locked(p, stream))) {
		rc = -ENOMEM;
		goto out;
	}
	/* Claimed, not just looked at: a lock-free free of the same pointer
	 * may have read r already, and only one of the two may win. A
	 * block's claim is its park bit (small.c). */
	if (!r->small && !vpi_claim(r, __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE)))
		goto out;
	if (r->small) {
		rc = vpi_small_free_locked(p, r, ptr, s, 0, false);
	} else {
		vpi_give_locked(p, r, s, 0);
		rc = 0;
	}
	if (!rc)
		p->st.frees++;
out:
	pthread_mutex_unlock(&p->lock);
	return rc;
}

int vpmm_pool_find(vpmm_pool *p, CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	int rc = -EINVAL;
	if (!p)
		return rc;
	pthread_mutex_lock(&p->lock);
	struct region *r = find_region(p, ptr);
	if (r && r->kind == R_LIVE && ptr < r->va + r->size &&
	    (r->small || !vpi_claimed(r))) {
		if (r->small) {
			rc = vpi_small_find_locked(p, r, ptr, base, size);
		} else {
			if (base)
				*base = r->va;
			if (size)
				*size = r->size;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* The stream `s`, at *link in its hash chain, is gone: no malloc will name
 * it again, and a new stream may come with its handle. */
static void stream_forget_locked(vpmm_pool *p, struct stream *s, struct stream **link)
{
	s->dead = true;
	pthread_mutex_lock(&s->front.lock);
	vpi_loop_fini(&s->front.loop);
	pthread_mutex_unlock(&s->front.lock);
	*link = s->hash_next;
	s->hash_next = NULL;
	if (p->last_stream == s)
		p->last_stream = NULL;
	__atomic_fetch_add(&p->stream_gen, 1, __ATOMIC_RELEASE);
}

int vpmm_pool_stream_gone(vpmm_pool *p, CUstream h)
{
	int rc = 0;
	if (!p || h == VPMM_NO_STREAM)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	struct stream *s = NULL, **link = NULL;
	if (p->stream_hash_size)
		for (link = &p->stream_hash[stream_slot(p, h)]; *link; link = &(*link)->hash_next)
			if ((*link)->handle == h) {
				s = *link;
				break;
			}
	if (s) {
		/* Its parked frees join its pending ones; one last event, while
		 * the stream still exists, covers them all, and what it frees
		 * later: blocks of its slabs, freed by others once it is gone,
		 * are released in the epoch of that event (give_locked). Recorded
		 * even with no pending free, since those blocks' work may follow
		 * every event before it. */
		vpi_front_flush_stream_locked(p, s);
		uint64_t open = s->epoch;
		if ((rc = close_epoch_uncaptured(p, s)))
			/* No event will follow to cover an epoch a failed record
			 * closed: back to the last one recorded. */
			__atomic_store_n(&s->epoch, open, __ATOMIC_SEQ_CST);
		stream_forget_locked(p, s, link);
	}
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* Lock-free: chunks are a fixed array published by an atomic count, and
 * only the last one is ever given back (chunk_drop_if_unused). */
bool vpmm_pool_owns(vpmm_pool *p, CUdeviceptr ptr)
{
	if (!p)
		return false;
	unsigned n = __atomic_load_n(&p->nchunks, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n; i++)
		if (ptr >= p->chunks[i].va && ptr - p->chunks[i].va < p->chunks[i].size)
			return true;
	return false;
}

int vpmm_pool_reclaim(vpmm_pool *p)
{
	if (!p)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	for (struct stream *s = p->streams; s; s = s->next)
		poll_stream(p, s);
	vpi_small_drain_locked(p);
	int n = reserve_regions(p, 2) ? -ENOMEM : reclaim_zombies(p, false, NULL);
	pthread_mutex_unlock(&p->lock);
	return n;
}

void vpmm_pool_drop_events(vpmm_pool *p, CUcontext rebind)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	while (p->event_cache) {
		struct event *ev = p->event_cache;
		p->event_cache = ev->next;
		event_forget(p, ev);
		DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
		free(ev);
	}
	/* The completed events still held (by a zombie's old address, a
	 * deferred small block) die with the context too: left alive here,
	 * each went back to the cache once let go, and was recorded again,
	 * destroyed, in the next context. Their holders only read `done`.
	 * One still on its stream's list (epoch past the stream's done) may
	 * yet be waited on, and stays. */
	for (struct event *ev = p->events; ev; ev = ev->all_next)
		if (ev->done && !ev->gone && ev->epoch <= ev->stream->done) {
			DRV(p, VPMM_OP_EVENT_DESTROY, event_destroy, ev->ev);
			ev->ev = NULL;
			ev->gone = true;
		}
	/* The context's streams end with it, with no cuStreamDestroy to tell,
	 * and their handles may come back for new streams: each is forgotten
	 * as a destroyed one is. The caller synchronised the context and
	 * polled, so what they freed has settled and no last event is due.
	 * The default streams' handles (0, CU_STREAM_LEGACY,
	 * CU_STREAM_PER_THREAD) stay: they name the current context's own
	 * default stream, in whichever context comes next. */
	for (unsigned i = 0; i < p->stream_hash_size; i++)
		for (struct stream **link = &p->stream_hash[i]; *link;) {
			struct stream *s = *link;
			if ((uintptr_t)s->handle <= (uintptr_t)CU_STREAM_PER_THREAD) {
				link = &s->hash_next;
				continue;
			}
			stream_forget_locked(p, s, link); /* *link is the next one */
		}
	if (rebind && rebind != p->ctx) {
		p->ctx = rebind;
		pthread_cond_signal(&p->reclaim_cond);
	}
	pthread_mutex_unlock(&p->lock);
}

int vpmm_pool_poll(vpmm_pool *p, bool before_sync)
{
	if (!p)
		return -EINVAL;
	/* A pool only synchronous callers used has nothing to settle. */
	if (!__atomic_load_n(&p->nstreams, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&p->lock);
	uint64_t settled = p->settled_count;
	if (before_sync) {
		/* Parked frees join their stream's pending ones, so that the
		 * events closing the open epochs cover them too. */
		for (struct stream *s = p->streams; s; s = s->next)
			vpi_front_flush_stream_locked(p, s);
		poll_others(p, NULL);
	} else {
		for (struct stream *s = p->streams; s; s = s->next)
			poll_stream(p, s);
		vpi_small_drain_locked(p);
	}
	int n = (int)(p->settled_count - settled);
	pthread_mutex_unlock(&p->lock);
	return n;
}

long long vpmm_pool_trim(vpmm_pool *p, size_t keep)
{
	if (!p)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	size_t got = trim_locked(p, keep);
	pthread_mutex_unlock(&p->lock);
	return (long long)got;
}

size_t vpmm_pool_page_size(const vpmm_pool *p)
{
	return p->page;
}

CUresult vpmm_pool_last_result(vpmm_pool *p)
{
	pthread_mutex_lock(&p->lock);
	CUresult r = p->last_result;
	pthread_mutex_unlock(&p->lock);
	return r;
}

void vpmm_pool_stats(vpmm_pool *p, struct vpmm_stats *out)
{
	pthread_mutex_lock(&p->lock);
	vpi_stats_locked(p, out);
	pthread_mutex_unlock(&p->lock);
}

void vpi_stats_locked(vpmm_pool *p, struct vpmm_stats *out)
{
	uint64_t parked, hits, parks;
	*out = p->st;
	vpi_front_counts_locked(p, &parked, &hits, &parks);
	/* Parked allocations are live to the pool's structures, free to the
	 * program: report them as reusable. */
	out->live -= parked;
	out->reusable += parked;
	out->parked = parked;
	out->front_hits = hits;
	out->front_parks = parks;
	out->mallocs += hits;
	out->frees += parks;
}

size_t vpmm_pool_check(vpmm_pool *p, FILE *log)
{
	pthread_mutex_lock(&p->lock);
	size_t bad = vpi_check_locked(p, log);
	pthread_mutex_unlock(&p->lock);
	return bad;
}
