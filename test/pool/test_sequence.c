/* loop.c: a stream's sequence of mallocs, on its own. Which period it keeps
 * for hints (the longest that still repeats, where a step's layers repeat
 * inside the step, but not a multiple of a step), the places it gives (one and two steps back, only while
 * the sequence repeats), and what it does without its memory. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "loop.h"

#define GRAIN 65536
#define LAYER 16 /* mallocs a layer: the shortest period seen */

/* A training-like step: `layers` layers that make the same LAYER mallocs,
 * then `own` mallocs the layers do not make. Each test sets its own. */
static unsigned layers = 4, own = 3;
#define STEP (layers * LAYER + own)

static size_t size_at(uint64_t i)
{
	uint64_t k = i % STEP;
	if (k >= layers * LAYER)
		return (100 + k) * GRAIN;
	return (1 + k % LAYER) * GRAIN;
}

/* Notes mallocs [from, to) of the loop, each at an address of its own. */
static void run(struct loop *l, uint64_t from, uint64_t to)
{
	for (uint64_t i = from; i < to; i++)
		cr_assert_eq(vpi_loop_note(l, size_at(i), 0x10000000 + i * GRAIN), i);
}

/* Notes mallocs up to offset `off` of the step after the current one. */
static void run_to(struct loop *l, uint64_t off)
{
	run(l, l->n, (l->n / STEP + 1) * STEP + off);
}

/* Records a defragmentation for the malloc noted last. */
static bool defrag_last(struct loop *l)
{
	return vpi_loop_repeats(l, size_at(l->n - 1), GRAIN);
}

static bool defrag_size(struct loop *l, size_t size)
{
	return vpi_loop_repeats(l, size, GRAIN);
}

Test(sequence, the_step_not_the_layer)
{
	struct loop l = {0};
	CUdeviceptr at[VPMM_LOOP_HINTS];
	cr_assert_eq(vpi_loop_init(&l), 0);
	/* A layer's request defragments in two layers running: the window of
	 * one layer repeats three times (3 layers behind), the layer's period
	 * is all there is to keep yet. */
	run(&l, 0, 3 * STEP);
	run_to(&l, 2 * LAYER + 1);
	cr_assert_not(defrag_last(&l), "nothing to repeat yet");
	run(&l, l.n, l.n + LAYER);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, LAYER);
	/* The step's own request defragments in two steps running: the step's
	 * period replaces the layer's. */
	run_to(&l, STEP - 1);
	cr_assert_not(defrag_last(&l));
	run(&l, l.n, l.n + STEP);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP);
	/* A layer repeating again keeps the step's. */
	run_to(&l, 2 * LAYER + 1);
	defrag_last(&l);
	run(&l, l.n, l.n + LAYER);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP, "the layer's period replaced the step's");
	/* The places: one and two steps back. */
	uint64_t i = l.n;
	run(&l, i, i + 1);
	cr_assert_eq(vpi_loop_hints(&l, at), 2);
	cr_assert_eq(at[0], 0x10000000 + (i - STEP) * GRAIN);
	cr_assert_eq(at[1], 0x10000000 + (i - 2 * STEP) * GRAIN);
	/* Where a malloc went, once placed (vpi_loop_placed). */
	vpi_loop_placed(&l, i, 0x7000000);
	run(&l, i + 1, i + STEP + 1);
	cr_assert_eq(vpi_loop_hints(&l, at), 2);
	cr_assert_eq(at[0], 0x7000000);
	vpi_loop_fini(&l);
}

/* Once the sequence stops repeating, no places are given, whatever the
 * period kept; they come back three steps after it repeats again. */
Test(sequence, no_places_while_it_does_not_repeat)
{
	struct loop l = {0};
	CUdeviceptr at[VPMM_LOOP_HINTS];
	cr_assert_eq(vpi_loop_init(&l), 0);
	run(&l, 0, 4 * STEP - 1);
	cr_assert_not(defrag_last(&l));
	run(&l, l.n, 5 * STEP - 1);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP);
	run(&l, l.n, l.n + 1);
	cr_assert_eq(vpi_loop_hints(&l, at), 2);
	/* One malloc out of order, then the loop again from one layer
	 * further on: where a layer's size matches the size one step back,
	 * the sequence still does not repeat. */
	vpi_loop_note(&l, 12345 * GRAIN, 0x1000);
	cr_assert_eq(vpi_loop_hints(&l, at), 0);
	uint64_t from = l.n;
	for (uint64_t i = from; i < from + 3 * STEP - 1; i++) {
		vpi_loop_note(&l, size_at(i + LAYER), 0x10000000 + i * GRAIN);
		cr_assert_eq(vpi_loop_hints(&l, at), 0, "a place %llu mallocs after the break",
			     (unsigned long long)(i - from + 1));
	}
	vpi_loop_note(&l, size_at(from + 3 * STEP - 1 + LAYER), 0);
	cr_assert_eq(vpi_loop_hints(&l, at), 2, "no places three steps after the break");
	vpi_loop_fini(&l);
}

/* Without its rings (no memory at the stream's first malloc) the sequence
 * still counts, and sees nothing; rings taken later start from there: what
 * came before has no hashes, and only three steps after them is a loop
 * seen. */
Test(sequence, without_memory_nothing_is_seen)
{
	struct loop l = {0};
	CUdeviceptr at[VPMM_LOOP_HINTS];
	run(&l, 0, 10 * STEP);
	cr_assert_eq(l.n, 10 * STEP);
	cr_assert_not(defrag_last(&l));
	run(&l, l.n, l.n + STEP);
	cr_assert_not(defrag_last(&l));
	cr_assert_eq(vpi_loop_hints(&l, at), 0);
	vpi_loop_placed(&l, 3, 0x1000);
	cr_assert_eq(vpi_loop_init(&l), 0);
	uint64_t start = l.n;
	for (int k = 1; k < 3; k++) {
		run(&l, l.n, l.n + STEP);
		cr_assert_not(defrag_last(&l), "a loop seen %llu mallocs after the rings came",
			      (unsigned long long)(l.n - start));
	}
	run(&l, l.n, l.n + STEP);
	cr_assert(defrag_last(&l), "no loop seen three steps after the rings came");
	vpi_loop_fini(&l);
}

/* One size's history holds two periods that repeat, a layer (newest) and
 * a step: the step is kept. */
Test(sequence, the_longest_that_a_size_saw)
{
	struct loop l = {0};
	cr_assert_eq(vpi_loop_init(&l), 0);
	run(&l, 0, 3 * STEP);
	run_to(&l, 3 * LAYER + 1); /* layer 3 of a step */
	defrag_last(&l);
	run_to(&l, 2 * LAYER + 1); /* layers 2 and 3 of the next */
	defrag_last(&l);
	run(&l, l.n, l.n + LAYER);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP, "kept %llu, not the step's %u",
		     (unsigned long long)l.period, STEP);
	vpi_loop_fini(&l);
}

/* Two steps repeat too; they do not replace one, which still repeats over
 * them: places would then be offered two steps back first. */
Test(sequence, two_steps_do_not_replace_one)
{
	struct loop l = {0};
	cr_assert_eq(vpi_loop_init(&l), 0);
	run(&l, 0, 6 * STEP - 1);
	cr_assert_not(defrag_last(&l));
	run(&l, l.n, l.n + STEP);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP);
	/* The step's last malloc again two steps on, and not in between. */
	run(&l, l.n, l.n + 2 * STEP);
	cr_assert_eq(size_at(l.n - 1), size_at(l.n - 1 - 2 * STEP));
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP, "two steps (%llu) replaced one",
		     (unsigned long long)l.period);
	vpi_loop_fini(&l);
}

/* A step that is a whole number of layers long (5 layers and 16 mallocs of
 * its own: 96 = 6 x 16) replaces the layer's period all the same: the
 * sequence does not repeat every layer over the step. */
Test(sequence, a_step_as_long_as_whole_layers)
{
	struct loop l = {0};
	layers = 5;
	own = LAYER;
	cr_assert_eq(STEP % LAYER, 0);
	cr_assert_eq(vpi_loop_init(&l), 0);
	run(&l, 0, 3 * STEP);
	run_to(&l, 2 * LAYER + 1);
	defrag_last(&l);
	run(&l, l.n, l.n + LAYER);
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, LAYER);
	run_to(&l, 3 * LAYER + 1); /* the same layer of the next step */
	cr_assert(defrag_last(&l));
	cr_assert_eq(l.period, STEP, "kept %llu, not the step's %u",
		     (unsigned long long)l.period, STEP);
	vpi_loop_fini(&l);
}

/* Notes `n` mallocs of sizes that never repeat, at no address. */
static void noise(struct loop *l, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		vpi_loop_note(l, (1000 + l->n) * GRAIN, 0);
}

/* A model of many layers makes thousands of mallocs a step. The ring
 * grows once two equal steps are seen; the loop is seen once three steps
 * are in it, at step `seen`, and places are offered as for a short step.
 * `pre` mallocs of noise come first, so that the ring may have wrapped
 * before it grows. */
static void long_step(unsigned nlayers, uint64_t pre, unsigned seen, uint64_t ring)
{
	struct loop l = {0};
	CUdeviceptr at[VPMM_LOOP_HINTS];
	layers = nlayers;
	cr_assert_gt((VPMM_LOOP_TIMES + 1) * STEP, VPMM_LOOP_RING);
	cr_assert_eq(vpi_loop_init(&l), 0);
	noise(&l, pre);
	uint64_t base = l.n;
	for (unsigned k = 1; k <= seen; k++) {
		/* up to the step's last malloc, the loop's sizes from `base` on */
		for (uint64_t i = l.n; i < base + k * STEP - 1; i++)
			vpi_loop_note(&l, size_at(i - base), 0x10000000 + i * GRAIN);
		cr_assert_eq(defrag_size(&l, size_at(STEP - 2)), k == seen, "step %u: a loop %s", k,
			     k == seen ? "not seen" : "seen before three steps were in the ring");
	}
	cr_assert_eq(l.ring, ring, "ring of %llu", (unsigned long long)l.ring);
	cr_assert_eq(l.period, STEP);
	/* Steps on, the ring wrapping again and again, the hashes still hold. */
	for (unsigned k = seen + 1; k <= seen + 8; k++) {
		for (uint64_t i = l.n; i < base + k * STEP - 1; i++)
			vpi_loop_note(&l, size_at(i - base), 0x10000000 + i * GRAIN);
		cr_assert(defrag_size(&l, size_at(STEP - 2)), "step %u: the loop no longer seen", k);
		cr_assert_eq(vpi_loop_hints(&l, at), 2);
		cr_assert_eq(at[0], 0x10000000 + (l.n - 1 - STEP) * GRAIN);
		cr_assert_eq(at[1], 0x10000000 + (l.n - 1 - 2 * STEP) * GRAIN);
	}
	cr_assert_eq(l.ring, ring);
	vpi_loop_fini(&l);
}

/* 150 layers, 2 403 mallocs: two steps fit the first ring, which doubles at
 * the second step's defragmentation. */
Test(sequence, a_step_of_thousands_of_mallocs)
{
	long_step(150, 0, 4, 2 * VPMM_LOOP_RING);
}

Test(sequence, a_step_of_thousands_of_mallocs_after_the_ring_wrapped)
{
	long_step(150, VPMM_LOOP_RING + 1234, 4, 2 * VPMM_LOOP_RING);
}

/* 300 layers, 4 803 mallocs, and 1 250 layers, 20 003: no two steps fit the
 * first ring. Three defragmentations a step apart whose stretches hash the
 * same grow it at the third step; three steps fill the new ring two or
 * three steps later. */
Test(sequence, a_step_longer_than_half_the_ring)
{
	long_step(300, 0, 5, 4 * VPMM_LOOP_RING);
	long_step(300, VPMM_LOOP_RING + 1234, 5, 4 * VPMM_LOOP_RING);
	long_step(1250, 0, 6, 16 * VPMM_LOOP_RING);
}

/* A step of 65 603 mallocs would need rings past VPMM_LOOP_RING_MAX: it
 * stays unseen, and the ring as it was. */
Test(sequence, a_step_past_the_largest_ring_is_not_seen)
{
	struct loop l = {0};
	layers = 4100;
	cr_assert_geq((VPMM_LOOP_TIMES + 1) * STEP, VPMM_LOOP_RING_MAX);
	cr_assert_eq(vpi_loop_init(&l), 0);
	for (unsigned k = 1; k <= 6; k++) {
		run(&l, l.n, k * STEP - 1);
		cr_assert_not(defrag_size(&l, size_at(STEP - 2)), "step %u: a loop seen", k);
	}
	cr_assert_eq(l.ring, VPMM_LOOP_RING, "grew to %llu", (unsigned long long)l.ring);
	vpi_loop_fini(&l);
}

/* A step of 595 mallocs that defragments once a step: the size's history
 * then holds distances of up to 8 steps, but the ring grows for none. */
Test(sequence, a_short_step_keeps_its_ring)
{
	struct loop l = {0};
	layers = 37;
	cr_assert_lt((VPMM_LOOP_TIMES + 1) * STEP, VPMM_LOOP_RING);
	cr_assert_gt((VPMM_LOOP_TIMES + 1) * VPMM_LOOP_HISTORY * STEP, VPMM_LOOP_RING);
	cr_assert_eq(vpi_loop_init(&l), 0);
	for (unsigned k = 1; k <= 12; k++) {
		run(&l, l.n, k * STEP - 1);
		defrag_last(&l);
	}
	cr_assert_eq(l.period, STEP);
	cr_assert_eq(l.ring, VPMM_LOOP_RING, "grew to %llu", (unsigned long long)l.ring);
	vpi_loop_fini(&l);
}

/* A size that defragments at far-apart moments of a sequence that does not
 * repeat, or further apart than any step kept: the ring stays. */
Test(sequence, far_apart_defragmentations_keep_the_ring)
{
	struct loop l = {0};
	cr_assert_eq(vpi_loop_init(&l), 0);
	for (int k = 0; k < 4; k++) {
		noise(&l, 3000);
		cr_assert_not(defrag_size(&l, 7 * GRAIN));
	}
	for (int k = 0; k < 3; k++) {
		noise(&l, 20001);
		cr_assert_not(defrag_size(&l, 7 * GRAIN));
	}
	cr_assert_eq(l.ring, VPMM_LOOP_RING, "grew to %llu", (unsigned long long)l.ring);
	vpi_loop_fini(&l);
}

/* White box: after the rings grow, every hash they claim to hold (from
 * max(start, n + 1 - ring) to n) is the hash of the sizes noted since the
 * rings came, and every address is the one noted. Three cases: the first
 * ring not yet wrapped, wrapped, and rings that came late (start > 0). */
static size_t sizes[40000];

static void check_rings(const struct loop *l, uint64_t since)
{
	uint64_t oldest = l->n + 1 > l->ring ? l->n + 1 - l->ring : 0;
	cr_assert_geq(l->start, since, "start %llu before the rings came at %llu",
		      (unsigned long long)l->start, (unsigned long long)since);
	uint64_t h = 0;
	for (uint64_t i = since; i <= l->n; i++) {
		if (i >= l->start && i >= oldest) {
			cr_assert_eq(l->prefix[i & (l->ring - 1)], h, "prefix %llu wrong",
				     (unsigned long long)i);
			if (i < l->n)
				cr_assert_eq(l->at[i & (l->ring - 1)], 0x10000000 + i * GRAIN,
					     "address %llu wrong", (unsigned long long)i);
		}
		if (i < l->n)
			h = h * VPMM_LOOP_BASE + sizes[i];
	}
}

static void grown_rings(uint64_t without, uint64_t pre)
{
	struct loop l = {0};
	layers = 150;
	for (uint64_t i = 0; i < without; i++)
		vpi_loop_note(&l, sizes[i] = (2000 + i) * GRAIN, 0x10000000 + i * GRAIN);
	cr_assert_eq(vpi_loop_init(&l), 0);
	uint64_t since = l.n;
	for (uint64_t i = l.n; i < since + pre; i++)
		vpi_loop_note(&l, sizes[i] = (1000 + i) * GRAIN, 0x10000000 + i * GRAIN);
	uint64_t base = l.n;
	for (unsigned k = 1; k <= 5; k++) {
		for (uint64_t i = l.n; i < base + k * STEP - 1; i++)
			vpi_loop_note(&l, sizes[i] = size_at(i - base), 0x10000000 + i * GRAIN);
		defrag_size(&l, size_at(STEP - 2));
		check_rings(&l, since);
	}
	cr_assert_eq(l.ring, 2 * VPMM_LOOP_RING, "the rings did not grow: the test shows nothing");
	vpi_loop_fini(&l);
}

Test(sequence, grown_rings_hold_what_they_held)
{
	grown_rings(0, 0);
	grown_rings(0, VPMM_LOOP_RING + 1234);
	grown_rings(5000, 0);
}

