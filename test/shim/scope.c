/* scope.c — libshimscope.so: a library linked into drv_prog, loaded after
 * libvpmm.so, whose dlsym(RTLD_NEXT, ...) must keep its meaning ("after me")
 * under the shim, as interposers that chain to the next definition rely on. */
#include <dlfcn.h>

#define API __attribute__((visibility("default")))

API int shimtest_local_sym(void);
API int shimtest_dup_sym(void);
API void *scope_lookup_next(void);
API int scope_use(void);

/* The next definition after this library: the dependency's (seen from
 * libvpmm.so, the next one would be this library's own). */
void *scope_lookup_next(void)
{
	void *p = dlsym(RTLD_NEXT, "shimtest_dup_sym");
	/* No tail call: that would make our caller dlsym's caller. */
	__asm__ volatile("" ::: "memory");
	return p;
}

int shimtest_dup_sym(void)
{
	return 1;
}

/* Makes the dependency a real one (the link drops unused libraries). */
int scope_use(void)
{
	return shimtest_local_sym();
}
