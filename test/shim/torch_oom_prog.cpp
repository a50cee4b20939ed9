// torch_oom_prog.cpp — what PyTorch's pluggable allocator sees when the pool
// cannot serve: libvpmm.so dlopen'ed RTLD_LOCAL, as CUDAPluggableAllocator
// loads it, and vpmm_torch_malloc called from C++ frames that catch, in a
// library named as PyTorch's are (torch_oom_caller.cpp). A failure must
// arrive there as a C++ exception naming out of memory (PyTorch takes any
// returned pointer, NULL included, as the tensor's memory); called from
// here, not PyTorch's, it returns NULL; a failure the pool did not refuse
// is described with the pool as it is, not with an earlier refusal; and
// the pool serves again afterwards. Run by test_shim.c with VPMM_LIMIT=8M;
// prints the message thrown at the first refusal ("thrown: ...") and the
// one thrown for the driver's refusal ("thrown unrefused: ..."), then "ok"
// and exits 0, or says what failed and exits 1.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <string>

#include "torch_oom_caller.h"

typedef void *cudaStream_t;
extern "C" int cudaSetDevice(int dev);
extern "C" int cudaStreamCreate(cudaStream_t *s);
extern "C" int cudaStreamBeginCapture(cudaStream_t s, int mode);
extern "C" int cudaStreamEndCapture(cudaStream_t s, void **graph);

static int failures;
#define CHECK(c)                                                                        \
	do {                                                                            \
		if (!(c)) {                                                             \
			fprintf(stderr, "torch_oom_prog:%d: check failed: %s\n", __LINE__, #c); \
			failures++;                                                     \
		}                                                                       \
	} while (0)

typedef void (*free_fn)(void *, long, int, cudaStream_t);

// The exception's message, or "" when the call returned (*out: what).
static std::string attempt(oom_malloc_fn m, long size, int device, cudaStream_t s, void **out)
{
	const char *why = oom_attempt(m, size, device, s, out);
	return why ? why : "";
}

int main()
{
	cudaStream_t st;
	void *p, *q, *r, *g;
	if (cudaSetDevice(0) != 0 || cudaStreamCreate(&st) != 0) {
		fprintf(stderr, "torch_oom_prog: no device\n");
		return 1;
	}
	void *lib = dlopen(SHIMTEST_LIBVPMM, RTLD_NOW | RTLD_LOCAL);
	CHECK(lib);
	if (!lib)
		return 1;
	oom_malloc_fn m = (oom_malloc_fn)dlsym(lib, "vpmm_torch_malloc");
	free_fn f = (free_fn)dlsym(lib, "vpmm_torch_free");
	CHECK(m && f);
	if (!m || !f)
		return 1;

	std::string why = attempt(m, 1L << 20, 0, st, &p);
	CHECK(why.empty() && p);
	// some memory free
	why = attempt(m, 512L << 10, 0, st, &q);
	CHECK(why.empty() && q);
	f(q, 512L << 10, 0, st);
	// over VPMM_LIMIT: thrown, not NULL
	why = attempt(m, 64L << 20, 0, st, &q);
	CHECK(!q);
	printf("thrown: %s\n", why.c_str());
	CHECK(why.find("out of memory") != std::string::npos);
	CHECK(why.find("67108864") != std::string::npos);
	// ... with what the pool holds (the 1 MiB above), where its free memory
	// lies (the 512 KiB freed filled handles of their own: the fake
	// device's pages are 64 KiB), and the device's free memory; test_shim.c
	// checks that the pool's log line said the same
	CHECK(why.find("the pool holds 1.00 MiB live and 512.00 KiB reusable (512.00 KiB in "
		       "wholly free handles, 0 B stranded in handles that also hold live "
		       "memory; the largest free region 512.00 KiB); the device has ") !=
	      std::string::npos);
	// a device that does not exist: thrown, with the driver's answer
	why = attempt(m, 1L << 16, 7, st, &q);
	CHECK(!q);
	CHECK(why.find("failed (CUresult") != std::string::npos);
	// not called from PyTorch's code: NULL, as to a C program
	CHECK(m(64L << 20, 0, st) == nullptr);
	// a failure the pool did not refuse, after a refusal of the same size
	// on the same device that was not described (returned NULL, from
	// here): the exception reads the pool afresh, 1 MiB more live than at
	// the refusal. The pool leaves a capturing stream to the driver's own
	// allocator, which refuses more than the device has.
	const long big = 512L << 20;
	CHECK(m(big, 0, st) == nullptr);
	why = attempt(m, 1L << 20, 0, st, &r);
	CHECK(why.empty() && r);
	CHECK(cudaStreamBeginCapture(st, 1 /* thread-local */) == 0);
	why = attempt(m, big, 0, st, &q);
	CHECK(cudaStreamEndCapture(st, &g) == 0);
	CHECK(!q);
	printf("thrown unrefused: %s\n", why.c_str());
	CHECK(why.find("tried to allocate 536870912 bytes on device 0; the pool holds "
		       "2.00 MiB live") != std::string::npos);
	f(r, 1L << 20, 0, st);
	// the pool serves on: the first allocation is still there, a second fits
	why = attempt(m, 2L << 20, 0, st, &q);
	CHECK(why.empty() && q && q != p);
	f(q, 2L << 20, 0, st);
	f(p, 1L << 20, 0, st);
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
