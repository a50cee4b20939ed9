/* count.c — the hook counters: how often each hook ran, and what the
 * shim did with the calls (served by the pool, passed through, ...).
 * vpmm_shim_hook_calls (api.c) reads them.
 *
 * Owns: the striped counters. May call: nothing of the shim.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "shim.h"

/* Hook counters, striped: threads allocating at once would otherwise all
 * write one cache line on every call. A thread picks its stripe once. */
#define COUNT_STRIPES 16
static struct {
	_Atomic uint64_t n[VPMM_HOOK_COUNT];
} __attribute__((aligned(64))) counts[COUNT_STRIPES];
static atomic_uint next_stripe;
static __thread int my_stripe = -1;
static const char *const hook_names[VPMM_HOOK_COUNT] = {
#define X(n) #n,
	VPMM_HOOKS(X)
#undef X
};

void vpmm_count(enum vpmm_hook h)
{
	if (my_stripe < 0)
		my_stripe = (int)(atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) %
				  COUNT_STRIPES);
	atomic_fetch_add_explicit(&counts[my_stripe].n[h], 1, memory_order_relaxed);
}

unsigned long long vpmm_count_total(const char *name)
{
	for (int i = 0; name && i < VPMM_HOOK_COUNT; i++)
		if (!strcmp(name, hook_names[i])) {
			unsigned long long sum = 0;
			for (int k = 0; k < COUNT_STRIPES; k++)
				sum += atomic_load_explicit(&counts[k].n[i], memory_order_relaxed);
			return sum;
		}
	return ~0ULL;
}
