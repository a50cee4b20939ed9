/* loop.c — a stream's sequence of mallocs, to see a training loop repeat.
 *
 * A training step makes the same mallocs in the same order every step. Two
 * rules use that: a defragmentation that repeats a loop grows the pool
 * instead (vpi_loop_repeats, from take.c), and a malloc is placed where the
 * same malloc went one or two steps before, when that memory is free
 * (vpi_loop_hints, from pool.c). The first stops the pool from regathering memory for
 * the same tensor every step; the second stops the other tensors from
 * taking that memory before the tensor comes.
 *
 * What is kept: every malloc of the stream extends a polynomial hash of the
 * sequence of requested sizes, and the hash of every prefix of the last
 * `ring` mallocs is kept (VPMM_LOOP_RING, more for a longer step, up to
 * VPMM_LOOP_RING_MAX), so two stretches compare in O(log n)
 * (the size of malloc i is prefix[i + 1] - prefix[i] * BASE). Beside it, the
 * address each malloc got. Mallocs the stream's cache serves are counted as
 * well as those through the pool lock: which of them the cache serves
 * changes from step to step (a flush empties it), so counting only the
 * others hid most loops (docs/policy.md, "Loops").
 *
 * Per stream, under the front's lock that the cache's fast path holds
 * anyway: threads on their own streams share nothing. 128 KiB a stream,
 * taken at its first malloc through the pool lock. More for a stream whose
 * loop repeats over more than 2 047 mallocs: 64 to 128 bytes a malloc of
 * that distance, up to 4 MiB (at most 65 535). The distance is the one
 * between a size's defragmentations, a whole number of steps: a short step
 * whose tensor defragments only every tenth step grows the rings to ten
 * steps, and its places are then offered from ten and twenty steps back,
 * where the same mallocs went.
 *
 * Owns struct loop (loop.h). Calls nothing else of the pool.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "vpi.h"

#define BASE VPMM_LOOP_BASE

/* Without memory for the rings the stream's loops go unseen; the count
 * goes on, and the rings are asked for again a ring's worth of mallocs
 * later rather than on every malloc. */
int vpi_loop_init(struct loop *l)
{
	if (l->prefix || l->n < l->retry)
		return l->prefix ? 0 : -ENOMEM;
	uint64_t *prefix = calloc(VPMM_LOOP_RING, sizeof(*prefix));
	CUdeviceptr *at = calloc(VPMM_LOOP_RING, sizeof(*at));
	if (!prefix || !at) {
		free(prefix);
		free(at);
		l->retry = l->n + VPMM_LOOP_RING;
		return -ENOMEM;
	}
	/* What was counted before has no hashes: a fresh start. */
	memset(l->slot, 0, sizeof(l->slot));
	l->period = 0;
	l->start = l->n;
	l->ring = VPMM_LOOP_RING;
	l->prefix = prefix;
	l->at = at;
	return 0;
}

void vpi_loop_fini(struct loop *l)
{
	free(l->prefix);
	free(l->at);
	memset(l, 0, sizeof(*l));
}

uint64_t vpi_loop_note(struct loop *l, size_t size, CUdeviceptr at)
{
	uint64_t i = l->n++;
	if (l->prefix) {
		l->prefix[l->n & (l->ring - 1)] = l->prefix[i & (l->ring - 1)] * BASE + size;
		l->at[i & (l->ring - 1)] = at;
	}
	return i;
}

void vpi_loop_placed(struct loop *l, uint64_t i, CUdeviceptr at)
{
	if (l->prefix && l->n - i < l->ring)
		l->at[i & (l->ring - 1)] = at;
}

static uint64_t power(uint64_t b, uint64_t e)
{
	uint64_t r = 1;
	for (; e; e >>= 1, b *= b)
		if (e & 1)
			r *= b;
	return r;
}

static uint64_t prefix(const struct loop *l, uint64_t i)
{
	return l->prefix[i & (l->ring - 1)];
}

/* The size of malloc i, from the hashes either side of it. */
static uint64_t size_of(const struct loop *l, uint64_t i)
{
	return prefix(l, i + 1) - prefix(l, i) * BASE;
}

/* Whether the last VPMM_LOOP_TIMES stretches of `period` mallocs are
 * equal, size for size (by hash). */
static bool window_repeats(const struct loop *l, uint64_t period)
{
	uint64_t n = l->n, bp = power(BASE, period);
	if (!l->prefix || period < VPMM_LOOP_MIN_PERIOD ||
	    (VPMM_LOOP_TIMES + 1) * period >= l->ring ||
	    n - l->start < VPMM_LOOP_TIMES * period)
		return false;
	uint64_t prev = prefix(l, n - period), w = prefix(l, n) - prev * bp;
	for (unsigned k = 2; k <= VPMM_LOOP_TIMES; k++) {
		uint64_t before = prefix(l, n - k * period);
		if (prev - before * bp != w)
			return false;
		prev = before;
	}
	return true;
}

/* The last three stretches equal means the malloc noted last had the same
 * size one and two periods before; the sizes are compared anyway, against
 * a collision of hashes. Two periods back, not only one: a tensor of one
 * step may live into the next, so its place of one step ago is still
 * taken, but not its place of two. */
unsigned vpi_loop_hints(const struct loop *l, CUdeviceptr *at)
{
	uint64_t i = l->n - 1, per = l->period;
	unsigned n = 0;
	if (!window_repeats(l, per))
		return 0;
	/* window_repeats() holds n >= VPMM_LOOP_TIMES periods in the ring. */
	for (unsigned k = 1; k <= VPMM_LOOP_HINTS; k++) {
		uint64_t j = i - k * per;
		CUdeviceptr there = l->at[j & (l->ring - 1)];
		if (size_of(l, j) == size_of(l, i) && there)
			at[n++] = there;
	}
	return n;
}

/* Whether the last `span` mallocs repeat with `period` (span > period,
 * span < the ring): the stretch [n - span, n - period) equals the
 * one `period` later, by hash. */
static bool periodic_over(const struct loop *l, uint64_t period, uint64_t span)
{
	uint64_t n = l->n, b = power(BASE, span - period);
	return prefix(l, n - period) - prefix(l, n - span) * b ==
	       prefix(l, n) - prefix(l, n - span + period) * b;
}

/* Whether the last two stretches of `d0` mallocs are equal, d0 being the
 * distance from the last defragmentation of slot e's size. From the ring
 * where it holds both; otherwise from the hashes noted at that size's last
 * two defragmentations, if they were d0 apart too: a step
 * longer than half the ring shows only that way (a model of hundreds of
 * layers makes tens of thousands of mallocs a step). Slots are emptied when
 * the rings come (vpi_loop_init), so every hash noted is of these rings. */
static bool twice(const struct loop *l, const struct loop_slot *e, uint64_t d0)
{
	if (2 * d0 < l->ring && 2 * d0 <= l->n - l->start)
		return periodic_over(l, d0, 2 * d0);
	if (!e->at[1] || e->at[0] - e->at[1] != d0)
		return false;
	uint64_t bp = power(BASE, d0);
	return prefix(l, l->n) - e->hash[0] * bp == e->hash[0] - e->hash[1] * bp;
}

/* A larger ring, for a step longer than a quarter of it (a model of many
 * layers makes thousands of mallocs a step). What the old ring held is
 * kept; history older than that is not there. Without memory the ring
 * stays as it is, and so does the limit on the period. */
static void grow(struct loop *l, uint64_t period)
{
	uint64_t ring = l->ring;
	if ((VPMM_LOOP_TIMES + 1) * period >= VPMM_LOOP_RING_MAX)
		return; /* no ring allowed would hold it */
	while (ring <= (VPMM_LOOP_TIMES + 1) * period)
		ring *= 2;
	if (ring == l->ring)
		return;
	uint64_t *prefix = calloc(ring, sizeof(*prefix));
	CUdeviceptr *at = calloc(ring, sizeof(*at));
	if (!prefix || !at) {
		free(prefix);
		free(at);
		return;
	}
	uint64_t oldest = l->n + 1 > l->ring ? l->n + 1 - l->ring : 0;
	uint64_t from = oldest > l->start ? oldest : l->start;
	for (uint64_t i = from; i <= l->n; i++) {
		prefix[i & (ring - 1)] = l->prefix[i & (l->ring - 1)];
		at[i & (ring - 1)] = l->at[i & (l->ring - 1)];
	}
	free(l->prefix);
	free(l->at);
	l->prefix = prefix;
	l->at = at;
	l->start = from;
	l->ring = ring;
}

/* A training step makes the same calls every step; random traces, and a
 * training loop whose shapes change every step, do not repeat three
 * stretches exactly (two repeated in one of 24 replays of training_varlen,
 * where two iterations drew the same shapes).
 *
 * The period kept for hints is the longest one seen that still repeats: a
 * step's layers repeat within it (30 mallocs a layer in the PyTorch step's
 * trace, against 553 a step), and a layer's place one layer ago is still
 * live, since its activations wait for the backward pass. But a multiple
 * of the period kept, over which the kept one still repeats (two steps,
 * three), does not replace it: places two steps back would be offered
 * first. */
bool vpi_loop_repeats(struct loop *l, size_t need, size_t grain)
{
	struct loop_slot *e = &l->slot[vpi_hash_bits(need / grain, VPMM_LOOP_SLOT_BITS)];
	uint64_t longest = 0, kept = l->period;
	if (e->size != need) {
		memset(e, 0, sizeof(*e));
		e->size = need;
	}
	/* The ring grows for the newest distance only, the one a loop repeats
	 * at (older ones are its multiples, or nothing), and only once two
	 * equal stretches of it are seen: a random trace's far-apart
	 * defragmentations leave it as it is. */
	uint64_t d0 = e->at[0] ? l->n - e->at[0] : 0;
	if (l->prefix && d0 && (VPMM_LOOP_TIMES + 1) * d0 >= l->ring && twice(l, e, d0))
		grow(l, d0);
	for (unsigned i = 0; i < VPMM_LOOP_HISTORY && e->at[i]; i++) {
		uint64_t d = l->n - e->at[i];
		if (d > longest && window_repeats(l, d))
			longest = d;
	}
	if (longest && longest != kept) {
		bool kept_repeats = window_repeats(l, kept);
		if (!kept_repeats ||
		    (longest > kept &&
		     !(longest % kept == 0 && periodic_over(l, kept, VPMM_LOOP_TIMES * longest))))
			l->period = longest;
	}
	memmove(&e->at[1], &e->at[0], (VPMM_LOOP_HISTORY - 1) * sizeof(e->at[0]));
	memmove(&e->hash[1], &e->hash[0], (VPMM_LOOP_HISTORY - 1) * sizeof(e->hash[0]));
	e->at[0] = l->n;
	e->hash[0] = l->prefix ? prefix(l, l->n) : 0;
	return longest != 0;
}
