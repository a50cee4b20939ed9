/* scope_dep.c — libshimscopedep.so, the dependency of libshimscope.so. */
#define API __attribute__((visibility("default")))

API int shimtest_local_sym(void);
API int shimtest_dup_sym(void);

int shimtest_local_sym(void)
{
	return 2;
}

int shimtest_dup_sym(void)
{
	return 3;
}
