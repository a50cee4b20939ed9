/* run_prog.c — test_shim.c's runs of the test programs (run_prog.h): a
 * clean environment, the fake libcuda.so.1 on LD_LIBRARY_PATH, libvpmm.so
 * preloaded or not, the output and the exit within a deadline.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run_prog.h"

/* A sanitized libvpmm.so needs the sanitizer's runtime loaded first. */
#ifdef ASAN_RUNTIME
#define PRELOAD ASAN_RUNTIME ":" LIBVPMM
#else
#define PRELOAD LIBVPMM
#endif

struct run R;

/* How long one program may run, its output and exit included. A program
 * that hangs is killed, with its process group, and its test fails with
 * what it wrote. The tests set no Criterion .timeout, whose watchdog leaks
 * a block in the runner when two run at once, which LeakSanitizer reports
 * (so the suite can run in parallel under ASan). */
#define RUN_DEADLINE_S 60

static long ms_left(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return RUN_DEADLINE_S * 1000L - (t.tv_sec - t0->tv_sec) * 1000L -
	       (t.tv_nsec - t0->tv_nsec) / 1000000L;
}

void run(const char *prog, const char *scenario, bool preload,
		const char *const *extra)
{
	const char *env[32];
	char *argv[] = {(char *)prog, (char *)scenario, NULL};
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t sa;
	size_t n = 0, len = 0;
	int fds[2], st = 0;
	bool hung = false;
	struct timespec t0;
	pid_t pid;

	env[n++] = "LD_LIBRARY_PATH=" FAKE_DIR;
	if (preload)
		env[n++] = "LD_PRELOAD=" PRELOAD;
	for (size_t i = 0; extra && extra[i] && n < 30; i++)
		env[n++] = extra[i];
	env[n] = NULL;

	cr_assert_eq(pipe(fds), 0);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
	posix_spawn_file_actions_addclose(&fa, fds[0]);
	/* A process group of its own: a kill reaches the children it forked. */
	posix_spawnattr_init(&sa);
	posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&sa, 0);
	cr_assert_eq(posix_spawn(&pid, prog, &fa, &sa, argv, (char *const *)env),
		     0, "cannot start %s", prog);
	posix_spawnattr_destroy(&sa);
	posix_spawn_file_actions_destroy(&fa);
	close(fds[1]);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* Its output, until every writer has closed the pipe. */
	for (;;) {
		struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
		char scratch[4096];
		long left = ms_left(&t0);
		if (left <= 0) {
			hung = true;
			break;
		}
		int ready = poll(&pfd, 1, (int)left);
		if (ready < 0) {
			cr_assert_eq(errno, EINTR, "poll: %s", strerror(errno));
			continue;
		}
		if (!ready)
			continue;
		bool full = len == sizeof R.out - 1;
		ssize_t r = read(fds[0], full ? scratch : R.out + len,
				 full ? sizeof scratch : sizeof R.out - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (!full)
			len += (size_t)r;
	}
	/* Its exit (it may have closed its output and gone on). */
	while (!hung) {
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid)
			break;
		cr_assert(w == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
		if (ms_left(&t0) <= 0)
			hung = true;
		else
			usleep(2000);
	}
	if (hung) {
		kill(-pid, SIGKILL);
		cr_assert_eq(waitpid(pid, &st, 0), pid);
	}
	R.out[len] = '\0';
	close(fds[0]);
	R.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	cr_assert(!hung, "%s %s: still running after %d s, killed; output:\n%s", prog,
		  scenario, RUN_DEADLINE_S, R.out);
}

int count_lines_with(const char *a, const char *b)
{
	int n = 0;
	for (const char *line = R.out; *line;) {
		const char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);
		char buf[1024];
		snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
		if (strstr(buf, a) && (!b || strstr(buf, b)))
			n++;
		line += len + (end ? 1 : 0);
	}
	return n;
}
