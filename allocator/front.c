/* front.c — the pool's fast path, taken without the pool lock: a small cache
 * per stream of allocations freed on that stream ("parked"), and the page map
 * that finds an allocation from its pointer.
 *
 * Why: with one pool lock, threads allocating on their own streams serialize
 * on it (two threads ran slower than one). A free parks the allocation in its
 * stream's cache; a malloc of the same rounded size on the same stream takes
 * it back. Stream order makes that safe at once, as for any same-stream reuse.
 * Parked memory stays live for the rest of the pool; the pool flushes every
 * cache (under its lock) before it defragments, trims or answers what is
 * free, so parking never costs memory.
 *
 * Locks: pool lock -> front lock is the only order; the fast path takes a
 * front lock alone. Page map entries and the per-allocation "parked" marks
 * are atomics, written by the pool under its lock or by the fast path.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pool_internal.h"

/* ---- page map --------------------------------------------------------------------- */

int vpmm_pmap_create(vpmm_pool *p, struct chunk *c)
{
	size_t bytes = c->size / p->grain * sizeof(struct region *);
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	c->pmap = m;
	return 0;
}

void vpmm_pmap_destroy(vpmm_pool *p, struct chunk *c)
{
	if (c->pmap)
		munmap(c->pmap, c->size / p->grain * sizeof(struct region *));
	c->pmap = NULL;
}

static struct region **pmap_slot(vpmm_pool *p, CUdeviceptr va)
{
	unsigned n = __atomic_load_n(&p->nchunks, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n; i++) {
		struct chunk *c = &p->chunks[i];
		if (va >= c->va && va - c->va < c->size)
			return &c->pmap[(va - c->va) / p->grain];
	}
	return NULL;
}

/* Every grain of a slab, else the first grain of the allocation. */
void vpmm_pmap_publish(vpmm_pool *p, struct region *r, bool publish)
{
	size_t n = r->small ? r->size / p->grain : 1;
	struct region **slot = pmap_slot(p, r->va);
	for (size_t i = 0; slot && i < n; i++)
		__atomic_store_n(&slot[i], publish ? r : NULL, __ATOMIC_RELEASE);
}

/* ---- stream lookup without the pool lock -------------------------------------------------- */

static _Atomic uint64_t pool_generation;

/* One entry per thread: threads usually stay on one stream of one pool. */
static __thread struct {
	uint64_t gen, stream_gen;
	CUstream handle;
	struct stream *s;
} tls_stream;

void vpmm_front_pool_init(vpmm_pool *p)
{
	p->gen = atomic_fetch_add(&pool_generation, 1) + 1;
	pthread_mutex_init(&p->sync_front.lock, NULL);
}

static struct stream *front_stream(vpmm_pool *p, CUstream h)
{
	uint64_t sgen = __atomic_load_n(&p->stream_gen, __ATOMIC_ACQUIRE);
	if (tls_stream.gen == p->gen && tls_stream.handle == h && tls_stream.stream_gen == sgen)
		return tls_stream.s;
	pthread_mutex_lock(&p->lock);
	struct stream *s = vpmm_stream_get_locked(p, h);
	pthread_mutex_unlock(&p->lock);
	if (s) {
		tls_stream.gen = p->gen;
		tls_stream.stream_gen = sgen;
		tls_stream.handle = h;
		tls_stream.s = s;
	}
	return s;
}

static struct front *front_of(vpmm_pool *p, CUstream h, struct stream **s)
{
	*s = NULL;
	if (h == VPMM_NO_STREAM)
		return &p->sync_front;
	*s = front_stream(p, h);
	return *s ? &(*s)->front : NULL;
}

/* ---- fast path ------------------------------------------------------------------------------ */

static size_t rounded(const vpmm_pool *p, size_t size)
{
	if (size <= vpmm_small_max(p))
		return vpmm_small_class_size(p, size);
	return (size + p->grain - 1) / p->grain * p->grain;
}

int vpmm_front_malloc(vpmm_pool *p, size_t size, CUstream stream, CUdeviceptr *out)
{
	size_t want = rounded(p, size);
	struct stream *s;
	struct front *f = front_of(p, stream, &s);
	if (!f)
		return -EAGAIN;
	pthread_mutex_lock(&f->lock);
	for (unsigned i = f->n; i-- > 0;) {
		struct fentry e = f->e[i];
		if (e.size != want)
			continue;
		f->e[i] = f->e[--f->n];
		f->bytes -= e.size;
		f->hits++;
		pthread_mutex_unlock(&f->lock);
		if (e.r->small)
			vpmm_small_unpark(p, e.r, e.ptr);
		else
			__atomic_store_n(&e.r->parked, 0, __ATOMIC_RELEASE);
		*out = e.ptr;
		return 0;
	}
	pthread_mutex_unlock(&f->lock);
	return -EAGAIN;
}

int vpmm_front_free(vpmm_pool *p, CUdeviceptr ptr, CUstream stream)
{
	struct region **slot = pmap_slot(p, ptr), *r;
	struct small_slab *small;
	struct front *f;
	size_t size;

	if (!slot || !(r = __atomic_load_n(slot, __ATOMIC_ACQUIRE)))
		return -EAGAIN;
	small = __atomic_load_n(&r->small, __ATOMIC_ACQUIRE);
	if (small) {
		if (vpmm_small_park(p, r, ptr, &size))
			return -EAGAIN; /* the pool lock decides what is wrong */
	} else {
		uint8_t live = 0;
		size = r->size;
		if (r->va != ptr ||
		    !__atomic_compare_exchange_n(&r->parked, &live, 1, false,
						 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return -EAGAIN;
	}
	struct stream *s;
	f = front_of(p, stream, &s);
	if (f) {
		/* Read after the park: see close_epoch() for why this order
		 * makes the epoch's event cover the work before this free. */
		uint64_t epoch = s ? __atomic_load_n(&s->epoch, __ATOMIC_SEQ_CST) : 0;
		pthread_mutex_lock(&f->lock);
		if (f->n < p->cfg.front_entries && f->bytes + size <= p->cfg.front_bytes) {
			f->e[f->n++] = (struct fentry){.ptr = ptr, .size = size,
						       .epoch = epoch, .r = r};
			f->bytes += size;
			f->parks++;
			pthread_mutex_unlock(&f->lock);
			return 0;
		}
		pthread_mutex_unlock(&f->lock);
	}
	if (small)
		vpmm_small_unpark(p, r, ptr);
	else
		__atomic_store_n(&r->parked, 0, __ATOMIC_RELEASE);
	return -EAGAIN;
}

/* ---- the pool's side ---------------------------------------------------------------------- */

static size_t flush_one(vpmm_pool *p, struct front *f, struct stream *s)
{
	struct fentry e[VPMM_FRONT_MAX];
	unsigned n;
	pthread_mutex_lock(&f->lock);
	n = f->n;
	memcpy(e, f->e, n * sizeof(e[0]));
	f->n = 0;
	f->bytes = 0;
	pthread_mutex_unlock(&f->lock);
	for (unsigned i = 0; i < n; i++) {
		/* Only a racing bogus free could have parked something else. */
		if (e[i].r->kind != R_LIVE)
			continue;
		if (e[i].r->small) {
			vpmm_small_unpark(p, e[i].r, e[i].ptr);
			vpmm_small_free_locked(p, e[i].r, e[i].ptr, s, e[i].epoch);
		} else {
			__atomic_store_n(&e[i].r->parked, 0, __ATOMIC_RELEASE);
			vpmm_pool_give_locked(p, e[i].r, s, e[i].epoch);
		}
	}
	return n;
}

size_t vpmm_front_flush_stream_locked(vpmm_pool *p, struct stream *s)
{
	return p->cfg.front_entries ? flush_one(p, &s->front, s) : 0;
}

size_t vpmm_front_flush_locked(vpmm_pool *p)
{
	size_t n = 0;
	if (!p->cfg.front_entries)
		return 0;
	n += flush_one(p, &p->sync_front, NULL);
	for (struct stream *s = p->streams; s; s = s->next)
		n += flush_one(p, &s->front, s);
	return n;
}

/* The synchronous callers' front, then each stream's, in turn; NULL after
 * the last. */
static struct front *front_next(vpmm_pool *p, struct front *f, struct stream **s)
{
	if (!f) {
		*s = p->streams;
		return &p->sync_front;
	}
	if (!*s)
		return NULL;
	f = &(*s)->front;
	*s = (*s)->next;
	return f;
}

void vpmm_front_counts_locked(vpmm_pool *p, uint64_t *parked_bytes,
			      uint64_t *hits, uint64_t *parks)
{
	struct stream *s;
	*parked_bytes = *hits = *parks = 0;
	for (struct front *f = front_next(p, NULL, &s); f; f = front_next(p, f, &s)) {
		pthread_mutex_lock(&f->lock);
		*parked_bytes += f->bytes;
		*hits += f->hits;
		*parks += f->parks;
		pthread_mutex_unlock(&f->lock);
	}
}

static bool entry_ok(vpmm_pool *p, const struct front *f, unsigned i)
{
	const struct fentry *e = &f->e[i];
	bool ok = e->r->kind == R_LIVE && e->ptr >= e->r->va && e->ptr < e->r->va + e->r->size;
	if (ok && !e->r->small)
		ok = e->ptr == e->r->va && __atomic_load_n(&e->r->parked, __ATOMIC_ACQUIRE) &&
		     e->size == e->r->size;
	if (ok && e->r->small)
		ok = vpmm_small_is_parked(p, e->r, e->ptr);
	for (unsigned j = 0; ok && j < i; j++)
		ok = f->e[j].ptr != e->ptr;
	return ok;
}

size_t vpmm_front_check_locked(vpmm_pool *p, FILE *log)
{
	size_t bad = 0;
	struct stream *s;
	for (struct front *f = front_next(p, NULL, &s); f; f = front_next(p, f, &s)) {
		size_t bytes = 0;
		pthread_mutex_lock(&f->lock);
		for (unsigned i = 0; i < f->n; i++) {
			if (!entry_ok(p, f, i)) {
				bad++;
				if (log)
					fprintf(log, "vpmm check: parked %#llx inconsistent\n",
						(unsigned long long)f->e[i].ptr);
			}
			bytes += f->e[i].size;
		}
		if (bytes != f->bytes) {
			bad++;
			if (log)
				fprintf(log, "vpmm check: front bytes %zu, entries %zu\n",
					f->bytes, bytes);
		}
		pthread_mutex_unlock(&f->lock);
	}
	return bad;
}
