/* rt_prog.c — an unmodified CUDA program linked with (the fake) libcudart.so:
 * interposition path 1, the exported runtime hooks. `rt_prog SCENARIO`
 * exits 0 when every check holds, else prints "FAIL file:line ..." and
 * exits non-zero. See shimtest.h for SHIMTEST_EXPECT. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shimtest.h"

typedef int cudaError_t;
typedef CUstream cudaStream_t;
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *f, size_t *t);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceSynchronize(void);

#define P ((size_t)64 << 10) /* the fake driver's granularity: one pool page */

static void basic(void)
{
	void *a, *b, *c, *z = &z;
	size_t f, t, ff, ft;
	struct vpmm_stats s;
	bool pool = expect_pool();

	CHECK_EQ(cudaFree(NULL), 0); /* initialises the runtime */
	controls_init();
	CHECK_EQ(cudaMalloc(&a, 100), 0);
	CHECK_EQ(cudaMalloc(&b, P), 0);
	CHECK_EQ(cudaMalloc(&c, 3 * P + 100), 0);
	CHECK(a && b && c);
	touch(a, 100, 1);
	touch(b, P, 2);
	touch(c, 3 * P + 100, 3);
	CHECK_EQ(cudaMalloc(&z, 0), 0);
	CHECK(z == NULL);
	CHECK_EQ(cudaMalloc(NULL, 10), 1);
	if (pool) {
		s = pool_stats(0);
		CHECK_EQ(s.mallocs, 3);
		CHECK(s.live >= 5 * P);
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 0);
		CHECK_EQ(hook_calls("cudaMalloc"), 5);
		CHECK_EQ(hook_calls("pool_malloc"), 3);
		CHECK_EQ(hook_calls("cuMemAlloc_v2"), 0); /* one hook per allocation */
	} else {
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 3);
		CHECK(!has_pool(0));
	}

	/* cudaMemGetInfo counts the pool's reusable bytes as free, once. */
	CHECK_EQ(cudaFree(b), 0);
	/* The pool reads the device's free memory when it grows (growth.c):
	 * only the calls from here on are the program's. */
	unsigned long info_calls = fake_calls("cuMemGetInfo_v2");
	CHECK_EQ(cudaMemGetInfo(&f, &t), 0);
	st_fake_mem_info(&ff, &ft);
	CHECK_EQ(t, ft);
	CHECK_EQ(fake_calls("cuMemGetInfo_v2"), info_calls + 1);
	if (pool) {
		s = pool_stats(0);
		CHECK(s.reusable >= P);
		CHECK_EQ(f, ff + s.reusable);
		CHECK_EQ(hook_calls("cudaMemGetInfo"), 1);
	} else {
		CHECK_EQ(f, ff);
	}

	CHECK_EQ(cudaFree(a), 0);
	CHECK_EQ(cudaFree(c), 0);
	CHECK_EQ(cudaFree(NULL), 0);
	if (pool) {
		s = pool_stats(0);
		CHECK_EQ(s.frees, 3);
		CHECK(s.live <= P); /* at most the sub-page slab the pool keeps */
		CHECK_EQ(fake_calls("cuMemFree_v2"), 0);
		const char *mode = getenv("VPMM_SYNC_FREE");
		if (mode && !strcmp(mode, "device")) {
			/* every synchronous free synchronised the context first */
			CHECK_EQ(hook_calls("sync_free"), 3);
			CHECK(fake_calls("cuCtxSynchronize") >= 3);
		} else {
			/* no stream but the legacy one: fences of no driver call */
			CHECK_EQ(hook_calls("sync_free"), 0);
			CHECK_EQ(hook_calls("fence_free"), 3);
			CHECK_EQ(fake_calls("cuCtxSynchronize"), 0);
			CHECK_EQ(fake_calls("cuStreamWaitEvent"), 0);
		}
	} else {
		CHECK_EQ(fake_calls("cuMemFree_v2"), 3);
	}
}

static void async(void)
{
	cudaStream_t s1, s2;
	void *a, *b, *c, *d, *z = &z;
	long long syncs;
	struct vpmm_stats s;
	bool pool = expect_pool();

	CHECK_EQ(cudaStreamCreate(&s1), 0);
	CHECK_EQ(cudaStreamCreate(&s2), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&a, 2 * P, s1), 0);
	touch(a, 2 * P, 5);
	CHECK_EQ(cudaFreeAsync(a, s1), 0);
	CHECK_EQ(cudaMallocAsync(&b, 2 * P, s1), 0);
	if (pool)
		CHECK(b == a); /* reused at once, in stream order */
	CHECK_EQ(cudaMallocAsync(&c, 2 * P, s2), 0);
	touch(c, 2 * P, 6);
	CHECK_EQ(cudaFreeAsync(b, s1), 0);
	CHECK_EQ(cudaFreeAsync(c, s2), 0);

	/* the per-thread default stream */
	CHECK_EQ(cudaMallocAsync_ptsz(&d, P, NULL), 0);
	touch(d, P, 7);
	syncs = fake_calls("cuStreamSynchronize");
	CHECK_EQ(cudaFreeAsync_ptsz(d, NULL), 0);

	CHECK_EQ(cudaMallocAsync(&z, 0, s1), 0);
	CHECK(z == NULL);
	CHECK_EQ(cudaFreeAsync(NULL, s1), 0);
	if (pool) {
		s = pool_stats(0);
		CHECK_EQ(s.mallocs, 4);
		CHECK_EQ(s.frees, 4);
		CHECK_EQ(fake_calls("cuStreamSynchronize"), syncs + 1);
		CHECK_EQ(fake_calls("cuMemAllocAsync") + fake_calls("cuMemAllocAsync_ptsz"), 0);
		CHECK_EQ(fake_calls("cuMemFreeAsync_ptsz"), 0);
		CHECK_EQ(fake_calls("cuMemFreeAsync"), 1); /* the NULL one */
		CHECK_EQ(hook_calls("cudaMallocAsync"), 4);
		CHECK_EQ(hook_calls("cudaMallocAsync_ptsz"), 1);
		CHECK_EQ(hook_calls("cudaFreeAsync"), 4);
		CHECK_EQ(hook_calls("cudaFreeAsync_ptsz"), 1);
		/* stream-ordered frees never synchronise the device */
		CHECK_EQ(fake_calls("cuCtxSynchronize"), 0);
	} else {
		CHECK_EQ(fake_calls("cuMemAllocAsync"), 3);
		CHECK_EQ(fake_calls("cuMemAllocAsync_ptsz"), 1);
		CHECK_EQ(fake_calls("cuMemFreeAsync_ptsz"), 1);
	}
}

/* Pointers the pool does not own, or no longer holds, get the real answer. */
static void foreign(void)
{
	char host[64];
	void *p;
	bool pool = expect_pool();

	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	CHECK_EQ(cudaFree(host), 1);
	CHECK_EQ(fake_calls("cuMemFree_v2"), 1);
	CHECK_EQ(cudaFreeAsync(host, NULL), 1);
	CHECK_EQ(fake_calls("cuMemFreeAsync"), 1);

	CHECK_EQ(cudaMalloc(&p, 2 * P), 0);
	CHECK_EQ(cudaFree((char *)p + 16), 1); /* inside, not the start */
	CHECK_EQ(cudaFree(p), 0);
	CHECK_EQ(cudaFree(p), 1); /* twice */
	if (pool) {
		CHECK_EQ(pool_stats(0).frees, 1);
		CHECK_EQ(fake_calls("cuMemFree_v2"), 1);
		CHECK(hook_calls("passthrough") >= 2);
	}
}

/* A capture the program's own calls do not show (set by the fake's
 * control): allocations on the stream go to the driver (the graph owns
 * them), a free of pool memory waits for the capture's end, which the next
 * call through the shim finds. */
static void capture(void)
{
	cudaStream_t s;
	void *p, *q;
	bool pool = expect_pool();

	CHECK_EQ(cudaStreamCreate(&s), 0);
	controls_init();
	CHECK_EQ(cudaMallocAsync(&q, P, s), 0);
	st_fake_set_capturing(s, 1);
	CHECK_EQ(cudaMallocAsync(&p, P, s), 0);
	CHECK_EQ(fake_calls("cuMemAllocAsync"), pool ? 1 : 2);
	CHECK_EQ(cudaFreeAsync(p, s), 0);
	CHECK_EQ(fake_calls("cuMemFreeAsync"), 1);
	CHECK_EQ(cudaFreeAsync(q, s), 0);
	if (pool) {
		CHECK_EQ(pool_stats(0).mallocs, 1);
		CHECK_EQ(pool_stats(0).frees, 0); /* deferred */
	}
	st_fake_set_capturing(s, 0);
	CHECK_EQ(cudaMallocAsync(&p, P, s), 0);
	if (pool) {
		CHECK_EQ(pool_stats(0).frees, 1);
		CHECK(p == q); /* reused on its stream once the capture ended */
	}
	CHECK_EQ(cudaFreeAsync(p, s), 0);
}

/* Run with a small FAKECUDA_CAPACITY: the pool's OOM is exactly
 * cudaErrorMemoryAllocation, and the pool keeps working. */
static void oom(void)
{
	void *p = &p, *q;
	bool pool = expect_pool();

	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	CHECK_EQ(cudaMalloc(&p, (size_t)64 << 20), 2);
	CHECK_EQ(cudaMallocAsync(&p, (size_t)64 << 20, NULL), 2);
	if (pool) {
		CHECK_EQ(pool_stats(0).failures, 2);
		CHECK_EQ(fake_calls("cuMemAlloc_v2") + fake_calls("cuMemAllocAsync"), 0);
	}
	CHECK_EQ(cudaMalloc(&q, (size_t)1 << 20), 0);
	touch(q, (size_t)1 << 20, 9);
	/* Refused with memory free: the line says where it lies. */
	void *r;
	CHECK_EQ(cudaMalloc(&r, (size_t)512 << 10), 0);
	CHECK_EQ(cudaFree(r), 0);
	CHECK_EQ(cudaMalloc(&p, (size_t)64 << 20), 2);
	CHECK_EQ(cudaFree(q), 0);
}

/* Run with VPMM_LIMIT=8M (the device has 256M): cudaMemGetInfo reports
 * what the pool can still hand out, so that a program sizing a buffer by
 * what is free (a KV cache, a workspace) gets it. */
static void limit_info(void)
{
	const size_t M = (size_t)1 << 20;
	void *a, *b;
	size_t f, t;
	bool pool = expect_pool();

	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	CHECK_EQ(cudaMalloc(&a, 4 * M), 0);
	CHECK_EQ(cudaMemGetInfo(&f, &t), 0);
	if (pool)
		CHECK(f <= 4 * M);
	CHECK_EQ(cudaMalloc(&b, f / 2), 0);
	touch(b, 4096, 1);
	CHECK_EQ(cudaFree(b), 0);
	CHECK_EQ(cudaFree(a), 0);
	CHECK_EQ(cudaMemGetInfo(&f, &t), 0);
	if (pool)
		CHECK_EQ(f, 8 * M);
	CHECK_EQ(cudaMalloc(&b, f), 0);
	CHECK_EQ(cudaFree(b), 0);
}

/* One pool per device, chosen by the current context (or the stream's). */
static void devices(void)
{
	cudaStream_t s1;
	void *p, *q, *r;

	CHECK_EQ(cudaSetDevice(1), 0);
	controls_init();
	CHECK_EQ(cudaStreamCreate(&s1), 0);
	CHECK_EQ(cudaMalloc(&p, P), 0);
	CHECK(has_pool(1));
	CHECK(!has_pool(0));
	CHECK_EQ(cudaSetDevice(0), 0);
	CHECK_EQ(cudaMalloc(&q, P), 0);
	CHECK(p != q);
	CHECK_EQ(pool_stats(0).mallocs, 1);
	CHECK_EQ(cudaMallocAsync(&r, P, s1), 0); /* device 1's stream */
	CHECK_EQ(pool_stats(1).mallocs, 2);
	CHECK_EQ(cudaFree(p), 0); /* device 0 current, device 1's memory */
	CHECK_EQ(cudaFreeAsync(r, s1), 0);
	CHECK_EQ(pool_stats(1).frees, 2);
	CHECK_EQ(cudaFree(q), 0);
	CHECK_EQ(pool_stats(0).frees, 1);
	CHECK_EQ(fake_calls("no_context"), 0);
}

static void *thread_main(void *arg)
{
	void *p;
	(void)arg;
	CHECK_EQ(cudaMalloc(&p, P), 0);
	touch(p, P, 4);
	CHECK_EQ(cudaFree(p), 0);
	return NULL;
}

/* A thread with no context: the hook lets the runtime set one up first. */
static void thread(void)
{
	pthread_t t;
	CHECK_EQ(pthread_create(&t, NULL, thread_main, NULL), 0);
	CHECK_EQ(pthread_join(t, NULL), 0);
	controls_init();
	if (expect_pool()) {
		CHECK_EQ(pool_stats(0).mallocs, 1);
		CHECK_EQ(pool_stats(0).frees, 1);
		CHECK_EQ(fake_calls("no_context"), 0);
	} else {
		CHECK_EQ(fake_calls("cuMemAlloc_v2"), 1);
	}
}

/* Several threads, each on its own stream and on the synchronous calls, all
 * on one pool: every allocation's data intact, every allocation freed. */
static void *worker(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	cudaStream_t s;
	void *held[8] = {0};
	CHECK_EQ(cudaStreamCreate(&s), 0);
	for (int i = 0; i < 300; i++) {
		int k = (int)(rand_r(&seed) % 8);
		size_t n = (size_t)(rand_r(&seed) % (3 * P)) + 1;
		if (held[k]) {
			CHECK_EQ(k % 2 ? cudaFreeAsync(held[k], s) : cudaFree(held[k]), 0);
			held[k] = NULL;
		}
		CHECK_EQ(k % 2 ? cudaMallocAsync(&held[k], n, s) : cudaMalloc(&held[k], n), 0);
		touch(held[k], n < 4096 ? n : 4096, (unsigned char)k);
	}
	for (int k = 0; k < 8; k++)
		if (held[k])
			CHECK_EQ(k % 2 ? cudaFreeAsync(held[k], s) : cudaFree(held[k]), 0);
	return NULL;
}

static void threads(void)
{
	pthread_t t[4];
	struct vpmm_stats s;
	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	for (uintptr_t i = 0; i < 4; i++)
		CHECK_EQ(pthread_create(&t[i], NULL, worker, (void *)(i + 1)), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(pthread_join(t[i], NULL), 0);
	if (expect_pool()) {
		s = pool_stats(0);
		CHECK_EQ(s.mallocs, 4 * 300);
		CHECK_EQ(s.frees, 4 * 300);
		CHECK_EQ(fake_calls("cuMemAlloc_v2") + fake_calls("cuMemAllocAsync"), 0);
		CHECK_EQ(fake_calls("no_context"), 0);
	}
}

static void *late_ptr;

/* Runs after the runtime's exit teardown (atexit runs before destructors). */
__attribute__((destructor)) static void late_free(void)
{
	char host[16];
	int foreign, e;
	if (!late_ptr)
		return;
	foreign = cudaFree(host);
	e = cudaFree(late_ptr);
	if (foreign != 4) {
		fprintf(stderr, "FAIL: the runtime was not torn down (%d)\n", foreign);
		_exit(3);
	}
	if (expect_pool() ? e != 0 : e != 4) {
		fprintf(stderr, "FAIL: late free returned %d\n", e);
		_exit(4);
	}
	printf("late free ok\n");
	fflush(stdout);
}

static void teardown(void)
{
	CHECK_EQ(cudaMalloc(&late_ptr, P), 0);
	controls_init();
	if (expect_pool())
		CHECK_EQ(pool_stats(0).mallocs, 1);
}

/* A forked child starts with no pool; the parent's is intact. */
static void forked(void)
{
	void *p, *q;
	pid_t pid;
	int status;
	bool pool = expect_pool();

	CHECK_EQ(cudaMalloc(&p, P), 0);
	controls_init();
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (pool) {
			CHECK(!has_pool(0));
			CHECK_EQ(cudaFree(p), 1); /* not the child's pool's */
		}
		CHECK_EQ(cudaMalloc(&q, P), 0);
		touch(q, P, 8);
		if (pool) {
			CHECK(has_pool(0));
			CHECK_EQ(pool_stats(0).mallocs, 1);
		}
		_exit(0);
	}
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK_EQ(cudaFree(p), 0);
	if (pool)
		CHECK_EQ(pool_stats(0).frees, 1);
}

/* Many allocations and frees, for a long trace (SHIMTEST_CHURN of each,
 * default 10000). */
static void churn(void)
{
	const char *e = getenv("SHIMTEST_CHURN");
	long n = e ? atol(e) : 10000;
	void *p;

	CHECK_EQ(cudaFree(NULL), 0);
	for (long i = 0; i < n; i++) {
		CHECK_EQ(cudaMalloc(&p, P), 0);
		CHECK_EQ(cudaFree(p), 0);
	}
}

static double secs(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Allocations failing out of memory in a loop for SHIMTEST_FLOOD_MS
 * (default 1500), on a device of FAKECUDA_CAPACITY=8M. With
 * SHIMTEST_FULL_STDERR=1 stderr is meanwhile a full pipe nobody reads (the
 * alarm ends the program if an allocation waits on it). */
static void oom_flood(void)
{
	const char *e = getenv("SHIMTEST_FLOOD_MS");
	double ms = e ? atof(e) : 1500, t0, worst = 0;
	bool full = getenv("SHIMTEST_FULL_STDERR") != NULL;
	int saved = -1, pipefd[2];
	long n = 0;
	void *p;

	CHECK_EQ(cudaFree(NULL), 0);
	if (full) {
		static char junk[4096];
		saved = dup(2);
		CHECK(saved >= 0 && pipe(pipefd) == 0 && dup2(pipefd[1], 2) == 2);
		CHECK(fcntl(pipefd[1], F_SETFL, O_NONBLOCK) == 0);
		while (write(pipefd[1], junk, sizeof junk) > 0)
			;
		CHECK(fcntl(pipefd[1], F_SETFL, 0) == 0); /* blocking, and full */
	}
	alarm(20);
	t0 = secs();
	while (secs() - t0 < ms / 1000) {
		double a = secs();
		CHECK_EQ(cudaMalloc(&p, (size_t)64 << 20), 2);
		if (secs() - a > worst)
			worst = secs() - a;
		n++;
	}
	alarm(0);
	if (full) {
		CHECK(dup2(saved, 2) == 2);
		CHECK((fcntl(2, F_GETFL) & O_NONBLOCK) == 0); /* the program's flags, as they were */
	}
	printf("flood: %ld failures in %.3f s, the slowest %.6f s\n", n, secs() - t0, worst);
	CHECK(worst < 1.0); /* waiting on the pipe: until the alarm */
}

static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A stream per request, 20 000 times: created, 1 MiB allocated and freed
 * on it, synchronised, destroyed. What the pool keeps for the destroyed
 * streams stays bounded, and no two thousands of streams in a row cost four
 * times the CPU time of the cheapest thousand after the first (which makes
 * the pool): a cost that grows with the streams seen fails, one slow block
 * on a loaded machine does not. */
static void stream_per_request(void)
{
	uint64_t t0 = cpu_ns(), ref = 0;
	int slow = 0;
	for (int i = 1; i <= 20000; i++) {
		cudaStream_t s;
		void *p;
		CHECK_EQ(cudaStreamCreate(&s), 0);
		CHECK_EQ(cudaMallocAsync(&p, 16 * P, s), 0);
		CHECK_EQ(cudaFreeAsync(p, s), 0);
		CHECK_EQ(cudaStreamSynchronize(s), 0);
		CHECK_EQ(cudaStreamDestroy(s), 0);
		if (i % 1000)
			continue;
		uint64_t t = cpu_ns(), spent = t - t0;
		t0 = t;
		if (i == 2000 || (i > 2000 && spent < ref))
			ref = spent;
		slow = i > 2000 && spent > 4 * ref ? slow + 1 : 0;
		if (slow == 2) {
			fprintf(stderr, "FAIL streams %d-%d: %llu ns a stream, %llu at 1001-2000\n",
				i - 999, i, (unsigned long long)spent / 1000,
				(unsigned long long)ref / 1000);
			exit(1);
		}
		if (expect_pool()) {
			struct vpmm_stats st = pool_stats(0);
			CHECK(st.streams <= 8);
			CHECK(st.events <= 64);
		}
	}
}

/* cudaDeviceReset as the CUDA 13 runtime does it: through the driver's
 * private table, which no hook of the shim sees. Frees pending on two
 * streams, a synchronous free's legacy record owed, and memory live across
 * it; after it, allocations on several new
 * streams, and a second reset among them. No stream or event of the ended
 * context may be named again (the fake counts each as dead_handle: a crash
 * inside libcuda on a GPU), and the live memory keeps its bytes. */
static void device_reset(void)
{
	cudaStream_t s, t, u[3];
	void *live, *a, *b;
	CHECK_EQ(cudaFree(NULL), 0);
	controls_init();
	CHECK_EQ(cudaStreamCreate(&s), 0);
	CHECK_EQ(cudaStreamCreate(&t), 0);
	CHECK_EQ(cudaMalloc(&live, 3 * P), 0);
	touch(live, 3 * P, 7);
	for (int i = 0; i < 6; i++) {
		CHECK_EQ(cudaMallocAsync(&a, (size_t)(1 + i % 3) * P, s), 0);
		CHECK_EQ(cudaMallocAsync(&b, (size_t)(2 + i % 2) * P + 100, t), 0);
		CHECK_EQ(cudaFreeAsync(a, s), 0);
		CHECK_EQ(cudaFreeAsync(b, t), 0); /* pending on s and t at the reset */
	}
	/* a synchronous free owes the legacy stream a record at the reset; the
	 * first malloc on the legacy stream after it must not make it */
	CHECK_EQ(cudaMalloc(&a, P), 0);
	CHECK_EQ(cudaFree(a), 0);
	CHECK_EQ(cudaDeviceReset(), 0);
	CHECK_EQ(cudaMallocAsync(&a, P, NULL), 0);
	touch(a, P, 3);
	CHECK_EQ(cudaFreeAsync(a, NULL), 0);
	for (int round = 0; round < 8; round++) {
		if (round == 4) {
			/* made again by a call the shim does not see, a record
			 * still owed to the old one */
			CHECK_EQ(cudaDeviceSynchronize(), 0);
			CHECK_EQ(cudaMallocAsync(&a, P, NULL), 0);
			touch(a, P, 5);
			CHECK_EQ(cudaFreeAsync(a, NULL), 0);
		}
		for (int k = 0; k < 3; k++)
			CHECK_EQ(cudaStreamCreate(&u[k]), 0);
		for (int k = 0; k < 3; k++) {
			void *p, *q;
			size_t n = (size_t)(1 + (round + k) % 4) * P + 64 * (size_t)k;
			CHECK_EQ(cudaMallocAsync(&p, n, u[k]), 0);
			touch(p, n, (unsigned char)(round * 3 + k));
			CHECK_EQ(cudaMalloc(&q, 2 * P), 0);
			touch(q, 2 * P, (unsigned char)k);
			CHECK_EQ(cudaFreeAsync(p, u[k]), 0);
			CHECK_EQ(cudaFree(q), 0);
		}
		for (int k = 0; k < 3; k++) {
			CHECK_EQ(cudaStreamSynchronize(u[k]), 0);
			CHECK_EQ(cudaStreamDestroy(u[k]), 0);
		}
		if (round == 3)
			CHECK_EQ(cudaDeviceReset(), 0);
	}
	intact(live, 3 * P, 7);
	CHECK_EQ(cudaFree(live), 0);
	/* No handle of the old context named once the pool could know of the
	 * reset. One use is left that no check can prevent: the reset, unseen
	 * by every hook, falling between the background thread's context
	 * check and the event query it guards (dead_handle_raced, not
	 * asserted). On a GPU that query names a destroyed event inside
	 * libcuda: a rare hazard the shim cannot close, which the next check
	 * ends. */
	CHECK_EQ(fake_calls("dead_handle"), 0);
	pool_clean(0);
}

int main(int argc, char **argv)
{
	static const struct scenario scenarios[] = {
		{"basic", basic},     {"async", async},     {"foreign", foreign},
		{"capture", capture}, {"oom", oom},         {"devices", devices},
		{"thread", thread},   {"exit", teardown},   {"fork", forked},
		{"threads", threads}, {"limit_info", limit_info}, {"churn", churn},
		{"oom_flood", oom_flood}, {"stream_per_request", stream_per_request},
		{"device_reset", device_reset},
	};
	return run_scenario(argc, argv, scenarios, sizeof scenarios / sizeof scenarios[0]);
}
