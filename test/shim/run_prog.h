/* run_prog.h — how test_shim.c runs a test program: in a clean
 * environment, with or without libvpmm.so preloaded, within a deadline,
 * its output and exit status kept in R (run_prog.c).
 */
#ifndef RUN_PROG_H
#define RUN_PROG_H

#include <criterion/criterion.h>
#include <stdbool.h>

struct run {
	int status; /* exit code, or 128 + signal */
	char out[1 << 16];
};

/* The last program's run. */
extern struct run R;

/* Runs `prog scenario` with the given extra VAR=value entries (NULL-ended),
 * stdout and stderr both into R.out (the first 64 KiB; the rest is read
 * and dropped, so that no writer blocks on a full pipe). A program that
 * outlives its deadline (60 s, output and exit included) is killed with
 * its process group, and the test fails with what it wrote. */
void run(const char *prog, const char *scenario, bool preload, const char *const *extra);
/* Lines of R.out holding `a` (and `b`, unless NULL). */
int count_lines_with(const char *a, const char *b);

#define EXPECT_OK()                                                           \
	cr_assert_eq(R.status, 0, "exit %d, output:\n%s", R.status, R.out)
#define EXPECT_QUIET()                                                        \
	cr_expect_eq(count_lines_with("vpmm:", NULL), 0, "unexpected:\n%s", R.out)

/* The environment of a run without the pool: every allocation must reach
 * the fake driver. */
static const char *const REAL[] = {"SHIMTEST_EXPECT=real", NULL};

#endif
