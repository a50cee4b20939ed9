/* test_shim.c — libvpmm.so under LD_PRELOAD, on the host driver.
 *
 * Each test runs one of the unmodified test programs (rt_prog: linked with
 * the fake libcudart.so; drv_prog: the driver API through dlopen, dlsym,
 * cuGetProcAddress and direct calls; torch_prog: the pluggable-allocator
 * way) in a clean environment, with the fake libcuda.so.1 found through
 * LD_LIBRARY_PATH, and checks its exit status and output. The programs
 * check the semantics themselves (see their scenarios); here we check how
 * they ran: with the shim, without it, disabled, with bad options. How a
 * program is run, within a deadline: run_prog.c.
 *
 * Hooks and where they are exercised: cudaMalloc, cudaFree, cudaMemGetInfo
 * (rt basic); cudaMallocAsync, cudaFreeAsync and the _ptsz pair (rt async);
 * cuGetProcAddress(_v2), every cu* wrapper, cuMemGetInfo_v2, the address
 * range and pointer attributes (drv gpa; all of them, with the allocation
 * handle, in query_prog address); the memory pool calls (query_prog
 * mempool); dlsym (drv dlsym, drv gpa); exported cu* names (drv linked);
 * vpmm_torch_* (torch); the capture entry points (graph_prog).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run_prog.h"

/* ---- path 1: the runtime hooks --------------------------------------------------- */

#define RT_SCENARIO(name)                                                     \
	Test(shim_rt, name##_pool)                                            \
	{                                                                     \
		run(RT_PROG, #name, true, NULL);                              \
		EXPECT_OK();                                                  \
		EXPECT_QUIET();                                               \
	}                                                                     \
	Test(shim_rt, name##_without_shim)                                    \
	{                                                                     \
		run(RT_PROG, #name, false, REAL);                             \
		EXPECT_OK();                                                  \
	}

RT_SCENARIO(basic)
Test(shim_rt, basic_sync_device)
{
	const char *const env[] = {"VPMM_SYNC_FREE=device", NULL};
	run(RT_PROG, "basic", true, env);
	EXPECT_OK();
}
RT_SCENARIO(async)
RT_SCENARIO(foreign)

/* A free of pool memory on a captured stream waits for the capture's end. */
RT_SCENARIO(capture)

/* ---- stream capture (graph_prog: the scenarios say what each checks) -------------- */

#define GRAPH_SCENARIO(name)                                                  \
	Test(shim_graph, name)                                                \
	{                                                                     \
		run(GRAPH_PROG, #name, true, NULL);                           \
		EXPECT_OK();                                                  \
		EXPECT_QUIET();                                               \
	}

GRAPH_SCENARIO(async_free)
GRAPH_SCENARIO(sync_free_own)
GRAPH_SCENARIO(sync_free_other_thread)
GRAPH_SCENARIO(sync_malloc)
GRAPH_SCENARIO(end_other_thread)
GRAPH_SCENARIO(invalidated)
GRAPH_SCENARIO(destroyed)
GRAPH_SCENARIO(legacy)
GRAPH_SCENARIO(per_thread)
GRAPH_SCENARIO(exit_mid_capture)
GRAPH_SCENARIO(to_graph)

/* The driver's own refusal, which the shim's answer must equal. */
Test(shim_graph, sync_malloc_without_shim)
{
	run(GRAPH_PROG, "sync_malloc", false, REAL);
	EXPECT_OK();
}

/* The pluggable allocator loaded without the preload. */
Test(shim_graph, torch)
{
	run(GRAPH_PROG, "torch", false, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
}
RT_SCENARIO(thread)
RT_SCENARIO(fork)
RT_SCENARIO(threads)
/* A stream per request, 20 000 of them: flat in time and memory. */
RT_SCENARIO(stream_per_request)

Test(shim_rt, devices_pool)
{
	run(RT_PROG, "devices", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
}

/* cudaMemGetInfo under VPMM_LIMIT: what the pool can still hand out. */
Test(shim_rt, limit_info_pool)
{
	static const char *const env[] = {"VPMM_LIMIT=8M", NULL};
	run(RT_PROG, "limit_info", true, env);
	EXPECT_OK();
	EXPECT_QUIET();
}

Test(shim_rt, limit_info_without_shim)
{
	run(RT_PROG, "limit_info", false, REAL);
	EXPECT_OK();
}

Test(shim_rt, oom)
{
	const char *const small[] = {"FAKECUDA_CAPACITY=8M", NULL};
	const char *const small_real[] = {"FAKECUDA_CAPACITY=8M", "SHIMTEST_EXPECT=real", NULL};
	run(RT_PROG, "oom", true, small);
	EXPECT_OK();
	/* One line says what was asked and what the pool and the device hold, */
	cr_expect_geq(count_lines_with("out of memory: requested", NULL), 1,
		      "no out-of-memory line:\n%s", R.out);
	cr_expect_not_null(strstr(R.out, "device free"), "%s", R.out);
	/* ... and where the pool's free memory lies. */
	cr_expect_not_null(strstr(R.out, "wholly free handles"), "%s", R.out);
	cr_expect_not_null(strstr(R.out, "stranded in"), "%s", R.out);
	run(RT_PROG, "oom", false, small_real);
	EXPECT_OK();
}

/* A runtime in an extension's own scope, unloaded, then another: calls
 * reach the runtime of the scope that calls (the shim crashed, jumping into
 * the first one's unmapped code). */
Test(shim_rt, a_runtime_unloaded_and_another_loaded)
{
	run(UNLOADED_PROG, NULL, true, NULL);
	EXPECT_OK();
	cr_expect(strstr(R.out, "ok unloaded"), "%s", R.out);
	run(UNLOADED_PROG, NULL, false, NULL);
	EXPECT_OK();
}

/* cudaDeviceReset through the driver's private table, unseen by the hooks:
 * the pool learns of it by the context's id. */
Test(shim_rt, device_reset_pool)
{
	run(RT_PROG, "device_reset", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
}

Test(shim_rt, device_reset_without_shim)
{
	run(RT_PROG, "device_reset", false, REAL);
	EXPECT_OK();
}

/* Frees after the runtime tore its context down at exit: accepted quietly. */
Test(shim_rt, exit_teardown)
{
	run(RT_PROG, "exit", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
	cr_expect(strstr(R.out, "late free ok"), "%s", R.out);
	run(RT_PROG, "exit", false, REAL);
	EXPECT_OK();
	cr_expect(strstr(R.out, "late free ok"), "%s", R.out);
}

/* ---- path 2: dlsym and cuGetProcAddress; direct calls --------------------------------- */

#define DRV_SCENARIO(name)                                                    \
	Test(shim_drv, name##_pool)                                           \
	{                                                                     \
		run(DRV_PROG, #name, true, NULL);                             \
		EXPECT_OK();                                                  \
		EXPECT_QUIET();                                               \
	}                                                                     \
	Test(shim_drv, name##_without_shim)                                   \
	{                                                                     \
		run(DRV_PROG, #name, false, REAL);                            \
		EXPECT_OK();                                                  \
	}

DRV_SCENARIO(gpa)
DRV_SCENARIO(dlsym)
DRV_SCENARIO(linked)
DRV_SCENARIO(destroy_elsewhere)
DRV_SCENARIO(destroy_other_device)
/* Contexts other than the pool's, and contexts that end (review): another
 * device's stream freeing pool memory, a context the program made, that
 * context destroyed, the primary context reset (cudaDeviceReset). */
DRV_SCENARIO(cross_stream)
DRV_SCENARIO(cross_default_stream)
DRV_SCENARIO(user_context)
DRV_SCENARIO(context_destroyed)
Test(shim_drv, context_destroyed_sync_device)
{
	const char *const env[] = {"VPMM_SYNC_FREE=device", NULL};
	run(DRV_PROG, "context_destroyed", true, env);
	EXPECT_OK();
}
DRV_SCENARIO(primary_reset)
DRV_SCENARIO(primary_reset_sticky)
DRV_SCENARIO(primary_released)
/* Review 2: the default stream of a context the program made; a program of
 * its own contexts keeps its primary context inactive. */
DRV_SCENARIO(user_context_default)
DRV_SCENARIO(no_primary_made)
/* Pool memory freed on a stream while the pool has no context. */
DRV_SCENARIO(free_without_context)
/* The pool's context outlives a cuCtxDestroy the driver refused. */
DRV_SCENARIO(destroy_refused)
DRV_SCENARIO(destroy_refused_primary)

/* An allocation served from another context that waits for the pool's own
 * stream: VPMM_LIMIT leaves it nothing else. */
Test(shim_drv, user_context_waits_pool)
{
	static const char *const env[] = {"VPMM_LIMIT=512K", NULL};
	run(DRV_PROG, "user_context_waits", true, env);
	EXPECT_OK();
	EXPECT_QUIET();
}

Test(shim_drv, user_context_waits_without_shim)
{
	run(DRV_PROG, "user_context_waits", false, REAL);
	EXPECT_OK();
}

/* The program's own handles pass through, silently at the default level
 * (NCCL makes them on every rank), and once at the info level. */
Test(shim_drv, own_pool)
{
	run(DRV_PROG, "own", true, NULL);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 0, "%s", R.out);
	const char *const env[] = {"VPMM_LOG=info", NULL};
	run(DRV_PROG, "own", true, env);
	EXPECT_OK();
	/* the first handle made (2 granules of the fake's 64 KiB), not the
	 * failed calls before it */
	cr_expect_eq(count_lines_with("vpmm:", "maps memory of its own (cuMemCreate of 131072 bytes)"),
		     1, "%s", R.out);
}

Test(shim_drv, own_without_shim)
{
	run(DRV_PROG, "own", false, REAL);
	EXPECT_OK();
	EXPECT_QUIET();
}

/* ---- sharing between processes, peers --------------------------------------------------- */

/* Synchronous frees by fences (syncfree_prog.c), and as synchronisations
 * with VPMM_SYNC_FREE=device; the programs check ordering and counts. */
/* SYNCFREE_SCENARIO_ENV: the same with one more variable set (NULL: none). */
#define SYNCFREE_SCENARIO_ENV(name, var)                                      \
	Test(shim_syncfree, name##_events)                                    \
	{                                                                     \
		const char *const env[] = {var, NULL};                        \
		run(SYNCFREE_PROG, #name, true, env);                         \
		EXPECT_OK();                                                  \
		cr_expect(strstr(R.out, "ok " #name), "%s", R.out);           \
	}                                                                     \
	Test(shim_syncfree, name##_device)                                    \
	{                                                                     \
		const char *const env[] = {"VPMM_SYNC_FREE=device", var, NULL}; \
		run(SYNCFREE_PROG, #name, true, env);                         \
		EXPECT_OK();                                                  \
	}
#define SYNCFREE_SCENARIO(name) SYNCFREE_SCENARIO_ENV(name, NULL)

SYNCFREE_SCENARIO(late)
SYNCFREE_SCENARIO(many)
SYNCFREE_SCENARIO(gpa)
SYNCFREE_SCENARIO(destroyed)
SYNCFREE_SCENARIO(unseen)
SYNCFREE_SCENARIO(capture)
SYNCFREE_SCENARIO(blocking)
SYNCFREE_SCENARIO(other)
SYNCFREE_SCENARIO(lazy)
SYNCFREE_SCENARIO(pool_wait)
SYNCFREE_SCENARIO(capture_owed)
SYNCFREE_SCENARIO(capture_owed_elsewhere)
SYNCFREE_SCENARIO(destroyed_elsewhere)
SYNCFREE_SCENARIO(destroyed_busy)
SYNCFREE_SCENARIO(destroyed_quiet)
/* The only one destroyed before the free: its work still waited for. */
SYNCFREE_SCENARIO(destroyed_last)
/* One parked at a primary context's reset: dead with it, not touched. */
SYNCFREE_SCENARIO(destroyed_reset)
/* A green context made (cuGreenCtxCreate): the frees synchronise. */
SYNCFREE_SCENARIO(green)

/* The pool's own record on the legacy stream comes after the wait for the
 * non-blocking streams that a free left owed (VPMM_LIMIT: the memory can
 * only be moved to the other stream). */
SYNCFREE_SCENARIO_ENV(pool_record, "VPMM_LIMIT=256K")
SYNCFREE_SCENARIO_ENV(pool_record_forked, "VPMM_LIMIT=256K")

SYNCFREE_SCENARIO(owed)

/* A malloc of memory no free since the last fence gave back makes none;
 * pages freed since and moved to a new address still fence (VPMM_LIMIT:
 * the pool can only move them). */
SYNCFREE_SCENARIO(clean)
SYNCFREE_SCENARIO(overflow)
/* No stream waits for a legacy record that has completed already. */
SYNCFREE_SCENARIO(idle)
SYNCFREE_SCENARIO_ENV(moved, "VPMM_LIMIT=256K")
SYNCFREE_SCENARIO_ENV(moved_blocking, "VPMM_LIMIT=256K")
SYNCFREE_SCENARIO(overflow_blocking)
SYNCFREE_SCENARIO(owed_clean)
SYNCFREE_SCENARIO(owed_obligation)

Test(shim_ipc, share_pool)
{
	run(IPC_PROG, "share", true, NULL);
	EXPECT_OK();
	cr_expect(strstr(R.out, "share ok"), "%s", R.out);
	/* the one complaint: the stale handle's opener */
	cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: error:", "no such shared allocation"), 1, "%s",
		     R.out);
}

/* More handles than one reply carries descriptors: fetched in batches. */
Test(shim_ipc, share_many_pieces)
{
	const char *const env[] = {"VPMM_HANDLE_SIZE=64K", "IPC_SIZE=20971520", NULL};
	run(IPC_PROG, "share", true, env);
	EXPECT_OK();
	cr_expect(strstr(R.out, "share ok"), "%s", R.out);
}

Test(shim_ipc, share_without_shim)
{
	run(IPC_PROG, "share", false, REAL);
	EXPECT_OK();
	cr_expect(strstr(R.out, "no ipc without the shim"), "%s", R.out);
}

Test(shim_ipc, refuse_pool)
{
	run(IPC_PROG, "refuse", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
	const char *const off[] = {"VPMM_SOCKET=off", NULL};
	run(IPC_PROG, "refuse", true, off);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm: error:", "needs this process's vpmm socket"), 1,
		     "%s", R.out);
	run(IPC_PROG, "refuse", false, REAL);
	EXPECT_OK();
}

Test(shim_ipc, open_with_shim_disabled)
{
	run(IPC_PROG, "disabled", true, NULL);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm: error:", "only opens with libvpmm active"), 1, "%s",
		     R.out);
}

Test(shim_ipc, peer_pool)
{
	run(IPC_PROG, "peer", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
	run(IPC_PROG, "peer", false, REAL);
	EXPECT_OK();
}

/* ---- one answer about an address; CUDA's memory pools -------------------------------------- */

/* The range, the mapping, IPC capability, the handle (refused), freed
 * memory: the allocation's answers, as the driver gives them for memory it
 * made whole (checked without the shim). VPMM_PAGES: the allocations share
 * the pool's first handle. One test a part, then the whole. */
#define QUERY_PART(scenario, name, ...)                                       \
	Test(shim_query, scenario##_##name)                                   \
	{                                                                     \
		static const char *const env[] = {__VA_ARGS__};               \
		run(QUERY_PROG, #scenario ":" #name, true, env);              \
		EXPECT_OK();                                                  \
		EXPECT_QUIET();                                               \
	}
QUERY_PART(address, mapping, "VPMM_PAGES=32", NULL)
QUERY_PART(address, ipc, "VPMM_PAGES=32", NULL)
QUERY_PART(address, retain, "VPMM_PAGES=32", NULL)
QUERY_PART(address, freed, "VPMM_PAGES=32", NULL)
QUERY_PART(mempool, attrs, NULL)
QUERY_PART(mempool, trim, NULL)
QUERY_PART(mempool, threshold, NULL)
QUERY_PART(mempool, chosen, NULL)

Test(shim_query, address_pool)
{
	static const char *const env[] = {"VPMM_PAGES=32", NULL};
	run(QUERY_PROG, "address", true, env);
	EXPECT_OK();
	EXPECT_QUIET();
}

/* Without the socket, no legacy IPC: the attribute says so. */
Test(shim_query, address_without_socket)
{
	static const char *const env[] = {"VPMM_PAGES=32", "VPMM_SOCKET=off", NULL};
	run(QUERY_PROG, "address", true, env);
	EXPECT_OK();
}

Test(shim_query, address_without_shim)
{
	run(QUERY_PROG, "address", false, REAL);
	EXPECT_OK();
}

/* The default pool's attributes and trim are the pool's; a pool of the
 * program's own made current, and cudaMallocFromPoolAsync, are CUDA's. */
Test(shim_query, mempool_pool)
{
	run(QUERY_PROG, "mempool", true, NULL);
	EXPECT_OK();
	EXPECT_QUIET();
}

Test(shim_query, mempool_without_shim)
{
	run(QUERY_PROG, "mempool", false, REAL);
	EXPECT_OK();
}

/* A refused handle and a chosen pool are said once, at the info level. */
Test(shim_query, said_at_info_level)
{
	static const char *const env[] = {"VPMM_PAGES=32", "VPMM_LOG=info", NULL};
	run(QUERY_PROG, "address", true, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", "cuMemRetainAllocationHandle on pool memory is refused"),
		     1, "%s", R.out);
	run(QUERY_PROG, "mempool", true, env + 1);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", "made a memory pool of its own current"), 3,
		     "%s", R.out);
}

/* ---- the pluggable allocator ------------------------------------------------------------ */

/* The only lines: the two for devices that do not exist. */
#define EXPECT_BAD_DEVICES_ONLY()                                             \
	do {                                                                  \
		cr_expect_eq(count_lines_with("vpmm:", NULL), 2, "%s", R.out); \
		cr_expect_eq(count_lines_with("vpmm: error: vpmm_torch_malloc(65536, device 7)", \
					      "CUresult"), 1, "%s", R.out);   \
		cr_expect_eq(count_lines_with("vpmm: error: vpmm_torch_malloc(65536, device -1)", \
					      "CUresult"), 1, "%s", R.out);   \
	} while (0)

Test(shim_torch, pluggable)
{
	run(TORCH_PROG, NULL, false, NULL);
	EXPECT_OK();
	EXPECT_BAD_DEVICES_ONLY();
}

Test(shim_torch, pluggable_disabled)
{
	const char *const env[] = {"VPMM_DISABLE=1", "SHIMTEST_EXPECT=real", NULL};
	run(TORCH_PROG, NULL, false, env);
	EXPECT_OK();
	EXPECT_BAD_DEVICES_ONLY();
}

/* A failed vpmm_torch_malloc reaches PyTorch's C++ as an exception that
 * names out of memory, never as NULL (a tensor at address 0), with the
 * state of its own refusal, or of none (torch_oom_prog checks that a
 * failure the pool did not refuse reads the pool afresh). */
Test(shim_torch, failure_is_thrown)
{
	const char *const env[] = {"VPMM_LIMIT=8M", "FAKECUDA_FREE_DRIFT=1M", NULL};
	run(TORCH_OOM_PROG, NULL, false, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("ok", NULL), 1, "%s", R.out);
	/* The exception and the pool's line give the same state:
	 * its live, reusable and wholly free bytes, and the device's free
	 * memory (the line in bytes, the exception in binary units). The
	 * fake device loses 1 MiB of free memory to another process at each
	 * read (FAKECUDA_FREE_DRIFT), so that two reads differ in the
	 * exception's two decimals: they agree only when both come from the
	 * one read at the refusal. The program's few reads leave most of the
	 * 256 MiB free. The first such line is the refusal thrown; the
	 * second, a read later, the one returned NULL. */
	const char *line = strstr(R.out, "out of memory: requested 67108864 bytes; live 1048576, "
				  "mapped 1572864, reusable 524288 (524288 in 8 wholly free handles");
	const char *thrown = strstr(R.out, "thrown: ");
	cr_assert(line && thrown, "%s", R.out);
	unsigned long long dev_free = 0;
	const char *df = strstr(line, "device free ");
	cr_assert(df && sscanf(df, "device free %llu", &dev_free) == 1, "%s", R.out);
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double d = (double)dev_free;
	int u = 0;
	for (; d >= 1024 && u < 4; u++)
		d /= 1024;
	char want[64];
	snprintf(want, sizeof want, "the device has %.2f %s free", d, unit[u]);
	cr_expect_not_null(strstr(thrown, want), "%s not in:\n%s", want, R.out);
}

/* ---- options ---------------------------------------------------------------------------------- */

/* VPMM_DISABLE=1: everything passes through, on both paths. */
Test(shim_options, disabled)
{
	const char *const env[] = {"VPMM_DISABLE=1", "SHIMTEST_EXPECT=real", NULL};
	const char *const rt[] = {"basic", "async", "capture", "exit"};
	const char *const drv[] = {"gpa", "dlsym", "linked"};
	for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
		run(RT_PROG, rt[i], true, env);
		EXPECT_OK();
		EXPECT_QUIET();
	}
	for (size_t i = 0; i < sizeof drv / sizeof drv[0]; i++) {
		run(DRV_PROG, drv[i], true, env);
		EXPECT_OK();
		EXPECT_QUIET();
	}
}

/* A bad value: one clear line naming the variable; the program runs, with
 * everything passed through. */
Test(shim_options, bad_values)
{
	static const char *const bad[][2] = {
		{"VPMM_PAGES=abc", "VPMM_PAGES"},
		{"VPMM_PAGE_SIZE=12Q", "VPMM_PAGE_SIZE"},
		{"VPMM_LOG=loud", "VPMM_LOG"},
		{"VPMM_DISABLE=maybe", "VPMM_DISABLE"},
		{"VPMM_VA_SIZE=-1", "VPMM_VA_SIZE"},
		{"VPMM_VA_SIZE=64K", "VPMM_VA_SIZE=\"64K\": must be at least 1G"},
		{"VPMM_GROWTH_SPLIT=4294967296", "VPMM_GROWTH_SPLIT"},
		{"VPMM_SOCKET= ", "VPMM_SOCKET"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *const env[] = {bad[i][0], "SHIMTEST_EXPECT=real", NULL};
		run(RT_PROG, "basic", true, env);
		EXPECT_OK();
		cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s:\n%s", bad[i][0], R.out);
		cr_expect_eq(count_lines_with("vpmm:", bad[i][1]), 1, "%s:\n%s", bad[i][0], R.out);
		run(DRV_PROG, "gpa", true, env);
		EXPECT_OK();
		cr_expect_eq(count_lines_with("vpmm:", bad[i][1]), 1, "%s:\n%s", bad[i][0], R.out);
	}
}

Test(shim_options, log_info)
{
	const char *const env[] = {"VPMM_LOG=info", NULL};
	run(RT_PROG, "basic", true, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm: active", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: device 0: pool created", NULL), 1, "%s", R.out);
}

/* Values known to be bad only with the driver's granularity (64K here):
 * the device's pool is not made, its allocations pass through, and the one
 * line says which variable is at fault, as an error: VPMM_LOG=error once
 * hid it, the pool lost without a word. */
Test(shim_options, a_bad_combination_names_the_variable)
{
	static const char *const bad[][3] = {
		{"VPMM_PAGE_SIZE=32K", NULL, "no pool (VPMM_PAGE_SIZE=32K is not a multiple of the "
					     "driver's granularity 64K)"},
		{"VPMM_HANDLE_SIZE=96K", NULL, "no pool (VPMM_HANDLE_SIZE=96K is not a whole number"},
		{"VPMM_GRAIN=256", NULL, "no pool (VPMM_GRAIN=256: expected a power of two from 512"},
		/* values with which every allocation failed, or that were
		 * refused without a name, or with the wrong one */
		{"VPMM_PAGE_SIZE=512M", NULL,
		 "no pool (VPMM_PAGE_SIZE=512M is more than the device's memory (256M)"},
		{"VPMM_LIMIT=1", NULL, "no pool (VPMM_LIMIT=1 is less than one page of 64K"},
		{"VPMM_VA_SIZE=16383T", NULL,
		 "no pool (VPMM_VA_SIZE=16383T: the driver cannot reserve that much address space"},
		{"VPMM_PAGES=2", "VPMM_LIMIT=64K",
		 "no pool (VPMM_LIMIT=64K is less than the VPMM_PAGES=2 pages of 64K"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *const env[] = {"SHIMTEST_EXPECT=real", "VPMM_LOG=error", bad[i][0],
					   bad[i][1], NULL};
		run(RT_PROG, "basic", true, env);
		EXPECT_OK();
		cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s:\n%s", bad[i][0], R.out);
		cr_expect_eq(count_lines_with("vpmm: error: device 0:", bad[i][2]), 1, "%s:\n%s",
			     bad[i][0], R.out);
	}
}

/* A VPMM_ name one slip from an option: a warning naming the option meant,
 * and the program runs on the defaults. Other programs' VPMM_ names are
 * left alone. */
Test(shim_options, a_misspelled_name_is_pointed_out)
{
	const char *const env[] = {"VPMM_PAGESIZE=1G", "VPMM_LIB=x",
				   "VPMM_PAGE_S\xc4\xb0ZE=1M" /* a Turkish dotted I */, NULL};
	run(RT_PROG, "basic", true, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 2, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: warning: VPMM_PAGESIZE is not a libvpmm variable",
				      "VPMM_PAGE_SIZE?"), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: warning: VPMM_PAGE_S\xc4\xb0ZE is not a libvpmm "
				      "variable", "VPMM_PAGE_SIZE?"), 1, "%s", R.out);
}

/* Out of memory under VPMM_LIMIT: the line says the limit. */
Test(shim_options, the_limit_is_in_the_out_of_memory_line)
{
	const char *const env[] = {"VPMM_LIMIT=2M", NULL};
	run(RT_PROG, "oom", true, env);
	EXPECT_OK();
	/* the scenario's three refusals */
	cr_expect_eq(count_lines_with("vpmm: error: device 0: out of memory", "VPMM_LIMIT 2097152"),
		     3, "%s", R.out);
}

/* Allocations failing in a loop: the first lines, then one a second with
 * the count of those not shown (there was a line for each, 36,000 in two
 * seconds, even with VPMM_LOG=error). */
Test(shim_options, out_of_memory_lines_are_rate_limited)
{
	const char *const env[] = {"FAKECUDA_CAPACITY=8M", "VPMM_LOG=error",
				   "SHIMTEST_FLOOD_MS=1500", NULL};
	run(RT_PROG, "oom_flood", true, env);
	EXPECT_OK();
	int lines = count_lines_with("vpmm: error: device 0: out of memory", NULL);
	/* five, then one at about 1 s */
	cr_expect(lines >= 6 && lines <= 7, "%d lines:\n%.3000s", lines, R.out);
	cr_expect_eq(count_lines_with("vpmm: error: device 0: out of memory",
				      "more since the last such line)"), lines - 5, "%.3000s", R.out);
	cr_expect_eq(count_lines_with("vpmm:", NULL), lines, "%.3000s", R.out);
}

/* ... and an allocation never waits for stderr: a full pipe nobody reads
 * held each failing allocation (for ever, here). */
Test(shim_options, out_of_memory_lines_never_wait_for_stderr)
{
	const char *const env[] = {"FAKECUDA_CAPACITY=8M", "SHIMTEST_FLOOD_MS=300",
				   "SHIMTEST_FULL_STDERR=1", NULL};
	run(RT_PROG, "oom_flood", true, env);
	EXPECT_OK();
	cr_expect(strstr(R.out, "ok oom_flood"), "%.3000s", R.out);
}

/* VPMM_PAGE_SIZE reaches the pool: sizes round to it. */
Test(shim_options, page_size)
{
	const char *const env[] = {"VPMM_PAGE_SIZE=256K", "SHIMTEST_PAGE=262144", NULL};
	run(DRV_PROG, "linked", true, env);
	EXPECT_OK();
	EXPECT_QUIET();
}

/* The trace's writes go past the file size limit (ulimit -f): the program
 * is not killed by SIGXFSZ (it was, at exit, after its own work was done),
 * one line says the trace stopped, and the file holds whole lines only.
 * The stand-in driver's memory is a memfd, which the limit counts too:
 * handles of one page keep it under. */
Test(shim_options, a_trace_past_the_file_size_limit)
{
	char dir[] = "/tmp/vpmm-shim-test-XXXXXX", path[64], env_trace[80], line[256];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/t.csv", dir);
	snprintf(env_trace, sizeof env_trace, "VPMM_TRACE=%s", path);
	const char *const env[] = {env_trace, "VPMM_HANDLE_SIZE=64K", NULL};
	struct rlimit old, lim;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 100000; /* 20000 events take about a megabyte */
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	run(RT_PROG, "churn", true, env);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: error: trace", "File too large"), 1, "%s", R.out);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_leq(st.st_size, 100000);
	cr_expect_geq(st.st_size, 90000, "the trace stopped short of the limit");
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	int lines = 0;
	while (fgets(line, sizeof line, f)) {
		size_t n = strlen(line);
		cr_expect(n && line[n - 1] == '\n', "a cut line: \"%s\"", line);
		int commas = 0;
		for (size_t i = 0; i < n; i++)
			commas += line[i] == ',';
		cr_expect_eq(commas, 5, "not a whole record: %s", line);
		lines++;
	}
	fclose(f);
	cr_expect_geq(lines, 1000);
	unlink(path);
	rmdir(dir);
}

/* A socket that cannot be set up: one line says why (it took two). */
Test(shim_options, a_socket_that_cannot_be_set_up_is_one_line)
{
	const char *const env[] = {"VPMM_SOCKET=/dev/null", NULL};
	run(RT_PROG, "basic", true, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm:", "/dev/null exists and is not a socket"), 1, "%s",
		     R.out);
	/* A path the socket cannot be looked up at: the line names it and
	 * the reason (it said only "Not a directory", as a warning). */
	const char *const env2[] = {"VPMM_SOCKET=/dev/null/x.sock", "VPMM_LOG=error", NULL};
	run(RT_PROG, "basic", true, env2);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: server: /dev/null/x.sock: Not a directory",
				      "not serving"), 1, "%s", R.out);
}

/* A trace that cannot be opened is lost: an error, seen under
 * VPMM_LOG=error too. */
Test(shim_options, a_trace_that_cannot_be_opened_is_an_error)
{
	const char *const env[] = {"VPMM_TRACE=/dev/null/t.csv", "VPMM_LOG=error", NULL};
	run(RT_PROG, "basic", true, env);
	EXPECT_OK();
	cr_expect_eq(count_lines_with("vpmm:", NULL), 1, "%s", R.out);
	cr_expect_eq(count_lines_with("vpmm: error: VPMM_TRACE=/dev/null/t.csv", "not tracing"), 1,
		     "%s", R.out);
}
