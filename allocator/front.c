/* front.c — the pool's fast path, taken without the pool lock: a small cache
 * per stream of allocations freed on that stream ("parked"), and the grain map
 * that finds an allocation from its pointer.
 *
 * Why: with one pool lock, threads allocating on their own streams serialize
 * on it (two threads ran slower than one). A free parks the allocation in its
 * stream's cache; a malloc of the same rounded size on the same stream takes
 * it back. Stream order makes that safe at once, as for any same-stream reuse.
 * Parked memory stays live for the rest of the pool; the pool flushes every
 * cache (under its lock) before it defragments, trims or answers what is
 * free, so parking never costs memory. A malloc that misses and would
 * strand memory first takes back its stream's parked allocations that lie
 * beside free memory, so that they join it.
 *
 * Locks: pool lock -> front lock is the only order; the fast path takes a
 * front lock alone. Grain map entries and the per-allocation "parked" marks
 * are atomics, written by the pool under its lock or by the fast path.
 *
 * Owns struct front (front.h). Calls give.c, small.c (parks and frees),
 * stream.c, region.c, loop.c and chunk.h's grain map; never the take path
 * (take.c calls the flushes here).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "chunk.h"
#include "front.h"
#include "give.h"
#include "pool.h"
#include "region.h"
#include "small.h"
#include "stream.h"

#ifdef VPMM_TEST_HOOKS
void (*vpi_test_hook)(const char *point);
#endif

/* ---- stream lookup without the pool lock -------------------------------------------------- */

static _Atomic uint64_t pool_generation;

/* One entry per thread: threads usually stay on one stream of one pool. */
static __thread struct {
	uint64_t gen, stream_gen;
	CUstream handle;
	struct stream *s;
} tls_stream;

void vpi_front_pool_init(vpmm_pool *p)
{
	p->gen = atomic_fetch_add(&pool_generation, 1) + 1;
	pthread_mutex_init(&p->sync_front.lock, NULL);
}

static struct stream *front_stream(vpmm_pool *p, CUstream h)
{
	uint64_t sgen = __atomic_load_n(&p->stream_gen, __ATOMIC_ACQUIRE);
	if (tls_stream.gen == p->gen && tls_stream.handle == h && tls_stream.stream_gen == sgen)
		return tls_stream.s;
	/* Unchecked: the context may have been reset under the pool, and
	 * the reap a new record makes would query dead events (reset.c). */
	vpi_mutex_lock(&p->lock);
	struct stream *s = vpi_stream_get_unchecked_locked(p, h);
	vpi_mutex_unlock(&p->lock);
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
	if (size <= vpi_small_max(p))
		return vpi_small_class_size(p, size);
	return vpi_grains(p, size);
}

/* The chain of rounded size `size`: sizes recur exactly (a loop's tensors),
 * so the multiplicative hash only has to spread distinct sizes. */
static unsigned bucket(size_t size)
{
	return vpi_hash_bits(size, VPMM_FRONT_BUCKET_BITS);
}

/* Takes the entry *link names out of chain b; its slot goes to the
 * unused list. Front lock held. */
static inline void unlink_entry(struct front *f, uint16_t *link, unsigned b)
{
	uint16_t slot = *link;
	*link = f->e[slot - 1].next;
	if (!f->head[b])
		f->used &= ~(1ull << b);
	f->e[slot - 1].next = f->unused;
	f->unused = slot;
	f->n--;
	f->bytes -= f->e[slot - 1].size;
}

int vpi_front_malloc(vpmm_pool *p, size_t size, CUstream stream, CUdeviceptr *out)
{
	size_t want = rounded(p, size);
	struct stream *s;
	struct front *f = front_of(p, stream, &s);
	if (!f)
		return -EAGAIN;
	unsigned b = bucket(want);
	vpi_mutex_lock(&f->lock);
	for (uint16_t *link = &f->head[b]; *link; link = &f->e[*link - 1].next) {
		struct fentry e = f->e[*link - 1];
		if (e.size != want)
			continue;
		unlink_entry(f, link, b);
		f->hits++;
		vpi_loop_note(&f->loop, size, e.ptr);
		vpi_mutex_unlock(&f->lock);
		if (e.r->small)
			vpi_small_unpark(p, e.r->small, e.r, e.ptr);
		else
			vpi_unclaim(e.r);
		*out = e.ptr;
		return 0;
	}
	vpi_mutex_unlock(&f->lock);
	return -EAGAIN;
}

/* A slot for a new entry: one a hit gave back, else the next never used. */
static uint16_t take_slot(struct front *f)
{
	uint16_t slot = f->unused;
	if (slot)
		f->unused = f->e[slot - 1].next;
	else if (f->touched < VPMM_FRONT_MAX)
		slot = ++f->touched;
	return slot;
}

/* The region the grain map names at ptr's grain (a live allocation's
 * first, or any of a slab's), read without the lock; NULL if none. */
static struct region *published(vpmm_pool *p, CUdeviceptr ptr)
{
	struct region **slot = vpi_gmap_slot(p, ptr);
	return slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : NULL;
}

/* Whether sl (NULL: not a block) is a slab of a destroyed stream. Its
 * blocks are not parked: in a cache one kept the slab, and the stream's
 * record with it, until the cache was flushed, which nothing may do again
 * (a program's last free, on a pool that goes idle). Freed under the lock,
 * it empties the slab, which then goes back (small.c). Read under the
 * cache's lock, with the block parked: the slab, and so its owner's
 * record, stay while a block is used; the destroy marks the stream dead
 * before it takes the blocks of its slabs out of every cache, each under
 * that cache's lock (vpi_front_release_owned_locked), so either it finds
 * this entry there or this free finds the stream dead. (A free into the
 * cache of a stream destroyed meanwhile is the program's race with its
 * own destroy; the entry waits there for a flush.) */
static bool owner_gone(const struct slab *sl)
{
	const struct stream *owner = sl ? sl->owner : NULL;
	return owner && __atomic_load_n(&owner->dead, __ATOMIC_ACQUIRE);
}

int vpi_front_free(vpmm_pool *p, CUdeviceptr ptr, CUstream stream)
{
	struct region *r = published(p, ptr);
	struct slab *small;
	struct front *f;
	size_t size;

	if (!r)
		return -EAGAIN;
	/* r may be out of date by now: freed under the lock by a racing
	 * double free of ptr, even reused. The claim settles it: it fails
	 * unless r is still the live allocation it was when `seen` was
	 * read, and then va and size, read after, are that allocation's. */
	small = __atomic_load_n(&r->small, __ATOMIC_ACQUIRE);
	if (small) {
		if (vpi_small_park(p, small, r, ptr, &size))
			return -EAGAIN; /* the pool lock decides what is wrong */
		VPMM_TEST_POINT("front_free:parked");
	} else {
		uint32_t seen = __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE);
		size = r->size;
		if (r->va != ptr)
			return -EAGAIN;
		VPMM_TEST_POINT("front_free:claim");
		if (!vpi_claim(r, seen))
			return -EAGAIN;
	}
	struct stream *s;
	f = front_of(p, stream, &s);
	if (f) {
		/* Read after the park: see vpi_close_epoch() for why this order
		 * makes the epoch's event cover the work before this free. */
		uint64_t epoch = s ? __atomic_load_n(&s->epoch, __ATOMIC_SEQ_CST) : 0;
		uint16_t at;
		vpi_mutex_lock(&f->lock);
		if (!owner_gone(small) && f->n < p->cfg.front_entries &&
		    f->bytes + size <= p->cfg.front_bytes && (at = take_slot(f))) {
			unsigned b = bucket(size);
			f->e[at - 1] = (struct fentry){.ptr = ptr, .size = size, .epoch = epoch,
						       .r = r, .next = f->head[b]};
			f->head[b] = at;
			f->used |= 1ull << b;
			f->n++;
			f->bytes += size;
			f->parks++;
			vpi_mutex_unlock(&f->lock);
			return 0;
		}
		vpi_mutex_unlock(&f->lock);
	}
	if (small)
		vpi_small_unpark(p, small, r, ptr);
	else
		vpi_unclaim(r);
	return -EAGAIN;
}

int vpmm_pool_find_own(vpmm_pool *p, CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
	struct region *r = p ? published(p, ptr) : NULL;
	if (!r)
		return -EINVAL;
	struct slab *small = __atomic_load_n(&r->small, __ATOMIC_ACQUIRE);
	if (small) {
		size_t n;
		if (vpi_small_find_own(p, small, r, ptr, &n))
			return -EINVAL;
		if (base)
			*base = ptr;
		if (size)
			*size = n;
		return 0;
	}
	/* Read as vpi_front_free reads it: the claim, then the fields. While
	 * its owner holds a plain live allocation, nothing claims it and its
	 * va and size stay; a slab, a parked allocation, one being freed are
	 * claimed. */
	if (vpi_claimed(r))
		return -EINVAL;
	size_t n = r->size;
	if (r->va != ptr)
		return -EINVAL;
	if (base)
		*base = ptr;
	if (size)
		*size = n;
	return 0;
}

/* ---- the pool's side ---------------------------------------------------------------------- */

/* Gives every entry back to the pool. Under the front lock throughout: only
 * this stream's fast path waits, and flushes are rare (a placement that
 * failed, a defragmentation, a trim). Flushing only the entries a request
 * could use (as large or larger) kept no more hits in the PyTorch step and
 * packed worse (docs/performance.md). */
static size_t flush_one(vpmm_pool *p, struct front *f, struct stream *s)
{
	size_t n = 0;
	struct fentry *e;
	vpi_mutex_lock(&f->lock);
	VPMM_FRONT_FOR_EACH(f, e) {
		n++;
		/* Entries are claimed live memory (vpi_front_check_locked). */
		if (e->r->kind != R_LIVE)
			continue;
		if (e->r->small) {
			/* Still claimed: a racing double free cannot take it
			 * between an unpark and a new claim. Unparked if the
			 * free fails (its event could not be made): handed out
			 * again, as before it was parked. */
			if (vpi_small_free_locked(p, e->r, e->ptr, s, e->epoch, true)) {
				vpi_small_unpark(p, e->r->small, e->r, e->ptr);
				p->front_unparked++;
			} else {
				p->front_given++;
			}
		} else {
			vpi_give_locked(p, e->r, s, e->epoch); /* stays claimed */
			p->front_given++;
		}
	}
	memset(f->head, 0, sizeof(f->head));
	f->used = 0;
	f->n = 0;
	f->bytes = 0;
	f->unused = 0;
	f->touched = 0;
	vpi_mutex_unlock(&f->lock);
	return n;
}

/* Walks f's chains in use (only those: a miss may look on every malloc)
 * under its lock and takes out every entry that give() gave back (true);
 * give() may not touch the cache. Under the front lock, as flush_one(). */
static size_t give_back_where(vpmm_pool *p, struct front *f,
			      bool (*give)(vpmm_pool *p, const struct fentry *e, void *arg),
			      void *arg)
{
	size_t n = 0;
	vpi_mutex_lock(&f->lock);
	for (uint64_t m = f->used; m && f->n; m &= m - 1) {
		unsigned b = (unsigned)__builtin_ctzll(m);
		uint16_t *link = &f->head[b];
		while (*link) {
			if (!give(p, &f->e[*link - 1], arg)) {
				link = &f->e[*link - 1].next;
				continue;
			}
			unlink_entry(f, link, b);
			n++;
		}
	}
	vpi_mutex_unlock(&f->lock);
	return n;
}

static bool give_if_beside_free(vpmm_pool *p, const struct fentry *e, void *arg)
{
	struct stream *s = arg;
	if (e->r->small || e->r->kind != R_LIVE || !vpi_region_beside_free_locked(e->r, s))
		return false;
	vpi_give_locked(p, e->r, s, e->epoch); /* stays claimed */
	p->front_given++;
	return true;
}

/* Gives back the entries of s's cache that lie beside free memory, so that
 * they join it: the pool asks for it when a malloc that missed the cache
 * finds no place, or only one that strands memory, or, while the device
 * has room, before the first place of a miss that follows one that
 * stranded (take.c). */
size_t vpi_front_release_beside_free_locked(vpmm_pool *p, struct stream *s)
{
	if (!p->cfg.front_entries)
		return 0;
	return give_back_where(p, vpi_front_of(p, s), give_if_beside_free, s);
}

struct owned {
	struct stream *s;           /* the cache's stream; NULL: synchronous */
	const struct stream *owner; /* gone */
};

/* A block of the gone stream's slabs, freed on the cache's stream as a
 * flush frees it. One whose free fails (its event could not be made)
 * stays parked, as before. */
static bool give_if_owned(vpmm_pool *p, const struct fentry *e, void *arg)
{
	const struct owned *o = arg;
	if (e->r->kind != R_LIVE || !e->r->small || e->r->small->owner != o->owner ||
	    vpi_small_free_locked(p, e->r, e->ptr, o->s, e->epoch, true))
		return false;
	p->front_given++;
	return true;
}

/* Every cache, dead streams' too: a destroyed stream's was flushed when it
 * went (vpmm_pool_stream_gone); those of the streams a context took with
 * it may still hold entries, on streams whose work is known done
 * (vpi_stream_ended_locked), which need no record. */
size_t vpi_front_release_owned_locked(vpmm_pool *p, const struct stream *owner)
{
	size_t n = 0;
	if (!p->cfg.front_entries || !owner->slabs)
		return 0;
	struct owned o = {.s = NULL, .owner = owner};
	n += give_back_where(p, &p->sync_front, give_if_owned, &o);
	for (struct stream *s = p->streams; s; s = s->next) {
		o.s = s;
		n += give_back_where(p, &s->front, give_if_owned, &o);
	}
	return n;
}

size_t vpi_front_flush_stream_locked(vpmm_pool *p, struct stream *s)
{
	return p->cfg.front_entries ? flush_one(p, vpi_front_of(p, s), s) : 0;
}

bool vpi_front_holds_locked(vpmm_pool *p, struct stream *s, const struct region *r)
{
	struct front *f = vpi_front_of(p, s);
	bool found = false;
	vpi_mutex_lock(&f->lock);
	for (uint16_t slot = f->head[bucket(r->size)]; slot && !found; slot = f->e[slot - 1].next)
		found = f->e[slot - 1].r == r;
	vpi_mutex_unlock(&f->lock);
	return found;
}

size_t vpi_front_flush_locked(vpmm_pool *p)
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

void vpi_front_counts_locked(vpmm_pool *p, uint64_t *parked_bytes,
			      uint64_t *hits, uint64_t *parks)
{
	struct stream *s;
	*parked_bytes = 0;
	*hits = p->gone_hits; /* what freed streams' caches served */
	*parks = p->gone_parks;
	for (struct front *f = front_next(p, NULL, &s); f; f = front_next(p, f, &s)) {
		vpi_mutex_lock(&f->lock);
		*parked_bytes += f->bytes;
		*hits += f->hits;
		*parks += f->parks;
		vpi_mutex_unlock(&f->lock);
	}
}

static bool entry_ok(vpmm_pool *p, const struct fentry *all, unsigned i)
{
	const struct fentry *e = &all[i];
	bool ok = e->r->kind == R_LIVE && e->ptr >= e->r->va && e->ptr < e->r->va + e->r->size;
	if (ok && !e->r->small)
		ok = e->ptr == e->r->va && vpi_claimed(e->r) &&
		     e->size == e->r->size;
	if (ok && e->r->small)
		ok = vpi_small_is_parked(p, e->r, e->ptr);
	for (unsigned j = 0; ok && j < i; j++)
		ok = all[j].ptr != e->ptr;
	return ok;
}

/* Broken invariants of one cache: entries not parked live memory, in the
 * wrong chain or twice, counts that disagree with the chains (a cycle shows
 * as more entries than slots), slots lost or listed twice, and chains
 * marked wrongly in `used`. Adds f's hits, parks and entries to `t`, read
 * under the same lock. */
struct tally {
	uint64_t hits, parks, held;
};

static size_t check_one(vpmm_pool *p, struct front *f, struct fentry *all, FILE *log,
			struct tally *t)
{
	size_t bad = 0, bytes = 0;
	unsigned n = 0, steps = 0, unused = 0;
	uint64_t seen[VPMM_FRONT_MAX / 64] = {0}; /* slots in a chain */
	vpi_mutex_lock(&f->lock);
	for (unsigned b = 0; b < VPMM_FRONT_BUCKETS; b++) {
		if (!(f->used >> b & 1) != !f->head[b]) {
			bad++;
			if (log)
				fprintf(log, "vpmm check: front chain %u %s but marked %s\n", b,
					f->head[b] ? "holds entries" : "is empty",
					f->used >> b & 1 ? "in use" : "empty");
		}
		for (uint16_t slot = f->head[b]; slot; slot = f->e[slot - 1].next) {
			if (slot > f->touched || ++steps > VPMM_FRONT_MAX) {
				bad++;
				if (log)
					fprintf(log, "vpmm check: front chain %u broken\n", b);
				break;
			}
			seen[(slot - 1) / 64] |= 1ull << ((slot - 1) % 64);
			all[n] = f->e[slot - 1];
			if (bucket(all[n].size) != b || !entry_ok(p, all, n)) {
				bad++;
				if (log)
					fprintf(log, "vpmm check: parked %#llx inconsistent\n",
						(unsigned long long)all[n].ptr);
			}
			bytes += all[n++].size;
		}
	}
	if (n != f->n || bytes != f->bytes) {
		bad++;
		if (log)
			fprintf(log, "vpmm check: front counts %u entries, %zu bytes; "
				     "chains hold %u, %zu\n", f->n, f->bytes, n, bytes);
	}
	/* Every slot used since the flush is in a chain or unused, not both. */
	for (uint16_t slot = f->unused; slot; slot = f->e[slot - 1].next) {
		if (slot > f->touched || ++unused > VPMM_FRONT_MAX ||
		    (seen[(slot - 1) / 64] >> ((slot - 1) % 64) & 1)) {
			bad++;
			if (log)
				fprintf(log, "vpmm check: front slot %u both parked and unused, "
					     "or the unused list broken\n", slot);
			break;
		}
	}
	if (n + unused != f->touched) {
		bad++;
		if (log)
			fprintf(log, "vpmm check: front %u slots used, %u parked, %u unused\n",
				f->touched, n, unused);
	}
	t->hits += f->hits;
	t->parks += f->parks;
	t->held += f->n;
	vpi_mutex_unlock(&f->lock);
	return bad;
}

size_t vpi_front_check_locked(vpmm_pool *p, FILE *log)
{
	size_t bad = 0;
	struct stream *s;
	struct fentry *all = malloc(VPMM_FRONT_MAX * sizeof(*all));
	if (!all)
		return 0; /* no room to look: nothing found, nothing claimed */
	/* Each cache's counts agree under its lock, and the pool's given and
	 * unparked counts move only under the pool lock, which the caller
	 * holds: the sums agree too. */
	struct tally t = {.hits = p->gone_hits, .parks = p->gone_parks};
	for (struct front *f = front_next(p, NULL, &s); f; f = front_next(p, f, &s))
		bad += check_one(p, f, all, log, &t);
	free(all);
	if (t.parks != t.hits + t.held + p->front_given + p->front_unparked) {
		bad++;
		if (log)
			fprintf(log, "vpmm check: %" PRIu64 " parks, but %" PRIu64 " hits + %" PRIu64
				" parked + %" PRIu64 " given back + %" PRIu64 " unparked\n",
				t.parks, t.hits, t.held, p->front_given, p->front_unparked);
	}
	return bad;
}
