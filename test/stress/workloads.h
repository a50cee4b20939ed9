/* workloads.h — allocation scripts like the benchmarks' workloads, made in C
 * from a seed, for test/stress/pressure.c: LLM serving (KV blocks held over
 * many steps, prefill activations layer by layer, small decode buffers),
 * training with a new sequence length every iteration, mixture of experts,
 * and scratch buffers on several streams. Sizes are in units (1 MiB on the
 * unbacked driver, less on backed memory); each script keeps its live bytes
 * within a budget and ends with everything freed.
 */
#ifndef VPMM_TEST_WORKLOADS_H
#define VPMM_TEST_WORKLOADS_H

#include <stddef.h>
#include <stdint.h>

enum workload { W_LLM, W_TRAINING, W_MOE, W_SCRATCH, W_COUNT };

#define W_NO_STREAM 255 /* the op goes without a stream (cudaMalloc/cudaFree) */

struct op {
	uint32_t id;    /* 1.. within its script; an allocation's name */
	uint8_t alloc;  /* 1: allocate `size`, 0: free id */
	uint8_t stream; /* the script's stream index, or W_NO_STREAM */
	size_t size;
};

struct script {
	struct op *ops;
	size_t n, cap;
	uint32_t nids;  /* ids used: 1..nids */
	size_t *sizes;  /* [id]: its size */
	size_t live, peak; /* requested bytes, as made */
};

struct wl_params {
	enum workload kind;
	uint64_t seed;
	size_t unit;      /* bytes of one unit: the scale */
	size_t budget;    /* live bytes the script stays within */
	size_t max_ops;   /* stop adding work past this many ops */
	unsigned nstreams; /* streams of the script (1..8) */
	unsigned sync_permille;  /* ops without a stream */
	unsigned cross_permille; /* frees on another of its streams */
};

const char *workload_name(enum workload w);
/* 0, or -1 if the host has no memory. */
int workload_make(const struct wl_params *wp, struct script *out);
void script_free(struct script *s);
/* The script's live peak with every size rounded up by round(size, arg). */
size_t script_peak(const struct script *s, size_t (*round)(size_t, void *), void *arg);

#endif
