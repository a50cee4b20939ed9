/* torch_prog.c — libvpmm.so used the way torch.cuda.memory.CUDAPluggableAllocator
 * uses it: dlopen'ed RTLD_LOCAL (no LD_PRELOAD), vpmm_torch_malloc/free called
 * with a device and a stream. The program sets up its context through the
 * (fake) runtime, as PyTorch does. `torch_prog`; see shimtest.h. */
#include <pthread.h>

#include "shimtest.h"
#include "vpmm/vpmm.h"

typedef int cudaError_t;
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreate(CUstream *s);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);

#define P ((size_t)64 << 10)

static void *(*tmalloc)(long, int, CUstream);
static int (*stats)(int, struct vpmm_stats *);
static void (*tfree)(void *, long, int, CUstream);
static CUstream st;

/* PyTorch's autograd threads allocate before any CUDA call of their own:
 * no current context. */
static void *no_context_thread(void *arg)
{
	void *p = tmalloc((long)(3 * P), 0, st);
	(void)arg;
	CHECK(p);
	touch(p, 3 * P, 23);
	tfree(p, (long)(3 * P), 0, st);
	return NULL;
}

/* What the allocation observer saw: the events, and the pool's live bytes
 * at each (a free is observed before the pool takes it). */
static struct vpmm_alloc_event seen[8];
static uint64_t seen_live[8];
static int nseen;
static int seen_ctx;

static void observer(void *ctx, const struct vpmm_alloc_event *ev)
{
	struct vpmm_stats s;
	CHECK(ctx == &seen_ctx);
	CHECK(nseen < 8);
	CHECK_EQ(stats(ev->device, &s), 0);
	seen_live[nseen] = s.live;
	seen[nseen++] = *ev;
}

/* vpmm_set_alloc_observer: told of the pool's allocations and frees (not
 * of what passes to the driver), the free before the pool takes it. */
static void check_observer(void *lib, bool pool)
{
	int (*set)(vpmm_alloc_observer, void *);
	void *p, *q;
	LOOKUP(set, lib, "vpmm_set_alloc_observer");
	CHECK(set);
	CHECK_EQ(set(observer, &seen_ctx), 0);
	p = tmalloc((long)(P + 1), 0, st);
	CHECK(p);
	tfree(p, (long)(P + 1), 0, st);
	st_fake_set_capturing(st, 1); /* the driver's: not observed */
	q = tmalloc((long)P, 0, st);
	CHECK(q);
	tfree(q, (long)P, 0, st);
	st_fake_set_capturing(st, 0);
	if (pool) {
		CHECK_EQ(nseen, 2);
		CHECK_EQ(seen[0].kind, VPMM_EVENT_ALLOC);
		CHECK_EQ(seen[0].device, 0);
		CHECK_EQ(seen[0].address, (unsigned long long)(uintptr_t)p);
		CHECK_EQ(seen[0].size, P + 1); /* as asked */
		CHECK(seen[0].stream == (struct CUstream_st *)st);
		CHECK_EQ(seen[1].kind, VPMM_EVENT_FREE);
		CHECK_EQ(seen[1].address, seen[0].address);
		CHECK(seen[1].size >= P + 1); /* the pool's size */
		CHECK(seen[1].stream == (struct CUstream_st *)st);
		CHECK_EQ(seen_live[1], seen_live[0]); /* still live when observed */
	} else {
		CHECK_EQ(nseen, 0);
	}
	CHECK_EQ(set(NULL, NULL), 0);
	p = tmalloc((long)P, 0, st);
	CHECK(p);
	tfree(p, (long)P, 0, st);
	CHECK_EQ(nseen, pool ? 2 : 0); /* removed: no more calls */
}

int main(void)
{
	void *lib, *a, *b, *c, *plain;
	struct vpmm_stats s;
	long long ctx_syncs, stream_syncs;
	pthread_t thread;
	bool pool = expect_pool();

	CHECK_EQ(cudaSetDevice(0), 0);
	CHECK_EQ(cudaStreamCreate(&st), 0);
	st_shim_not_global = true;
	controls_init();
	lib = dlopen(SHIMTEST_LIBVPMM, RTLD_NOW | RTLD_LOCAL);
	CHECK(lib);
	LOOKUP(tmalloc, lib, "vpmm_torch_malloc");
	LOOKUP(tfree, lib, "vpmm_torch_free");
	LOOKUP(stats, lib, "vpmm_shim_stats");
	CHECK(tmalloc && tfree && stats);
	/* not preloaded: the library's hooks are not in the program's way */
	CHECK(!dlsym(RTLD_DEFAULT, "vpmm_shim_stats"));

	ctx_syncs = fake_calls("cuCtxSynchronize");
	stream_syncs = fake_calls("cuStreamSynchronize");
	a = tmalloc((long)(2 * P), 0, st);
	CHECK(a);
	touch(a, 2 * P, 21);
	tfree(a, (long)(2 * P), 0, st);
	b = tmalloc((long)(2 * P), 0, st);
	CHECK(b);
	tfree(b, (long)(2 * P), 0, st);
	CHECK(tmalloc(0, 0, st) == NULL);
	/* stream-ordered: no synchronisation of any kind */
	CHECK_EQ(fake_calls("cuCtxSynchronize"), ctx_syncs);
	CHECK_EQ(fake_calls("cuStreamSynchronize"), stream_syncs);
	if (pool) {
		CHECK(b == a); /* reused at once on the same stream */
		CHECK_EQ(stats(0, &s), 0);
		CHECK_EQ(s.mallocs, 2);
		CHECK_EQ(s.frees, 2);
		CHECK_EQ(fake_calls("cuMemAllocAsync"), 0);
	} else {
		CHECK_EQ(stats(0, &s), -ENODEV);
		CHECK_EQ(fake_calls("cuMemAllocAsync"), 2);
		CHECK_EQ(fake_calls("cuMemFreeAsync"), 2);
	}

	CHECK_EQ(pthread_create(&thread, NULL, no_context_thread, NULL), 0);
	CHECK_EQ(pthread_join(thread, NULL), 0);
	CHECK_EQ(fake_calls("no_context"), 0); /* the thread got one for its calls */
	if (pool) {
		CHECK_EQ(stats(0, &s), 0);
		CHECK_EQ(s.mallocs, 3);
		CHECK_EQ(s.frees, 3);
	}

	/* a capturing stream: the driver's stream-ordered allocator */
	st_fake_set_capturing(st, 1);
	c = tmalloc((long)P, 0, st);
	CHECK(c);
	tfree(c, (long)P, 0, st);
	st_fake_set_capturing(st, 0);
	if (pool) {
		CHECK_EQ(fake_calls("cuMemAllocAsync"), 1);
		CHECK_EQ(fake_calls("cuMemFreeAsync"), 1);
	}

	check_observer(lib, pool);

	/* the program's own runtime calls are its own */
	CHECK_EQ(cudaMalloc(&plain, P), 0);
	CHECK_EQ(cudaFree(plain), 0);
	CHECK_EQ(fake_calls("cuMemAlloc_v2"), 1);

	/* A device that does not exist: NULL, and a line that says why
	 * (test_shim counts it), the pool's or the driver's answer. */
	CHECK(!tmalloc((long)P, 7, st));
	CHECK(!tmalloc((long)P, -1, st));

	/* dlclose() leaves the library mapped (-z nodelete): the pool's and
	 * the socket's threads still run its code, and wake within a second. */
	CHECK_EQ(dlclose(lib), 0);
	CHECK(dlopen(SHIMTEST_LIBVPMM, RTLD_NOW | RTLD_NOLOAD));
	struct timespec nap = {1, 200 * 1000 * 1000};
	nanosleep(&nap, NULL);
	printf("ok torch\n");
	return 0;
}
