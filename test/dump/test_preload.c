/* test_preload.c — an unmodified program under LD_PRELOAD=libvpmm.so with
 * the shim suite's stand-in driver: listed and read by vpmm-dump, its trace
 * loaded and replayed, and a socket given relative to its directory found.
 * Skipped when the build has no shim suite. Helpers: dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dump_test.h"
#include "json.h"
#include "vpmm.h"

#ifdef PRELOAD_PROG
struct preloaded {
	pid_t pid;
	int in, out; /* its stdin (we hold it open) and stdout */
};

/* rel_socket: VPMM_SOCKET, a path relative to dir, where the program runs;
 * extra: one more VAR=VALUE, or NULL. */
static void preload_start(struct preloaded *p, const char *dir, const char *trace,
			  const char *rel_socket, const char *extra)
{
	char xdg[160], tr[200], so[160];
	snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", dir);
	snprintf(tr, sizeof(tr), "VPMM_TRACE=%s", trace);
	snprintf(so, sizeof(so), "VPMM_SOCKET=%s", rel_socket ? rel_socket : "");
	char *env[] = { "LD_LIBRARY_PATH=" FAKE_DIR, "LD_PRELOAD=" LIBVPMM, xdg, tr, so,
			(char *)extra, NULL };
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
	preload_start(&p, dir, trace, NULL, NULL);
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
	preload_start(&p, dir, trace, "here.sock", NULL);
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
/* The trace names the stream the pool took each call on, so that
 * vpmm-replay does what the pool did: cudaMalloc and cudaFree on the legacy
 * stream (0x0) while the shim's fences stand for cudaFree's
 * synchronisation, without stream order (0xffffffffffffffff) under
 * VPMM_SYNC_FREE=device; the stream-ordered pair on its stream, both
 * times. */
static void trace_streams(const char *extra, unsigned long long sync_stream)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char trace[128], line[256];
	snprintf(trace, sizeof(trace), "%s/trace.csv", dir);
	struct preloaded p;
	preload_start(&p, dir, trace, NULL, extra);
	cr_assert_eq(preload_finish(&p), 0, "the program failed under the shim");
	FILE *f = fopen(trace, "r");
	cr_assert_not_null(f, "no trace at %s", trace);
	cr_assert_not_null(fgets(line, sizeof(line), f)); /* the header */
	/* cudaMalloc a, cudaMalloc b, cudaMallocAsync c; cudaFree a, b;
	 * cudaFreeAsync c (preload_prog.c) */
	const bool ordered[6] = { false, false, true, false, false, true };
	unsigned long long stream[6];
	int n = 0;
	while (n < 6 && fgets(line, sizeof(line), f)) {
		struct trace_rec t;
		cr_assert(trace_rec_parse(line, &t), "not a record: %s", line);
		stream[n] = t.stream;
		cr_expect_str_eq(t.action, n < 3 ? "allocate" : "free", "%s", line);
		if (!ordered[n])
			cr_expect_eq(stream[n], sync_stream, "%s with %s: %s", n < 3 ? "cudaMalloc" : "cudaFree",
				     extra ? extra : "the defaults", line);
		n++;
	}
	fclose(f);
	cr_assert_eq(n, 6, "6 records expected, %d read", n);
	cr_expect_neq(stream[2], 0, "cudaMallocAsync on the program's stream");
	cr_expect_neq(stream[2], ~0ull, "cudaMallocAsync on the program's stream");
	cr_expect_eq(stream[5], stream[2], "freed on the stream it was taken on");
	remove_dir(dir);
}

Test(dump, a_trace_names_the_stream_the_pool_used)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("sanitizer build: LD_PRELOAD runs are covered by the plain build");
#endif
	trace_streams(NULL, 0);
	trace_streams("VPMM_SYNC_FREE=device", ~0ull);
}
#else
Test(dump, a_preloaded_program_is_listed_and_read)
{
	cr_skip("built without the shim suite's stand-in driver: no LD_PRELOAD run");
}
#endif
