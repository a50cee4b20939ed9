/* exit_prog.c — a host for the dump suite's exit and fork checks, outside
 * Criterion's workers (whose exit handlers a test's own children must not
 * run): a pool on the host driver and the socket server on the default path.
 * It prints the socket path, forks a child that starts its own server and
 * leaves through exit() (destructors run: its socket goes, the parent's
 * stays), prints the child's path, waits for its standard input to close,
 * then leaves through exit() itself. Exit status 0 if every step worked. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_host.h"
#include "server.h"
#include "vpmm.h"

static vpmm_pool *pool;

static size_t one_pool(vpmm_pool **out, size_t cap, void *arg)
{
	(void)arg;
	if (cap)
		out[0] = pool;
	return 1;
}

int main(void)
{
	struct vpmm_host_options ho = { .granularity = 64 << 10, .unbacked = true };
	vpmm_driver *drv;
	struct vpmm_config cfg;
	if (vpmm_driver_host_create(&ho, &drv) != CUDA_SUCCESS)
		return 2;
	vpmm_config_default(&cfg);
	cfg.page_size = 64 << 10;
	cfg.va_size = (size_t)64 << 20;
	if (vpmm_pool_create(&cfg, drv, &pool))
		return 2;
	struct vpmm_server_config sc = { .pools = one_pool };
	if (vpmm_server_start(&sc))
		return 3;
	printf("%s\n", vpmm_server_socket());
	fflush(stdout);

	int fds[2];
	if (pipe(fds))
		return 4;
	pid_t c = fork();
	if (c == 0) {
		close(fds[0]);
		/* nothing inherited is served here; a server of its own is */
		if (vpmm_server_socket()[0] || vpmm_server_start(&sc))
			_exit(5);
		dprintf(fds[1], "%s\n", vpmm_server_socket());
		close(fds[1]);
		exit(0); /* destructors: the child's socket goes */
	}
	close(fds[1]);
	char child[256] = "";
	ssize_t n = read(fds[0], child, sizeof(child) - 1);
	close(fds[0]);
	int st;
	waitpid(c, &st, 0);
	if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		return 6;
	printf("%s", child);
	fflush(stdout);

	char buf[16];
	while (read(0, buf, sizeof(buf)) > 0)
		;
	exit(0); /* destructors: our socket goes; the pool is the OS's to reclaim */
}
