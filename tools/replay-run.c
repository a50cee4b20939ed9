/* replay-run.c — vpmm-replay's loop: the parsed log's operations through
 * a pool on the simulated device (driver_host.h), with another process's
 * share of the device (--tenant) and the device finishing its queued work
 * every so many operations, the pool's clock at each operation's time in
 * the log (--clock), and --plot's samples taken after each. Only this loop
 * is timed. Calls vpmm.h, snapshot.h (the pool at the first refusal),
 * driver_host.h, replay-progress.c and replay-plot.c.
 *
 * Streams: a host stream is made at a stream's first operation. One the
 * log names no more (its last operation passed) is destroyed when the next
 * new stream comes, as a program that makes a stream per request does: the
 * pool learns that it is gone (vpmm_pool_stream_gone), and the new stream
 * may get its handle. A log whose streams all come at the start replays as
 * if none were destroyed.
 */
#include <errno.h>
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

struct streams {
	CUstream *s;       /* [k]: stream k's; NULL before its first operation */
	size_t *last;      /* [k]: the last operation naming stream k */
	uint32_t *ended;   /* streams past their last operation, not destroyed */
	size_t nended;
};

/* The stream of operation i (NULL without memory). */
static CUstream stream_of(const struct log *lg, vpmm_pool *pool, vpmm_driver *drv,
			  struct streams *ss, size_t i)
{
	uint32_t k = lg->ops[i].stream;
	if (k && !ss->s[k]) {
		for (; ss->nended; ss->nended--) {
			CUstream *e = &ss->s[ss->ended[ss->nended - 1]];
			vpmm_pool_stream_gone(pool, *e);
			vpmm_host_stream_destroy(drv, *e);
			*e = NULL;
		}
		ss->s[k] = vpmm_host_stream_create(drv);
	}
	return ss->s[k];
}

static void stream_passed(const struct log *lg, struct streams *ss, size_t i)
{
	uint32_t k = lg->ops[i].stream;
	if (k && ss->last[k] == i && ss->s[k] != VPMM_NO_STREAM)
		ss->ended[ss->nended++] = k;
}

const char *replay_clock_name(enum replay_clock c)
{
	return c == CLOCK_LOG ? "log" : c == CLOCK_OPS ? "operations" : "wall";
}

/* The pool's clock in a replay on the log's time: the operation's. */
static uint64_t log_clock(void *arg)
{
	return *(const uint64_t *)arg;
}

/* The pool as the first refusal left it. A walk of every region and
 * handle, once a replay; its time counts in the replay's. */
static void failure_at(vpmm_pool *pool, vpmm_driver *drv, uint64_t op, size_t size,
		       struct failure_at *f)
{
	struct vpmm_snapshot sn;
	struct vpmm_config cfg;
	struct vpmm_stats st;
	size_t dev_free = 0, total = 0;
	f->op = op;
	f->size = size;
	if (drv->mem_info(drv, &dev_free, &total) != CUDA_SUCCESS)
		dev_free = 0;
	f->creatable = dev_free;
	vpmm_pool_summary(pool, &cfg, &st);
	if (cfg.limit) {
		uint64_t left = cfg.limit > st.mapped ? cfg.limit - st.mapped : 0;
		if (left < f->creatable)
			f->creatable = left;
	}
	if (vpmm_pool_snapshot(pool, &sn) != 0)
		return;
	f->split = sn.free_split;
	f->split_known = true;
	vpmm_snapshot_free(&sn);
}

int replay(struct log *lg, vpmm_pool *pool, vpmm_driver *drv, CUstream *streams,
	   const struct tenant *tn, uint64_t complete_every, enum replay_clock clock,
	   bool check, struct plot *plot, struct result *r)
{
	uint64_t clock_ns = 0;
	uint64_t live = 0, since = 0;
	size_t next_step = 0;
	struct vpmm_stats st;
	struct streams ss = { streams, calloc(lg->nstreams, sizeof(size_t)),
			      calloc(lg->nstreams, sizeof(uint32_t)), 0 };
	if (!ss.last || !ss.ended) {
		free(ss.last);
		free(ss.ended);
		return -ENOMEM;
	}
	for (size_t i = 0; i < lg->nops; i++)
		ss.last[lg->ops[i].stream] = i;
	char *mbuf = NULL;
	size_t mlen = 0;
	FILE *msgs = check ? open_memstream(&mbuf, &mlen) : NULL;
	int rc = 0;

	if (plot) {
		vpmm_pool_stats(pool, &st);
		plot_begin(plot, lg->nops, &st);
	}
	if (clock != CLOCK_WALL)
		vpmm_pool_set_clock(pool, log_clock, &clock_ns);
	progress_begin("replaying", lg->name, lg->nops, lg->nops >= PROGRESS_MIN_OPS);
	uint64_t t0 = now_ns();
	for (size_t i = 0; i < lg->nops; i++) {
		const struct op *op = &lg->ops[i];
		/* from 1 us: the pool reads a clock of 0 as 1 ns, which would
		 * shorten the intervals that start at the log's first line */
		clock_ns = ((clock == CLOCK_LOG ? op->t_us : (uint64_t)i) + 1) * 1000;
		if ((i & 4095) == 0)
			progress_at(i);
		if (plot && i) {
			vpmm_pool_stats(pool, &st);
			plot_sample(plot, i, &st);
		}
		while (next_step < tn->n && tn->step[next_step].op <= i)
			vpmm_host_set_tenant(drv, tn->step[next_step++].bytes);
		struct alloc *a = &lg->allocs[op->id];
		CUstream s = stream_of(lg, pool, drv, &ss, i);
		if (op->stream && !s) {
			rc = -ENOMEM;
			break;
		}
		stream_passed(lg, &ss, i);

		if (op->kind == OP_ALLOC) {
			int e = vpmm_pool_malloc(pool, a->size, s, &a->ptr);
			r->ops++;
			if (e == 0) {
				a->live = true;
				r->allocs++;
				live += a->size;
				if (live > r->peak_requested)
					r->peak_requested = live;
			} else {
				if (!r->failures++) {
					r->first_failure = -e;
					failure_at(pool, drv, i + 1, a->size, &r->first);
				}
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
	vpmm_pool_set_clock(pool, NULL, NULL);
	if (msgs)
		fclose(msgs);
	free(mbuf);
	free(ss.last);
	free(ss.ended);
	vpmm_pool_stats(pool, &r->stats);
	return rc;
}

