/* unloaded_prog.c — an extension with its own runtime, in its own scope,
 * is used, closed (its runtime unloaded with it), and another extension
 * with another runtime is loaded: calls through the shim must reach the
 * runtime of the scope that calls, not the one that was unloaded (the
 * shim cached the first and jumped into freed code; review). Links no
 * CUDA runtime itself. `unloaded_prog` */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OTHER_TOTAL 67890 /* rt_other.c */

#define CHECK(c)                                                              \
	do {                                                                  \
		if (!(c)) {                                                   \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
			exit(1);                                              \
		}                                                             \
	} while (0)

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

int main(void)
{
	void *a, *b;
	CHECK(!dlsym(RTLD_DEFAULT, "cudaMemGetInfo") ||
	      dlsym(RTLD_DEFAULT, "vpmm_shim_stats")); /* none global but ours */
	size_t first = total_via(EXT_A, &a);
	CHECK(first > 0 && first != OTHER_TOTAL);
	CHECK(dlclose(a) == 0);
	CHECK(!dlopen(EXT_A, RTLD_NOW | RTLD_NOLOAD)); /* really gone */
	size_t second = total_via(EXT_B, &b);
	CHECK(second == OTHER_TOTAL);
	CHECK(dlclose(b) == 0);
	printf("ok unloaded\n");
	return 0;
}
