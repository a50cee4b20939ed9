/* loop.h — a stream's sequence of mallocs (loop.c): struct loop and its
 * calls. loop.c calls nothing else of the pool.
 */
#ifndef VPMM_LOOP_H
#define VPMM_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "vpmm.h"

#define VPMM_LOOP_SLOT_BITS 6 /* request sizes remembered by vpi_loop_repeats() */
#define VPMM_LOOP_SLOTS (1u << VPMM_LOOP_SLOT_BITS)
#define VPMM_LOOP_HISTORY 8  /* defragmentations remembered per size */
#define VPMM_LOOP_RING 8192  /* mallocs whose prefix hashes are kept, at first */
#define VPMM_LOOP_RING_MAX 262144 /* ... and at most (loop.c): a step under 65 536
				   * mallocs, 4 MiB of rings */
#define VPMM_LOOP_TIMES 3    /* stretches of a period that must repeat exactly */
#define VPMM_LOOP_HINTS 2    /* steps back a malloc's place is looked up (loop.c) */
#define VPMM_LOOP_MIN_PERIOD 16 /* mallocs; shorter repeats are no step */
#define VPMM_LOOP_KEPT VPMM_LOOP_MIN_PERIOD /* places the loops kept (pool-wide)
						  * before a loop's miss turns the
						  * placement to the cost (take.c):
						  * a shortest step's worth */
#define VPMM_LOOP_BASE 0x100000001b3ull /* the sequence's hash (loop.c); odd:
					 * multiplying by it loses nothing mod 2^64 */

/* One stream's sequence of mallocs (loop.c), every one counted: those the
 * cache serves and those through the pool lock. Guarded by the lock of the
 * front that holds it. */
struct loop {
	uint64_t n;       /* mallocs noted */
	uint64_t period;  /* the period places are offered for: the longest a
			   * defragmentation found repeating (vpi_loop_repeats); 0: none */
	uint64_t start;   /* the oldest malloc the rings hold a hash for */
	uint64_t retry;   /* n from which the rings are asked for again after
			   * the host had no memory for them */
	uint64_t ring;    /* entries of the rings: a power of two */
	uint64_t *prefix; /* [i % ring]: hash of sizes 0..i-1, for i in
			   * [max(start, n + 1 - ring), n]; NULL until the
			   * stream's first malloc through the lock */
	CUdeviceptr *at;  /* [i % ring]: where malloc i went; 0: unknown */
	struct loop_slot {
		size_t size;
		uint64_t at[VPMM_LOOP_HISTORY]; /* mallocs noted when this size
						 * defragmented, newest first; 0: unused */
		uint64_t hash[VPMM_LOOP_HISTORY]; /* the prefix hash at each:
						   * compares stretches the
						   * ring no longer holds */
	} slot[VPMM_LOOP_SLOTS];
};

/* loop.c: a stream's sequence of mallocs; the front's lock held. */
int vpi_loop_init(struct loop *l);
void vpi_loop_fini(struct loop *l);
/* Count one malloc of `size` (as requested) that went to `at` (0: not yet
 * known); returns its index for vpi_loop_placed(). */
uint64_t vpi_loop_note(struct loop *l, size_t size, CUdeviceptr at);
void vpi_loop_placed(struct loop *l, uint64_t i, CUdeviceptr at);
/* Where the malloc noted last went one, ... VPMM_LOOP_HINTS periods
 * before, while the sequence repeats; returns how many. */
unsigned vpi_loop_hints(const struct loop *l, CUdeviceptr *at);
/* Records that `need` bytes needed a defragmentation now; whether the same
 * size did one period ago and the sequence repeats that period. */
bool vpi_loop_repeats(struct loop *l, size_t need, size_t grain);

#endif
