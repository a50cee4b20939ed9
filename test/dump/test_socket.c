/* test_socket.c — the dump suite's socket cases: where the socket is made
 * and with what permissions, listing, stale sockets swept or left alone,
 * another uid refused, and the socket through fork and exit. Helpers:
 * dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dump_test.h"
#include "json.h"
#include "server.h"
#include "vpmm.h"

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
