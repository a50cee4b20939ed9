/* syncfree_prog.c — synchronous frees (cuMemFree) by fences instead of a
 * synchronisation of the context (VPMM_SYNC_FREE=events, the default), on
 * the fake libcuda it is linked with. "Work" is an event the program records
 * on a stream; the device runs a stream when the program synchronises it
 * (as far as its waits allow). Each scenario checks that the new owner's
 * first work cannot run before the old owner's last work, and counts the
 * context synchronisations. With VPMM_SYNC_FREE=device every free
 * synchronises instead. The scenarios where a stream ends are in
 * syncfree_ends.c. `syncfree_prog SCENARIO`; see shimtest.h. */
#include "syncfree.h"

#include <sys/wait.h>

CUresult fakecuda_stream_create_unseen(CUstream *s, unsigned int flags);
void fakecuda_set_eager(int on);

bool device_mode(void)
{
	const char *e = getenv("VPMM_SYNC_FREE");
	return e && !strcmp(e, "device");
}

void start(void)
{
	CUcontext c;
	CHECK_EQ(cuInit(0), 0);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c, 0), 0);
	CHECK_EQ(cuCtxSetCurrent(c), 0);
	controls_init();
	fakecuda_set_implicit(1); /* the legacy stream's implicit order */
}

CUevent work_on(CUstream s)
{
	CUevent ev;
	CHECK_EQ(cuEventCreate(&ev, 0), 0);
	CHECK_EQ(cuEventRecord(ev, s), 0);
	return ev;
}

CUevent freed_after_work(CUstream late, CUdeviceptr *a)
{
	CHECK_EQ(cuMemAlloc(a, 4 * P), 0);
	CUevent ev = work_on(late);
	CHECK_EQ(cuMemFree(*a), 0);
	return ev;
}

/* The new owner's write on `next`, which the device runs first: it must
 * not complete before `old`, the old owner's late write (destroyed). */
void expect_ordered(CUevent old, CUstream next)
{
	CUevent young = work_on(next);
	CHECK_EQ(cuStreamSynchronize(next), 0);
	if (cuEventQuery(young) == CUDA_SUCCESS)
		CHECK_EQ(cuEventQuery(old), CUDA_SUCCESS);
	/* the host waits: the device runs everything the new write waits for */
	CHECK_EQ(cuEventSynchronize(young), 0);
	CHECK_EQ(cuEventQuery(old), CUDA_SUCCESS);
	cuEventDestroy(old);
	cuEventDestroy(young);
}

void fence_now(CUdeviceptr *f)
{
	CHECK_EQ(cuMemFree(*f), 0);
	CHECK_EQ(cuMemAlloc(f, P), 0);
}

/* The same for b's new owner; then b is freed. */
void new_write(CUevent old, CUstream next, CUdeviceptr b)
{
	expect_ordered(old, next);
	CHECK_EQ(cuMemFree(b), 0);
}

/* a: allocated, written late on `late` (work pending), freed (and `late`
 * destroyed, if asked); then the same size allocated again and written on
 * `next`. The device runs `next` first: the new write must not complete
 * before the late one. Returns whether the memory was reused. */
bool late_write_then(CUstream late, CUstream next, bool destroy_late)
{
	CUdeviceptr a, b;
	CUevent old = freed_after_work(late, &a);
	if (destroy_late)
		CHECK_EQ(cuStreamDestroy(late), 0);
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
	new_write(old, next, b);
	return a == b;
}

bool late_write(CUstream late, CUstream next)
{
	return late_write_then(late, next, false);
}

/* The context synchronisations since `from`, as the shim and the fake
 * count them. */
void expect_syncs(long long from_hook, long long from_fake, long long n)
{
	if (!expect_pool())
		return;
	CHECK_EQ(hook_calls("sync_free") - from_hook, n);
	CHECK_EQ(fake_calls("cuCtxSynchronize") - from_fake, n);
}

/* The end of a scenario whose frees all fenced: no synchronisation (with
 * VPMM_SYNC_FREE=device they all synchronised, which each counts itself),
 * no failed allocation. */
void expect_fenced(void)
{
	if (!device_mode())
		expect_syncs(0, 0, 0);
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* A malloc and its free, the free synchronising the context. */
void free_syncs(void)
{
	CUdeviceptr a;
	long long h = hook_calls("sync_free"), f = fake_calls("cuCtxSynchronize");
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	CHECK_EQ(cuMemFree(a), 0);
	expect_syncs(h, f, 1);
}

static void late(void)
{
	CUstream nb, nb2;
	start();
	CHECK_EQ(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&nb2, CU_STREAM_NON_BLOCKING), 0);
	for (int i = 0; i < 3; i++) {
		bool reused = late_write(nb, nb2);
		if (expect_pool())
			CHECK(reused); /* at once, in the legacy stream's order */
	}
	if (device_mode()) {
		expect_syncs(0, 0, 6);
		CHECK_EQ(hook_calls("fence_free"), 0);
	} else {
		expect_syncs(0, 0, 0);
		if (expect_pool())
			CHECK_EQ(hook_calls("fence_free"), 6);
	}
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* At most VPMM_FENCE_STREAMS_MAX (256) non-blocking streams: with more, a
 * free synchronises; blocking streams do not count. */
static void many(void)
{
	enum { NB = 257, BL = 300 };
	static CUstream nb[NB], bl[BL];
	start();
	for (int i = 0; i < BL; i++)
		CHECK_EQ(cuStreamCreate(&bl[i], 0), 0);
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], CU_STREAM_NON_BLOCKING), 0);
	free_syncs();
	CHECK_EQ(cuStreamDestroy(nb[NB - 1]), 0);
	long long h = hook_calls("sync_free"), f = fake_calls("cuCtxSynchronize");
	long long waits = fake_calls("cuStreamWaitEvent");
	bool reused = late_write(nb[0], nb[1]);
	expect_syncs(h, f, device_mode() ? 2 : 0);
	if (expect_pool() && !device_mode()) {
		CHECK(reused);
		/* each malloc: each of 256 waits for the legacy stream; the
		 * second also makes the wait for each of 256 that the first
		 * free owed the legacy stream (the second free's is owed
		 * still), and for the destroyed one's kept event */
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 3 * (NB - 1) + 1);
	}
	for (int i = 0; i < NB - 1; i++)
		CHECK_EQ(cuStreamDestroy(nb[i]), 0);
	for (int i = 0; i < BL; i++)
		CHECK_EQ(cuStreamDestroy(bl[i]), 0);
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* Streams made through cuGetProcAddress, as the runtime makes them. */
static void gpa(void)
{
	CUresult (*create)(CUstream *, unsigned) = NULL;
	CUresult (*create_prio)(CUstream *, unsigned, int) = NULL;
	CUdriverProcAddressQueryResult q;
	CUstream s1, s2;
	start();
	CHECK_EQ(cuGetProcAddress_v2("cuStreamCreate", (void **)&create, 12000, 0, &q), 0);
	CHECK_EQ(cuGetProcAddress_v2("cuStreamCreateWithPriority", (void **)&create_prio, 12000,
				     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q),
		 0);
	CHECK(create && create_prio);
	CHECK_EQ(create(&s1, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(create_prio(&s2, CU_STREAM_NON_BLOCKING, -1), 0);
	late_write(s1, s2);
	late_write(s2, s1);
	if (!device_mode()) {
		expect_syncs(0, 0, 0);
		if (expect_pool()) {
			CHECK_EQ(hook_calls("cuStreamCreate"), 1);
			CHECK_EQ(hook_calls("cuStreamCreateWithPriority"), 1);
		}
	}
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* Blocking streams and the per-thread default stream: no fence of their
 * own, only the legacy stream's implicit order (one event recorded on it
 * between the frees and the next malloc on it). */
static void blocking(void)
{
	CUstream b1, b2;
	start();
	CHECK_EQ(cuStreamCreate(&b1, 0), 0);
	CHECK_EQ(cuStreamCreate(&b2, 0), 0);
	bool reused = late_write(b1, b2);
	reused &= late_write(b2, b1);
	reused &= late_write(CU_STREAM_PER_THREAD, b2);
	reused &= late_write(b1, CU_STREAM_PER_THREAD);
	if (!device_mode()) {
		expect_syncs(0, 0, 0);
		if (expect_pool()) {
			CHECK(reused);
			CHECK_EQ(fake_calls("cuStreamWaitEvent"), 0);
		}
	}
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* The waits for the non-blocking streams come once for a run of frees,
 * at the next malloc, and a malloc with no free since the last one makes
 * none; the order holds throughout (late_write). */
static void lazy(void)
{
	enum { NB = 4 };
	CUstream nb[NB];
	CUdeviceptr a[3], b, c;
	start();
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], CU_STREAM_NON_BLOCKING), 0);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(cuMemAlloc(&a[i], 4 * P), 0);
	CUevent old = work_on(nb[0]);
	long long waits = fake_calls("cuStreamWaitEvent");
	long long records = fake_calls("cuEventRecord");
	for (int i = 0; i < 3; i++)
		CHECK_EQ(cuMemFree(a[i]), 0);
	bool counted = !device_mode() && expect_pool();
	if (counted) { /* the three frees: no driver call */
		CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
		CHECK_EQ(fake_calls("cuEventRecord"), records);
	}
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0);
	if (counted) { /* the legacy stream waits for each, each for it */
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 2 * NB);
		CHECK_EQ(fake_calls("cuEventRecord") - records, NB + 1);
	}
	waits = fake_calls("cuStreamWaitEvent");
	records = fake_calls("cuEventRecord");
	CHECK_EQ(cuMemAlloc(&c, 4 * P), 0);
	if (counted) { /* nothing freed since: nothing to wait for */
		CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
		CHECK_EQ(fake_calls("cuEventRecord"), records);
	}
	CHECK_EQ(cuMemFree(c), 0);
	new_write(old, nb[1], b);
	for (int i = 0; i < 3; i++)
		late_write(nb[i], nb[i + 1]);
	expect_fenced();
}

/* A synchronous malloc after a free, of memory that only frees before the
 * last fence gave back, makes no wait and no record: the non-blocking
 * streams' last wait covers it. One of the memory freed since fences as
 * before, and the order holds. */
static void clean(void)
{
	enum { NB = 4 };
	CUstream nb[NB];
	CUdeviceptr a, c, g, x, h, b, d, y;
	start();
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuMemAlloc(&a, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&c, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&g, 4 * P), 0);
	CHECK_EQ(cuMemAlloc(&x, 2 * P), 0);
	CHECK_EQ(cuMemAlloc(&h, P), 0);
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuMemFree(c), 0);
	bool counted = !device_mode() && expect_pool();
	long long waits = fake_calls("cuStreamWaitEvent");
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0); /* half of a and c's 8 pages */
	if (counted)
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 2 * NB);
	/* The other half was freed before that fence; x's two pages after. */
	CUevent old = work_on(nb[0]);
	CHECK_EQ(cuMemFree(x), 0);
	waits = fake_calls("cuStreamWaitEvent");
	long long records = fake_calls("cuEventRecord");
	long long cleans = hook_calls("fence_clean");
	CHECK_EQ(cuMemAlloc(&d, 4 * P), 0);
	if (counted) {
		CHECK(d + 4 * P <= x || x + 2 * P <= d);
		CHECK_EQ(fake_calls("cuStreamWaitEvent"), waits);
		CHECK_EQ(fake_calls("cuEventRecord"), records);
		CHECK_EQ(hook_calls("fence_clean") - cleans, 1);
	}
	CHECK_EQ(cuMemAlloc(&y, 2 * P), 0); /* x's pages: fenced again */
	if (counted) {
		CHECK_EQ(y, x);
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 2 * NB);
	}
	new_write(old, nb[1], y);
	CHECK_EQ(cuMemFree(b), 0);
	CHECK_EQ(cuMemFree(d), 0);
	CHECK_EQ(cuMemFree(g), 0);
	CHECK_EQ(cuMemFree(h), 0);
	expect_fenced();
}

/* The streams of `overflow` and `moved`: non-blocking, or blocking for
 * their _blocking forms (where the fence is the legacy stream's record). */
static unsigned stream_flags = CU_STREAM_NON_BLOCKING;

/* More frees since the last fence than the ranges kept (256): a malloc of
 * memory whose range was overwritten since still fences. A fence comes
 * first (the first malloc after a free always fences). */
static void overflow(void)
{
	enum { NB = 2, N = 300 };
	static CUdeviceptr v[N];
	CUstream nb[NB];
	CUdeviceptr g1, r, g2, z, f;
	start();
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], stream_flags), 0);
	for (int i = 0; i < N; i++)
		CHECK_EQ(cuMemAlloc(&v[i], P), 0);
	CHECK_EQ(cuMemAlloc(&g1, P), 0);
	CHECK_EQ(cuMemAlloc(&r, 3 * P), 0);
	CHECK_EQ(cuMemAlloc(&g2, P), 0);
	CHECK_EQ(cuMemAlloc(&f, P), 0);
	fence_now(&f);
	CUevent old = work_on(nb[0]);
	CHECK_EQ(cuMemFree(r), 0); /* its range first, then N others */
	for (int i = 0; i < N; i++)
		CHECK_EQ(cuMemFree(v[i]), 0);
	long long waits = fake_calls("cuStreamWaitEvent");
	long long records = hook_calls("fence_owed");
	CHECK_EQ(cuMemAlloc(&z, 3 * P), 0);
	if (!device_mode() && expect_pool()) {
		CHECK_EQ(z, r);
		if (stream_flags)
			CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 2 * NB);
		else
			CHECK_EQ(hook_calls("fence_owed") - records, 1);
	}
	new_write(old, nb[1], z);
	CHECK_EQ(cuMemFree(g1), 0);
	CHECK_EQ(cuMemFree(g2), 0);
	CHECK_EQ(cuMemFree(f), 0);
	expect_fenced();
}

/* A malloc of memory freed since the last fence, with the device caught
 * up: once the legacy stream's record (after its wait for every
 * non-blocking stream) has completed, no stream waits for it. With late
 * work on one stream, the record cannot complete before that work, and
 * every stream waits for it. */
static void idle(void)
{
	enum { NB = 4 };
	CUstream nb[NB];
	CUdeviceptr a, b, c;
	start();
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuMemAlloc(&a, 4 * P), 0);
	bool counted = !device_mode() && expect_pool();
	fakecuda_set_eager(1);
	CHECK_EQ(cuStreamSynchronize(NULL), 0);
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamSynchronize(nb[i]), 0);
	CHECK_EQ(cuMemFree(a), 0);
	long long waits = fake_calls("cuStreamWaitEvent");
	long long records = fake_calls("cuEventRecord");
	long long done = hook_calls("fence_done");
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0); /* a's pages */
	if (counted) {
		CHECK_EQ(b, a);
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, NB);
		CHECK_EQ(fake_calls("cuEventRecord") - records, NB + 1);
		CHECK_EQ(hook_calls("fence_done") - done, 1);
	}
	fakecuda_set_eager(0);
	CUevent old = work_on(nb[0]);
	CHECK_EQ(cuMemFree(b), 0);
	waits = fake_calls("cuStreamWaitEvent");
	records = fake_calls("cuEventRecord");
	CHECK_EQ(cuMemAlloc(&c, 4 * P), 0); /* b's pages */
	if (counted) {
		CHECK_EQ(c, b);
		CHECK_EQ(fake_calls("cuStreamWaitEvent") - waits, 2 * NB);
		CHECK_EQ(fake_calls("cuEventRecord") - records, NB + 1);
	}
	new_write(old, nb[1], c);
	expect_fenced();
}

/* Run with VPMM_LIMIT=256K, four pages. Pages freed since the last fence
 * while late work on them was pending, which the pool moves to a new
 * address for a synchronous malloc: no freed range names that address,
 * and the malloc fences all the same (the pool's mapping of moved pages
 * counts). */
static void moved(void)
{
	enum { NB = 2 };
	CUstream nb[NB];
	CUdeviceptr a, x, c, z, b;
	start();
	for (int i = 0; i < NB; i++)
		CHECK_EQ(cuStreamCreate(&nb[i], stream_flags), 0);
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	CHECK_EQ(cuMemAlloc(&x, P), 0);
	CHECK_EQ(cuMemAlloc(&c, P), 0);
	CHECK_EQ(cuMemAlloc(&z, P), 0);
	fence_now(&z);
	CUevent old = work_on(nb[0]);
	CHECK_EQ(cuMemFree(a), 0);
	CHECK_EQ(cuMemFree(c), 0);
	uint64_t remapped = pool_stats(0).handles_remapped;
	CHECK_EQ(cuMemAlloc(&b, 2 * P), 0); /* a's and c's pages, moved */
	if (expect_pool()) {
		CHECK(b + 2 * P <= a || a + P <= b);
		CHECK(b + 2 * P <= c || c + P <= b);
		CHECK_EQ(pool_stats(0).mapped, 4 * P);
		CHECK(pool_stats(0).handles_remapped > remapped);
	}
	new_write(old, nb[1], b);
	CHECK_EQ(cuMemFree(x), 0);
	CHECK_EQ(cuMemFree(z), 0);
	expect_fenced();
}

/* On blocking streams the ordering holds, but the pool's own record on the
 * legacy stream (its caches flushed before the defragmentation) orders it
 * too: the obligation is tested by owed_obligation. */
static void moved_blocking(void)
{
	stream_flags = 0;
	moved();
}

static void overflow_blocking(void)
{
	stream_flags = 0;
	overflow();
}

/* Run with VPMM_LIMIT=256K, four pages. Memory a synchronous free gave back
 * while a non-blocking stream's work on it was late, taken by a
 * stream-ordered malloc on another non-blocking stream: the pool can only
 * move its pages there (to a new address), after an event it records on
 * the legacy stream (which the other stream waits for), and that
 * record must come after the legacy stream's wait for the late stream,
 * which the free left owed. */
static void pool_record_run(void)
{
	CUstream late, next;
	CUdeviceptr a, b;
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&next, CU_STREAM_NON_BLOCKING), 0);
	for (int round = 0; round < 2; round++) {
		CUevent old = freed_after_work(late, &a);
		CHECK_EQ(cuMemAllocAsync(&b, 4 * P, next), 0);
		/* a's pages, moved: nothing else fits the limit */
		if (expect_pool())
			CHECK_EQ(pool_stats(0).mapped, 4 * P);
		expect_ordered(old, next);
		CHECK_EQ(cuMemFreeAsync(b, next), 0);
		CHECK_EQ(cuStreamSynchronize(next), 0);
	}
	expect_fenced();
}

static void pool_record(void)
{
	start();
	pool_record_run();
}

/* The same in a child forked after the parent's pool was made: the
 * child's pool has a driver of its own, which must be wrapped too. */
static void pool_record_forked(void)
{
	CUdeviceptr a;
	int status;
	start();
	CHECK_EQ(cuMemAlloc(&a, P), 0);
	CHECK_EQ(cuMemFree(a), 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		start();
		pool_record_run();
		_exit(0);
	}
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A synchronous malloc with no free since the last one's fence, which the
 * pool serves with the pages of a stream-ordered free whose work is late on
 * a non-blocking stream (a pool holding that much free memory remaps it
 * rather than grow: growth.c's spare share): the legacy stream waits for
 * that work first (the pool's wait), and the non-blocking streams must
 * wait for the legacy stream again. (No synchronous free comes before:
 * its wait for every non-blocking stream would cover the late work.) */
static void pool_wait(void)
{
	CUstream late, next;
	CUdeviceptr a, b, c, x;
	start();
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&next, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuMemAlloc(&x, 4 * P), 0);
	CHECK_EQ(cuMemAllocAsync(&a, 4 * P, late), 0);
	CUevent old = work_on(late);
	CHECK_EQ(cuMemFreeAsync(a, late), 0);
	CHECK_EQ(cuMemFreeAsync(x, NULL), 0);
	long long waits = pool_stats(0).stream_waits;
	CHECK_EQ(cuMemAlloc(&c, 4 * P), 0); /* x's pages, in the legacy order */
	if (expect_pool() && !device_mode())
		CHECK_EQ(pool_stats(0).stream_waits, waits);
	CHECK_EQ(cuMemAlloc(&b, 4 * P), 0); /* a's pages */
	if (expect_pool()) {
		CHECK_EQ(pool_stats(0).mapped, 8 * P);
		if (!device_mode())
			CHECK_EQ(pool_stats(0).stream_waits - waits, 1);
	}
	new_write(old, next, b);
	CHECK_EQ(cuMemFree(c), 0);
	expect_fenced();
}

/* A capture begins on a non-blocking stream while a free still owes the
 * legacy stream its wait for the non-blocking streams: the wait is made
 * before the capture begins, so that nothing is recorded on the capturing
 * stream later (a record would join its graph) and the malloc after needs
 * no synchronisation. `elsewhere`: with another context current when the
 * capture begins, the wait the pool's context's frees owe is made all the
 * same. */
static void capture_owed_with(bool elsewhere)
{
	CUstream late, cap;
	CUcontext primary, mine = NULL;
	CUdeviceptr a, b;
	CUgraph g = NULL;
	start();
	CHECK_EQ(cuCtxGetCurrent(&primary), 0);
	CHECK_EQ(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), 0);
	CUevent old = freed_after_work(late, &a);
	if (elsewhere)
		CHECK_EQ(cuCtxCreate_v2(&mine, 0, 0), 0); /* current now */
	CHECK_EQ(cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_RELAXED), 0);
	CHECK_EQ(cuCtxSetCurrent(primary), 0);
	CHECK_EQ(cuMemAllocAsync(&b, 4 * P, NULL), 0);
	CHECK_EQ(fake_calls("record_capturing"), 0);
	CHECK_EQ(cuStreamEndCapture(cap, &g), 0); /* the fake's graph: nothing to destroy */
	CHECK_EQ(cuMemFreeAsync(b, NULL), 0);
	CHECK_EQ(cuEventSynchronize(old), 0);
	cuEventDestroy(old);
	if (mine) {
		CHECK_EQ(cuCtxDestroy(mine), 0);
		CHECK_EQ(cuCtxSetCurrent(primary), 0);
	}
	expect_fenced();
}

static void capture_owed(void)
{
	capture_owed_with(false);
}

static void capture_owed_elsewhere(void)
{
	capture_owed_with(true);
}

/* A stream the shim never saw made: once a hook meets it, every
 * synchronous free synchronises. */
static void unseen(void)
{
	CUstream known, hidden;
	CUdeviceptr a;
	start();
	CHECK_EQ(cuStreamCreate(&known, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(fakecuda_stream_create_unseen(&hidden, CU_STREAM_NON_BLOCKING), 0);
	late_write(known, known);
	if (!device_mode())
		expect_syncs(0, 0, 0);
	CHECK_EQ(cuMemAllocAsync(&a, P, hidden), 0);
	CHECK_EQ(cuMemFreeAsync(a, hidden), 0);
	long long h = hook_calls("sync_free"), f = fake_calls("cuCtxSynchronize");
	late_write(hidden, known);
	expect_syncs(h, f, 2); /* both frees */
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* A capturing non-blocking stream gets no event: the free synchronises. */
static void capture(void)
{
	CUstream cap, s;
	start();
	CHECK_EQ(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), 0);
	CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
	st_fake_set_capturing(cap, 1);
	late_write(s, s);
	expect_syncs(0, 0, 2); /* both frees */
	st_fake_set_capturing(cap, 0);
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* A stream of another context on the device does not wait for this
 * context's legacy stream, nor does that context's own legacy stream:
 * while the context lives (with a stream or none), a free synchronises;
 * once it is destroyed, frees are fenced again (the table's verdict
 * follows it). */
static void other(void)
{
	CUcontext primary, mine;
	CUstream theirs, s;
	start();
	CHECK_EQ(cuCtxGetCurrent(&primary), 0);
	CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
	for (int round = 0; round < 2; round++) {
		long long h = hook_calls("sync_free"), f = fake_calls("cuCtxSynchronize");
		late_write(s, s); /* fenced: the table's verdict is cached */
		expect_syncs(h, f, device_mode() ? 2 : 0);
		CHECK_EQ(cuCtxCreate_v2(&mine, 0, 0), 0); /* current now */
		CHECK_EQ(cuCtxSetCurrent(primary), 0);
		free_syncs(); /* no stream of its own: its legacy stream is one */
		CHECK_EQ(cuCtxSetCurrent(mine), 0);
		CHECK_EQ(cuStreamCreate(&theirs, 0), 0);
		CHECK_EQ(cuCtxSetCurrent(primary), 0);
		free_syncs();
		CHECK_EQ(cuStreamDestroy(theirs), 0);
		CHECK_EQ(cuCtxDestroy(mine), 0);
		CHECK_EQ(cuCtxSetCurrent(primary), 0);
	}
	CHECK_EQ(pool_stats(0).failures, 0);
}

/* A green context made: its default stream reaches pool memory beside the
 * legacy stream, so the synchronous frees synchronise from then on, made
 * through the exported name or cuGetProcAddress alike. */
static void green(void)
{
	CUstream s;
	CUgreenCtx g;
	CUdevResourceDesc desc = NULL;
	CUresult (*create)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned) = NULL;
	CUdriverProcAddressQueryResult q;
	start();
	CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
	long long h = hook_calls("sync_free"), f = fake_calls("cuCtxSynchronize");
	late_write(s, s);
	expect_syncs(h, f, device_mode() ? 2 : 0);
	CHECK_EQ(cuGetProcAddress_v2("cuGreenCtxCreate", (void **)&create, 12040, 0, &q), 0);
	CHECK(create != NULL);
	CHECK_EQ(create(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM), 0);
	free_syncs();
	CHECK_EQ(cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM), 0);
	free_syncs();
	if (expect_pool())
		CHECK_EQ(hook_calls("cuGreenCtxCreate"), 2);
	CHECK_EQ(pool_stats(0).failures, 0);
}

int main(int argc, char **argv)
{
	static const struct scenario scenarios[] = {
		{"late", late},           {"many", many},     {"gpa", gpa},
		{"destroyed", destroyed}, {"unseen", unseen}, {"capture", capture},
		{"blocking", blocking},   {"other", other},   {"owed", owed},
		{"lazy", lazy},           {"pool_record", pool_record},
		{"pool_wait", pool_wait}, {"capture_owed", capture_owed},
		{"destroyed_elsewhere", destroyed_elsewhere},
		{"pool_record_forked", pool_record_forked},
		{"capture_owed_elsewhere", capture_owed_elsewhere},
		{"clean", clean},         {"moved", moved},   {"idle", idle},
		{"moved_blocking", moved_blocking}, {"overflow_blocking", overflow_blocking},
		{"owed_clean", owed_clean}, {"owed_obligation", owed_obligation},
		{"destroyed_busy", destroyed_busy}, {"overflow", overflow},
		{"destroyed_quiet", destroyed_quiet}, {"green", green},
		{"destroyed_last", destroyed_last}, {"destroyed_reset", destroyed_reset},
	};
	return run_scenario(argc, argv, scenarios, sizeof scenarios / sizeof scenarios[0]);
}
