/* small.c — requests under a grain, carved in size classes from pool memory.
 *
 * A slab is one live pool region cut into equal blocks of one class; its
 * bookkeeping is host memory (a bitmap), never the device's. A slab belongs
 * to the stream that took it (or to no stream, for synchronous callers), so
 * a block freed on that stream is reused at once in stream order. A block
 * freed on another stream waits, as a "deferred" block, for an event of that
 * stream before it is reused. An empty slab goes back to the pool on its
 * stream, but for one per class, pool-wide, kept to avoid churn (see
 * keep_or_release).
 *
 * Classes: multiples of 512 B up to 4 KiB, then four steps per doubling, up
 * to the pool's grain; a slab spans enough grains to hold at least 8 blocks. Everything here runs
 * under the pool's lock.
 *
 * Owns struct slab (small.h). Calls give.c and stream.c; the malloc path,
 * which takes slabs from the pool, is small_take.c, above this file and
 * above take.c (whose last resort trims empty slabs here).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "give.h"
#include "pool.h"
#include "region.h"
#include "small.h"
#include "stream.h"

static uint64_t *parked_map(struct slab *sl)
{
	return sl->used + sl->words;
}

size_t vpi_small_deferred(const vpmm_pool *p)
{
	return p->small ? p->small->deferred : 0;
}

size_t vpi_small_max(const vpmm_pool *p)
{
	return p->small ? p->small->max : 0;
}

int vpi_small_init(vpmm_pool *p)
{
	struct small_state *s;
	size_t max = p->cfg.small_max;
	if (!max)
		return 0;
	/* Above a grain the pool itself rounds to grains: classes only pay
	 * below it (with the grain at the page, below a page). */
	if (max >= p->grain)
		max = p->grain - 1;
	if (max < MIN_BLOCK)
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (size_t b = MIN_BLOCK; b <= 4096 && s->nclasses < MAX_CLASSES; b += MIN_BLOCK)
		s->block[s->nclasses++] = b;
	for (size_t base = 4096; s->nclasses < MAX_CLASSES; base *= 2) {
		for (unsigned q = 1; q <= 4 && s->nclasses < MAX_CLASSES; q++)
			s->block[s->nclasses++] = base + base / 4 * q;
		if (base * 2 >= max)
			break;
	}
	while (s->nclasses && s->block[s->nclasses - 1] > max &&
	       s->block[s->nclasses - 2] >= max)
		s->nclasses--; /* keep one class that holds `max` */
	for (unsigned c = 0; c < s->nclasses; c++) {
		size_t bytes = s->block[c] * MIN_BLOCKS_PER_SLAB;
		s->slab_bytes[c] = vpi_grains(p, bytes);
	}
	s->max = max < s->block[s->nclasses - 1] ? max : s->block[s->nclasses - 1];
	p->small = s;
	return 0;
}

struct slab **vpi_small_partial_list(vpmm_pool *p, struct stream *owner,
					unsigned cls)
{
	struct small_state *s = vpi_small_st(p);
	if (!owner)
		return &s->sync_partial[cls];
	if (!owner->small_partial) {
		owner->small_partial = calloc(MAX_CLASSES, sizeof(*owner->small_partial));
		if (!owner->small_partial)
			return NULL;
	}
	return &owner->small_partial[cls];
}

/* A claimed block becomes free. The used bit goes first: a lock-free park
 * that finds the block unparked and then not used gives it up. */
static void block_clear(struct slab *sl, uint32_t b)
{
	__atomic_fetch_and(&sl->used[b / 64], ~(1ull << (b % 64)), __ATOMIC_RELEASE);
	__atomic_fetch_and(&parked_map(sl)[b / 64], ~(1ull << (b % 64)), __ATOMIC_RELEASE);
	sl->nfree++;
	sl->hint = b / 64;
}

/* Deferred blocks whose stream completed become free. */
/* `wait`: block on the CPU for each pending event (the last resort before
 * an allocation fails). */
void vpi_small_drain_deferred(vpmm_pool *p, struct slab *sl, bool wait)
{
	struct deferred **link = &sl->deferred;
	while (*link) {
		struct deferred *d = *link;
		if (vpi_event_done_locked(p, d->ev) ||
		    (wait && vpi_event_wait_locked(p, d->ev))) {
			*link = d->next;
			vpi_small_st(p)->deferred--;
			block_clear(sl, d->block);
			vpi_event_unref(p, d->ev);
			free(d);
		} else {
			link = &d->next;
		}
	}
}

static void slab_release(vpmm_pool *p, struct slab *sl)
{
	struct slab **head = vpi_small_partial_list(p, sl->owner, sl->cls);
	if (vpi_small_st(p)->kept[sl->cls] == sl)
		vpi_small_st(p)->kept[sl->cls] = NULL;
	if (sl->listed && head)
		vpi_small_list_del(head, sl);
	vpi_small_st(p)->slabs--;
	vpi_give_locked(p, sl->r, sl->owner, 0);
	if (sl->owner)
		sl->owner->slabs--;
	sl->next = vpi_small_st(p)->spare[sl->cls];
	vpi_small_st(p)->spare[sl->cls] = sl;
}

static bool slab_empty(const struct slab *sl)
{
	return sl->nfree == sl->nblocks && !sl->deferred;
}

/* An empty slab is kept only if it is the only one with room left in its
 * list, so that a workload hovering around one block does not take and
 * give a slab on every call, and only one such slab per class is kept in
 * the whole pool. Kept per stream, the empty slabs added up: a program
 * with many streams held one per class and stream (64 streams each using
 * every class once: 240 MiB mapped at peak against 3.75 MiB for one
 * stream; test_small.c), and only the last resort before out-of-memory
 * gave them back. A slab given back becomes free memory pending on its
 * stream, which the pool's stream order lets any stream reuse, so none is
 * handed from stream to stream here.
 *
 * `newest`: sl was emptied just now by a free on its list; it replaces a
 * kept slab of another stream that is still empty, and that one goes back:
 * the stream that freed last is the likelier to allocate the class again,
 * and the older slab's work is the likelier to have completed, so that its
 * memory settles for any stream sooner. A sweep keeps the kept one. An
 * empty slab of a destroyed stream is never kept: it can have no malloc
 * again. */
static void keep_or_release(vpmm_pool *p, struct slab *sl, bool newest)
{
	struct small_state *s = vpi_small_st(p);
	struct slab *kept = s->kept[sl->cls];
	struct slab **head = vpi_small_partial_list(p, sl->owner, sl->cls);
	bool alone = head && *head == sl && !sl->next;
	bool dead = sl->owner && sl->owner->dead;
	bool other = kept && kept != sl && slab_empty(kept);
	if (!slab_empty(sl))
		return;
	if (!alone || dead || (other && !newest)) {
		slab_release(p, sl);
		return;
	}
	if (other)
		slab_release(p, kept); /* another list's: sl's is untouched */
	s->kept[sl->cls] = sl;
}

int vpi_small_free_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   struct stream *s, uint64_t epoch, bool claimed)
{
	struct slab *sl = r->small;
	size_t bs = vpi_small_st(p)->block[sl->cls];
	CUdeviceptr off = ptr - r->va;
	uint32_t b = (uint32_t)(off / bs);
	uint64_t bit = 1ull << (b % 64);
	if (off % bs || b >= sl->nblocks || !(sl->used[b / 64] & bit))
		return -EINVAL; /* not handed out */
	/* Claimed, not just looked at: a lock-free park of the same block
	 * may be under way, and only one of the two may win. */
	if (!claimed && (__atomic_fetch_or(&parked_map(sl)[b / 64], bit, __ATOMIC_ACQ_REL) & bit))
		return -EINVAL; /* freed already */
	/* Reuse by the owner is safe at once if the free is in its own stream
	 * order, or if the caller synchronized (s == NULL). */
	if (s && s != sl->owner) {
		struct deferred *d = malloc(sizeof(*d));
		int rc = d ? vpi_cover_event(p, s, epoch ? epoch : s->epoch, &d->ev)
			   : -ENOMEM;
		if (rc) {
			free(d);
			/* A caller that claimed the block keeps its claim
			 * (front.c: the entry stays, or the flush unparks). */
			if (!claimed)
				__atomic_fetch_and(&parked_map(sl)[b / 64], ~bit,
						   __ATOMIC_RELEASE);
			return rc;
		}
		if (d->ev)
			d->ev->refs++;
		d->block = b;
		d->next = sl->deferred;
		sl->deferred = d; /* still claimed: parked until it drains */
		vpi_small_st(p)->deferred++;
		pthread_cond_signal(&p->reclaim_cond);
	} else {
		block_clear(sl, b);
	}
	if (!sl->listed) {
		struct slab **head = vpi_small_partial_list(p, sl->owner, sl->cls);
		if (head)
			vpi_small_list_add(head, sl);
	}
	keep_or_release(p, sl, true);
	return 0;
}

/* Visit every listed slab: blocks deferred to a stream whose work completed
 * become free; empty slabs go back. `all` (the last resort before an
 * allocation fails): wait for deferred blocks and return every empty slab;
 * else keep one per class (keep_or_release). Returns how many went back. */
static size_t sweep_list(vpmm_pool *p, struct slab **head, bool all)
{
	size_t n = 0;
	for (struct slab *sl = *head, *next; sl; sl = next) {
		next = sl->next;
		if (sl->deferred)
			vpi_small_drain_deferred(p, sl, all);
		if (!slab_empty(sl))
			continue;
		size_t before = vpi_small_st(p)->slabs;
		if (all)
			slab_release(p, sl);
		else
			keep_or_release(p, sl, false); /* releases sl or nothing */
		n += before - vpi_small_st(p)->slabs;
	}
	return n;
}

static size_t sweep(vpmm_pool *p, bool all)
{
	struct small_state *s = vpi_small_st(p);
	size_t n = 0;
	if (!s)
		return 0;
	for (unsigned c = 0; c < s->nclasses; c++)
		n += sweep_list(p, &s->sync_partial[c], all);
	for (struct stream *st = p->streams; st; st = st->next)
		if (st->small_partial)
			for (unsigned c = 0; c < s->nclasses; c++)
				n += sweep_list(p, &st->small_partial[c], all);
	return n;
}

void vpi_small_stream_gone_locked(vpmm_pool *p, struct stream *s)
{
	struct small_state *st = vpi_small_st(p);
	if (!st || !s->slabs)
		return;
	for (unsigned c = 0; c < st->nclasses; c++)
		if (st->kept[c] && st->kept[c]->owner == s && slab_empty(st->kept[c]))
			slab_release(p, st->kept[c]);
}

size_t vpi_small_trim_locked(vpmm_pool *p)
{
	return sweep(p, true);
}

void vpi_small_drain_locked(vpmm_pool *p)
{
	sweep(p, false);
}

size_t vpi_small_class_size(const vpmm_pool *p, size_t size)
{
	const struct small_state *s = p->small;
	return s->block[vpi_small_class_of(s, size)];
}

/* Lock-free reads for vpi_small_park and _find_own. Whether ptr is a
 * handed-out block of sl, a slab at va (r->va as the caller read it):
 * its index in *b and its class's size in *bs. A block's used bit cannot
 * change under us while the caller legitimately owns it. */
static bool handed_out(vpmm_pool *p, const struct slab *sl, CUdeviceptr va, CUdeviceptr ptr,
		       uint32_t *b, size_t *bs)
{
	*bs = vpi_small_st(p)->block[sl->cls]; /* spares keep their class */
	CUdeviceptr off = ptr - va;
	*b = (uint32_t)(off / *bs);
	return ptr >= va && !(off % *bs) && *b < sl->nblocks &&
	       (__atomic_load_n(&sl->used[*b / 64], __ATOMIC_ACQUIRE) & (1ull << (*b % 64)));
}

/* Whether r still carves sl at va: the pool may have released the slab
 * and reused both since the caller read them. */
static bool still_slab(const struct region *r, const struct slab *sl, CUdeviceptr va)
{
	return __atomic_load_n(&r->small, __ATOMIC_ACQUIRE) == sl && r->va == va;
}

/* Lock-free: only the marks are touched, the used bits are read. */
int vpi_small_park(vpmm_pool *p, struct slab *sl, struct region *r,
		    CUdeviceptr ptr, size_t *size)
{
	CUdeviceptr va = r->va;
	uint32_t b;
	size_t bs;
	if (!handed_out(p, sl, va, ptr, &b, &bs))
		return -EINVAL;
	uint64_t bit = 1ull << (b % 64);
	VPMM_TEST_POINT("small_park:claim");
	if (__atomic_fetch_or(&parked_map(sl)[b / 64], bit, __ATOMIC_ACQ_REL) & bit)
		return -EINVAL; /* parked already: a double free */
	/* Between the look and the claim the pool may have freed the block
	 * (a racing double free), even released the slab and reused it:
	 * keep the claim only on a block still handed out, of this slab,
	 * at ptr. */
	if (!(__atomic_load_n(&sl->used[b / 64], __ATOMIC_ACQUIRE) & bit) ||
	    !still_slab(r, sl, va)) {
		__atomic_fetch_and(&parked_map(sl)[b / 64], ~bit, __ATOMIC_RELEASE);
		return -EINVAL;
	}
	*size = bs;
	return 0;
}

int vpi_small_find_own(vpmm_pool *p, struct slab *sl, struct region *r, CUdeviceptr ptr,
		       size_t *size)
{
	CUdeviceptr va = r->va;
	uint32_t b;
	size_t bs;
	if (!handed_out(p, sl, va, ptr, &b, &bs) ||
	    (__atomic_load_n(&parked_map(sl)[b / 64], __ATOMIC_ACQUIRE) & (1ull << (b % 64))) ||
	    !still_slab(r, sl, va))
		return -EINVAL;
	*size = bs;
	return 0;
}

void vpi_small_unpark(vpmm_pool *p, struct slab *sl, struct region *r,
		       CUdeviceptr ptr)
{
	uint32_t b = (uint32_t)((ptr - r->va) / vpi_small_st(p)->block[sl->cls]);
	__atomic_fetch_and(&parked_map(sl)[b / 64], ~(1ull << (b % 64)), __ATOMIC_RELEASE);
}

bool vpi_small_is_parked(vpmm_pool *p, struct region *r, CUdeviceptr ptr)
{
	struct slab *sl = r->small;
	uint32_t b = (uint32_t)((ptr - r->va) / vpi_small_st(p)->block[sl->cls]);
	return (ptr - r->va) % vpi_small_st(p)->block[sl->cls] == 0 && b < sl->nblocks &&
	       (__atomic_load_n(&parked_map(sl)[b / 64], __ATOMIC_ACQUIRE) & (1ull << (b % 64))) &&
	       (sl->used[b / 64] & (1ull << (b % 64)));
}

int vpi_small_find_locked(vpmm_pool *p, struct region *r, CUdeviceptr ptr,
			   CUdeviceptr *base, size_t *size)
{
	struct slab *sl = r->small;
	size_t bs = vpi_small_st(p)->block[sl->cls];
	uint32_t b = (uint32_t)((ptr - r->va) / bs);
	if (b >= sl->nblocks || !(sl->used[b / 64] & (1ull << (b % 64))) ||
	    (__atomic_load_n(&parked_map(sl)[b / 64], __ATOMIC_ACQUIRE) & (1ull << (b % 64))))
		return -EINVAL;
	if (base)
		*base = r->va + (CUdeviceptr)b * bs;
	if (size)
		*size = bs;
	return 0;
}

size_t vpi_small_check_locked(vpmm_pool *p, FILE *log)
{
	struct small_state *s = vpi_small_st(p);
	size_t bad = 0, slabs = 0, kept = 0, kept_found = 0;
	if (!s)
		return 0;
	for (unsigned c = 0; c < s->nclasses; c++)
		kept += s->kept[c] != NULL;
	for (struct vpi_tnode *n = vpi_tree_first(&p->regions); n; n = vpi_tree_next(n)) {
		const struct region *r = vpi_container_of(n, struct region, by_va);
		const struct slab *sl = r->small;
		if (!sl)
			continue;
		slabs++;
		uint32_t set = 0;
		for (uint32_t w = 0; w < (sl->nblocks + 63) / 64; w++)
			set += (uint32_t)__builtin_popcountll(sl->used[w]);
		if (r->kind != R_LIVE || sl->r != r || sl->cls >= s->nclasses ||
		    r->size != s->slab_bytes[sl->cls] || set + sl->nfree != sl->nblocks ||
		    sl->listed != (sl->nfree > 0 || sl->deferred)) {
			bad++;
			if (log)
				fprintf(log, "vpmm check: slab at %#llx inconsistent\n",
					(unsigned long long)r->va);
		}
		if (sl->cls < s->nclasses && s->kept[sl->cls] == sl) {
			kept_found++;
		} else if (!set && !sl->deferred) {
			bad++; /* empty slabs would add up over streams */
			if (log)
				fprintf(log, "vpmm check: empty slab at %#llx kept beside "
					"the class's kept one\n", (unsigned long long)r->va);
		}
	}
	if (kept_found != kept) {
		bad++;
		if (log)
			fprintf(log, "vpmm check: %zu kept empty slabs named, %zu of them live\n",
				kept, kept_found);
	}
	if (slabs != s->slabs) {
		bad++;
		if (log)
			fprintf(log, "vpmm check: %zu slabs found, %zu counted\n", slabs, s->slabs);
	}
	/* A spare's next slab starts from its bitmaps as they are. */
	for (unsigned c = 0; c < s->nclasses; c++)
		for (const struct slab *sl = s->spare[c]; sl; sl = sl->next) {
			uint64_t any = 0;
			for (uint32_t w = 0; w < 2 * sl->words; w++)
				any |= __atomic_load_n(&sl->used[w], __ATOMIC_ACQUIRE);
			if (any || sl->cls != c) {
				bad++;
				if (log)
					fprintf(log, "vpmm check: spare slab of class %u not clear\n", c);
			}
		}
	return bad;
}

void vpi_small_fini(vpmm_pool *p)
{
	struct small_state *s = vpi_small_st(p);
	if (!s)
		return;
	for (struct vpi_tnode *n = vpi_tree_first(&p->regions); n; n = vpi_tree_next(n)) {
		struct region *r = vpi_container_of(n, struct region, by_va);
		struct slab *sl = r->small;
		if (!sl)
			continue;
		while (sl->deferred) {
			struct deferred *d = sl->deferred;
			sl->deferred = d->next;
			free(d); /* the events go with the pool's own lists */
		}
		r->small = NULL;
		free(sl);
	}
	for (struct stream *st = p->streams; st; st = st->next) {
		free(st->small_partial);
		st->small_partial = NULL;
	}
	for (unsigned c = 0; c < s->nclasses; c++)
		while (s->spare[c]) {
			struct slab *sl = s->spare[c];
			s->spare[c] = sl->next;
			free(sl);
		}
	free(s);
	p->small = NULL;
}
