/* replay-run.c — vpmm-replay's loop: the parsed log's operations through
 * a pool on the simulated device (driver_host.h), with another process's
 * share of the device (--tenant) and the device finishing its queued work
 * every so many operations. Only this loop is timed. Calls vpmm.h and
 * driver_host.h.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "driver_host.h"
#include "replay.h"
#include "vpmm.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void replay(struct log *lg, vpmm_pool *pool, vpmm_driver *drv,
		   const CUstream *streams, const struct tenant *tn,
		   uint64_t complete_every, bool check, struct result *r)
{
	uint64_t live = 0, since = 0;
	size_t next_step = 0;

	uint64_t t0 = now_ns();
	for (size_t i = 0; i < lg->nops; i++) {
		const struct op *op = &lg->ops[i];
		while (next_step < tn->n && tn->step[next_step].op <= i)
			vpmm_host_set_tenant(drv, tn->step[next_step++].bytes);
		struct alloc *a = &lg->allocs[op->id];
		CUstream s = streams[op->stream];

		if (op->kind == OP_ALLOC) {
			int rc = vpmm_pool_malloc(pool, a->size, s, &a->ptr);
			r->ops++;
			if (rc == 0) {
				a->live = true;
				r->allocs++;
				live += a->size;
				if (live > r->peak_requested)
					r->peak_requested = live;
			} else {
				if (!r->failures++)
					r->first_failure = -rc;
			}
		} else {
			if (!a->live)
				continue; /* its allocation failed in the replay */
			r->ops++;
			if (vpmm_pool_free(pool, a->ptr, s) == 0) {
				r->frees++;
				live -= a->size;
			} else {
				r->free_errors++;
			}
			a->live = false;
		}
		if (complete_every && ++since >= complete_every) {
			vpmm_host_complete_all(drv);
			since = 0;
		}
		if (check) {
			size_t bad = vpmm_pool_check(pool, stderr);
			if (bad && !r->check_violations)
				fprintf(stderr, "%s: the pool check failed after "
						"operation %zu\n", lg->name, i + 1);
			r->check_violations += bad;
		}
	}
	r->wall_ns = now_ns() - t0;
	vpmm_pool_stats(pool, &r->stats);
}

