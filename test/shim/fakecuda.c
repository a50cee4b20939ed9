/* fakecuda.c — a stand-in libcuda.so.1 for the shim's CI tests, built on the
 * host driver (backed host memory behaves as device memory: the test
 * programs read and write what they allocate).
 *
 * It implements what libvpmm.so, the cuda driver layer and the fake runtime
 * call, with the real driver's conventions where the shim depends on them:
 *  - cuGetProcAddress(_v2) picks a variant by base name, version and
 *    per-thread flag, and "cuGetProcAddress" itself is one of the names;
 *    a v1 cuMemAlloc/cuMemFree/cuMemGetInfo exists below version 3020;
 *  - contexts: one primary context per device, a per-thread current context
 *    and push/pop stack; calls that need a context fail with
 *    CUDA_ERROR_INVALID_CONTEXT without one and CONTEXT_IS_DESTROYED after
 *    cuDevicePrimaryCtxReset_v2;
 *  - cuMemGetAddressRange and the range attributes answer one mapping (one
 *    handle) for VMM memory, as the real driver does;
 *  - plain allocations (cuMemAlloc_v2, cuMemAllocAsync) are host memory that
 *    the fake tracks, so foreign pointers are rejected with INVALID_VALUE.
 *  - cuCtxGetId: a context made again (a reset primary context, retained
 *    anew) keeps its handle and gets a new id, CONTEXT_IS_DESTROYED in
 *    between; cuGetExportTable hands out a private table whose reset is
 *    the CUDA 13 runtime's cudaDeviceReset path, which no hook sees;
 *  - stream capture: begin and end (every form), the capture status and id,
 *    the thread's interaction mode; a call the capture modes forbid
 *    (cuCtxSynchronize, cuMemAlloc_v2, cuMemFree_v2) is refused with
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures
 *    that forbade it, as on the real driver;
 * Test controls (exported, names no hook wraps): fakecuda_calls(),
 * fakecuda_fail(), fakecuda_set_capturing(), fakecuda_mem_info(),
 * fakecuda_accessible(), fakecuda_sticky() (every synchronisation fails
 * until the context ends, as after a kernel's fault),
 * fakecuda_refuse_destroy() (the next cuCtxDestroy fails, ending nothing).
 *
 * Environment: FAKECUDA_CAPACITY (bytes, default 256M), FAKECUDA_GRANULARITY
 * (default 64K), FAKECUDA_DEVICES (default 2), FAKECUDA_FREE_DRIFT (bytes,
 * default 0): another process whose use of the device grows between reads,
 * so that each answer of cuMemGetInfo_v2 reports that much less free memory
 * for every answer given before it (down to 0; the total stays). Two reads
 * then differ, and a test can tell one read of the state from two.
 * fakecuda_mem_info() leaves the other process out.
 *
 * Linked -Bsymbolic: the addresses it hands out must be its own functions
 * even though libvpmm.so exports the same names ahead of it.
 *
 * One job a file; fakecuda.h lists the files and their layers. This one
 * owns the state they share, the call counters and the injected faults.
 */
#include "fakecuda.h"

#include <string.h>

/* ---- state -------------------------------------------------------------------- */

pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
vpmm_driver *fake_drv;
size_t fake_capacity;
size_t fake_free_drift;
int fake_ndev;
struct fake_ctx fake_ctxs[MAX_DEV];

/* ---- call counts ------------------------------------------------------------------ */

static const char *const counted[] = {
	"cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2",
	"cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemFreeAsync",
	"cuMemFreeAsync_ptsz", "cuMemGetInfo_v2", "cuMemGetAddressRange_v2",
	"cuPointerGetAttribute", "cuPointerGetAttributes", "cuCtxSynchronize",
	"cuStreamSynchronize", "cuMemCreate", "cuMemMap", "cuGetProcAddress_v2",
	"cuGetProcAddress", "cuStreamWaitEvent", "cuEventRecord",
	"cuMemAllocFromPoolAsync", "cuMemPoolTrimTo", "cuMemRetainAllocationHandle",
	"no_context", /* driver work done with no current context */
	"dead_handle", /* a stream or event of an ended context named */
	"dead_handle_raced", /* the same, racing an end the caller could not see */
	"record_refused", /* an event recorded on another context's stream */
	"capture_violation", /* a call a capture forbade (it was refused) */
	"record_capturing", /* an event recorded on a capturing stream */
};
#define NCOUNTED (sizeof counted / sizeof counted[0])
static unsigned long counts[NCOUNTED];

void fake_count(const char *name)
{
	for (size_t i = 0; i < NCOUNTED; i++)
		if (!strcmp(counted[i], name)) {
			__atomic_add_fetch(&counts[i], 1, __ATOMIC_RELAXED);
			return;
		}
}

/* Ends of contexts so far, and the count when this thread last asked
 * cuCtxGetId (both under fake_lock). */
static unsigned long fake_epoch;
static __thread unsigned long checked_epoch;
static __thread bool may_race; /* no dead use or other work since it */

void fake_ctx_end(struct fake_ctx *c, bool unseen)
{
	unsigned i = c->gen % FAKE_GENS;
	c->end_gen[i] = c->gen;
	c->end_epoch[i] = ++fake_epoch;
	c->end_thread[i] = pthread_self();
	c->end_unseen[i] = unseen;
	c->destroyed = true;
	c->gen++;
}

void fake_ctx_other_work(void)
{
	may_race = false;
}

void fake_ctx_checked(void)
{
	checked_epoch = fake_epoch;
	may_race = true;
}

void fake_dead_use(struct fake_ctx *c, unsigned gen)
{
	unsigned i = gen % FAKE_GENS;
	bool raced = may_race && c->end_gen[i] == gen && c->end_unseen[i] &&
		     checked_epoch < c->end_epoch[i] &&
		     !pthread_equal(c->end_thread[i], pthread_self());
	may_race = false;
	fake_count(raced ? "dead_handle_raced" : "dead_handle");
}

unsigned long fakecuda_calls(const char *name)
{
	for (size_t i = 0; i < NCOUNTED; i++)
		if (!strcmp(counted[i], name))
			return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
	return ~0UL;
}

/* Test control: the nth next call of driver operation `op` (enum vpmm_op)
 * fails with `result` (0 disarms). */
void fakecuda_fail(int op, unsigned long nth, int result)
{
	vpmm_host_fail(fake_drv, (enum vpmm_op)op, nth, (CUresult)result);
}
