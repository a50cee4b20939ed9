/* test_trace.c — the PyTorch snapshot and the trace: --torch-snapshot
 * loaded by Python's pickle (check_snapshot.py), trace CSV lines vpmm-dump
 * must skip, trace start and restart, no event lost under threads, a trace
 * replayed by vpmm-replay to the pool's peak, and a forked child's trace
 * apart from its parent's. Helpers: dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_host.h"
#include "dump_test.h"
#include "json.h"
#include "trace.h"
#include "vpmm.h"

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
		"1,00:00:01:000004,allocate,0x30000,4096,0x0\n"
		"1,00:00:01.000004,allocate,0x70000,-1,0x0\n";
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
	/* and a size of -1 (strtoull's 2^64 - 1) */
	cr_expect(strstr(r.err, ": 3 malformed trace lines skipped"), "%s", r.err);
	if (have_file(PYTHON3)) {
		/* three allocations and a free (requested, completed): 5 entries */
		run_free(&r);
		run((char *[]){PYTHON3, TEST_DIR "/check_snapshot.py", snap, "65536", "65536", "5",
			       NULL},
		    &r);
		cr_expect_eq(r.status, 0, "check_snapshot.py: %s%s", r.out, r.err);
	}
	run_free(&r);

	/* A file that is no trace file and never ends (/dev/zero, one
	 * endless line) is refused, where it was read for ever. */
	ask_fake(path, replies,
		 (char *[]){VPMM_DUMP, "--socket", path, "--torch-snapshot", snap, "--trace-csv",
			    "/dev/zero", NULL},
		 &r, &fs);
	cr_expect_eq(r.status, 1, "status %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "/dev/zero: not a regular file"), "%s", r.err);
	run_free(&r);
	/* nor a FIFO with no writer, which held open() */
	char fifo[160];
	snprintf(fifo, sizeof(fifo), "%s/trace.fifo", dir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	ask_fake(path, replies,
		 (char *[]){VPMM_DUMP, "--socket", path, "--torch-snapshot", snap, "--trace-csv",
			    fifo, NULL},
		 &r, &fs);
	cr_expect_eq(r.status, 1, "status %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "trace.fifo: not a regular file"), "%s", r.err);
	run_free(&r);
	unlink(fifo);

	remove_dir(dir);
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
	/* a request without stream order: stream 0 in the snapshot */
	vpmm_trace_event(VPMM_TRACE_ALLOCATE_FAILURE, 0, (size_t)1 << 40, VPMM_NO_STREAM);
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
		struct trace_rec e;
		cr_assert(trace_rec_parse(line, &e), "malformed line: %s", line);
		cr_assert(e.hh < 24 && e.mm < 60 && e.ss < 61 && e.us < 1000000);
		cr_assert_eq(e.size, 4096);
		cr_assert_lt(e.stream, THREADS);
		if (!strcmp(e.action, "allocate")) {
			cr_assert_gt(e.ptr, last[e.stream], "thread %llu out of order", e.stream);
			last[e.stream] = e.ptr;
		} else {
			cr_assert_str_eq(e.action, "free");
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
