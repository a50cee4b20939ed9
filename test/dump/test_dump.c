/* test_dump.c — the vpmm-dump suite's shared parts (dump_test.h), on the
 * host driver without a GPU: this program is the "host" (a pool plus the
 * socket server of shim/server.c, and the trace recorder of shim/trace.c,
 * compiled in: no shim) and runs the built vpmm-dump, vpmm-replay and
 * python3 against itself; one test runs an unmodified program under
 * LD_PRELOAD=libvpmm.so with the shim suite's stand-in driver instead.
 *
 * Here: the host, running programs, the raw protocol, a fake server, trace
 * producers. The tests, by topic: test_socket.c (the socket's place and
 * permissions, listing, refusing another uid, stale sockets and forks),
 * test_show.c (the JSON document against the pool's own view, the text and
 * map output, names kept exact or made printable), test_protocol.c
 * (versions, protocol errors, untrusted replies, hooks), test_flood.c (10^5
 * hostile requests while allocation latency stays bounded), test_trace.c
 * (the PyTorch snapshot in Python's pickle, trace recording replayed to the
 * same peak), test_preload.c (a program under LD_PRELOAD), test_hostile.c
 * (hostile cases for the trace and the server).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver_host.h"
#include "dump_test.h"
#include "json.h"
#include "server.h"
#include "trace.h"
#include "vpmm.h"

/* ---- the host: a pool, its server ---------------------------------------- */

size_t one_pool(vpmm_pool **out, size_t cap, void *arg)
{
	struct host *h = arg;
	if (cap)
		out[0] = h->pool;
	return 1;
}

void host_pool(struct host *h, size_t va_pages)
{
	struct vpmm_host_options ho = { .granularity = PAGE, .unbacked = true };
	cr_assert_eq(vpmm_driver_host_create(&ho, &h->drv), CUDA_SUCCESS);
	struct vpmm_config cfg;
	vpmm_config_default(&cfg);
	cfg.page_size = PAGE;
	cfg.grain = PAGE;
	cfg.handle_size = PAGE;
	cfg.va_size = va_pages * PAGE;
	cfg.event_interval_ns = 0;
	cfg.background = false; /* what the tests see changes only when they act */
	cfg.release = false;
	cr_assert_eq(vpmm_pool_create(&cfg, h->drv, &h->pool), 0);
}

/* Starts the server: on `socket` ("" = the default rule, with
 * XDG_RUNTIME_DIR pointing at the temporary directory). */
void host_open(struct host *h, const char *socket, unsigned timeout_ms,
		      size_t va_pages)
{
	memset(h, 0, sizeof(*h));
	snprintf(h->dir, sizeof(h->dir), "/tmp/vpmm-dump-test-XXXXXX");
	cr_assert_not_null(mkdtemp(h->dir));
	host_pool(h, va_pages);
	setenv("XDG_RUNTIME_DIR", h->dir, 1);
	char path[128];
	if (socket && *socket)
		snprintf(path, sizeof(path), "%s/%s", h->dir, socket);
	struct vpmm_server_config sc = {
		.socket = socket && *socket ? path : NULL,
		.pools = one_pool,
		.arg = h,
		.client_timeout_ms = timeout_ms,
		.trace_start = vpmm_trace_open,
		.trace_strerror = vpmm_trace_strerror,
		.trace_stop = vpmm_trace_close,
		.trace_flush = vpmm_trace_flush,
		.trace_status = vpmm_trace_status,
	};
	int rc = vpmm_server_start(&sc);
	cr_assert_eq(rc, 0, "vpmm_server_start: %d", rc);
	snprintf(h->sock, sizeof(h->sock), "%s", vpmm_server_socket());
	cr_assert_neq(h->sock[0], '\0');
}

void host_close(struct host *h)
{
	vpmm_server_stop();
	struct stat st;
	cr_expect_neq(lstat(h->sock, &st), 0, "socket %s left after stop", h->sock);
	vpmm_pool_destroy(h->pool);
	h->drv->destroy(h->drv);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", h->dir);
	cr_expect_eq(system(cmd), 0);
}

CUdeviceptr alloc(struct host *h, size_t pages, CUstream s)
{
	CUdeviceptr p = 0;
	int rc = vpmm_pool_malloc(h->pool, pages * PAGE, s, &p);
	cr_assert_eq(rc, 0, "malloc %zu pages: %d", pages, rc);
	return p;
}

/* The four kinds at once: [~2][1][3][-2][*...] (the zombie scenario of the
 * pool suite, plus a free on `s`). live_out: the live allocations; returns
 * the freed one. */
CUdeviceptr make_all_kinds(struct host *h, CUstream s, CUdeviceptr live_out[2])
{
	CUdeviceptr a = alloc(h, 2, s);
	live_out[0] = alloc(h, 1, s);
	cr_assert_eq(vpmm_pool_free(h->pool, a, s), 0);
	live_out[1] = alloc(h, 3, s);
	CUdeviceptr d = alloc(h, 2, s);
	cr_assert_eq(vpmm_pool_free(h->pool, d, s), 0);
	return d;
}

/* ---- running programs ------------------------------------------------------ */

void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
}

/* Runs argv (NULL-terminated) as uid `as` (-1: ourselves), capturing both
 * outputs; killed after 60 s. */
void run_as(char *const argv[], int as, struct run *r)
{
	int po[2], pe[2];
	cr_assert_eq(pipe(po), 0);
	cr_assert_eq(pipe(pe), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		if (as >= 0 && (setgroups(0, NULL) || setgid((gid_t)as) || setuid((uid_t)as)))
			_exit(126);
		execv(argv[0], argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	size_t cap[2] = { 4096, 4096 }, len[2] = { 0, 0 };
	char *buf[2] = { malloc(cap[0]), malloc(cap[1]) };
	struct pollfd p[2] = { { .fd = po[0], .events = POLLIN }, { .fd = pe[0], .events = POLLIN } };
	time_t deadline = time(NULL) + 60;
	int open_fds = 2;
	while (open_fds && time(NULL) < deadline) {
		if (poll(p, 2, 1000) <= 0)
			continue;
		for (int i = 0; i < 2; i++) {
			if (p[i].fd < 0 || !p[i].revents)
				continue;
			if (len[i] + 4097 > cap[i]) {
				cap[i] *= 2;
				buf[i] = realloc(buf[i], cap[i]);
			}
			ssize_t n = read(p[i].fd, buf[i] + len[i], 4096);
			if (n > 0) {
				len[i] += (size_t)n;
			} else if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
				continue; /* a signal, not the end of the output */
			} else {
				close(p[i].fd);
				p[i].fd = -1;
				open_fds--;
			}
		}
	}
	for (int i = 0; i < 2; i++) {
		if (p[i].fd >= 0)
			close(p[i].fd);
		buf[i][len[i]] = '\0';
	}
	if (open_fds)
		kill(pid, SIGKILL);
	int st;
	waitpid(pid, &st, 0);
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	r->out = buf[0];
	r->err = buf[1];
}

void run(char *const argv[], struct run *r)
{
	run_as(argv, -1, r);
}

bool have_file(const char *path)
{
	return access(path, X_OK) == 0;
}

/* A test's scratch directory (made by mkdtemp) goes, with what is in it. */
void remove_dir(const char *dir)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

/* ---- raw protocol ------------------------------------------------------------- */

int dial(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct timeval tv = { .tv_sec = 5 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

bool send_all(int fd, const void *b, size_t n)
{
	const char *p = b;
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0) {
			if (w < 0 && errno == EINTR)
				continue;
			return false;
		}
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* One reply line (malloc'd, without the newline), or NULL at EOF/timeout. */
char *read_line(int fd)
{
	size_t cap = 4096, len = 0;
	char *b = malloc(cap);
	for (;;) {
		if (len + 1 >= cap)
			b = realloc(b, cap *= 2);
		ssize_t n = recv(fd, b + len, 1, 0);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			free(b);
			return NULL;
		}
		if (b[len] == '\n') {
			b[len] = '\0';
			return b;
		}
		len++;
	}
}

/* Sends `req` raw and parses the reply; false if none came. */
bool exchange(int fd, const char *req, struct json *reply)
{
	memset(reply, 0, sizeof(*reply));
	if (!send_all(fd, req, strlen(req)))
		return false;
	char *line = read_line(fd);
	if (!line)
		return false;
	char err[128];
	int rc = json_parse(line, strlen(line), reply, err, sizeof(err));
	cr_assert_eq(rc, 0, "reply is not JSON (%s): %s", err, line);
	free(line);
	return true;
}

bool reply_ok(const struct json *r)
{
	bool ok = false;
	json_bool(json_get(r, "ok"), &ok);
	return ok;
}

/* The server closed: EOF, or ECONNRESET when it closed with our bytes
 * unread (Linux reports that on Unix sockets). */
bool at_eof(int fd)
{
	char c;
	ssize_t n;
	do
		n = recv(fd, &c, 1, 0);
	while (n < 0 && errno == EINTR);
	return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* ---- sockets and processes ------------------------------------------------------ */

/* A pid that is not running: a child that has exited and been reaped. */
pid_t dead_pid(void)
{
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	return dead;
}

/* A socket bound at path and listening. */
int listen_at(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 4), 0);
	return fd;
}

/* ---- a fake server ------------------------------------------------------------ */

static void *fake_seq_server(void *arg)
{
	struct fake_seq *f = arg;
	int c = accept(f->fd, NULL, NULL);
	for (int i = 0; c >= 0 && f->replies[i] && i < 4; i++) {
		char *line = read_line(c);
		if (!line)
			break;
		snprintf(f->got[i], sizeof(f->got[i]), "%s", line);
		free(line);
		ssize_t w = send(c, f->replies[i], strlen(f->replies[i]), MSG_NOSIGNAL);
		(void)w;
	}
	if (c >= 0)
		close(c);
	return NULL;
}

void ask_fake(const char *path, const char *const *replies, char *const argv[], struct run *r,
	      struct fake_seq *f)
{
	unlink(path);
	*f = (struct fake_seq){.fd = listen_at(path), .replies = replies};
	pthread_t t;
	pthread_create(&t, NULL, fake_seq_server, f);
	run(argv, r);
	shutdown(f->fd, SHUT_RDWR);
	pthread_join(t, NULL);
	close(f->fd);
}

/* ---- random numbers, the trace -------------------------------------------------- */

static uint32_t rng_state = 12345;
uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 17;
	rng_state ^= rng_state << 5;
	return rng_state;
}

size_t count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	size_t n = 0;
	int c;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

bool trace_rec_parse(const char *line, struct trace_rec *r)
{
	return sscanf(line, "%u,%u:%u:%u.%u,%31[a-z ],0x%llx,%llu,0x%llx", &r->tid, &r->hh, &r->mm,
		      &r->ss, &r->us, r->action, &r->ptr, &r->size, &r->stream) == 9;
}

void *produce(void *arg)
{
	struct producer *p = arg;
	for (int i = 0; i < p->events; i++) {
		CUdeviceptr va = ((CUdeviceptr)(p->id + 1) << 32) + (CUdeviceptr)i * 4096;
		vpmm_trace_event(i % 2 ? VPMM_TRACE_FREE : VPMM_TRACE_ALLOCATE, i % 2 ? va - 4096 : va,
				 4096, (CUstream)(uintptr_t)p->id);
	}
	return NULL;
}

