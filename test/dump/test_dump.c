/* test_dump.c — the vpmm-dump suite, on the host driver without a GPU: this
 * program is the "host" (a pool plus the socket server of shim/server.c, and
 * the trace recorder of shim/trace.c, compiled in: no shim) and runs the
 * built vpmm-dump, vpmm-replay and python3 against itself; one test runs an
 * unmodified program under LD_PRELOAD=libvpmm.so with the shim suite's
 * stand-in driver instead.
 *
 * Covered: the socket's place and permissions, listing, the JSON document
 * against the pool's own view, the text and map output, refusing another
 * uid, 10^5 hostile requests while allocation latency stays bounded, the
 * PyTorch snapshot in Python's pickle, trace recording replayed to the same
 * peak, protocol errors, hooks, stale sockets and forks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver_host.h"
#include "dump_test.h"
#include "json.h"
#include "protocol.h"
#include "server.h"
#include "snapshot.h"
#include "trace.h"
#include "vpmm.h"
#include "vpmm/version.h"

/* ---- the host: a pool, its server ---------------------------------------- */

static size_t one_pool(vpmm_pool **out, size_t cap, void *arg)
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
static CUdeviceptr make_all_kinds(struct host *h, CUstream s, CUdeviceptr live_out[2])
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

/* ---- the socket ---------------------------------------------------------------- */

Test(dump, default_socket_is_private_and_listed)
{
	struct host h;
	host_open(&h, "", 0, 256);
	char expect[256];
	snprintf(expect, sizeof(expect), "%s/vpmm/%ld.sock", h.dir, (long)getpid());
	cr_assert_str_eq(h.sock, expect);
	struct stat st;
	char dir[128];
	snprintf(dir, sizeof(dir), "%s/vpmm", h.dir);
	cr_assert_eq(lstat(dir, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0700, "directory mode %o", st.st_mode & 0777);
	cr_assert_eq(lstat(h.sock, &st), 0);
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(st.st_mode & 0777, 0600, "socket mode %o", st.st_mode & 0777);

	CUdeviceptr live[2];
	make_all_kinds(&h, 0, live);
	struct vpmm_stats s;
	vpmm_pool_stats(h.pool, &s);

	struct run r;
	run((char *[]){ VPMM_DUMP, NULL }, &r);
	cr_assert_eq(r.status, 0, "vpmm-dump: %d %s", r.status, r.err);
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld ", (long)getpid());
	cr_assert_not_null(strstr(r.out, pid), "pid missing from the list:\n%s", r.out);
	char comm[64] = "";
	FILE *cf = fopen("/proc/self/comm", "r");
	cr_assert_not_null(cf);
	cr_assert_not_null(fgets(comm, sizeof(comm), cf));
	fclose(cf);
	comm[strcspn(comm, "\n")] = '\0';
	cr_assert_not_null(strstr(r.out, comm), "command %s missing:\n%s", comm, r.out);
	cr_assert_not_null(strstr(r.out, h.sock), "socket missing:\n%s", r.out);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, "--json", NULL }, &r);
	cr_assert_eq(r.status, 0, "vpmm-dump --json: %s", r.err);
	struct json doc;
	char err[128];
	cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s", err);
	const struct json *procs = json_get(&doc, "processes");
	cr_assert(procs && procs->type == JSON_ARRAY && procs->n >= 1);
	bool found = false;
	for (size_t i = 0; i < procs->n; i++) {
		int64_t p = 0;
		uint64_t mapped = 0, l = 0;
		json_i64(json_get(&procs->items[i], "pid"), &p);
		if (p != getpid())
			continue;
		found = true;
		cr_assert(json_u64(json_get(&procs->items[i], "mapped"), &mapped));
		cr_assert(json_u64(json_get(&procs->items[i], "live"), &l));
		cr_assert_eq(mapped, s.mapped);
		cr_assert_eq(l, s.live);
		cr_assert_eq(l, 4 * PAGE);
	}
	cr_assert(found, "pid missing from the JSON list: %s", r.out);
	json_free(&doc);
	run_free(&r);
	host_close(&h);
}

/* A pid that is not running: a child that has exited and been reaped. */
static pid_t dead_pid(void)
{
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	return dead;
}

static int listen_at(const char *path);

Test(dump, a_starting_server_sweeps_stale_sockets)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	setenv("XDG_RUNTIME_DIR", dir, 1);
	char sub[128], stale[160], alive[160], file[160];
	snprintf(sub, sizeof(sub), "%s/vpmm", dir);
	cr_assert_eq(mkdir(sub, 0700), 0);
	pid_t dead = dead_pid();
	snprintf(stale, sizeof(stale), "%s/%ld.sock", sub, (long)dead);
	close(listen_at(stale)); /* bound, nobody listening */
	snprintf(alive, sizeof(alive), "%s/%ld.sock", sub, (long)getppid());
	close(listen_at(alive)); /* stale too, but its pid runs: left alone */
	pid_t dead2 = dead_pid();
	snprintf(file, sizeof(file), "%s/%ld.sock", sub, (long)dead2);
	int fd = open(file, O_CREAT | O_WRONLY, 0600); /* not a socket: not ours to remove */
	cr_assert_geq(fd, 0);
	close(fd);

	struct host h;
	memset(&h, 0, sizeof(h));
	host_pool(&h, 64);
	struct vpmm_server_config sc = { .pools = one_pool, .arg = &h };
	cr_assert_eq(vpmm_server_start(&sc), 0);
	cr_assert_neq(access(stale, F_OK), 0, "the stale socket of a gone process stayed");
	cr_assert_eq(access(alive, F_OK), 0, "removed the socket of a running pid");
	cr_assert_eq(access(file, F_OK), 0, "removed a file that is not a socket");
	vpmm_server_stop();
	vpmm_pool_destroy(h.pool);
	h.drv->destroy(h.drv);
	remove_dir(dir);
}

Test(dump, refuses_a_directory_that_is_not_private)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	setenv("XDG_RUNTIME_DIR", dir, 1);
	char sub[128];
	snprintf(sub, sizeof(sub), "%s/vpmm", dir);
	cr_assert_eq(mkdir(sub, 0755), 0);
	cr_assert_eq(chmod(sub, 0755), 0);
	struct host h;
	memset(&h, 0, sizeof(h));
	host_pool(&h, 64);
	struct vpmm_server_config sc = { .pools = one_pool, .arg = &h };
	cr_assert_eq(vpmm_server_start(&sc), -EPERM, "served from a 0755 directory");
	cr_assert_str_eq(vpmm_server_socket(), "");
	if (geteuid() == 0) { /* owned by someone else, even if 0700 */
		cr_assert_eq(chmod(sub, 0700), 0);
		cr_assert_eq(chown(sub, NOBODY, NOBODY), 0);
		cr_assert_eq(vpmm_server_start(&sc), -EPERM, "served from nobody's directory");
	}
	cr_assert_eq(chmod(sub, 0700), 0);
	cr_assert_eq(chown(sub, geteuid(), getegid()), 0);
	cr_assert_eq(vpmm_server_start(&sc), 0);
	vpmm_server_stop();

	struct vpmm_server_config off = { .socket = "off", .pools = one_pool, .arg = &h };
	cr_assert_eq(vpmm_server_start(&off), 1);
	cr_assert_str_eq(vpmm_server_socket(), "");

	/* A file that is not a socket is never removed. */
	char file[128];
	snprintf(file, sizeof(file), "%s/not-a-socket", dir);
	int fd = open(file, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	struct vpmm_server_config sf = { .socket = file, .pools = one_pool, .arg = &h };
	cr_assert_eq(vpmm_server_start(&sf), -EEXIST);
	cr_assert_eq(access(file, F_OK), 0);
	vpmm_pool_destroy(h.pool);
	h.drv->destroy(h.drv);
	remove_dir(dir);
}

/* ---- what vpmm-dump shows ------------------------------------------------------ */

struct expected {
	size_t nregions;
	uint64_t by_kind[4];
};

/* What the dump must show: the pool's own region map, where an allocation
 * the program freed may still be live (parked in the stream's cache for a
 * quick reuse): to the program, and so in the dump, it is free memory of the
 * stream that freed it. */
static void pool_truth(struct host *h, CUdeviceptr freed, CUstream s,
		       struct vpmm_region_info **regions, size_t *n, struct expected *e)
{
	*n = vpmm_pool_regions(h->pool, NULL, 0);
	*regions = calloc(*n + 1, sizeof(**regions));
	cr_assert_eq(vpmm_pool_regions(h->pool, *regions, *n), *n);
	memset(e, 0, sizeof(*e));
	e->nregions = *n;
	for (size_t i = 0; i < *n; i++) {
		struct vpmm_region_info *r = &(*regions)[i];
		if (r->va == freed && r->kind == VPMM_REGION_LIVE) {
			r->kind = VPMM_REGION_FREE;
			r->stream = s;
			r->settled = false;
		}
		e->by_kind[r->kind] += r->size;
	}
}

Test(dump, json_matches_the_pool)
{
	struct host h;
	host_open(&h, "explicit.sock", 0, 64);
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr live[2];
	CUdeviceptr freed = make_all_kinds(&h, s, live);

	struct vpmm_region_info *truth;
	size_t n;
	struct expected e;
	pool_truth(&h, freed, s, &truth, &n, &e);
	for (int k = 0; k < 4; k++)
		cr_assert_gt(e.by_kind[k], 0, "the scenario lacks kind %d", k);

	char pid[32], out[128];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	struct run r;
	run((char *[]){ VPMM_DUMP, "--json", "--socket", h.sock, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	struct json doc;
	char err[128];
	cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s", err);
	const struct json *pools = json_get(&doc, "pools");
	cr_assert(pools && pools->n == 1);
	const struct json *regions = json_get(&pools->items[0], "regions");
	cr_assert_eq(regions->n, n, "%zu regions in the dump, %zu in the pool", regions->n, n);
	for (size_t i = 0; i < n; i++) {
		const struct json *jr = &regions->items[i];
		uint64_t va = 0, size = 0;
		json_u64(json_get(jr, "va"), &va);
		json_u64(json_get(jr, "size"), &size);
		cr_assert_eq(va, truth[i].va, "region %zu va", i);
		cr_assert_eq(size, truth[i].size, "region %zu size", i);
		cr_assert_str_eq(json_str(json_get(jr, "kind")), vpmm_region_kind_name(truth[i].kind));
		if (truth[i].kind == VPMM_REGION_FREE) {
			uint64_t stream = 0;
			bool settled = true;
			cr_assert(json_u64(json_get(jr, "stream"), &stream));
			cr_assert(json_bool(json_get(jr, "settled"), &settled));
			cr_assert_eq(stream, (uint64_t)(uintptr_t)truth[i].stream);
			cr_assert_eq(settled, truth[i].settled);
		}
	}
	/* Every allocation we hold is a live region of its size, and nothing
	 * else is live. */
	size_t nlive = 0;
	for (size_t i = 0; i < n; i++) {
		if (truth[i].kind != VPMM_REGION_LIVE)
			continue;
		nlive++;
		cr_assert(truth[i].va == live[0] || truth[i].va == live[1]);
		cr_assert_eq(truth[i].size, (truth[i].va == live[0] ? 1 : 3) * PAGE);
	}
	cr_assert_eq(nlive, 2);
	json_free(&doc);

	/* The same document read by Python's json module. */
	if (!have_file(PYTHON3)) {
		run_free(&r);
		free(truth);
		host_close(&h);
		cr_skip("python3 not found at " PYTHON3 ": the independent JSON check did not run");
	}
	snprintf(out, sizeof(out), "%s/dump.json", h.dir);
	FILE *f = fopen(out, "w");
	cr_assert_not_null(f);
	fputs(r.out, f);
	fclose(f);
	run_free(&r);
	char live_s[32], nreg[32], kinds[256];
	snprintf(live_s, sizeof(live_s), "%zu", 4 * PAGE);
	snprintf(nreg, sizeof(nreg), "%zu", n);
	snprintf(kinds, sizeof(kinds), "live=%" PRIu64 ",free=%" PRIu64 ",hole=%" PRIu64
		 ",zombie=%" PRIu64, e.by_kind[0], e.by_kind[1], e.by_kind[2], e.by_kind[3]);
	run((char *[]){ PYTHON3, TEST_DIR "/check_dump.py", out, pid, live_s, nreg, kinds, NULL },
	    &r);
	cr_assert_eq(r.status, 0, "check_dump.py: %s%s", r.out, r.err);
	run_free(&r);
	free(truth);
	host_close(&h);
}

Test(dump, text_and_map_use_the_spec_symbols)
{
	struct host h;
	host_open(&h, "", 0, 64);
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr live[2];
	make_all_kinds(&h, s, live);
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());

	struct run r;
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	/* [~2][1][3][-2][*56] in 64K pages: sizes are written in K/M/G */
	const char *want[] = { "[~128K]", "[64K]", "[192K]", "[-128K]", "[*3584K]", "reserved",
			       "mapped", "live", "reusable", "holes", "zombies", "peak", "defrags",
			       "pages_remapped", "layout: [~128K][64K][192K][-128K][*3584K]" };
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert_not_null(strstr(r.out, want[i]), "\"%s\" missing from:\n%s", want[i], r.out);
	char stream[64];
	snprintf(stream, sizeof(stream), "stream 0x%" PRIxPTR, (uintptr_t)s);
	cr_assert_not_null(strstr(r.out, stream), "the free region's %s missing:\n%s", stream,
			   r.out);
	/* ascending VA */
	const char *p1 = strstr(r.out, "[~128K] "), *p2 = strstr(r.out, "[*3584K] ");
	cr_assert(p1 && p2 && p1 < p2);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, pid, "--map", "--color", "never", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	/* 8 used pages, one cell each: ~~#+###--  */
	cr_assert_not_null(strstr(r.out, "|~~####--|"), "map:\n%s", r.out);
	cr_assert_null(strstr(r.out, "\033["), "colors without a terminal");
	run_free(&r);
	run((char *[]){ VPMM_DUMP, pid, "--map", "--color", "always", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\033[42;30m#"), "no colored live cell:\n%s", r.out);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, pid, "--watch", "0.1", "--count", "3", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	int shown = 0;
	for (const char *p = r.out; (p = strstr(p, "layout:")); p++)
		shown++;
	cr_assert_eq(shown, 3, "--watch --count 3 drew %d times", shown);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, "--help", NULL }, &r);
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "--torch-snapshot"));
	run_free(&r);
	host_close(&h);
}

/* ---- refusals ------------------------------------------------------------------- */

/* In a child running as nobody: connect to `path`; report what happened as
 * the exit status: 0 connected and got the permission error then EOF,
 * 1 connect refused by the filesystem (EACCES), 2 anything else. */
static int as_nobody_connect(const char *path)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
			_exit(3);
		int fd = dial(path);
		if (fd == -EACCES)
			_exit(1);
		if (fd < 0)
			_exit(2);
		const char *req = "vpmm 1 map\n";
		ssize_t w = send(fd, req, strlen(req), MSG_NOSIGNAL);
		(void)w;
		char *line = read_line(fd);
		bool denied = line && strstr(line, "\"ok\":false") &&
			      strstr(line, "permission denied") && !strstr(line, "regions");
		bool eof = at_eof(fd);
		_exit(denied && eof ? 0 : 2);
	}
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

Test(dump, another_uid_is_refused)
{
	if (geteuid() != 0)
		cr_skip("needs root to act as another uid (CI runs as root)");
	struct host h;
	host_open(&h, "", 0, 64);
	alloc(&h, 1, 0);
	/* Through the filesystem: the directory is 0700 and the socket 0600. */
	cr_assert_eq(as_nobody_connect(h.sock), 1, "nobody reached a private socket");
	/* Past a careless chmod, the peer check still refuses. */
	char dir[128];
	snprintf(dir, sizeof(dir), "%s/vpmm", h.dir);
	cr_assert_eq(chmod(h.dir, 0755), 0);
	cr_assert_eq(chmod(dir, 0777), 0);
	cr_assert_eq(chmod(h.sock, 0777), 0);
	cr_assert_eq(as_nobody_connect(h.sock), 0, "nobody was served, or not told why");
	/* and vpmm-dump, run by nobody (from a copy nobody may execute), says
	 * so and fails */
	char copy[160], cmd[400];
	snprintf(copy, sizeof(copy), "%s/vpmm-dump", h.dir);
	snprintf(cmd, sizeof(cmd), "cp %s %s && chmod 0755 %s", VPMM_DUMP, copy, copy);
	cr_assert_eq(system(cmd), 0);
	struct run r;
	run_as((char *[]){ copy, "--socket", h.sock, NULL }, NOBODY, &r);
	cr_assert_eq(r.status, 4, "vpmm-dump as nobody: status %d, %s", r.status, r.err);
	cr_assert_not_null(strstr(r.err, "permission denied"), "%s", r.err);
	run_free(&r);
	/* the owner is still served */
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json rep;
	cr_assert(exchange(fd, "vpmm 1 ping\n", &rep));
	cr_assert(reply_ok(&rep));
	json_free(&rep);
	close(fd);
	host_close(&h);
}

/* ---- protocol ------------------------------------------------------------------- */

/* The version of the project's meson.build reaches the socket's replies and
 * both tools' --version. */
Test(dump, version_is_the_projects)
{
	struct host h;
	host_open(&h, "v.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 version\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "library")), VPMM_VERSION);
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 config\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "library")), VPMM_VERSION);
	json_free(&r);
	close(fd);
	host_close(&h);

	char want[128];
	struct run run_out;
	run((char *[]){ VPMM_DUMP, "--version", NULL }, &run_out);
	snprintf(want, sizeof(want), "vpmm-dump %s (socket protocol %d)\n", VPMM_VERSION,
		 VPMM_PROTOCOL);
	cr_assert_eq(run_out.status, 0, "%s", run_out.err);
	cr_assert_str_eq(run_out.out, want);
	run_free(&run_out);
	run((char *[]){ VPMM_REPLAY, "--version", NULL }, &run_out);
	snprintf(want, sizeof(want), "vpmm-replay %s\n", VPMM_VERSION);
	cr_assert_eq(run_out.status, 0, "%s", run_out.err);
	cr_assert_str_eq(run_out.out, want);
	run_free(&run_out);
}

Test(dump, protocol_errors_are_answered)
{
	struct host h;
	host_open(&h, "p.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;

	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	int64_t v = 0, pid = 0;
	cr_assert(json_i64(json_get(&r, "protocol"), &v));
	cr_assert_eq(v, VPMM_PROTOCOL);
	cr_assert(json_i64(json_get(&r, "pid"), &pid));
	cr_assert_eq(pid, getpid());
	json_free(&r);

	/* malformed requests: an error each, the connection stays usable */
	const char *bad[] = { "hello\n", "vpmm\n", "vpmm x map\n", "vpmm 1\n", "vpmm 1 nosuch\n",
			      "vpmm 1 map\x01\n", "\xff\xfe\n", "\n", "vpmm -1 map\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert(exchange(fd, bad[i], &r), "no reply to bad request %zu", i);
		cr_assert_not(reply_ok(&r), "bad request %zu accepted", i);
		cr_assert_not_null(json_str(json_get(&r, "error")));
		json_free(&r);
	}
	cr_assert(exchange(fd, "vpmm 1 stats\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	/* pipelined */
	const char *three = "vpmm 1 ping\nvpmm 1 version\nvpmm 1 help\n";
	cr_assert(send_all(fd, three, strlen(three)));
	for (int i = 0; i < 3; i++) {
		char *line = read_line(fd);
		cr_assert_not_null(line);
		cr_assert_not_null(strstr(line, "\"ok\":true"), "%s", line);
		if (i == 2)
			cr_assert(strstr(line, "trim") && strstr(line, "trace"), "%s", line);
		free(line);
	}
	/* hooks: trim has none here; trace is wired to trace.c */
	cr_assert(exchange(fd, "vpmm 1 trim 1M\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "unsupported"));
	json_free(&r);
	char req[256], path[128];
	snprintf(path, sizeof(path), "%s/t.csv", h.dir);
	snprintf(req, sizeof(req), "vpmm 1 trace start %s\n", path);
	cr_assert(exchange(fd, req, &r));
	cr_assert(reply_ok(&r), "trace start refused");
	bool active = false;
	cr_assert(json_bool(json_get(&r, "active"), &active) && active);
	cr_assert_str_eq(json_str(json_get(&r, "path")), path);
	json_free(&r);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x1000, 10, 0);
	cr_assert(exchange(fd, "vpmm 1 trace stop\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 config\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "socket")), h.sock);
	json_free(&r);

	/* a version we do not speak: error, then the connection closes */
	cr_assert(exchange(fd, "vpmm 2 map\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "protocol version 2"));
	json_free(&r);
	cr_assert(at_eof(fd));
	close(fd);

	/* too long: error, then closed */
	fd = dial(h.sock);
	char big[VPMM_REQUEST_MAX + 100];
	memset(big, 'a', sizeof(big));
	cr_assert(send_all(fd, big, sizeof(big)));
	char *line = read_line(fd);
	cr_assert_not_null(line);
	cr_assert_not_null(strstr(line, "too long"), "%s", line);
	free(line);
	cr_assert(at_eof(fd));
	close(fd);

	/* silent: closed after the timeout, and others are served meanwhile */
	int quiet = dial(h.sock);
	fd = dial(h.sock);
	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	close(fd);
	cr_assert(at_eof(quiet), "a silent client was never dropped");
	close(quiet);
	host_close(&h);
}

/* `echo "vpmm 1 ping" | socat - UNIX-CONNECT:...`: the client shuts its
 * writing side down before it reads. Every complete line is answered, in
 * order, a last line without its newline is dropped, then the server
 * closes. */
Test(dump, a_client_that_stops_writing_is_still_answered)
{
	struct host h;
	host_open(&h, "half.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	const char *req = "vpmm 1 ping\nvpmm 1 version\nvpmm 1 pi";
	cr_assert(send_all(fd, req, strlen(req)));
	cr_assert_eq(shutdown(fd, SHUT_WR), 0);
	for (int i = 0; i < 2; i++) {
		char *line = read_line(fd);
		cr_assert_not_null(line, "reply %d of 2 missing", i + 1);
		cr_assert_not_null(strstr(line, "\"ok\":true"), "%s", line);
		cr_assert_not_null(strstr(line, i ? "\"version\"" : "\"pid\""), "%s", line);
		free(line);
	}
	cr_assert(at_eof(fd), "more than the two replies, or not closed");
	close(fd);
	host_close(&h);
}

static int listen_at(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 4), 0);
	return fd;
}

/* A server that answers each request of one connection with the next of
 * `replies`, and keeps the requests it got. */
struct fake_seq {
	int fd;
	const char *const *replies;
	char got[4][256];
};

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

static void ask_fake(const char *path, const char *const *replies, char *const argv[],
		     struct run *r, struct fake_seq *f)
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

Test(dump, gone_stale_and_old_protocol_are_clear_failures)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	struct run r;

	/* a process that is gone */
	pid_t dead = dead_pid();
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)dead);
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 3, "gone: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "no process"), "%s", r.err);
	run_free(&r);

	/* a live process without a socket (ourselves, no server) */
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 3);
	cr_assert_not_null(strstr(r.err, "no vpmm socket"), "%s", r.err);
	run_free(&r);

	/* a stale socket: bound, nobody listening any more */
	char stale[128];
	snprintf(stale, sizeof(stale), "%s/vpmm", dir);
	cr_assert_eq(mkdir(stale, 0700), 0);
	snprintf(stale, sizeof(stale), "%s/vpmm/%ld.sock", dir, (long)dead);
	close(listen_at(stale));
	run((char *[]){ VPMM_DUMP, "--socket", stale, NULL }, &r);
	cr_assert_eq(r.status, 3, "stale: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "stale"), "%s", r.err);
	run_free(&r);
	setenv("XDG_RUNTIME_DIR", dir, 1);
	run((char *[]){ VPMM_DUMP, NULL }, &r);
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "stale (process gone)"), "%s", r.out);
	run_free(&r);
	cr_assert_eq(access(stale, F_OK), 0, "vpmm-dump removed a stale socket");

	/* another protocol version */
	char path[128];
	snprintf(path, sizeof(path), "%s/new.sock", dir);
	const char *const newer[] = {
		"{\"protocol\":2,\"ok\":false,\"error\":\"unsupported protocol version 1: "
		"this process speaks version 2\"}\n",
		NULL};
	struct fake_seq f;
	ask_fake(path, newer, (char *[]){ VPMM_DUMP, "--socket", path, NULL }, &r, &f);
	cr_assert_eq(r.status, 5, "old protocol: status %d (%s)", r.status, r.err);
	cr_assert_not_null(strstr(r.err, "protocol 2"), "%s", r.err);
	run_free(&r);

	/* garbage instead of a reply */
	const char *const garbage[] = {"this is not json\n", NULL};
	ask_fake(path, garbage, (char *[]){ VPMM_DUMP, "--socket", path, NULL }, &r, &f);
	cr_assert_eq(r.status, 1, "garbage reply: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "malformed reply"), "%s", r.err);
	run_free(&r);

	remove_dir(dir);
}

/* What a server sends is data, not trusted (review): a page size that
 * wraps the map's cell arithmetic, control characters for the terminal, a
 * --trim value longer than a request; and options with bad values. */
Test(dump, hostile_replies_and_bad_values)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/f.sock", dir);
	struct fake_seq f;
	struct run r;
	const char *map =
		"{\"protocol\":1,\"ok\":true,\"pid\":1,\"pools\":[{\"device\":0,"
		"\"config\":{\"page_size\":18446744073709551615},\"stats\":{\"live\":1,"
		"\"evil\\u001b[2J\":3},\"chunks\":[{\"index\":0,\"va\":0,\"size\":1048576}],"
		"\"regions\":[{\"va\":0,\"size\":65536,\"kind\":\"live\\u001b]0;x\\u0007\","
		"\"chunk\":0}]}]}\n";
	const char *config = "{\"protocol\":1,\"ok\":true,\"socket\":\"s\"}\n";
	const char *const replies[] = {map, config, NULL};
	const char *modes[] = {"--map", NULL};
	for (int i = 0; i < 2; i++) {
		ask_fake(path, replies,
			 i ? (char *[]){VPMM_DUMP, "--socket", path, NULL}
			   : (char *[]){VPMM_DUMP, "--socket", path, (char *)modes[0], NULL},
			 &r, &f);
		cr_expect(r.status == 0 || r.status == 1, "%s: status %d (a signal?)",
			  i ? "text" : "--map", r.status);
		cr_expect_null(strchr(r.out, '\033'), "%s: an escape reached the terminal: %s",
			       i ? "text" : "--map", r.out);
		cr_expect_null(strchr(r.out, '\007'), "%s: a bell: %s", i ? "text" : "--map", r.out);
		run_free(&r);
	}

	/* --trim sends the bytes it parsed, whatever their spelling */
	char keep[80];
	memset(keep, '0', 70);
	snprintf(keep + 70, sizeof(keep) - 70, "1G");
	const char *const trimmed[] = {"{\"protocol\":1,\"ok\":true,\"released\":0}\n", NULL};
	ask_fake(path, trimmed, (char *[]){VPMM_DUMP, "--trim", "--socket", path, keep, NULL}, &r,
		 &f);
	cr_expect_eq(r.status, 0, "%s", r.err);
	cr_expect_str_eq(f.got[0], "vpmm 1 trim 1073741824");
	run_free(&r);

	/* a reply with no protocol at all is malformed, not another version,
	 * and so is one whose protocol is no version (0, a string): only a
	 * real version asks for another vpmm-dump; a path that is not a
	 * socket is not a stale one */
	static const char *const no_version[] = {"{}\n", "{\"protocol\":0,\"ok\":true}\n",
						 "{\"protocol\":\"1\",\"ok\":true}\n"};
	for (size_t i = 0; i < sizeof(no_version) / sizeof(no_version[0]); i++) {
		const char *const reply[] = {no_version[i], NULL};
		ask_fake(path, reply, (char *[]){VPMM_DUMP, "--socket", path, NULL}, &r, &f);
		cr_expect_eq(r.status, 1, "%s: status %d: %s", no_version[i], r.status, r.err);
		cr_expect(strstr(r.err, "malformed reply (no protocol version)"), "%s: %s",
			  no_version[i], r.err);
		run_free(&r);
	}
	run((char *[]){VPMM_DUMP, "--socket", "/etc/passwd", NULL}, &r);
	cr_expect_eq(r.status, 1, "a regular file: status %d", r.status);
	cr_expect(strstr(r.err, "not a socket"), "%s", r.err);
	run_free(&r);

	/* bad option values: a clear message, no stray bytes */
	run((char *[]){VPMM_DUMP, "--count", " -1", "--watch", "1", "1", NULL}, &r);
	cr_expect_eq(r.status, 2, "--count \" -1\": status %d", r.status);
	run_free(&r);
	run((char *[]){VPMM_DUMP, "--watch", NULL}, &r);
	cr_expect_eq(r.status, 2);
	cr_expect(strstr(r.err, "--watch: unknown option, or a value missing"), "%s", r.err);
	for (const char *c = r.err; *c; c++)
		cr_expect((unsigned char)*c >= 0x20 || *c == '\n', "a control byte in: %s", r.err);
	run_free(&r);

	remove_dir(dir);
}

/* A map reply of one pool, one chunk and one live page: enough for
 * --torch-snapshot, whose trace then comes from --trace-csv alone. */
static const char one_page_map[] =
	"{\"protocol\":1,\"ok\":true,\"pid\":1,\"pools\":[{\"device\":0,"
	"\"config\":{\"page_size\":65536},\"stats\":{\"live\":65536,\"mapped\":65536},"
	"\"chunks\":[{\"index\":0,\"va\":0,\"size\":1048576}],"
	"\"regions\":[{\"va\":0,\"size\":65536,\"kind\":\"live\",\"chunk\":0}]}]}\n";

/* The number in "..., N trace events" of vpmm-dump's --torch-snapshot line,
 * or -1 if that line is missing. */
static long trace_events_said(const char *err)
{
	const char *p = strstr(err, " trace events");
	if (!p)
		return -1;
	while (p > err && p[-1] >= '0' && p[-1] <= '9')
		p--;
	return strtol(p, NULL, 10);
}

/* A NUL byte makes a line malformed even when the bytes before it parse:
 * fgets and strlen would see a short valid line there. The line is
 * skipped and counted, and the lines around it are all kept (its newline
 * is not taken for the end of a longer line, eating the next one). */
Test(dump, trace_csv_lines_with_nul_bytes_are_skipped)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128], csv[128], snap[128];
	snprintf(path, sizeof(path), "%s/f.sock", dir);
	snprintf(csv, sizeof(csv), "%s/trace.csv", dir);
	snprintf(snap, sizeof(snap), "%s/snap.pickle", dir);
	static const char text[] =
		"Thread,Time,Action,Pointer,Size,Stream\n"
		"1,00:00:01.000001,allocate,0x10000,65536,0x0\n"
		"1,00:00:01.000002,allocate,0x20000,65536,0x0\0tail\n"
		"1,00:00:01.000003,free,0x10000,65536,0x0\n"
		"1,00:00:01.000004,allocate,0x30000,4096,0x0\n";
	FILE *f = fopen(csv, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(text, 1, sizeof(text) - 1, f), sizeof(text) - 1);
	/* Around it, the other lines the reader bounds: one too long to be a
	 * trace line (skipped too), and a last line still being written (no
	 * newline yet: neither an event nor malformed). */
	fprintf(f, "1,00:00:01.000005,allocate,0x40000,%0600d,0x0\n", 7);
	fputs("1,00:00:01.000006,allocate,0x50000,4096,0x0\n", f);
	fputs("1,00:00:01.000007,allocate,0x60000,4096,0x", f);
	cr_assert_eq(fclose(f), 0);

	const char *const replies[] = {one_page_map, "{\"protocol\":1,\"ok\":true}\n", NULL};
	struct fake_seq fs;
	struct run r;
	ask_fake(path, replies,
		 (char *[]){VPMM_DUMP, "--socket", path, "--torch-snapshot", snap, "--trace-csv",
			    csv, NULL},
		 &r, &fs);
	cr_expect_eq(r.status, 0, "status %d: %s", r.status, r.err);
	cr_expect_eq(trace_events_said(r.err), 4, "not the 4 valid events: %s", r.err);
	cr_expect(strstr(r.err, ": 2 malformed trace lines skipped"), "%s", r.err);
	if (have_file(PYTHON3)) {
		/* three allocations and a free (requested, completed): 5 entries */
		run_free(&r);
		run((char *[]){PYTHON3, TEST_DIR "/check_snapshot.py", snap, "65536", "65536", "5",
			       NULL},
		    &r);
		cr_expect_eq(r.status, 0, "check_snapshot.py: %s%s", r.out, r.err);
	}
	run_free(&r);

	remove_dir(dir);
}

/* --json is for programs: names come out exactly as the process gave them
 * (escaped, not altered); text is for a terminal: no control byte of a
 * name reaches it, while UTF-8 (a user's file names) is still shown. The
 * names: the command (/proc/PID/comm), the socket path, the reply's strings
 * and keys. */
Test(dump, json_keeps_names_exact_and_text_makes_them_printable)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/s\001\xc3\xa9.sock", dir);
	/* The reply's pid is ours: its comm is what vpmm-dump reads. */
	static const char comm[] = "vd\001\033\xc3\xa9x";
	char old_comm[16] = "";
	cr_assert_eq(prctl(PR_GET_NAME, old_comm), 0);
	cr_assert_eq(prctl(PR_SET_NAME, comm), 0);
	char map[1024];
	snprintf(map, sizeof(map),
		 "{\"protocol\":1,\"ok\":true,\"pid\":%ld,\"pools\":[{\"device\":0,"
		 "\"config\":{\"page_size\":65536},\"stats\":{\"live\":0,"
		 "\"evil\\u0001\xc3\xa9\":3},\"chunks\":[],\"regions\":[]}]}\n",
		 (long)getpid());
	const char *config = "{\"protocol\":1,\"ok\":true,\"trace\":\"/t/\\u001b]0;x\\u0007"
			     "\xc3\xa9.csv\"}\n";
	const char *const replies[] = {map, config, NULL};
	struct fake_seq fs;
	struct run r;

	ask_fake(path, replies, (char *[]){VPMM_DUMP, "--socket", path, "--json", NULL}, &r, &fs);
	cr_expect_eq(r.status, 0, "--json: status %d: %s", r.status, r.err);
	size_t len = strlen(r.out);
	cr_expect(len && r.out[len - 1] == '\n', "--json: not one line: %s", r.out);
	for (size_t i = 0; i + 1 < len; i++)
		cr_expect((unsigned char)r.out[i] >= 0x20 && r.out[i] != 0x7f,
			  "--json: a raw control byte 0x%02x at %zu (not escaped)",
			  (unsigned char)r.out[i], i);
	struct json doc;
	char perr[128];
	cr_assert_eq(json_parse(r.out, len ? len - 1 : 0, &doc, perr, sizeof(perr)), 0,
		     "--json: not JSON (%s): %s", perr, r.out);
	const char *got = json_str(json_get(&doc, "command"));
	cr_expect(got && !strcmp(got, comm), "--json: command altered: %s", r.out);
	got = json_str(json_get(&doc, "socket"));
	cr_expect(got && !strcmp(got, path), "--json: socket altered: %s", r.out);
	got = json_str(json_get(json_get(&doc, "process"), "trace"));
	cr_expect(got && !strcmp(got, "/t/\033]0;x\007\xc3\xa9.csv"), "--json: trace altered: %s",
		  r.out);
	const struct json *pools = json_get(&doc, "pools");
	cr_assert(pools && pools->type == JSON_ARRAY && pools->n == 1, "%s", r.out);
	const struct json *stats = json_get(&pools->items[0], "stats");
	cr_expect(json_get(stats, "evil\001\xc3\xa9") != NULL, "--json: stats key altered: %s",
		  r.out);
	json_free(&doc);
	run_free(&r);

	ask_fake(path, replies, (char *[]){VPMM_DUMP, "--socket", path, NULL}, &r, &fs);
	cr_expect_eq(r.status, 0, "text: status %d: %s", r.status, r.err);
	for (const char *c = r.out; *c; c++)
		cr_expect(((unsigned char)*c >= 0x20 && *c != 0x7f) || *c == '\n',
			  "text: a control byte 0x%02x at %td: %s", (unsigned char)*c, c - r.out,
			  r.out);
	cr_expect(strstr(r.out, "\xc3\xa9.sock"), "text: the socket's UTF-8 name is lost: %s",
		  r.out);
	cr_expect(strstr(r.out, "\xc3\xa9x"), "text: the command's UTF-8 is lost: %s", r.out);
	run_free(&r);

	cr_assert_eq(prctl(PR_SET_NAME, old_comm), 0);
	remove_dir(dir);
}

/* ---- hostile clients ------------------------------------------------------------ */

#define FLOOD_REQUESTS 100000

/* A buffered line reader: replies of the flood are read in bulk. */
struct reader {
	int fd;
	char buf[1 << 16];
	size_t off, len;
};

/* true: a whole line was consumed (its start copied into `head`). */
static bool next_line(struct reader *r, char *head, size_t n)
{
	size_t h = 0;
	for (;;) {
		if (r->off == r->len) {
			ssize_t got;
			do
				got = recv(r->fd, r->buf, sizeof(r->buf), 0);
			while (got < 0 && errno == EINTR);
			if (got <= 0)
				return false;
			r->off = 0;
			r->len = (size_t)got;
		}
		char *nl = memchr(r->buf + r->off, '\n', r->len - r->off);
		size_t take = nl ? (size_t)(nl - (r->buf + r->off)) : r->len - r->off;
		size_t copy = take < n - 1 - h ? take : n - 1 - h;
		memcpy(head + h, r->buf + r->off, copy);
		h += copy;
		head[h] = '\0';
		r->off += take;
		if (nl) {
			r->off++;
			return true;
		}
	}
}

static uint32_t rng_state = 12345;
static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 17;
	rng_state ^= rng_state << 5;
	return rng_state;
}

/* The flooder (a child process): FLOOD_REQUESTS requests of every bad kind.
 * Exits 0 if every request that must be answered was, 1 otherwise. */
static void flood(const char *path)
{
	long sent = 0, unanswered = 0, busy = 0, failed_dials = 0;
	int stuck[6] = { -1, -1, -1, -1, -1, -1 };
	static struct reader rd;
	char head[256];
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
	if (getppid() == 1)
		_exit(1);
	while (sent < FLOOD_REQUESTS) {
		/* a few silent connections held at all times */
		int si = (int)(rnd() % 6);
		if (stuck[si] >= 0)
			close(stuck[si]);
		stuck[si] = dial(path);

		int fd = dial(path);
		if (fd < 0) {
			if (++failed_dials > 100)
				break; /* the server is gone: report, don't spin */
			unanswered++;
			sent++;
			continue;
		}
		rd.fd = fd;
		rd.off = rd.len = 0;
		uint32_t kind = rnd() % 8;
		char buf[VPMM_REQUEST_MAX * 2];
		if (kind <= 3) { /* 100 pipelined lines, a mix of good and bad */
			size_t len = 0;
			int lines = 100;
			for (int i = 0; i < lines; i++) {
				static const char *const reqs[] = {
					"vpmm 1 ping\n", "vpmm 1 stats\n", "vpmm 1 map\n",
					"vpmm 1 nosuch\n", "junk junk\n", "vpmm 1 trace bogus\n",
					"vpmm 1 config\n",
				};
				if (rnd() % 4 == 0) { /* random bytes, then a newline */
					size_t n = 1 + rnd() % 60;
					for (size_t k = 0; k < n; k++) {
						char ch = (char)(rnd() & 0xff);
						buf[len++] = ch == '\n' ? 'x' : ch;
					}
					buf[len++] = '\n';
				} else {
					const char *q = reqs[rnd() % 7];
					memcpy(buf + len, q, strlen(q));
					len += strlen(q);
				}
			}
			if (!send_all(fd, buf, len)) {
				/* A server at its client limit refuses at once and
				 * closes, maybe before the batch is all sent: the
				 * refusal is still there to read. */
				if (next_line(&rd, head, sizeof(head)) && strstr(head, "busy"))
					busy++;
				else
					unanswered += lines;
			} else {
				for (int i = 0; i < lines; i++) {
					if (!next_line(&rd, head, sizeof(head))) {
						unanswered += lines - i;
						break;
					}
					bool refused = i == 0 && strstr(head, "busy");
					if (refused)
						busy++; /* turned away whole: fine */
					else if (strncmp(head, "{\"protocol\":1,", 14) != 0)
						unanswered++;
					if (refused)
						break;
				}
			}
			sent += lines;
		} else if (kind == 4) { /* oversized */
			memset(buf, 'A' + (int)(rnd() % 26), sizeof(buf));
			send_all(fd, buf, VPMM_REQUEST_MAX + 1 + rnd() % VPMM_REQUEST_MAX);
			if (!next_line(&rd, head, sizeof(head)) ||
			    (!strstr(head, "too long") && !strstr(head, "busy")))
				unanswered++;
			sent++;
		} else if (kind == 5) { /* truncated: part of a line, then gone */
			const char *q = "vpmm 1 map\n";
			send_all(fd, q, 1 + rnd() % (strlen(q) - 1));
			sent++;
		} else if (kind == 6) { /* never reads its replies */
			for (int i = 0; i < 50; i++)
				send(fd, "vpmm 1 map\n", 11, MSG_NOSIGNAL | MSG_DONTWAIT);
			sent += 50;
		} else { /* wrong version: answered, then closed */
			const char *q = "vpmm 7 map\n";
			send_all(fd, q, strlen(q));
			if (!next_line(&rd, head, sizeof(head)) ||
			    (!strstr(head, "protocol version 7") && !strstr(head, "busy")))
				unanswered++;
			sent++;
		}
		close(fd);
	}
	for (int i = 0; i < 6; i++)
		if (stuck[i] >= 0)
			close(stuck[i]);
	fprintf(stderr, "flood: %ld requests, %ld unanswered, %ld busy\n", sent, unanswered, busy);
	_exit(unanswered == 0 && sent >= FLOOD_REQUESTS ? 0 : 1);
}

static uint64_t ns_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

Test(dump, hostile_clients_never_stall_allocations, .timeout = 240)
{
	struct host h;
	/* Clients silent or not reading for 1 s are dropped: long enough for a
	 * flooder that a loaded machine stalls a while, short enough that the
	 * silent ones it keeps open are cycled out during the test. */
	host_open(&h, "flood.sock", 1000, 1 << 16);
	/* a pool with hundreds of regions: map replies of tens of KB */
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr keep[600];
	for (int i = 0; i < 600; i++)
		keep[i] = alloc(&h, 1, s);
	for (int i = 0; i < 600; i += 2)
		cr_assert_eq(vpmm_pool_free(h.pool, keep[i], s), 0);

	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0)
		flood(h.sock);

	uint64_t worst = 0, ops = 0;
	int st = 0;
	for (;;) {
		pid_t w = waitpid(child, &st, WNOHANG);
		if (w == child)
			break;
		for (int i = 0; i < 100; i++) {
			CUdeviceptr p;
			uint64_t t0 = ns_now();
			int rc = vpmm_pool_malloc(h.pool, PAGE, s, &p);
			uint64_t t1 = ns_now();
			cr_assert_eq(rc, 0);
			cr_assert_eq(vpmm_pool_free(h.pool, p, s), 0);
			uint64_t t2 = ns_now();
			if (t1 - t0 > worst)
				worst = t1 - t0;
			if (t2 - t1 > worst)
				worst = t2 - t1;
			ops += 2;
		}
		struct timespec nap = { 0, 1000000 };
		nanosleep(&nap, NULL);
	}
	cr_assert(WIFEXITED(st), "the flooder died of signal %d", WTERMSIG(st));
	cr_assert_eq(WEXITSTATUS(st), 0, "some well-formed requests got no reply");
	cr_log_info("allocation latency during the flood: worst %.3f ms over %" PRIu64 " ops",
		    (double)worst / 1e6, ops);
	cr_assert_gt(ops, 0);
	cr_assert_lt(worst, 50 * 1000000ull, "an allocation took %.1f ms during the flood",
		     (double)worst / 1e6);
	/* still serving, and it still answers correctly */
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 map\n", &r));
	cr_assert(reply_ok(&r));
	const struct json *pools = json_get(&r, "pools");
	struct vpmm_stats stats;
	vpmm_pool_stats(h.pool, &stats);
	cr_assert_eq(json_get(&pools->items[0], "regions")->n, stats.regions);
	json_free(&r);
	close(fd);
	host_close(&h);
}

/* ---- the PyTorch snapshot and the trace -------------------------------------- */

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

/* `trace start` on a path it cannot use answers an error and leaves the
 * trace already running alone; a FIFO, with or without a reader, is
 * refused at once instead of holding the server in open() (and the
 * program at exit, in its writer). */
Test(dump, a_bad_trace_start_keeps_the_running_trace)
{
	struct host h;
	host_open(&h, "tr.sock", 0, 64);
	char good[128], fifo[128], req[300];
	snprintf(good, sizeof(good), "%s/good.csv", h.dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", h.dir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	cr_assert_eq(vpmm_trace_open(good), 0);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x1000, 10, 0);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;
	const char *bad[] = {"/nonexistent-dir/x.csv", fifo, fifo, h.dir};
	const char *why[] = {"No such file", "not a regular file", "not a regular file",
			     "directory"};
	int reader = -1;
	for (int i = 0; i < 4; i++) {
		if (i == 2) /* the same FIFO, now with a reader that never reads */
			cr_assert_geq(reader = open(fifo, O_RDONLY | O_NONBLOCK), 0);
		snprintf(req, sizeof(req), "vpmm 1 trace start %s\n", bad[i]);
		cr_assert(exchange(fd, req, &r), "no reply to trace start %s", bad[i]);
		cr_assert_not(reply_ok(&r), "trace start %s accepted", bad[i]);
		const char *e = json_str(json_get(&r, "error"));
		cr_assert(e && strstr(e, why[i]), "trace start %s: %s", bad[i], e ? e : "-");
		json_free(&r);
		cr_assert(exchange(fd, "vpmm 1 trace status\n", &r));
		bool active = false;
		cr_assert(json_bool(json_get(&r, "active"), &active) && active,
			  "the running trace stopped after trace start %s", bad[i]);
		cr_assert_str_eq(json_str(json_get(&r, "path")), good);
		json_free(&r);
	}
	close(reader);
	vpmm_trace_event(VPMM_TRACE_FREE, 0x1000, 10, 0);

	/* A path in UTF-8 comes back as it is, not byte by byte escaped. */
	char named[160];
	snprintf(named, sizeof(named), "%s/tr-\xc3\xa9-\xe2\x82\xac.csv", h.dir);
	snprintf(req, sizeof(req), "vpmm 1 trace start %s\n", named);
	cr_assert(exchange(fd, req, &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "path")), named);
	json_free(&r);
	cr_assert_eq(vpmm_trace_close(), 0);
	cr_assert_eq(count_lines(good), 3, "the header and both events");
	close(fd);
	host_close(&h);
}

/* Starting the trace again on the file it writes, by another name (./ or
 * a linked directory): the old run's last events must not land past the
 * new header (review: they did, after a hole of NUL bytes). */
Test(dump, a_trace_restarted_on_its_own_file_starts_clean)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128], other[160], link[160], ldir[160];
	snprintf(path, sizeof(path), "%s/t.csv", dir);
	snprintf(other, sizeof(other), "%s/./t.csv", dir);
	snprintf(ldir, sizeof(ldir), "%s/l", dir);
	snprintf(link, sizeof(link), "%s/l/t.csv", dir);
	cr_assert_eq(symlink(dir, ldir), 0);
	const char *again[] = {other, link};
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(vpmm_trace_open(path), 0);
		for (int i = 0; i < 1000; i++)
			vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x1000 + (CUdeviceptr)i * 4096, 10, 0);
		cr_assert_eq(vpmm_trace_flush(), 0);
		for (int i = 0; i < 5; i++)
			vpmm_trace_event(VPMM_TRACE_FREE, 0x1000 + (CUdeviceptr)i * 4096, 10, 0);
		cr_assert_eq(vpmm_trace_open(again[k]), 0);
		vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x9000, 10, 0);
		cr_assert_eq(vpmm_trace_close(), 0);
		FILE *f = fopen(path, "rb");
		cr_assert_not_null(f);
		char buf[8192];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		cr_assert_eq(memchr(buf, '\0', n), NULL, "NUL bytes in the trace (%s)", again[k]);
		cr_assert_eq(count_lines(path), 2, "not the header and one event (%s)", again[k]);
	}
	remove_dir(dir);
}

Test(dump, torch_snapshot_loads_in_python)
{
	struct host h;
	host_open(&h, "", 0, 64);
	char trace[128];
	snprintf(trace, sizeof(trace), "%s/trace.csv", h.dir);
	cr_assert_eq(vpmm_trace_open(trace), 0);
	CUstream s = vpmm_host_stream_create(h.drv);
	/* traced the way the shim does it: every malloc and free */
	CUdeviceptr a = alloc(&h, 2, s);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, a, 2 * PAGE, s);
	CUdeviceptr b = alloc(&h, 1, s);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, b, PAGE, s);
	cr_assert_eq(vpmm_pool_free(h.pool, a, s), 0);
	vpmm_trace_event(VPMM_TRACE_FREE, a, 2 * PAGE, s);
	CUdeviceptr c = alloc(&h, 3, s);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, c, 3 * PAGE, s);
	CUdeviceptr d = alloc(&h, 2, s);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, d, 2 * PAGE, s);
	cr_assert_eq(vpmm_pool_free(h.pool, d, s), 0);
	vpmm_trace_event(VPMM_TRACE_FREE, d, 2 * PAGE, s);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE_FAILURE, 0, (size_t)1 << 40, s);
	/* 4 allocs + 2 frees (2 entries each) + 1 oom */
	const int entries = 4 + 2 * 2 + 1;

	struct vpmm_stats st;
	vpmm_pool_stats(h.pool, &st);
	char pid[32], snap[128];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	snprintf(snap, sizeof(snap), "%s/snap.pickle", h.dir);
	struct run r;
	/* the trace comes from the process itself (trace status/flush) */
	run((char *[]){ VPMM_DUMP, pid, "--torch-snapshot", snap, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "trace events"), "%s", r.err);
	run_free(&r);
	cr_assert_eq(vpmm_trace_close(), 0);
	cr_assert_eq(count_lines(trace), 1 + 7, "trace lines");

	if (!have_file(PYTHON3)) {
		host_close(&h);
		cr_skip("python3 not found at " PYTHON3 ": the pickle was not loaded");
	}
	char mapped[32], live[32], n[32];
	snprintf(mapped, sizeof(mapped), "%" PRIu64, st.mapped);
	snprintf(live, sizeof(live), "%" PRIu64, st.live);
	snprintf(n, sizeof(n), "%d", entries);
	run((char *[]){ PYTHON3, TEST_DIR "/check_snapshot.py", snap, mapped, live, n, NULL }, &r);
	cr_assert_eq(r.status, 0, "check_snapshot.py: %s%s", r.out, r.err);
	run_free(&r);
	/* with an explicit CSV, and without any trace */
	run((char *[]){ VPMM_DUMP, pid, "--torch-snapshot", snap, "--trace-csv", trace, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	run_free(&r);
	run((char *[]){ PYTHON3, TEST_DIR "/check_snapshot.py", snap, mapped, live, n, NULL }, &r);
	cr_assert_eq(r.status, 0, "check_snapshot.py (--trace-csv): %s%s", r.out, r.err);
	run_free(&r);
	run((char *[]){ VPMM_DUMP, pid, "--torch-snapshot", snap, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	run_free(&r);
	run((char *[]){ PYTHON3, TEST_DIR "/check_snapshot.py", snap, mapped, live, "0", NULL }, &r);
	cr_assert_eq(r.status, 0, "check_snapshot.py (no trace): %s%s", r.out, r.err);
	run_free(&r);
	host_close(&h);
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

Test(dump, trace_loses_nothing_under_threads)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/threads.csv", dir);
	cr_assert_eq(vpmm_trace_open(path), 0);
	enum { THREADS = 4, EACH = 50000 }; /* more than the ring holds */
	pthread_t t[THREADS];
	struct producer p[THREADS];
	for (int i = 0; i < THREADS; i++) {
		p[i] = (struct producer){ i, EACH };
		pthread_create(&t[i], NULL, produce, &p[i]);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	uint64_t events = 0;
	char got[256];
	cr_assert(vpmm_trace_status(got, sizeof(got), &events));
	cr_assert_str_eq(got, path);
	cr_assert_eq(events, THREADS * EACH);
	cr_assert_eq(vpmm_trace_close(), 0);
	cr_assert_not(vpmm_trace_status(NULL, 0, NULL));
	cr_assert_eq(count_lines(path), 1 + THREADS * EACH);
	/* every line well formed, each thread's events in its order */
	FILE *f = fopen(path, "r");
	char line[256];
	cr_assert_not_null(fgets(line, sizeof(line), f));
	cr_assert_str_eq(line, "Thread,Time,Action,Pointer,Size,Stream\n");
	unsigned long long last[THREADS] = { 0 };
	while (fgets(line, sizeof(line), f)) {
		unsigned tid, hh, mm, ss, us;
		char action[32];
		unsigned long long ptr, size, stream;
		int n = sscanf(line, "%u,%u:%u:%u.%u,%31[a-z ],0x%llx,%llu,0x%llx", &tid, &hh, &mm,
			       &ss, &us, action, &ptr, &size, &stream);
		cr_assert_eq(n, 9, "malformed line: %s", line);
		cr_assert(hh < 24 && mm < 60 && ss < 61 && us < 1000000);
		cr_assert_eq(size, 4096);
		cr_assert_lt(stream, THREADS);
		if (!strcmp(action, "allocate")) {
			cr_assert_gt(ptr, last[stream], "thread %llu out of order", stream);
			last[stream] = ptr;
		} else {
			cr_assert_str_eq(action, "free");
		}
	}
	fclose(f);
	remove_dir(dir);
}

Test(dump, trace_replays_to_the_same_peak)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	struct host h;
	memset(&h, 0, sizeof(h));
	host_pool(&h, 1 << 14);
	char path[128];
	snprintf(path, sizeof(path), "%s/replay.csv", dir);
	cr_assert_eq(vpmm_trace_open(path), 0);
	CUstream s[3] = { 0, vpmm_host_stream_create(h.drv), vpmm_host_stream_create(h.drv) };
	CUdeviceptr held[64] = { 0 };
	size_t sizes[64] = { 0 };
	for (int i = 0; i < 4000; i++) {
		int k = (int)(rnd() % 64);
		CUstream st = s[rnd() % 3];
		if (held[k]) {
			cr_assert_eq(vpmm_pool_free(h.pool, held[k], st), 0);
			vpmm_trace_event(VPMM_TRACE_FREE, held[k], sizes[k], st);
			held[k] = 0;
		} else {
			/* over a page: whole-page allocations, rounded; sub-page
			 * ones share slabs whose packing depends on timing */
			sizes[k] = PAGE + 1 + rnd() % (7 * PAGE);
			CUdeviceptr p;
			cr_assert_eq(vpmm_pool_malloc(h.pool, sizes[k], st, &p), 0);
			vpmm_trace_event(VPMM_TRACE_ALLOCATE, p, sizes[k], st);
			held[k] = p;
		}
		if (i % 16 == 0)
			vpmm_host_complete_all(h.drv);
	}
	cr_assert_eq(vpmm_trace_close(), 0);
	struct vpmm_stats st;
	vpmm_pool_stats(h.pool, &st);
	vpmm_pool_destroy(h.pool);
	h.drv->destroy(h.drv);

	if (!have_file(VPMM_REPLAY))
		cr_skip("vpmm-replay not built (" VPMM_REPLAY "): the replay was not checked");
	char page[32];
	snprintf(page, sizeof(page), "%zu", PAGE);
	struct run r;
	/* The recorded pool's settings (host_pool()), device and completion
	 * cadence: its caches' parked allocations count as live, so the peak
	 * is the same only where the replay parks the same ones. */
	run((char *[]){ VPMM_REPLAY, "--json", "--page-size", page, "--granularity", page,
			"--grain", page, "--handle-size", page, "--front", "16",
			"--complete-every", "16", "--capacity", "1T",
			"--event-interval-us", "0", path, NULL },
	    &r);
	cr_assert_eq(r.status, 0, "vpmm-replay: %s", r.err);
	struct json doc;
	char err[128];
	cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s: %s", err,
		     r.out);
	uint64_t peak = 0, ops = 0, unknown = 1;
	cr_assert(json_u64(json_get(&doc, "peak_live_bytes"), &peak));
	cr_assert(json_u64(json_get(&doc, "ops"), &ops));
	cr_assert(json_u64(json_get(&doc, "unknown_frees"), &unknown));
	cr_assert_eq(ops, 4000);
	cr_assert_eq(unknown, 0);
	cr_assert_eq(peak, st.live_peak, "replayed peak %" PRIu64 ", recorded run %" PRIu64, peak,
		     st.live_peak);
	json_free(&doc);
	run_free(&r);
	remove_dir(dir);
}

/* ---- fork --------------------------------------------------------------------- */

Test(dump, a_forked_child_leaves_the_parents_socket_alone)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* fork() in a process whose other threads may hold the sanitizer's
	 * allocator lock can hang the child (seen under load); the plain
	 * build runs this test. */
	cr_skip_test("sanitizer build: fork with threads running is covered by the plain build");
#endif
	struct host h;
	host_open(&h, "", 0, 64);
	pid_t c = fork();
	cr_assert_geq(c, 0);
	if (c == 0) /* no server here: the parent's is forgotten */
		_exit(vpmm_server_socket()[0] == '\0' ? 0 : 1);
	int st;
	waitpid(c, &st, 0);
	cr_assert_eq(WEXITSTATUS(st), 0, "the child kept the parent's server");
	int fd = dial(h.sock);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	int64_t pid = 0;
	json_i64(json_get(&r, "pid"), &pid);
	cr_assert_eq(pid, getpid());
	json_free(&r);
	close(fd);
	host_close(&h);
}

/* Exits for real (destructors), in a program of its own: see exit_prog.c. */
Test(dump, sockets_go_at_exit_and_a_childs_exit_spares_its_parents)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* fork() in a process whose other threads may hold the sanitizer's
	 * allocator lock can hang the child (seen under load); the plain
	 * build runs this test. */
	cr_skip_test("sanitizer build: fork with threads running is covered by the plain build");
#endif
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char xdg[128];
	snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", dir);
	int in[2], out[2];
	cr_assert_eq(pipe(in), 0);
	cr_assert_eq(pipe(out), 0);
	pid_t p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		execve(EXIT_PROG, (char *[]){ EXIT_PROG, NULL }, (char *[]){ xdg, NULL });
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	FILE *f = fdopen(out[0], "r");
	char mine[256] = "", child[256] = "", want[256];
	cr_assert_not_null(fgets(mine, sizeof(mine), f), "the program said nothing");
	cr_assert_not_null(fgets(child, sizeof(child), f), "the child said nothing");
	mine[strcspn(mine, "\n")] = '\0';
	child[strcspn(child, "\n")] = '\0';
	snprintf(want, sizeof(want), "%s/vpmm/%ld.sock", dir, (long)p);
	cr_assert_str_eq(mine, want);
	cr_assert_str_neq(child, mine);
	cr_assert_neq(access(child, F_OK), 0, "the child's socket outlived it");
	int fd = dial(mine);
	cr_assert_geq(fd, 0, "the child's exit took the parent's socket");
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	close(fd);
	close(in[1]);
	fclose(f);
	int st;
	waitpid(p, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit_prog: status %d", st);
	cr_assert_neq(access(mine, F_OK), 0, "the socket outlived its process");
	remove_dir(dir);
}

/* ---- hooks ------------------------------------------------------------------- */

static int trim_hook(uint64_t keep, uint64_t *released, void *arg)
{
	struct host *h = arg;
	long long n = vpmm_pool_trim(h->pool, keep);
	if (n < 0)
		return (int)n;
	*released = (uint64_t)n;
	return 0;
}

Test(dump, trim_request_goes_to_its_hook)
{
	struct host h;
	memset(&h, 0, sizeof(h));
	snprintf(h.dir, sizeof(h.dir), "/tmp/vpmm-dump-test-XXXXXX");
	cr_assert_not_null(mkdtemp(h.dir));
	host_pool(&h, 64);
	char path[128];
	snprintf(path, sizeof(path), "%s/trim.sock", h.dir);
	struct vpmm_server_config sc = { .socket = path, .pools = one_pool, .arg = &h,
					 .trim = trim_hook };
	cr_assert_eq(vpmm_server_start(&sc), 0);
	snprintf(h.sock, sizeof(h.sock), "%s", path);
	CUdeviceptr a = alloc(&h, 4, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_free(h.pool, a, VPMM_NO_STREAM), 0);
	struct vpmm_stats before, after;
	vpmm_pool_stats(h.pool, &before);
	cr_assert_gt(before.reusable, 0);

	int fd = dial(h.sock);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 trim 64x\n", &r));
	cr_assert_not(reply_ok(&r), "a bad size was taken");
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 trim\n", &r));
	cr_assert(reply_ok(&r), "trim refused");
	uint64_t released = 0;
	cr_assert(json_u64(json_get(&r, "released"), &released));
	json_free(&r);
	vpmm_pool_stats(h.pool, &after);
	cr_assert_eq(released, before.reusable, "released %" PRIu64 " of %" PRIu64, released,
		     before.reusable);
	cr_assert_eq(after.reusable, 0);
	cr_assert_eq(after.mapped, before.mapped - released);

	/* The same through the CLI: vpmm-dump --trim --socket PATH [KEEP]. */
	CUdeviceptr b = alloc(&h, 4, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_free(h.pool, b, VPMM_NO_STREAM), 0);
	vpmm_pool_stats(h.pool, &before);
	struct run cli;
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, NULL }, &cli);
	cr_assert_eq(cli.status, 0, "vpmm-dump --trim: %s", cli.err);
	char want[64];
	snprintf(want, sizeof(want), "released %" PRIu64 " bytes", before.reusable);
	cr_assert_not_null(strstr(cli.out, want), "%s", cli.out);
	run_free(&cli);
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, "lots", NULL }, &cli);
	cr_assert_eq(cli.status, 2, "a bad size was taken: %s", cli.out);
	cr_assert_not_null(strstr(cli.err, "lots"), "%s", cli.err);
	run_free(&cli);
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, "1G", NULL }, &cli);
	cr_assert_eq(cli.status, 0, "vpmm-dump --trim 1G: %s", cli.err);
	cr_assert_not_null(strstr(cli.out, "released 0 bytes"), "%s", cli.out);
	run_free(&cli);
	/* trace has no hooks here */
	cr_assert(exchange(fd, "vpmm 1 trace status\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "unsupported"));
	json_free(&r);
	close(fd);
	host_close(&h);
}

Test(dump, a_forked_child_does_not_truncate_the_parents_trace)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* fork() in a process whose other threads may hold the sanitizer's
	 * allocator lock can hang the child (seen under load); the plain
	 * build runs this test. */
	cr_skip_test("sanitizer build: fork with threads running is covered by the plain build");
#endif
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128], other[128], link[128], ldir[128], each[128], mine[128];
	snprintf(path, sizeof(path), "%s/parent.csv", dir);
	snprintf(other, sizeof(other), "%s/child.csv", dir);
	snprintf(ldir, sizeof(ldir), "%s/l", dir);
	snprintf(link, sizeof(link), "%s/l/parent.csv", dir);
	snprintf(each, sizeof(each), "%s/t-%%p.csv", dir);
	cr_assert_eq(symlink(dir, ldir), 0);
	cr_assert_eq(vpmm_trace_open(path), 0);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x10000, 100, 0);
	pid_t c = fork();
	if (c == 0) {
		/* Not tracing; the parent's file refused, by its name or
		 * another (the name a spawned worker would not know: the file
		 * lock tells); another file is fine, and so is %p. */
		int ok = !vpmm_trace_on() && vpmm_trace_open(path) == -EBUSY &&
			 vpmm_trace_open(link) == -EBUSY && vpmm_trace_open(each) == 0;
		vpmm_trace_event(VPMM_TRACE_FREE, 0x30000, 1, 0);
		ok = ok && vpmm_trace_open(other) == 0;
		vpmm_trace_event(VPMM_TRACE_FREE, 0x20000, 1, 0);
		ok = ok && vpmm_trace_close() == 0;
		_exit(ok ? 0 : 1);
	}
	int st;
	waitpid(c, &st, 0);
	cr_assert_eq(WEXITSTATUS(st), 0);
	vpmm_trace_event(VPMM_TRACE_FREE, 0x10000, 100, 0);
	cr_assert_eq(vpmm_trace_close(), 0);
	cr_assert_eq(count_lines(path), 3, "the parent's trace: header + its 2 events only");
	cr_assert_eq(count_lines(other), 2, "the child's trace: header + its event");
	snprintf(mine, sizeof(mine), "%s/t-%ld.csv", dir, (long)c);
	cr_assert_eq(count_lines(mine), 2, "%%p: the child's trace under its pid");
	remove_dir(dir);
}

/* ---- an unmodified program under LD_PRELOAD ------------------------------------ */

#ifdef PRELOAD_PROG
struct preloaded {
	pid_t pid;
	int in, out; /* its stdin (we hold it open) and stdout */
};

/* rel_socket: VPMM_SOCKET, a path relative to dir, where the program runs. */
static void preload_start(struct preloaded *p, const char *dir, const char *trace,
			  const char *rel_socket)
{
	char xdg[160], tr[200], so[160];
	snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", dir);
	snprintf(tr, sizeof(tr), "VPMM_TRACE=%s", trace);
	snprintf(so, sizeof(so), "VPMM_SOCKET=%s", rel_socket ? rel_socket : "");
	char *env[] = { "LD_LIBRARY_PATH=" FAKE_DIR, "LD_PRELOAD=" LIBVPMM, xdg, tr, so, NULL };
	int in[2], out[2];
	cr_assert_eq(pipe(in), 0);
	cr_assert_eq(pipe(out), 0);
	p->pid = fork();
	cr_assert_geq(p->pid, 0);
	if (p->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		if (rel_socket && chdir(dir) != 0)
			_exit(126);
		execve(PRELOAD_PROG, (char *[]){ PRELOAD_PROG, NULL }, env);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	p->in = in[1];
	p->out = out[0];
	char line[64] = "";
	ssize_t n = read(p->out, line, sizeof(line) - 1);
	cr_assert_gt(n, 0, "the program said nothing");
	line[n] = '\0';
	cr_assert_str_eq(line, "ready\n", "the program failed: %s", line);
}

static int preload_finish(struct preloaded *p)
{
	close(p->in);
	close(p->out);
	int st;
	waitpid(p->pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(dump, a_preloaded_program_is_listed_and_read)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* A sanitized libvpmm.so in LD_PRELOAD would need the sanitizer's
	 * runtime loaded before it; the plain build runs this test. */
	cr_skip_test("sanitizer build: LD_PRELOAD runs are covered by the plain build");
#endif
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	setenv("XDG_RUNTIME_DIR", dir, 1); /* where vpmm-dump looks, too */
	char trace[128], sock[160], snap[160];
	snprintf(trace, sizeof(trace), "%s/trace.csv", dir);
	snprintf(snap, sizeof(snap), "%s/snap.pickle", dir);
	struct preloaded p;
	preload_start(&p, dir, trace, NULL);
	snprintf(sock, sizeof(sock), "%s/vpmm/%ld.sock", dir, (long)p.pid);
	bool served = false;
	for (int i = 0; i < 100 && !served; i++) {
		served = access(sock, F_OK) == 0;
		if (!served)
			usleep(50000);
	}
	if (!served) {
		preload_finish(&p);
		cr_skip("libvpmm.so serves no socket: the server is not wired into the shim");
	}
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)p.pid);

	struct run r;
	run((char *[]){ VPMM_DUMP, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, sock), "not listed:\n%s", r.out);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, pid, "--json", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	struct json doc;
	char err[128];
	cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s", err);
	run_free(&r);
	const struct json *pools = json_get(&doc, "pools");
	cr_assert(pools && pools->n == 1, "expected the pool of device 0");
	const struct json *st = json_get(&pools->items[0], "stats");
	uint64_t live = 0, live_peak = 0, mapped = 0;
	cr_assert(json_u64(json_get(st, "live"), &live));
	cr_assert(json_u64(json_get(st, "live_peak"), &live_peak));
	cr_assert(json_u64(json_get(st, "mapped"), &mapped));
	cr_assert_eq(live, 6 * PAGE, "live %" PRIu64, live);
	cr_assert_eq(live_peak, 9 * PAGE, "live peak %" PRIu64, live_peak);
	const struct json *proc = json_get(&doc, "process");
	cr_assert_str_eq(json_str(json_get(proc, "trace")), trace);
	size_t nlive = 0;
	const struct json *regions = json_get(&pools->items[0], "regions");
	for (size_t i = 0; i < regions->n; i++)
		nlive += !strcmp(json_str(json_get(&regions->items[i], "kind")), "live");
	cr_assert_eq(nlive, 2, "the two held allocations");
	json_free(&doc);

	run((char *[]){ VPMM_DUMP, pid, "--torch-snapshot", snap, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	run_free(&r);
	if (have_file(PYTHON3)) {
		char m[32], l[32];
		snprintf(m, sizeof(m), "%" PRIu64, mapped);
		snprintf(l, sizeof(l), "%" PRIu64, live);
		/* 3 allocations, 1 free (2 entries) */
		run((char *[]){ PYTHON3, TEST_DIR "/check_snapshot.py", snap, m, l, "5", NULL }, &r);
		cr_assert_eq(r.status, 0, "check_snapshot.py: %s%s", r.out, r.err);
		run_free(&r);
	}

	cr_assert_eq(preload_finish(&p), 0, "the program failed under the shim");
	cr_assert_neq(access(sock, F_OK), 0, "the socket outlived its process");
	cr_assert_eq(count_lines(trace), 1 + 6, "trace: header, 3 allocations, 3 frees");
	if (have_file(VPMM_REPLAY)) {
		char page[32];
		snprintf(page, sizeof(page), "%zu", PAGE);
		run((char *[]){ VPMM_REPLAY, "--json", "--page-size", page, "--granularity", page,
				trace, NULL },
		    &r);
		cr_assert_eq(r.status, 0, "vpmm-replay: %s", r.err);
		cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s", err);
		uint64_t peak = 0;
		cr_assert(json_u64(json_get(&doc, "peak_live_bytes"), &peak));
		cr_assert_eq(peak, live_peak, "replayed peak %" PRIu64 ", the run's %" PRIu64, peak,
			     live_peak);
		json_free(&doc);
		run_free(&r);
	}
	remove_dir(dir);
}

/* VPMM_SOCKET relative to the program's directory: vpmm-dump PID finds it
 * from anywhere (it read only absolute values before). */
Test(dump, a_relative_socket_is_found)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("sanitizer build: LD_PRELOAD runs are covered by the plain build");
#endif
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char trace[128], sock[160], pid[32];
	snprintf(trace, sizeof(trace), "%s/trace.csv", dir);
	snprintf(sock, sizeof(sock), "%s/here.sock", dir);
	struct preloaded p;
	preload_start(&p, dir, trace, "here.sock");
	for (int i = 0; i < 100 && access(sock, F_OK) != 0; i++)
		usleep(50000);
	cr_assert_eq(access(sock, F_OK), 0, "no socket at %s", sock);
	snprintf(pid, sizeof(pid), "%ld", (long)p.pid);
	struct run r;
	run((char *[]){ VPMM_DUMP, pid, "--json", NULL }, &r);
	cr_assert_eq(r.status, 0, "vpmm-dump: %s", r.err);
	cr_assert_not_null(strstr(r.out, "\"pools\""), "%s", r.out);
	run_free(&r);
	cr_assert_eq(preload_finish(&p), 0, "the program failed under the shim");
	remove_dir(dir);
}
#else
Test(dump, a_preloaded_program_is_listed_and_read)
{
	cr_skip("built without the shim suite's stand-in driver: no LD_PRELOAD run");
}
#endif
