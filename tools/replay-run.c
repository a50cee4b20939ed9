/* replay-run.c — vpmm-replay's loop: the parsed log's operations through
 * a pool on the simulated device (driver_host.h), with another process's
 * share of the device (--tenant) and the device finishing its queued work
 * every so many operations, and --plot's samples taken after each. Only
 * this loop is timed. Calls vpmm.h, driver_host.h, replay-progress.c and
 * replay-plot.c.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
	    uint64_t complete_every, bool check, struct plot *plot, struct result *r)
{
	uint64_t live = 0, since = 0;
	size_t next_step = 0;
	struct vpmm_stats st;
	char *mbuf = NULL;
	size_t mlen = 0;
	FILE *msgs = check ? open_memstream(&mbuf, &mlen) : NULL;

	if (plot) {
		vpmm_pool_stats(pool, &st);
		plot_begin(plot, lg->nops, &st);
	}
	progress_begin("replaying", lg->name, lg->nops, lg->nops >= PROGRESS_MIN_OPS);
	uint64_t t0 = now_ns();
	for (size_t i = 0; i < lg->nops; i++) {
		const struct op *op = &lg->ops[i];
		if ((i & 4095) == 0)
			progress_at(i);
		if (plot && i) {
			vpmm_pool_stats(pool, &st);
			plot_sample(plot, i, &st);
		}
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
			size_t bad = vpmm_pool_check(pool, msgs ? msgs : stderr);
			if (msgs && fflush(msgs) == 0 && mlen) {
				/* the check's lines, with the progress line out of
				 * their way */
				progress_clear();
				fwrite(mbuf, 1, mlen, stderr);
				fseeko(msgs, 0, SEEK_SET);
				fflush(msgs);
			}
			if (bad && !r->check_violations)
				fprintf(stderr, "%s: the pool check failed after "
						"operation %zu\n", lg->name, i + 1);
			r->check_violations += bad;
		}
	}
	if (plot && lg->nops) {
		vpmm_pool_stats(pool, &st);
		plot_sample(plot, lg->nops, &st);
	}
	r->wall_ns = now_ns() - t0;
	progress_end();
	if (msgs)
		fclose(msgs);
	free(mbuf);
	vpmm_pool_stats(pool, &r->stats);
}

