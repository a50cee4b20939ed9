/* hotpath_cpu.c — the pool's hot path on the unbacked host driver: a fixed,
 * deterministic sequence of malloc/free pairs that all hit memory the pool
 * already holds, so no driver work happens inside the loop.
 *
 * Owns the CPU-side cost of malloc + free, counted in instructions by
 * bench/callgrind.sh (a regression shows without a GPU) and timed here for
 * `meson benchmark`. The setup (pool, a fragmented layout of live and free
 * regions so the trees have some depth, one warm pass) is the same for every
 * N, so running N and 0 pairs and subtracting leaves the loop alone.
 *
 * Usage: hotpath_cpu [--pairs N] [--mode stream|nostream]
 *   stream    frees and mallocs on one stream; the epoch is never closed
 *             (event interval at its maximum) so that no event is recorded
 *             inside the loop and the count does not depend on the clock
 *   nostream  VPMM_NO_STREAM (cudaMalloc/cudaFree semantics)
 * Prints one line: mode, pairs, ns per pair. Exit 1 on any error.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_host.h"
#include "vpmm.h"

#define MiB ((size_t)1 << 20)

/* The request sizes the loop cycles through, in pages of 2 MiB. */
static const size_t cycle[] = {1, 3, 2, 8, 1, 5, 32, 2};
#define NCYCLE (sizeof cycle / sizeof cycle[0])

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "hotpath_cpu: %s: %s (%d)\n", what, strerror(rc < 0 ? -rc : rc), rc);
	return 1;
}

static int run(long pairs, int use_stream)
{
	struct vpmm_host_options ho = {.granularity = 2 * MiB, .capacity = 0,
				       .unbacked = true};
	vpmm_driver *drv;
	vpmm_pool *pool;
	struct vpmm_config cfg;
	CUdeviceptr live[48], p;
	int rc;

	if (vpmm_driver_host_create(&ho, &drv) != CUDA_SUCCESS)
		return fail("host driver", -EIO);
	vpmm_config_default(&cfg);
	cfg.event_interval_ns = UINT64_MAX;
	/* The layout below built by remapping, as the budget was set on. With
	 * VPMM_REMAP=pressure the 8- and 32-page requests of the cycle share
	 * one free range, and each cycle's 8-page malloc flushes the stream's
	 * cache: 6 mallocs of 8 go through the lock (2154 instructions a
	 * pair; docs/policy.md, "Growth follows the headroom"). */
	cfg.remap = VPMM_REMAP_ALWAYS;
	rc = vpmm_pool_create(&cfg, drv, &pool);
	if (rc)
		return fail("vpmm_pool_create", rc);
	CUstream s = use_stream ? vpmm_host_stream_create(drv) : VPMM_NO_STREAM;

	/* A fragmented layout: 48 allocations of 1-8 pages, every third freed,
	 * so the free trees hold regions of several sizes between live ones. */
	for (size_t i = 0; i < 48; i++) {
		rc = vpmm_pool_malloc(pool, (1 + i % 8) * 2 * MiB, s, &live[i]);
		if (rc)
			return fail("setup malloc", rc);
	}
	for (size_t i = 0; i < 48; i += 3) {
		rc = vpmm_pool_free(pool, live[i], s);
		if (rc)
			return fail("setup free", rc);
	}
	/* Warm passes: whatever the cycle needs is mapped from here on. The
	 * first may defragment, recording events and leaving zombies; the
	 * "device" then completes every event (as a GPU soon would) and the
	 * zombies are unmapped, so the loop sees the steady state. */
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < NCYCLE; i++) {
			rc = vpmm_pool_malloc(pool, cycle[i] * 2 * MiB, s, &p);
			if (!rc)
				rc = vpmm_pool_free(pool, p, s);
			if (rc)
				return fail("warm", rc);
		}
		vpmm_host_complete_all(drv);
		rc = vpmm_pool_reclaim(pool);
		if (rc < 0)
			return fail("reclaim", rc);
	}
	struct vpmm_stats before, after;
	unsigned long calls[VPMM_OP_COUNT];
	vpmm_pool_stats(pool, &before);
	for (int op = 0; op < VPMM_OP_COUNT; op++)
		calls[op] = vpmm_host_calls(drv, (enum vpmm_op)op);

	uint64_t t0 = now_ns();
	for (long i = 0; i < pairs; i++) {
		rc = vpmm_pool_malloc(pool, cycle[(size_t)i % NCYCLE] * 2 * MiB, s, &p);
		if (!rc)
			rc = vpmm_pool_free(pool, p, s);
		if (rc)
			return fail("loop", rc);
	}
	uint64_t t1 = now_ns();

	vpmm_pool_stats(pool, &after);
	if (after.driver_calls != before.driver_calls ||
	    after.mapped != before.mapped) {
		fprintf(stderr, "hotpath_cpu: the loop was not all pool hits "
			"(%llu driver calls, mapped %llu -> %llu bytes)\n",
			(unsigned long long)(after.driver_calls - before.driver_calls),
			(unsigned long long)before.mapped, (unsigned long long)after.mapped);
		for (int op = 0; op < VPMM_OP_COUNT; op++) {
			unsigned long n = vpmm_host_calls(drv, (enum vpmm_op)op) - calls[op];
			if (n)
				fprintf(stderr, "  %s: %lu\n", vpmm_op_name((enum vpmm_op)op), n);
		}
		return 1;
	}
	size_t broken = vpmm_pool_check(pool, stderr);
	if (broken) {
		fprintf(stderr, "hotpath_cpu: %zu broken invariants\n", broken);
		return 1;
	}
	printf("mode %s pairs %ld ns_per_pair %.1f\n", use_stream ? "stream" : "nostream",
	       pairs, pairs ? (double)(t1 - t0) / (double)pairs : 0.0);
	for (size_t i = 1; i < 48; i++)
		if (i % 3)
			vpmm_pool_free(pool, live[i], s);
	vpmm_pool_destroy(pool);
	drv->destroy(drv);
	return 0;
}

int main(int argc, char **argv)
{
	long pairs = 1000000;
	int use_stream = 1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
			char *end;
			pairs = strtol(argv[++i], &end, 10);
			if (*end || pairs < 0) {
				fprintf(stderr, "hotpath_cpu: bad --pairs %s\n", argv[i]);
				return 2;
			}
		} else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
			i++;
			if (!strcmp(argv[i], "stream")) {
				use_stream = 1;
			} else if (!strcmp(argv[i], "nostream")) {
				use_stream = 0;
			} else {
				fprintf(stderr, "hotpath_cpu: --mode stream|nostream\n");
				return 2;
			}
		} else {
			fprintf(stderr, "usage: %s [--pairs N] [--mode stream|nostream]\n",
				argv[0]);
			return 2;
		}
	}
	return run(pairs, use_stream);
}
