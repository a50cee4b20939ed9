/* check.c — looking at the pool without changing it: vpmm_pool_check(), which
 * walks every structure and counts broken invariants, and the region map
 * (vpmm_pool_regions, vpmm_pool_layout) in ascending VA order.
 *
 * A pure reader: nothing in allocator/ calls into it. It calls only the
 * other rooms' own checks (front.c, small.c) and the tree's, and
 * stream.c's slot lookup.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "chunk.h"
#include "front.h"
#include "handle.h"
#include "pool.h"
#include "region.h"
#include "small.h"
#include "stream.h"

static size_t complain(FILE *log, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static size_t complain(FILE *log, const char *fmt, ...)
{
	if (log) {
		va_list ap;
		va_start(ap, fmt);
		fputs("vpmm check: ", log);
		vfprintf(log, fmt, ap);
		fputc('\n', log);
		va_end(ap);
	}
	return 1;
}

static bool region_in_tree(const struct vpi_tree *t, const struct region *r)
{
	const struct vpi_tnode *n = &r->by_size;
	while (n->parent)
		n = n->parent;
	return n == t->root;
}

/* What a region counts as: a busy one as what it was. */
static enum rkind kind_of(const struct region *r)
{
	return r->kind == R_BUSY ? r->was : r->kind;
}

/* Regions partition each chunk; each region is in the index of its kind. */
static size_t check_regions(vpmm_pool *p, FILE *log, uint64_t sums[4],
			    size_t *nfree, size_t *nholes, size_t *nzombies,
			    size_t *nbusy)
{
	size_t bad = 0, runs = 0;
	CUdeviceptr expect = 0;
	const struct region *prev = NULL;

	const struct region *before = NULL; /* r's predecessor in the tree */
	for (struct vpi_tnode *n = vpi_tree_first(&p->regions); n;
	     n = vpi_tree_next(n)) {
		const struct region *r = REG(n, by_va);
		const struct chunk *c;
		/* The address links follow the tree (region.h). */
		if (r->lower != before || (before && before->upper != r))
			bad += complain(log, "region %#" PRIx64 " linked out of address order",
					(uint64_t)r->va);
		before = r;
		if (r->chunk >= p->nchunks) {
			bad += complain(log, "region %#" PRIx64 " in chunk %u of %u",
					(uint64_t)r->va, r->chunk, p->nchunks);
			continue;
		}
		c = &p->chunks[r->chunk];
		/* Chunks may lie in any address order; each is one run. */
		if (!prev || prev->chunk != r->chunk) {
			if (prev && expect != p->chunks[prev->chunk].va + p->chunks[prev->chunk].size)
				bad += complain(log, "chunk %u not covered to its end",
						prev->chunk);
			expect = c->va;
			runs++;
		}
		if (r->va != expect)
			bad += complain(log, "gap or overlap at %#" PRIx64 " (expected %#" PRIx64 ")",
					(uint64_t)r->va, (uint64_t)expect);
		if (!r->size || r->size % p->grain)
			bad += complain(log, "region %#" PRIx64 " size %zu not whole grains",
					(uint64_t)r->va, r->size);
		/* Unmapped or remapped VA comes in whole pages. */
		if ((kind_of(r) == R_HOLE || kind_of(r) == R_ZOMBIE) &&
		    ((r->va - c->va) % p->page || r->size % p->page))
			bad += complain(log, "%s %#" PRIx64 " not page-aligned",
					kind_of(r) == R_HOLE ? "hole" : "zombie", (uint64_t)r->va);
		if (r->va < c->va || r->va + r->size > c->va + c->size)
			bad += complain(log, "region %#" PRIx64 " crosses its chunk",
					(uint64_t)r->va);
		else if (kind_of(r) == R_HOLE && r->size >= p->page &&
			 (c->home[(r->va - c->va) / p->page] ||
			  c->home[(r->va + r->size - c->va) / p->page - 1]))
			bad += complain(log, "home map names a handle over hole %#" PRIx64,
					(uint64_t)r->va);
		expect = r->va + r->size;
		/* Unclaimed, a lock-free free could take it for a live
		 * allocation of its own (front.c). */
		if ((r->kind != R_LIVE || r->small) && !vpi_claimed(r))
			bad += complain(log, "%s %#" PRIx64 " unclaimed",
					r->small ? "slab" : "region that is not live",
					(uint64_t)r->va);
		if (r->kind == R_BUSY) {
			(*nbusy)++;
			if (r->was == R_BUSY || r->was == R_LIVE)
				bad += complain(log, "busy %#" PRIx64 " was %d",
						(uint64_t)r->va, r->was);
			sums[r->was] += r->size; /* counts as before meanwhile */
			prev = r;
			continue;
		}
		sums[r->kind] += r->size;

		/* An event is a zombie's alone: anything else holding one keeps
		 * it referenced, and it is never recycled. */
		if (r->ev && r->kind != R_ZOMBIE && r->kind != R_BUSY)
			bad += complain(log, "region %#" PRIx64 " (not a zombie) holds an event",
					(uint64_t)r->va);

		switch (r->kind) {
		case R_FREE:
			(*nfree)++;
			if (r->stream) {
				if (!region_in_tree(&r->stream->free_by_size, r))
					bad += complain(log, "free %#" PRIx64 " missing from its stream's index",
							(uint64_t)r->va);
				if (r->epoch <= r->stream->done || r->epoch > r->stream->epoch)
					bad += complain(log, "free %#" PRIx64 " epoch %" PRIu64 " outside (%" PRIu64 ", %" PRIu64 "]",
							(uint64_t)r->va, r->epoch, r->stream->done,
							r->stream->epoch);
			} else if (!region_in_tree(&p->settled, r)) {
				bad += complain(log, "settled %#" PRIx64 " missing from its index",
						(uint64_t)r->va);
			}
			if (prev && prev->kind == R_FREE && prev->chunk == r->chunk &&
			    (prev->stream == r->stream || !prev->stream || !r->stream))
				bad += complain(log, "mergeable free neighbours at %#" PRIx64,
						(uint64_t)r->va);
			break;
		case R_HOLE:
			(*nholes)++;
			if (!region_in_tree(&p->holes, r))
				bad += complain(log, "hole %#" PRIx64 " missing from its index",
						(uint64_t)r->va);
			if (prev && prev->kind == R_HOLE && prev->chunk == r->chunk)
				bad += complain(log, "unmerged holes at %#" PRIx64, (uint64_t)r->va);
			break;
		case R_ZOMBIE:
			(*nzombies)++;
			break;
		case R_LIVE:
		case R_BUSY:
			break;
		}
		prev = r;
	}
	if (before && before->upper)
		bad += complain(log, "last region %#" PRIx64 " linked to another",
				(uint64_t)before->va);
	if (prev && expect != p->chunks[prev->chunk].va + p->chunks[prev->chunk].size)
		bad += complain(log, "last chunk not covered to its end");
	if (runs != p->nchunks)
		bad += complain(log, "%zu runs of regions for %u chunks", runs, p->nchunks);
	return bad;
}

static const struct region *region_at(vpmm_pool *p, CUdeviceptr va)
{
	struct region probe = {.va = va};
	return REG(vpi_tree_floor(&p->regions, &probe.by_va), by_va);
}


/* Mappings cover exactly the live, free and zombie regions; each handle has one
 * home (in live or free memory) plus one mapping per zombie holding it. */
static size_t check_mappings(vpmm_pool *p, FILE *log, uint64_t *mapped_va,
			     uint64_t *physical)
{
	size_t bad = 0;
	const struct mapping *prev = NULL;
	for (struct vpi_tnode *n = vpi_tree_first(&p->maps); n; n = vpi_tree_next(n)) {
		const struct mapping *m = MAP(n);
		const struct handle *s = m->handle;
		if (prev && prev->va + prev->handle->size > m->va)
			bad += complain(log, "mappings overlap at %#" PRIx64, (uint64_t)m->va);
		if (!s->size || s->size % p->page || !s->nmaps)
			bad += complain(log, "handle at %#" PRIx64 ": size %zu, %u maps",
					(uint64_t)m->va, s->size, s->nmaps);
		*mapped_va += s->size;
		/* Every byte of the mapping lies in non-hole regions of one chunk. */
		const struct region *r = region_at(p, m->va);
		CUdeviceptr end = m->va + s->size;
		bool home = false, zombie = false;
		unsigned chunk = r ? r->chunk : 0;
		for (; r && r->va < end; r = REG(vpi_tree_next(&r->by_va), by_va)) {
			if (kind_of(r) == R_HOLE || r->chunk != chunk) {
				bad += complain(log, "mapping %#" PRIx64 " over a hole or two chunks",
						(uint64_t)m->va);
				break;
			}
			home |= kind_of(r) != R_ZOMBIE;
			zombie |= kind_of(r) == R_ZOMBIE;
		}
		if (home && zombie)
			bad += complain(log, "mapping %#" PRIx64 " half zombie", (uint64_t)m->va);
		/* The home map names a home over its pages, nothing else. */
		const struct chunk *c = &p->chunks[chunk];
		if (m->va >= c->va && end <= c->va + c->size)
			for (size_t i = 0; i < s->size / p->page; i++)
				if (c->home[(m->va - c->va) / p->page + i] != (home ? m : NULL)) {
					bad += complain(log, "home map wrong over mapping %#" PRIx64,
							(uint64_t)m->va);
					break;
				}
		prev = m;
	}
	/* Count maps and homes per handle in the handles' scratch fields. */
	for (struct vpi_tnode *n = vpi_tree_first(&p->maps); n; n = vpi_tree_next(n))
		MAP(n)->handle->seen_maps = MAP(n)->handle->seen_homes = 0;
	for (struct vpi_tnode *n = vpi_tree_first(&p->maps); n; n = vpi_tree_next(n)) {
		const struct mapping *m = MAP(n);
		const struct region *r = region_at(p, m->va);
		m->handle->seen_maps++;
		if (r && kind_of(r) != R_ZOMBIE) {
			m->handle->seen_homes++;
			*physical += m->handle->size;
		}
	}
	for (struct vpi_tnode *n = vpi_tree_first(&p->maps); n; n = vpi_tree_next(n)) {
		const struct handle *s = MAP(n)->handle;
		if (s->seen_homes != 1 || s->seen_maps != s->nmaps)
			bad += complain(log, "handle at %#" PRIx64 ": %u homes, %u of %u maps",
					(uint64_t)MAP(n)->va, s->seen_homes, s->seen_maps, s->nmaps);
	}
	return bad;
}

/* The stream records: each one's pending frees and events; the list, the
 * hash (the streams not destroyed) and the dead list (those destroyed that
 * something still refers to) agree with each other and with the counts. */
static size_t check_streams(vpmm_pool *p, FILE *log, size_t *nfree)
{
	size_t bad = 0, n = 0, alive = 0, hashed = 0, dead = 0;
	const struct stream *prev = NULL;
	for (const struct stream *s = p->streams; s; prev = s, s = s->next) {
		size_t in_fifo = 0;
		uint64_t last = 0;
		n++;
		alive += !s->dead;
		if (s->prev != prev)
			bad += complain(log, "stream %u: broken links in the list", s->id);
		bad += vpi_tree_check(&s->free_by_size);
		for (const struct region *r = s->fifo_head; r; r = r->next) {
			if (r->kind != R_FREE || r->stream != s)
				bad += complain(log, "stream %u fifo holds a foreign region", s->id);
			if (r->epoch < last)
				bad += complain(log, "stream %u fifo out of epoch order", s->id);
			if (r->next && r->next->prev != r)
				bad += complain(log, "stream %u fifo broken links", s->id);
			last = r->epoch;
			in_fifo++;
		}
		if (in_fifo != s->free_by_size.count)
			bad += complain(log, "stream %u: %zu in fifo, %zu indexed", s->id,
					in_fifo, s->free_by_size.count);
		*nfree += in_fifo;
		if (s->done >= s->epoch)
			bad += complain(log, "stream %u: done %" PRIu64 " >= open epoch %" PRIu64,
					s->id, s->done, s->epoch);
		for (const struct event *ev = s->ev_head; ev; ev = ev->next)
			if (ev->stream != s || ev->epoch <= s->done || !ev->refs)
				bad += complain(log, "stream %u: stale event in its list", s->id);
		if (s->pins > p->busy)
			bad += complain(log, "stream %u: %u pins, %zu regions busy", s->id, s->pins,
					p->busy);
	}
	if (prev != p->streams_tail || n != p->nrecords)
		bad += complain(log, "%zu streams listed, %zu counted", n, p->nrecords);
	for (unsigned i = 0; i < p->stream_hash_size; i++)
		for (const struct stream *s = p->stream_hash[i]; s; s = s->hash_next, hashed++)
			if (s->dead || vpi_stream_slot(p, s->handle) != i)
				bad += complain(log, "stream %u: dead or in the wrong slot of the hash",
						s->id);
	const struct stream *tail = NULL;
	for (const struct stream *s = p->dead; s && dead <= n; tail = s, s = s->dead_next, dead++)
		if (!s->dead)
			bad += complain(log, "stream %u: on the dead list, not dead", s->id);
	if (hashed != alive || hashed != p->nhashed || dead != n - alive || dead != p->ndead ||
	    tail != p->dead_tail)
		bad += complain(log, "%zu streams alive, %zu hashed (%zu counted), %zu dead "
				"listed of %zu (%zu counted)", alive, hashed, p->nhashed, dead,
				n - alive, p->ndead);
	size_t events = 0, cached = 0;
	for (const struct event *ev = p->events; ev && events <= p->nevents + p->nrecords;
	     ev = ev->all_next) {
		events += !ev->gone;
		if (ev->all_next && ev->all_next->all_prev != ev)
			bad += complain(log, "events: broken links");
	}
	for (const struct event *ev = p->event_cache; ev && cached <= p->nevents;
	     ev = ev->next, cached++)
		if (ev->refs || ev->gone || ev->stream)
			bad += complain(log, "a cached event is held, gone or on a stream");
	if (events != p->nevents || cached != p->ncached || p->cache_low > cached)
		bad += complain(log, "%zu events alive (%zu counted), %zu cached (%zu counted, "
				"%zu at least since the last trim)", events, p->nevents, cached,
				p->ncached, p->cache_low);
	return bad;
}

static size_t check_locked(vpmm_pool *p, FILE *log)
{
	uint64_t sums[4] = {0}, mapped_va = 0, physical = 0;
	size_t nfree = 0, nholes = 0, nzombies = 0, indexed_free = p->settled.count;
	size_t bad = 0, zlist = 0;

	bad += vpi_tree_check(&p->regions) + vpi_tree_check(&p->settled) +
	       vpi_tree_check(&p->holes) + vpi_tree_check(&p->maps);
	size_t nbusy = 0;
	bad += check_regions(p, log, sums, &nfree, &nholes, &nzombies, &nbusy);
	if (nbusy != p->busy)
		bad += complain(log, "%zu busy regions, %zu counted", nbusy, p->busy);
	bad += check_streams(p, log, &indexed_free);
	bad += check_mappings(p, log, &mapped_va, &physical);
	bad += vpi_small_check_locked(p, log);
	bad += vpi_front_check_locked(p, log);

	for (const struct region *z = p->zombie_head; z; z = z->next, zlist++)
		if (z->kind != R_ZOMBIE)
			bad += complain(log, "zombie list holds a %d region", z->kind);
	if (zlist != nzombies)
		bad += complain(log, "%zu zombies listed, %zu in the map", zlist, nzombies);
	if (indexed_free != nfree)
		bad += complain(log, "%zu free regions indexed, %zu in the map", indexed_free, nfree);
	if (p->holes.count != nholes)
		bad += complain(log, "%zu holes indexed, %zu in the map", p->holes.count, nholes);
	if (p->regions.count != p->st.regions)
		bad += complain(log, "region count %zu vs stats %" PRIu64, p->regions.count,
				p->st.regions);

	/* Page accounting: mapped VA = live + free + zombie; physical = live + free. */
	if (mapped_va != sums[R_LIVE] + sums[R_FREE] + sums[R_ZOMBIE])
		bad += complain(log, "mapped VA %" PRIu64 " != live+free+zombie %" PRIu64,
				mapped_va, sums[R_LIVE] + sums[R_FREE] + sums[R_ZOMBIE]);
	if (physical != sums[R_LIVE] + sums[R_FREE] || physical != p->st.mapped)
		bad += complain(log, "physical %" PRIu64 ", live+free %" PRIu64 ", stats %" PRIu64,
				physical, sums[R_LIVE] + sums[R_FREE], p->st.mapped);
	if (sums[R_LIVE] != p->st.live || sums[R_FREE] != p->st.reusable ||
	    sums[R_HOLE] != p->st.holes || sums[R_ZOMBIE] != p->st.zombies)
		bad += complain(log, "gauges disagree with the map");
	uint64_t reserved = 0;
	for (unsigned i = 0; i < p->nchunks; i++)
		reserved += p->chunks[i].size;
	if (reserved != p->st.reserved ||
	    reserved != sums[0] + sums[1] + sums[2] + sums[3])
		bad += complain(log, "reserved %" PRIu64 " disagrees with stats or the map",
				reserved);
	if (p->cfg.limit && p->st.mapped > p->cfg.limit)
		bad += complain(log, "mapped beyond the limit");
	return bad;
}

/* ---- the region map --------------------------------------------------------------- */

static const enum vpmm_region_kind kinds[R_BUSY] = {
	[R_LIVE] = VPMM_REGION_LIVE,
	[R_FREE] = VPMM_REGION_FREE,
	[R_HOLE] = VPMM_REGION_HOLE,
	[R_ZOMBIE] = VPMM_REGION_ZOMBIE,
};

size_t vpmm_pool_regions(vpmm_pool *p, struct vpmm_region_info *out, size_t cap)
{
	size_t n = 0;
	vpi_mutex_lock(&p->lock);
	for (struct vpi_tnode *t = vpi_tree_first(&p->regions); t;
	     t = vpi_tree_next(t), n++) {
		const struct region *r = REG(t, by_va);
		if (n >= cap)
			continue;
		out[n] = (struct vpmm_region_info){
			.va = r->va,
			.size = r->size,
			.kind = kinds[kind_of(r)],
			.stream = r->stream ? r->stream->handle : 0,
			.settled = r->kind == R_FREE && !r->stream,
			.chunk = r->chunk,
		};
	}
	vpi_mutex_unlock(&p->lock);
	return n;
}

static void size_text(char *buf, size_t n, uint64_t size, size_t unit)
{
	static const char suffix[] = "KMGTPE";
	if (unit) {
		if (size % unit)
			snprintf(buf, n, "%.2f", (double)size / (double)unit);
		else
			snprintf(buf, n, "%" PRIu64, size / unit);
		return;
	}
	int i = -1;
	while (size >= 1024 && size % 1024 == 0 && i < 5) {
		size /= 1024;
		i++;
	}
	if (i < 0)
		snprintf(buf, n, "%" PRIu64, size);
	else
		snprintf(buf, n, "%" PRIu64 "%c", size, suffix[i]);
}

size_t vpmm_pool_layout(vpmm_pool *p, char *buf, size_t n, size_t unit)
{
	static const char *const sym[] = {
		[R_LIVE] = "", [R_FREE] = "-", [R_HOLE] = "*", [R_ZOMBIE] = "~",
		[R_BUSY] = "!",
	};
	size_t len = 0;
	int prev_chunk = -1;
	char num[32];
	if (n)
		buf[0] = '\0';
	vpi_mutex_lock(&p->lock);
	for (struct vpi_tnode *t = vpi_tree_first(&p->regions); t; t = vpi_tree_next(t)) {
		const struct region *r = REG(t, by_va);
		size_text(num, sizeof(num), r->size, unit);
		int w = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0,
				 "%s[%s%s]", prev_chunk >= 0 && (unsigned)prev_chunk != r->chunk ? " | " : "",
				 sym[r->kind], num);
		if (w > 0)
			len += (size_t)w;
		prev_chunk = (int)r->chunk;
	}
	vpi_mutex_unlock(&p->lock);
	return len;
}

size_t vpmm_pool_check(vpmm_pool *p, FILE *log)
{
	vpi_mutex_lock(&p->lock);
	size_t bad = check_locked(p, log);
	vpi_mutex_unlock(&p->lock);
	return bad;
}
