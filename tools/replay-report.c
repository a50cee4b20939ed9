/* replay-report.c — vpmm-replay's report of a replay: text for a reader,
 * or one JSON object (--json) for scripts. Calls json.h (to escape the
 * log's name) and options.h (sizes as text).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "options.h"
#include "replay.h"
#include "vpmm.h"

/* Distinct streams the log used. */
static size_t streams_used(const struct log *lg)
{
	return lg->nstreams - 1 + lg->stream0_used;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

void print_json(FILE *f, const struct log *lg, const struct result *r,
		       const struct vpmm_config *cfg, uint64_t complete_every,
		       enum replay_clock clock)
{
	const struct vpmm_stats *s = &r->stats;
	fprintf(f, "{\"log\": ");
	json_write_string(f, lg->name);
	fprintf(f, ", \"ops\": %" PRIu64 ", \"allocs\": %" PRIu64
		   ", \"frees\": %" PRIu64 ", \"failures\": %" PRIu64
		   ", \"log_failures\": %" PRIu64 ", \"unknown_frees\": %" PRIu64
		   ", \"reallocated\": %" PRIu64 ", \"zero_sized\": %" PRIu64
		   ", \"streams\": %zu",
		r->ops, r->allocs, r->frees, r->failures, lg->log_failures,
		lg->unknown_frees, lg->reallocated, lg->zero_sized, streams_used(lg));
	fprintf(f, ", \"peak_requested_bytes\": %" PRIu64
		   ", \"peak_live_bytes\": %" PRIu64
		   ", \"peak_mapped_bytes\": %" PRIu64,
		r->peak_requested, s->live_peak, s->mapped_peak);
	if (s->live_peak)
		fprintf(f, ", \"ratio\": %.6f", ratio(s->mapped_peak, s->live_peak));
	else
		fprintf(f, ", \"ratio\": null");
	fprintf(f, ", \"pages_created\": %" PRIu64 ", \"pages_remapped\": %" PRIu64
		   ", \"defrags\": %" PRIu64 ", \"page_size\": %" PRIu64
		   ", \"reserved_peak_bytes\": %" PRIu64
		   ", \"driver_calls\": %" PRIu64,
		s->pages_created, s->pages_remapped, s->defrags, s->page_size,
		s->reserved_peak, s->driver_calls);
	fprintf(f, ", \"handles_created\": %" PRIu64 ", \"handles_remapped\": %" PRIu64
		   ", \"zombies_reclaimed\": %" PRIu64 ", \"front_hits\": %" PRIu64
		   ", \"loop_growths\": %" PRIu64 ", \"loop_hints\": %" PRIu64
		   ", \"events_recorded\": %" PRIu64 ", \"room_growths\": %" PRIu64
		   ", \"growth_refusals\": %" PRIu64,
		s->handles_created, s->handles_remapped, s->zombies_reclaimed, s->front_hits,
		s->loop_growths, s->loop_hints, s->events_recorded, s->room_growths,
		s->growth_refusals);
	fprintf(f, ", \"defrag\": \"%s\", \"remap\": \"%s\", \"complete_every\": %" PRIu64
		   ", \"clock\": \"%s\"",
		cfg->defrag == VPMM_DEFRAG_ALL ? "all" : "lacking",
		cfg->remap == VPMM_REMAP_ALWAYS ? "always" : "pressure", complete_every,
		replay_clock_name(clock));
	fprintf(f, ", \"wall_ns\": %" PRIu64 ", \"ns_per_op\": %.1f",
		r->wall_ns, r->ops ? (double)r->wall_ns / (double)r->ops : 0.0);
	if (r->check_violations)
		fprintf(f, ", \"check_violations\": %" PRIu64, r->check_violations);
	if (r->failures) {
		const struct failure_at *x = &r->first;
		fprintf(f, ", \"first_failure\": {\"op\": %" PRIu64 ", \"size\": %zu"
			   ", \"creatable\": %" PRIu64, x->op, x->size, x->creatable);
		if (x->split_known) /* the names of vpmm-dump's free_split */
			fprintf(f, ", \"free_split\": {\"whole\": %" PRIu64 ", \"whole_handles\": %" PRIu64
				   ", \"stranded\": %" PRIu64 ", \"stranded_handles\": %" PRIu64
				   ", \"largest\": %" PRIu64 "}",
				x->split.whole, x->split.whole_handles, x->split.stranded,
				x->split.stranded_handles, x->split.largest);
		fprintf(f, "}");
	}
	fprintf(f, "}\n");
}

/* Why the first refusal: a request fails with more than its size free when
 * the free memory is stranded in handles that also hold live memory. */
static void print_first_failure(FILE *f, const struct failure_at *x)
{
	char a[32], b[32], c[32];
	fprintf(f, "first failure       operation %" PRIu64 ": %s\n", x->op,
		vpmm_size_human(x->size, a, sizeof(a)));
	if (x->split_known) {
		fprintf(f, "  free then         %s: %s in %" PRIu64 " wholly free handles, "
			   "%s stranded in %" PRIu64 " partly live ones\n",
			vpmm_size_human(x->split.whole + x->split.stranded, a, sizeof(a)),
			vpmm_size_human(x->split.whole, b, sizeof(b)), x->split.whole_handles,
			vpmm_size_human(x->split.stranded, c, sizeof(c)), x->split.stranded_handles);
		fprintf(f, "  largest free      %s\n", vpmm_size_human(x->split.largest, a, sizeof(a)));
	}
	fprintf(f, "  creatable         %s (within the limit and the device's free memory)\n",
		vpmm_size_human(x->creatable, a, sizeof(a)));
}

void print_text(FILE *f, const struct log *lg, const struct result *r,
		enum replay_clock clock)
{
	const struct vpmm_stats *s = &r->stats;
	char a[32], b[32];

	fprintf(f, "log                 %s: %zu operations on %zu stream%s\n",
		lg->name, lg->nops, streams_used(lg), streams_used(lg) == 1 ? "" : "s");
	fprintf(f, "page size           %s\n", vpmm_size_human(s->page_size, a, sizeof(a)));
	fprintf(f, "operations          %" PRIu64 " (allocations %" PRIu64 ", frees %"
		   PRIu64 ")\n", r->ops, r->allocs, r->frees);
	fprintf(f, "peak requested      %" PRIu64 " bytes (%s): sizes as logged\n",
		r->peak_requested, vpmm_size_human(r->peak_requested, a, sizeof(a)));
	fprintf(f, "peak live           %" PRIu64 " bytes (%s): rounded to pages\n",
		s->live_peak, vpmm_size_human(s->live_peak, a, sizeof(a)));
	fprintf(f, "peak mapped         %" PRIu64 " bytes (%s)\n", s->mapped_peak,
		vpmm_size_human(s->mapped_peak, b, sizeof(b)));
	if (s->live_peak)
		fprintf(f, "mapped / live       %.3f\n", ratio(s->mapped_peak, s->live_peak));
	fprintf(f, "pages created       %" PRIu64 "\n", s->pages_created);
	fprintf(f, "pages remapped      %" PRIu64 "\n", s->pages_remapped);
	fprintf(f, "defragmentations    %" PRIu64 "\n", s->defrags);
	fprintf(f, "time per operation  %.1f ns (%.3f s in all)\n",
		r->ops ? (double)r->wall_ns / (double)r->ops : 0.0,
		(double)r->wall_ns / 1e9);
	if (clock == CLOCK_OPS)
		fprintf(f, "the pool's clock    1 us an operation: the Time of line %lu is "
			   "no time of day\n", lg->untimed_line);
	else
		fprintf(f, "the pool's clock    %s\n",
			clock == CLOCK_LOG ? "the log's Time" : "the host's");
	if (r->failures)
		fprintf(f, "failed allocations  %" PRIu64 " (first: %s); their frees "
			   "were skipped\n", r->failures, strerror(r->first_failure));
	if (r->failures)
		print_first_failure(f, &r->first);
	if (lg->log_failures)
		fprintf(f, "log failures        %" PRIu64 " 'allocate failure' lines "
			   "skipped\n", lg->log_failures);
	if (lg->unknown_frees)
		fprintf(f, "unknown frees       %" PRIu64 " ignored\n", lg->unknown_frees);
	if (lg->reallocated)
		fprintf(f, "missing frees       %" PRIu64 " pointers allocated again "
			   "while live\n", lg->reallocated);
	if (lg->zero_sized)
		fprintf(f, "zero-sized          %" PRIu64 " skipped\n", lg->zero_sized);
	if (r->free_errors)
		fprintf(f, "refused frees       %" PRIu64 "\n", r->free_errors);
	if (r->check_violations)
		fprintf(f, "check violations    %" PRIu64 "\n", r->check_violations);
}

