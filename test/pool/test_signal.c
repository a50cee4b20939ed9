/* test_signal.c — a signal handler that allocates, run while its thread
 * holds the pool's lock: here a signal raised from inside the pool's event
 * record (the host driver's hook runs on the caller's thread, the lock
 * held). The lock is not async-signal-safe; the pool must refuse the
 * handler's calls (-EDEADLK) instead of waiting for itself for ever, and
 * go on unharmed. */
#include <signal.h>

#include "pool_test.h"

static vpmm_pool *sig_pool;
static size_t sig_size;
static CUdeviceptr sig_live;
static volatile int sig_runs, sig_malloc_rc = 1, sig_free_rc = 1, sig_find_rc = 1;
static volatile bool armed;

static void on_signal(int sig)
{
	CUdeviceptr p = 0;
	(void)sig;
	sig_runs++;
	sig_malloc_rc = vpmm_pool_malloc(sig_pool, sig_size, VPMM_NO_STREAM, &p);
	sig_free_rc = vpmm_pool_free(sig_pool, sig_live, VPMM_NO_STREAM);
	sig_find_rc = vpmm_pool_find(sig_pool, sig_live, NULL, NULL);
}

static void raise_in_record(void *arg, enum vpmm_op op)
{
	(void)arg;
	if (op == VPMM_OP_EVENT_RECORD && armed) {
		armed = false;
		raise(SIGUSR1);
	}
}

Test(signal, a_handler_that_allocates_under_the_lock_is_refused, .timeout = 20)
{
	struct pt t;
	struct pt_setup su = {.va_pages = 64}; /* every free records an event */
	pt_open(&t, &su);
	struct sigaction sa = {.sa_handler = on_signal}, old;
	sigemptyset(&sa.sa_mask);
	cr_assert_eq(sigaction(SIGUSR1, &sa, &old), 0);
	sig_pool = t.pool;
	sig_size = t.page;
	CUstream s = vpmm_host_stream_create(t.drv);
	CUdeviceptr a = PT_MALLOC(&t, 2, s);
	sig_live = PT_MALLOC(&t, 1, VPMM_NO_STREAM);
	vpmm_host_set_hook(t.drv, raise_in_record, NULL);
	armed = true;
	PT_FREE(&t, a, s); /* records under the lock: the signal comes */
	vpmm_host_set_hook(t.drv, NULL, NULL);
	sigaction(SIGUSR1, &old, NULL);
	cr_assert_eq(sig_runs, 1, "the handler ran %d times", sig_runs);
	cr_assert_eq(sig_malloc_rc, -EDEADLK, "malloc in the handler: %d", sig_malloc_rc);
	cr_assert_eq(sig_free_rc, -EDEADLK, "free in the handler: %d", sig_free_rc);
	cr_assert_eq(sig_find_rc, -EDEADLK, "find in the handler: %d", sig_find_rc);
	/* Nothing changed for it; the pool goes on. */
	CUdeviceptr base;
	size_t size;
	cr_assert_eq(vpmm_pool_find(t.pool, sig_live, &base, &size), 0);
	cr_assert_eq(size, t.page);
	CUdeviceptr b = PT_MALLOC(&t, 1, s);
	PT_FREE(&t, b, s);
	PT_FREE(&t, sig_live, VPMM_NO_STREAM);
	pt_close(&t);
}
