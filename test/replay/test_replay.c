/* test_replay.c — runs the built vpmm-replay ($VPMM_REPLAY) on logs written
 * here in RMM's CSV format and checks what it reports: the design's
 * scenario, the pool's settings, tenants, text and JSON output, the log's
 * spellings and oddities counted, streams, events and a random log. Also
 * the suite's shared parts (replay_test.h); what vpmm-replay is given that
 * it must refuse or judge is in test_input.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "replay_test.h"

char dir[] = "/tmp/vpmm-replay-test.XXXXXX";

static void setup(void)
{
	cr_assert_not_null(getenv("VPMM_REPLAY"), "VPMM_REPLAY not set (run through meson test)");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(replay, .init = setup, .fini = teardown);

/* Writes `text` to DIR/name; returns the path (static buffer per call slot). */
const char *write_file(const char *name, const char *text)
{
	static char paths[8][256];
	static int slot;
	char *p = paths[slot++ % 8];
	snprintf(p, 256, "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f, "%s: %s", p, strerror(errno));
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
	return p;
}

char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	int c;
	while ((c = fgetc(f)) != EOF)
		fputc(c, m);
	fclose(f);
	fclose(m);
	return buf;
}

void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
}

/* Runs `prog` with args (NULL-terminated) and only PATH plus `env` (NULL-
 * terminated, may be NULL) in its environment: no VPMM_* of ours leaks in. */
unsigned run_cpu_limit_s;

struct run run_prog(const char *prog, const char *const *args, const char *const *env)
{
	char out[300], err[300];
	snprintf(out, sizeof(out), "%s/stdout", dir);
	snprintf(err, sizeof(err), "%s/stderr", dir);

	const char *argv[32];
	size_t n = 0;
	argv[n++] = prog;
	for (; args && args[0]; args++)
		argv[n++] = *args;
	argv[n] = NULL;

	char path_var[1024];
	const char *envp[16];
	size_t e = 0;
	snprintf(path_var, sizeof(path_var), "PATH=%s",
		 getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
	envp[e++] = path_var;
	for (; env && env[0]; env++)
		envp[e++] = *env;
	envp[e] = NULL;

	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
			_exit(126);
		struct rlimit cpu = { run_cpu_limit_s, run_cpu_limit_s };
		if (run_cpu_limit_s && setrlimit(RLIMIT_CPU, &cpu))
			_exit(126);
		execve(prog, (char *const *)argv, (char *const *)envp);
		_exit(127);
	}
	int st;
	struct rusage ru;
	cr_assert_eq(wait4(pid, &st, 0, &ru), pid);
	struct run r = { WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err),
			 (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
				 (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u,
			 (uint64_t)ru.ru_maxrss };
	cr_assert_neq(r.status, 127, "could not execute %s", prog);
	return r;
}

struct run replay(const char *const *args, const char *const *env)
{
	return run_prog(getenv("VPMM_REPLAY"), args, env);
}

/* The value of "key": N in a JSON object (fails the test when absent). */
uint64_t json_u64(const char *json, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	const char *p = strstr(json, pat);
	cr_assert_not_null(p, "no %s in %s", key, json);
	char *end;
	errno = 0;
	uint64_t v = strtoull(p + strlen(pat), &end, 10);
	cr_assert(errno == 0 && end != p + strlen(pat), "%s is not a number in %s", key, json);
	return v;
}

void log_open(struct logbuf *l)
{
	l->buf = NULL;
	l->f = open_memstream(&l->buf, &l->len);
	cr_assert_not_null(l->f);
	fputs(HEADER, l->f);
}

void log_add(struct logbuf *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(l->f, fmt, ap);
	va_end(ap);
	fputc('\n', l->f);
}

const char *log_write(struct logbuf *l, const char *name)
{
	fclose(l->f);
	const char *p = write_file(name, l->buf);
	free(l->buf);
	return p;
}

/* The design's scenario in GiB on one stream: +10 +1 -10 +4 +11, as RMM's
 * adaptor writes it (thread, time, action, pointer, size, stream). */
const char *spec_log(void)
{
	struct logbuf l;
	log_open(&l);
	log_add(&l, "140213,10:00:00.000001,allocate,0x7f0000000000,%" PRIu64 ",0x0", 10 * GiB);
	log_add(&l, "140213,10:00:00.000002,allocate,0x7f0280000000,%" PRIu64 ",0x0", 1 * GiB);
	log_add(&l, "140213,10:00:00.000003,free,0x7f0000000000,%" PRIu64 ",0x0", 10 * GiB);
	log_add(&l, "140213,10:00:00.000004,allocate,0x7f0000000000,%" PRIu64 ",0x0", 4 * GiB);
	log_add(&l, "140213,10:00:00.000005,allocate,0x7f0400000000,%" PRIu64 ",0x0", 11 * GiB);
	return log_write(&l, "spec.csv");
}

Test(replay, spec_scenario_maps_16_gib)
{
	const char *log = spec_log();
	struct run r = replay((const char *[]){ "--page-size", "1G", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	/* Pages on demand: 11 for +10 +1, +4 reuses the freed 10, +11 takes the
	 * 6 left over and creates the 5 it lacks: 16 GiB, all of it live. */
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 16 * GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_live_bytes"), 16 * GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_requested_bytes"), 16 * GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_created"), 16, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_remapped"), 6, "%s", r.out);
	cr_expect_geq(json_u64(r.out, "defrags"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "ops"), 5, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "failures"), 0, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "page_size"), GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "streams"), 1, "%s", r.out);
	cr_expect(strstr(r.out, "\"ns_per_op\": ") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "\"ratio\": 1.0") != NULL, "%s", r.out);
	run_free(&r);
}

Test(replay, spec_scenario_with_enough_pages_needs_no_defrag)
{
	/* Case A with X = 11: 22 pages mapped up front, +11 fits after [1]. */
	const char *log = spec_log();
	struct run r = replay((const char *[]){ "--page-size", "1G", "--pages", "22",
						"--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 22 * GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_created"), 22, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_remapped"), 0, "%s", r.out);
	run_free(&r);
}
/* 100 GiB in 1 GiB pieces, one freed in the middle (under 1/100 of the
 * pool free), then 2 GiB: a request no free range fits. */
static const char *growth_log(void)
{
	struct logbuf l;
	log_open(&l);
	for (int i = 0; i < 100; i++)
		log_add(&l, "1,10:00:00.000001,allocate,0x%x,%" PRIu64 ",0x0", 0x1000 + i, GiB);
	log_add(&l, "1,10:00:00.000002,free,0x%x,%" PRIu64 ",0x0", 0x1000 + 50, GiB);
	log_add(&l, "1,10:00:00.000003,allocate,0x9000,%" PRIu64 ",0x0", 2 * GiB);
	return log_write(&l, "growth.csv");
}

/* --remap and --tenant: with the device's room the request grows without
 * remapping; with VPMM_REMAP=always, or another process leaving the pool
 * too little room, it remaps the free page and creates only the other. */
Test(replay, remap_follows_the_room_a_tenant_leaves)
{
	const char *log = growth_log();
	static const struct {
		const char *args[8];
		uint64_t remapped, created;
		const char *says;
	} c[] = {
		{ { "--capacity", "1T", NULL }, 0, 102, "\"remap\": \"pressure\"" },
		{ { "--capacity", "1T", "--remap", "always", NULL }, 1, 101, "\"remap\": \"always\"" },
		/* 104 GiB for the pool: 4 GiB of room once 100 are mapped,
		 * under 16 times the request. */
		{ { "--capacity", "1T", "--tenant", "0:920G", NULL }, 1, 101, "\"remap\": \"pressure\"" },
		/* The tenant comes only after the 2 GiB request (operation 101). */
		{ { "--capacity", "1T", "--tenant", "102:920G", NULL }, 0, 102, "\"remap\": \"pressure\"" },
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		const char *args[16] = { "--page-size", "1G", "--json" };
		size_t n = 3;
		for (size_t k = 0; c[i].args[k]; k++)
			args[n++] = c[i].args[k];
		args[n++] = log;
		args[n] = NULL;
		struct run r = replay(args, NULL);
		cr_assert_eq(r.status, 0, "case %zu: exit %d: %s", i, r.status, r.err);
		cr_expect_eq(json_u64(r.out, "failures"), 0, "case %zu: %s", i, r.out);
		cr_expect_eq(json_u64(r.out, "pages_remapped"), c[i].remapped, "case %zu: %s", i, r.out);
		cr_expect_eq(json_u64(r.out, "pages_created"), c[i].created, "case %zu: %s", i, r.out);
		cr_expect(strstr(r.out, c[i].says), "case %zu: %s", i, r.out);
		run_free(&r);
	}
	/* A schedule out of order, or not OP:SIZE, is refused by name; so
	 * are empty items, which strtok_r passed over. */
	static const char *const bad[] = { "5:1G,2:1G", "1G", "x:1G", "1:lots", "",
					   ",", "0:1G,,5:2G", "0:1G,", ",0:1G" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct run r = replay((const char *[]){ "--tenant", bad[i], log, NULL }, NULL);
		cr_expect_eq(r.status, 2, "--tenant \"%s\": exit %d", bad[i], r.status);
		cr_expect(strstr(r.err, "--tenant") && strstr(r.err, "OP:SIZE"), "%s", r.err);
		cr_expect_str_empty(r.out);
		run_free(&r);
	}
}

Test(replay, text_output)
{
	const char *log = spec_log();
	struct run r = replay((const char *[]){ "--page-size", "1G", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.out, "peak mapped         17179869184 bytes (16.00 GiB)") != NULL,
		  "%s", r.out);
	cr_expect(strstr(r.out, "peak live") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "pages remapped      6\n") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "mapped / live       1.000") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "time per operation") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "the pool's clock    the log's Time\n") != NULL, "%s", r.out);
	run_free(&r);
}

Test(replay, json_parses_with_python)
{
	const char *log = spec_log();
	const char *py = getenv("PYTHON3");
	cr_assert_not_null(py, "PYTHON3 not set (run through meson test)");
	struct run r = replay((const char *[]){ "--page-size", "1G", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	const char *json = write_file("out.json", r.out);
	run_free(&r);

	const char *script =
		"import json, sys\n"
		"d = json.load(open(sys.argv[1]))\n"
		"keys = ['peak_live_bytes', 'peak_mapped_bytes', 'ops', 'pages_created',\n"
		"        'pages_remapped', 'defrags', 'ns_per_op', 'peak_requested_bytes',\n"
		"        'ratio', 'failures', 'unknown_frees']\n"
		"missing = [k for k in keys if k not in d]\n"
		"assert not missing, missing\n"
		"assert d['peak_mapped_bytes'] == 16 << 30, d\n"
		"assert abs(d['ratio'] - 1.0) < 1e-9, d\n"
		"assert d['ns_per_op'] >= 0, d\n"
		"print('ok')\n";
	r = run_prog(py, (const char *[]){ "-c", script, json, NULL }, NULL);
	cr_expect_eq(r.status, 0, "python: %s", r.err);
	cr_expect_str_eq(r.out, "ok\n");
	run_free(&r);
}

Test(replay, pointer_and_stream_spellings)
{
	/* Newer RMM: %llx without 0x; older: fmt's 0x...; decimal; glibc's (nil)
	 * for a null stream. Each pair must match up: nothing unknown. */
	const char *log = write_file("spell.csv", HEADER
		"1,00:00:00.0,allocate,7f3a40000000,4194304,0\n"
		"1,00:00:00.0,allocate,0x7F3A40400000,4194304,0x0\n"
		"1,00:00:00.0,allocate,123456789,4194304,(nil)\n"
		"1,00:00:00.0,free,0x7f3a40000000,4194304,0\n"
		"1,00:00:00.0,free,7f3a40400000,4194304,0\n"
		"1,00:00:00.0,free,123456789,4194304,0x0\n");
	struct run r = replay((const char *[]){ "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "unknown_frees"), 0, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "ops"), 6, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "frees"), 3, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "streams"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_requested_bytes"), 12 * MiB, "%s", r.out);
	run_free(&r);
}

Test(replay, rounding_peak_live_versus_requested)
{
	const char *log = write_file("round.csv", HEADER
		"1,t,allocate,0x1000,1,0x0\n"
		"1,t,allocate,0x2000,3145728,0x0\n");
	/* The reference rule: whole pages for everything. */
	struct run r = replay((const char *[]){ "--page-size", "2M", "--grain", "2M",
						"--small-max", "0", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "peak_requested_bytes"), 3 * MiB + 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_live_bytes"), 6 * MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 6 * MiB, "%s", r.out);
	run_free(&r);

	/* The defaults: 64 KiB grains, and a slab of the smallest class (one
	 * grain) for the byte; the two share the second page. */
	r = replay((const char *[]){ "--page-size", "2M", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "peak_live_bytes"), 3 * MiB + 64 * 1024, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 4 * MiB, "%s", r.out);
	run_free(&r);
}

Test(replay, crlf_blank_lines_and_repeated_header)
{
	const char *log = write_file("crlf.csv",
		"Thread,Time,Action,Pointer,Size,Stream\r\n"
		"1,t,allocate,0x1000,2097152,0x0\r\n"
		"\r\n"
		"Thread,Time,Action,Pointer,Size,Stream\r\n"
		"1,t,free,0x1000,2097152,0x0\r\n");
	struct run r = replay((const char *[]){ "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "ops"), 2, "%s", r.out);
	run_free(&r);
}

Test(replay, log_failures_and_zero_sizes_are_skipped_and_counted)
{
	const char *log = write_file("fail.csv", HEADER
		"1,t,allocate failure,0x0,99999999999,0x0\n"
		"1,t,allocate,0x1000,2097152,0x0\n"
		"1,t,allocate failure,0,1024,0x5\n"
		"1,t,allocate,0x0,0,0x0\n"
		"1,t,free,0x0,0,0x0\n"
		"1,t,free,0x1000,2097152,0x0\n");
	struct run r = replay((const char *[]){ "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "log_failures"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "zero_sized"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "ops"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "failures"), 0, "%s", r.out);
	run_free(&r);
}

Test(replay, unknown_free_is_a_counted_warning)
{
	const char *log = write_file("unknown.csv", HEADER
		"1,t,allocate,0x1000,2097152,0x0\n"
		"1,t,free,0xdead0000,2097152,0x0\n"
		"1,t,free,0x1000,2097152,0x0\n"
		"1,t,free,0x1000,2097152,0x0\n");
	struct run r = replay((const char *[]){ "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "unknown_frees"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "ops"), 2, "%s", r.out);
	char want[512];
	snprintf(want, sizeof(want), "%s:3: warning: free of 0xdead0000", log);
	cr_expect(strstr(r.err, want) != NULL, "stderr: %s", r.err);
	snprintf(want, sizeof(want), "%s:5: warning: free of 0x1000", log);
	cr_expect(strstr(r.err, want) != NULL, "stderr: %s", r.err);
	run_free(&r);
}

Test(replay, pool_out_of_memory_is_counted_and_the_replay_goes_on)
{
	/* A 4 GiB device: the 10 GiB request fails, its free is skipped, the
	 * rest replays. */
	const char *log = write_file("oom.csv", HEADER
		"1,t,allocate,0x1000,10737418240,0x0\n"
		"1,t,allocate,0x2000,1073741824,0x0\n"
		"1,t,free,0x1000,10737418240,0x0\n"
		"1,t,free,0x2000,1073741824,0x0\n");
	struct run r = replay((const char *[]){ "--capacity", "4G", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "failures"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "allocs"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "frees"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), GiB, "%s", r.out);
	run_free(&r);

	r = replay((const char *[]){ "--capacity", "4G", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.out, "failed allocations  1") != NULL, "%s", r.out);
	run_free(&r);
}

/* The first refusal says where the free memory lay. An 8 MiB device of
 * 2 MiB pages: 3 MiB take a handle of 4 and strand 1; 6 MiB more need 5
 * beyond that free MiB (3 pages), and the device has 2 pages left. */
Test(replay, the_first_failure_says_where_the_free_memory_lay)
{
	const char *log = write_file("strand.csv", HEADER
		"1,t,allocate,0x1000,3145728,0x0\n"
		"1,t,allocate,0x2000,6291456,0x0\n"
		"1,t,free,0x1000,3145728,0x0\n");
	struct run r = replay((const char *[]){ "--capacity", "8M", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "failures"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "op"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "size"), 6 * MiB, "%s", r.out);
	cr_expect_not_null(strstr(r.out, "\"first_failure\": {\"op\": 2, \"size\": 6291456, "
				     "\"creatable\": 4194304, \"free_split\": {\"whole\": 0, "),
			   "%s", r.out);
	cr_expect_eq(json_u64(r.out, "whole"), 0, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "whole_handles"), 0, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "stranded"), MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "stranded_handles"), 1, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "largest"), MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "creatable"), 4 * MiB, "%s", r.out);
	run_free(&r);

	r = replay((const char *[]){ "--capacity", "8M", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.out, "first failure       operation 2: 6.00 MiB\n"
				"  free then         1.00 MiB: 0 B in 0 wholly free handles, "
				"1.00 MiB stranded in 1 partly live ones\n"
				"  largest free      1.00 MiB\n"
				"  creatable         4.00 MiB (within the limit and the device's "
				"free memory)\n") != NULL, "%s", r.out);
	run_free(&r);

	/* No failure, no such object. */
	r = replay((const char *[]){ "--capacity", "16M", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_null(strstr(r.out, "first_failure"), "%s", r.out);
	run_free(&r);
}

/* What is creatable is the least of what the limit and the device leave.
 * The same log as above, two more ways to the same 8 MiB: a limit on a device
 * of a pebibyte (the limit leaves 4 MiB, the device almost all of it), and
 * another process holding 8 MiB of 16 from the first operation on (the
 * device leaves 4 MiB). Both refuse the second request as the 8 MiB device
 * did, with the same stranded MiB. */
Test(replay, creatable_is_what_the_limit_and_the_other_tenant_leave)
{
	const char *log = write_file("strand2.csv", HEADER
		"1,t,allocate,0x1000,3145728,0x0\n"
		"1,t,allocate,0x2000,6291456,0x0\n"
		"1,t,free,0x1000,3145728,0x0\n");
	const char **ways[] = {
		(const char *[]){"--limit", "8M", "--json", log, NULL},
		(const char *[]){"--capacity", "16M", "--tenant", "0:8M", "--json", log, NULL},
	};
	for (size_t i = 0; i < 2; i++) {
		struct run r = replay(ways[i], NULL);
		cr_assert_eq(r.status, 0, "%s: exit %d: %s", ways[i][0], r.status, r.err);
		cr_expect_eq(json_u64(r.out, "failures"), 1, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "op"), 2, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "stranded"), MiB, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "creatable"), 4 * MiB, "%s: %s", ways[i][0], r.out);
		run_free(&r);
	}
}

Test(replay, cross_stream_reuse_follows_completion)
{
	/* Freed on stream A, wanted on stream B. With the device keeping up, the
	 * event has completed and phase 1 reuses the page in place; with a device
	 * that never finishes, the page can only move through a defragmentation
	 * that makes B wait. Either way nothing new is mapped. */
	const char *log = write_file("streams.csv", HEADER
		"1,t,allocate,0x1000,2097152,0xa\n"
		"1,t,free,0x1000,2097152,0xa\n"
		"2,t,allocate,0x2000,2097152,0xb\n");
	struct run r = replay((const char *[]){ "--complete-every", "1", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "streams"), 2, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 2 * MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_remapped"), 0, "%s", r.out);
	run_free(&r);

	r = replay((const char *[]){ "--complete-every", "0", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 2 * MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_remapped"), 1, "%s", r.out);
	run_free(&r);
}

Test(replay, events_follow_the_interval)
{
	/* Two frees on one stream: with interval 0 each records an event; with
	 * a second's interval only the first does (no event before it). */
	const char *log = write_file("events.csv", HEADER
		"1,t,allocate,0x1000,2097152,0xa\n"
		"1,t,free,0x1000,2097152,0xa\n"
		"1,t,allocate,0x2000,2097152,0xa\n"
		"1,t,free,0x2000,2097152,0xa\n");
	struct run r = replay((const char *[]){ "--event-interval-us", "0", "--json", log, NULL },
			      NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "events_recorded"), 2, "%s", r.out);
	run_free(&r);
	r = replay((const char *[]){ "--event-interval-us", "1000000", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "events_recorded"), 1, "%s", r.out);
	run_free(&r);
}

/* Three frees on stream a while stream b takes memory too (the event
 * interval, 50 us, applies): at the log's times T1, T2, T3. */
static const char *interval_log(const char *name, const char *t0, const char *t1,
				const char *t2, const char *t3)
{
	struct logbuf l;
	log_open(&l);
	log_add(&l, "1,%s,allocate,0x9000,2097152,0xb", t0);
	log_add(&l, "1,%s,allocate,0x1000,2097152,0xa", t0);
	log_add(&l, "1,%s,free,0x1000,2097152,0xa", t1);
	log_add(&l, "1,%s,allocate,0x2000,2097152,0xa", t1);
	log_add(&l, "1,%s,free,0x2000,2097152,0xa", t2);
	log_add(&l, "1,%s,allocate,0x3000,2097152,0xa", t2);
	log_add(&l, "1,%s,free,0x3000,2097152,0xa", t3);
	return log_write(&l, name);
}

static struct run replay_events(const char *log, const char *clock, uint64_t events)
{
	struct run r = replay((const char *[]){ "--clock", clock, "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "events_recorded"), events, "%s: %s", log, r.out);
	return r;
}

/* interval_log()'s replay records `events` on the log's clock. */
static void events_at(const char *name, const char *t0, const char *t1, const char *t2,
		      const char *t3, uint64_t events)
{
	struct run r = replay_events(interval_log(name, t0, t1, t2, t3), "log", events);
	run_free(&r);
}

Test(replay, the_pools_clock_is_the_logs)
{
	/* The first free records (none before it); the second, 29 us after,
	 * does not; the third, 50 us after the first, does. */
	const char *log = interval_log("clock.csv", "10:00:00.000000", "10:00:00.000001",
				       "10:00:00.000030", "10:00:00.000051");
	struct run r = replay_events(log, "log", 2);
	cr_expect(strstr(r.out, "\"clock\": \"log\""), "%s", r.out);
	run_free(&r);
	/* Across midnight, and the fraction after ':' as bench/workloads.py
	 * writes it: the third free 50 us after the first, then 30 us. */
	events_at("midnight.csv", "23:59:59:999980", "23:59:59:999990", "23:59:59:999999",
		  "00:00:00:000040", 2);
	events_at("midnight2.csv", "23:59:59:999980", "23:59:59:999990", "23:59:59:999999",
		  "00:00:00:000020", 1);
	/* Times out of order (threads): the clock never goes back, so the
	 * third free, written with a time before the first's, is still 29 us
	 * after it (a clock gone back would record); nor does a time of day
	 * before the first line's pass for the next day. */
	events_at("disorder.csv", "10:00:00.000000", "10:00:00.000001", "10:00:00.000030",
		  "10:00:00.000000", 1);
	events_at("disorder2.csv", "10:00:00.000000", "10:00:00.000001", "10:00:00.000030",
		  "09:59:59.999999", 1);
	/* No time of day: 1 us an operation, the frees 2 and 4 us apart. */
	log = interval_log("untimed.csv", "t", "t", "t", "t");
	r = replay_events(log, "log", 1);
	cr_expect(strstr(r.out, "\"clock\": \"operations\""), "%s", r.out);
	run_free(&r);
	r = replay((const char *[]){ log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.out, "1 us an operation: the Time of line 2 is no time of day"),
		  "%s", r.out);
	run_free(&r);
	/* The host's clock: the whole log takes well under 50 us of it... or
	 * not, on a slow host: only the name is certain. */
	r = replay((const char *[]){ "--clock", "wall", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.out, "\"clock\": \"wall\""), "%s", r.out);
	run_free(&r);
	r = replay((const char *[]){ "--clock", "sundial", log, NULL }, NULL);
	cr_expect_eq(r.status, 2, "exit %d", r.status);
	cr_expect(strstr(r.err, "--clock \"sundial\": expected log or wall"), "%s", r.err);
	run_free(&r);
}

Test(replay, no_stream_value_frees_settled_memory)
{
	/* 0xffffffffffffffff is VPMM_NO_STREAM (cudaFree in a VPMM_TRACE): its
	 * free is settled at once, so another stream reuses the page in place
	 * even on a device that never finishes anything. */
	const char *log = write_file("nostream.csv", HEADER
		"1,t,allocate,0x1000,2097152,0xffffffffffffffff\n"
		"1,t,free,0x1000,2097152,0xffffffffffffffff\n"
		"2,t,allocate,0x2000,2097152,0xb\n");
	struct run r = replay((const char *[]){ "--complete-every", "0", "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 2 * MiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "pages_remapped"), 0, "%s", r.out);
	run_free(&r);
}

/* A random multi-stream log, replayed with the pool's check after every
 * operation; the requested-bytes peak is computed here independently. */
Test(replay, random_log_stays_consistent)
{
	struct logbuf l;
	enum { N = 3000, SLOTS = 64 };
	uint64_t ptrs[SLOTS] = { 0 }, sizes[SLOTS] = { 0 }, streams[SLOTS] = { 0 };
	uint64_t live = 0, peak = 0, next_ptr = 0x7f0000000000, allocs = 0, frees = 0;
	unsigned seed = 12345;

	log_open(&l);
	for (int i = 0; i < N; i++) {
		unsigned k = (unsigned)rand_r(&seed) % SLOTS;
		if (!ptrs[k]) {
			uint64_t size = 1 + (uint64_t)rand_r(&seed) % (9 * MiB);
			uint64_t stream = (uint64_t)rand_r(&seed) % 4; /* 0 and 3 others */
			ptrs[k] = next_ptr;
			next_ptr += 16 * MiB;
			sizes[k] = size;
			streams[k] = stream;
			log_add(&l, "7,12:00:%02d.%06d,allocate,0x%" PRIx64 ",%" PRIu64 ",0x%" PRIx64,
				i / 1000000 % 60, i % 1000000, ptrs[k], size, stream);
			live += size;
			peak = live > peak ? live : peak;
			allocs++;
		} else {
			log_add(&l, "7,12:00:00.000000,free,0x%" PRIx64 ",%" PRIu64 ",0x%" PRIx64,
				ptrs[k], sizes[k], streams[k]);
			live -= sizes[k];
			ptrs[k] = 0;
			frees++;
		}
	}
	const char *log = log_write(&l, "random.csv");
	const char *lags[] = { "1", "7", "0" };
	for (size_t j = 0; j < 3; j++) {
		struct run r = replay((const char *[]){ "--check", "--complete-every", lags[j],
							"--json", log, NULL }, NULL);
		cr_assert_eq(r.status, 0, "lag %s: exit %d: %s", lags[j], r.status, r.err);
		cr_expect(strstr(r.out, "check_violations") == NULL, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "peak_requested_bytes"), peak, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "ops"), allocs + frees, "%s", r.out);
		cr_expect_eq(json_u64(r.out, "failures"), 0, "%s", r.out);
		cr_expect_geq(json_u64(r.out, "peak_live_bytes"), peak, "%s", r.out);
		cr_expect_geq(json_u64(r.out, "peak_mapped_bytes"),
			      json_u64(r.out, "peak_live_bytes"), "%s", r.out);
		run_free(&r);
	}
}

/* A program that makes a stream per request: n streams, each allocating
 * 1 MiB and freeing it. */
static const char *stream_per_request_log(unsigned n, const char *name)
{
	struct logbuf l;
	log_open(&l);
	for (unsigned i = 1; i <= n; i++) {
		log_add(&l, "1,t,allocate,%#" PRIx64 ",1048576,%#x", (uint64_t)i << 20, i);
		log_add(&l, "1,t,free,%#" PRIx64 ",1048576,%#x", (uint64_t)i << 20, i);
	}
	return log_write(&l, name);
}

Test(replay, a_stream_per_request_costs_the_same_at_every_count)
{
	/* The replay destroys a stream the log names no more when the next
	 * new stream comes: the 32 000th stream costs what the 2 000th does,
	 * in CPU time and in memory. The large run is stopped at four times
	 * the small one's CPU time a stream. */
	const unsigned small = 2000, large = 32000;
	struct run s = replay((const char *[]){ "--json", stream_per_request_log(small, "s.csv"),
						NULL }, NULL);
	cr_assert_eq(s.status, 0, "exit %d: %s", s.status, s.err);
	cr_expect_eq(json_u64(s.out, "streams"), small, "%s", s.out);
	double per = (double)s.cpu_ns / small;
	unsigned limit = (unsigned)(4 * per * large / 1e9) + 1;
	run_cpu_limit_s = limit;
	struct run l = replay((const char *[]){ "--json", stream_per_request_log(large, "l.csv"),
						NULL }, NULL);
	run_cpu_limit_s = 0;
	cr_assert_eq(l.status, 0, "%u streams: exit %d (stopped past %u s of CPU, four times "
		     "%.0f ns a stream): %s", large, l.status, limit, per, l.err);
	cr_expect_eq(json_u64(l.out, "streams"), large, "%s", l.out);
	cr_expect_leq((double)l.cpu_ns / large, 4 * per, "%.0f ns a stream at %u streams, "
		      "%.0f at %u", (double)l.cpu_ns / large, large, per, small);
	uint64_t grew = l.rss_kib > s.rss_kib ? (l.rss_kib - s.rss_kib) * 1024 : 0;
	cr_expect_leq(grew / (large - small), 2048, "peak memory %" PRIu64 " KiB at %u "
		      "streams, %" PRIu64 " KiB at %u: %" PRIu64 " bytes a stream",
		      l.rss_kib, large, s.rss_kib, small, grew / (large - small));
	run_free(&s);
	run_free(&l);
}
