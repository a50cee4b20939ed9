/* unloaded_prog.c — an extension with its own runtime, in its own scope,
 * is used, closed (its runtime unloaded with it), and another extension
 * with another runtime is loaded: calls through the shim must reach the
 * runtime of the scope that calls, not the one that was unloaded (the
 * shim cached the first and jumped into freed code; review). Links no
 * CUDA runtime itself. `unloaded_prog` */
#include "shimtest.h"

#define OTHER_TOTAL 67890 /* rt_other.c */
#define NOT_INITIALISED 3 /* cudaErrorInitializationError */

static size_t total_via(const char *lib, void **h)
{
	size_t free_bytes = 0, total = 0;
	*h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	CHECK(*h);
	void *sym = dlsym(*h, "ext_mem_info");
	CHECK(sym);
	int (*info)(size_t *, size_t *);
	memcpy(&info, &sym, sizeof info); /* object to function pointer */
	CHECK(info(&free_bytes, &total) == 0);
	return total;
}

typedef int (*mem_info_t)(size_t *, size_t *);

/* The program's own call: the hook when preloaded, else none. */
static mem_info_t global_mem_info(void)
{
	void *s = dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
	mem_info_t f = NULL;
	memcpy(&f, &s, sizeof f);
	return f;
}

int main(void)
{
	void *a, *b;
	size_t fr, total;
	mem_info_t hook = global_mem_info();
	CHECK(!hook || dlsym(RTLD_DEFAULT, "vpmm_shim_stats")); /* none global but ours */
	/* No runtime anywhere yet: the shim's "not initialised", and not for
	 * good. */
	if (hook)
		CHECK(hook(&fr, &total) == NOT_INITIALISED);
	size_t first = total_via(EXT_A, &a);
	CHECK(first > 0 && first != OTHER_TOTAL);
	CHECK(dlclose(a) == 0);
	CHECK(!dlopen(EXT_A, RTLD_NOW | RTLD_NOLOAD)); /* really gone */
	size_t second = total_via(EXT_B, &b);
	CHECK(second == OTHER_TOTAL);
	CHECK(dlclose(b) == 0);
	/* A runtime loaded globally later is found (a miss is not cached). */
	CHECK(dlopen(FAKE_RT, RTLD_NOW | RTLD_GLOBAL));
	if (hook) /* the stand-in's own answer (709 after its reload) */
		CHECK(hook(&fr, &total) != NOT_INITIALISED);
	printf("ok unloaded\n");
	return 0;
}
