/* test_input.c — what vpmm-replay is given: pool settings from the
 * environment and from options, judged alike and named when refused;
 * malformed logs (exit 2, FILE:LINE), endless lines, lost output, names
 * that are not UTF-8, unreadable files and bad usage. Helpers:
 * replay_test.h (the suite's setup is in test_replay.c).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "replay_test.h"

Test(replay, config_defaults_come_from_the_environment)
{
	const char *log = spec_log();
	struct run r = replay((const char *[]){ "--json", log, NULL },
			      (const char *[]){ "VPMM_PAGE_SIZE=1G", NULL });
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "page_size"), GiB, "%s", r.out);
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 16 * GiB, "%s", r.out);
	run_free(&r);

	/* The command line wins over the environment. */
	r = replay((const char *[]){ "--page-size", "2M", "--json", log, NULL },
		   (const char *[]){ "VPMM_PAGE_SIZE=1G", NULL });
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "page_size"), 2 * MiB, "%s", r.out);
	run_free(&r);

	r = replay((const char *[]){ log, NULL }, (const char *[]){ "VPMM_PAGE_SIZE=3X", NULL });
	cr_expect_eq(r.status, 2);
	cr_expect(strstr(r.err, "VPMM_PAGE_SIZE=\"3X\"") != NULL, "%s", r.err);
	run_free(&r);
}

/* Settings that read well alone but make no pool (against the simulated
 * device's 2M granularity, or each other): exit 1 before any replay, and
 * the message names the variable at fault with its value, whether it came
 * from the command line or the environment, and the option where one
 * gave it. */
Test(replay, a_pool_the_settings_cannot_make_names_the_setting)
{
	const char *log = spec_log();
	static const struct {
		const char *arg[3], *env, *says;
	} bad[] = {
		{{"--page-size", "1M", NULL}, NULL,
		 "--page-size: VPMM_PAGE_SIZE=1M is not a multiple of the driver's granularity 2M"},
		{{"--granularity", "1G", NULL}, "VPMM_PAGE_SIZE=512M",
		 "VPMM_PAGE_SIZE=512M is not a multiple of the driver's granularity 1G"},
		{{NULL}, "VPMM_HANDLE_SIZE=3M", "VPMM_HANDLE_SIZE=3M is not a whole number of pages"},
		{{"--grain", "256", NULL}, NULL, "--grain: VPMM_GRAIN=256: expected a power of two from 512"},
		{{NULL}, "VPMM_GRAIN=256", "pool: VPMM_GRAIN=256: expected a power of two from 512"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *args[5];
		size_t n = 0;
		for (size_t k = 0; k < 2 && bad[i].arg[k]; k++)
			args[n++] = bad[i].arg[k];
		args[n++] = log;
		args[n] = NULL;
		struct run r = replay(args, (const char *[]){bad[i].env, NULL});
		cr_expect_eq(r.status, 1, "case %zu: exit %d: %s", i, r.status, r.err);
		cr_expect(strstr(r.err, "vpmm-replay: cannot create the pool: "), "case %zu: %s", i,
			  r.err);
		cr_expect(strstr(r.err, bad[i].says), "case %zu: \"%s\" does not say \"%s\"", i, r.err,
			  bad[i].says);
		cr_expect_str_empty(r.out, "case %zu: a report without a pool", i);
		run_free(&r);
	}
}

/* The simulated device's own options are checked as they are read: a
 * granularity the host driver refuses once said only "CUresult 1", and 0
 * for either quietly meant the default. */
Test(replay, a_device_the_options_cannot_make_is_bad_usage)
{
	const char *log = spec_log();
	static const char *const bad[][3] = {
		{"--granularity", "3M", "--granularity \"3M\": expected a power of two from 4K"},
		{"--granularity", "1", "--granularity \"1\": expected a power of two from 4K"},
		{"--granularity", "0", "--granularity \"0\": expected a power of two from 4K"},
		{"--capacity", "0", "--capacity \"0\": expected more than 0"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct run r = replay((const char *[]){bad[i][0], bad[i][1], log, NULL}, NULL);
		cr_expect_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
		cr_expect(strstr(r.err, bad[i][2]), "case %zu: %s", i, r.err);
		cr_expect_str_empty(r.out, "case %zu", i);
		run_free(&r);
	}
	struct run r = replay((const char *[]){"--granularity", "4K", "--json", log, NULL}, NULL);
	cr_expect_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "page_size"), 4096, "%s", r.out);
	run_free(&r);
}

/* A VPMM_ name one slip from a setting is pointed out, as the preload
 * does; the replay runs on. */
Test(replay, a_misspelled_variable_is_pointed_out)
{
	const char *log = spec_log();
	struct run r = replay((const char *[]){log, NULL},
			      (const char *[]){"VPMM_PAGESIZE=1G", "VPMM_LIB=x", NULL});
	cr_expect_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "vpmm-replay: warning: VPMM_PAGESIZE is not a libvpmm variable"),
		  "%s", r.err);
	cr_expect(strstr(r.err, "VPMM_PAGE_SIZE?"), "%s", r.err);
	cr_expect(!strstr(r.err, "VPMM_LIB"), "%s", r.err);
	run_free(&r);
}

/* An option and its variable are one setting: the same value is refused the
 * same way, as bad usage, whichever way it came (the options once took a
 * page of 3M and a VA of 1K that the variables refuse). */
Test(replay, an_option_is_judged_as_its_variable)
{
	const char *log = spec_log();
	static const struct {
		const char *opt, *var, *value, *says;
	} bad[] = {
		{"--page-size", "VPMM_PAGE_SIZE", "3M", "must be a power of two"},
		{"--va-size", "VPMM_VA_SIZE", "1K", "must be at least 1G"},
		{"--defrag", "VPMM_DEFRAG", "some", "expected one of: lacking, all"},
		{"--pages", "VPMM_PAGES", "-1", "VPMM_PAGES=\"-1\""},
		{"--event-interval-us", "VPMM_EVENT_INTERVAL_US", "18446744073709552", "too large"},
		{"--remap", "VPMM_REMAP", "never", "expected one of: pressure, always"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char env[96];
		snprintf(env, sizeof(env), "%s=%s", bad[i].var, bad[i].value);
		struct run by_env = replay((const char *[]){ log, NULL }, (const char *[]){ env, NULL });
		struct run by_opt = replay((const char *[]){ bad[i].opt, bad[i].value, log, NULL }, NULL);
		cr_expect_eq(by_env.status, 2, "%s: exit %d: %s", env, by_env.status, by_env.err);
		cr_expect_eq(by_opt.status, 2, "%s %s: exit %d: %s", bad[i].opt, bad[i].value,
			     by_opt.status, by_opt.err);
		cr_expect(strstr(by_env.err, bad[i].says), "%s: \"%s\" does not say \"%s\"", env,
			  by_env.err, bad[i].says);
		cr_expect(strstr(by_opt.err, bad[i].says) && strstr(by_opt.err, bad[i].opt),
			  "%s %s: \"%s\" does not name the option and say \"%s\"", bad[i].opt,
			  bad[i].value, by_opt.err, bad[i].says);
		cr_expect_str_empty(by_opt.out, "%s: a report for a refused setting", bad[i].opt);
		run_free(&by_env);
		run_free(&by_opt);
	}
	/* The replay measures the pool without the per-stream caches unless
	 * --front asks for them: VPMM_FRONT_ENTRIES is not read, the option
	 * is judged by its rule. */
	struct run f = replay((const char *[]){ "--front", "300", log, NULL }, NULL);
	cr_expect_eq(f.status, 2, "--front 300: exit %d: %s", f.status, f.err);
	cr_expect(strstr(f.err, "--front: VPMM_FRONT_ENTRIES=\"300\": must be at most 256"), "%s",
		  f.err);
	run_free(&f);
	f = replay((const char *[]){ log, NULL }, (const char *[]){ "VPMM_FRONT_ENTRIES=300", NULL });
	cr_expect_eq(f.status, 0, "VPMM_FRONT_ENTRIES=300 read: exit %d: %s", f.status, f.err);
	run_free(&f);

	/* The option stands in for its variable: a bad value of the variable
	 * it replaces is never read. */
	struct run r = replay((const char *[]){ "--page-size", "1G", "--json", log, NULL },
			      (const char *[]){ "VPMM_PAGE_SIZE=3M", NULL });
	cr_expect_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "page_size"), GiB, "%s", r.out);
	run_free(&r);
}

/* ---- malformed input: exit 2, FILE:LINE ------------------------------------------ */

struct bad_log {
	const char *name;
	const char *text;
	int line;
	const char *says;
};

Test(replay, malformed_lines_name_file_and_line)
{
	static const struct bad_log bad[] = {
		{ "action.csv", HEADER "1,t,allocate,0x1000,4096,0x0\n1,t,alloc,0x2000,4096,0x0\n",
		  3, "unknown action" },
		{ "fields.csv", HEADER "1,t,allocate,0x1000,4096\n", 2, "expected 6" },
		{ "extra.csv", HEADER "1,t,allocate,0x1000,4096,0x0,9\n", 2, "expected 6" },
		{ "size.csv", HEADER "1,t,allocate,0x1000,12a,0x0\n", 2, "bad size" },
		{ "negsize.csv", HEADER "1,t,allocate,0x1000,-5,0x0\n", 2, "bad size" },
		{ "bigsize.csv", HEADER "1,t,allocate,0x1000,99999999999999999999,0x0\n", 2,
		  "bad size" },
		{ "ptr.csv", HEADER "1,t,allocate,0xZZ,4096,0x0\n", 2, "bad pointer" },
		{ "emptyptr.csv", HEADER "1,t,free,,4096,0x0\n", 2, "bad pointer" },
		{ "longptr.csv", HEADER "1,t,free,0x11112222333344445,4096,0x0\n", 2,
		  "bad pointer" },
		{ "stream.csv", HEADER "1,t,allocate,0x1000,4096,stream1\n", 2, "bad stream" },
		{ "header.csv", "Thread,Time,Action,Pointer,Size\n1,t,allocate,0x1,1,0x0\n", 1,
		  "expected the header" },
		{ "noheader.csv", "1,t,allocate,0x1000,4096,0x0\n", 1, "expected the header" },
		{ "emptycol.csv", "Thread,,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x1,1,0x0\n",
		  1, "expected the header" },
		{ "empty.csv", "", 1, "empty log" },
		{ "nullalloc.csv", HEADER "1,t,allocate,0x0,4096,0x0\n", 2, "null pointer" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *log = write_file(bad[i].name, bad[i].text);
		struct run r = replay((const char *[]){ log, NULL }, NULL);
		char want[512];
		snprintf(want, sizeof(want), "%s:%d: ", log, bad[i].line);
		cr_expect_eq(r.status, 2, "%s: exit %d", bad[i].name, r.status);
		cr_expect(strstr(r.err, want) != NULL, "%s: stderr lacks \"%s\": %s",
			  bad[i].name, want, r.err);
		cr_expect(strstr(r.err, bad[i].says) != NULL, "%s: stderr lacks \"%s\": %s",
			  bad[i].name, bad[i].says, r.err);
		cr_expect_str_empty(r.out, "%s: printed results for a malformed log", bad[i].name);
		run_free(&r);
	}
}

/* Input that is not a log at all, output that cannot be written, a file
 * name that is not UTF-8 (review): a clear error or valid JSON, never
 * unbounded memory or a silent success. */
Test(replay, endless_lines_lost_output_and_names_that_are_not_utf8)
{
	static char longlog[sizeof(HEADER) + 6000];
	snprintf(longlog, sizeof(longlog), "%s1,t,allocate,0x1000,%05000d\n", HEADER, 7);
	const char *log = write_file("long.csv", longlog);
	struct run r = replay((const char *[]){ log, NULL }, NULL);
	cr_expect_eq(r.status, 2, "exit %d", r.status);
	cr_expect(strstr(r.err, ":2: a line longer than 4095 bytes"), "%s", r.err);
	run_free(&r);
	/* The bound itself: 4095 bytes and the newline are a line, 4096 not. */
	const char *head = "1,t,allocate,0x1000,";
	const char *tail = ",0x0";
	for (int extra = 0; extra < 2; extra++) {
		int digits = 4095 + extra - (int)strlen(head) - (int)strlen(tail);
		snprintf(longlog, sizeof(longlog), "%s%s%0*d%s\n", HEADER, head, digits, 7, tail);
		log = write_file("edge.csv", longlog);
		r = replay((const char *[]){ log, NULL }, NULL);
		cr_expect_eq(r.status, extra ? 2 : 0, "a line of %d bytes: exit %d: %s",
			     4095 + extra, r.status, r.err);
		run_free(&r);
	}
	/* /dev/zero: one endless line; refused at once, not read whole. */
	r = replay((const char *[]){ "/dev/zero", NULL }, NULL);
	cr_expect_eq(r.status, 2, "exit %d", r.status);
	cr_expect(strstr(r.err, "/dev/zero:1: a line longer"), "%s", r.err);
	run_free(&r);

	const char *spec = spec_log();
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "'%s' --page-size 1G '%s' > /dev/full 2>/dev/null",
		 getenv("VPMM_REPLAY"), spec);
	int st = system(cmd);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a report to /dev/full: status %d", st);
	snprintf(cmd, sizeof(cmd), "'%s' --help > /dev/full 2>/dev/null", getenv("VPMM_REPLAY"));
	st = system(cmd);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "--help to /dev/full: status %d", st);

	FILE *in = fopen(spec, "r");
	char text[4096];
	size_t n = fread(text, 1, sizeof(text) - 1, in);
	fclose(in);
	text[n] = '\0';
	const char *odd = write_file("odd-\xff\xfe-\xc3\xa9.csv", text);
	r = replay((const char *[]){ "--page-size", "1G", "--json", odd, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	const char *json = write_file("odd.json", r.out);
	run_free(&r);
	const char *script = "import json, sys\n"
			     "json.load(open(sys.argv[1], encoding='utf-8'))\n"
			     "print('ok')\n";
	r = run_prog(getenv("PYTHON3"), (const char *[]){ "-c", script, json, NULL }, NULL);
	cr_expect_eq(r.status, 0, "not JSON in UTF-8: %s", r.err);
	run_free(&r);
}

Test(replay, unreadable_file_and_bad_usage)
{
	char missing[300];
	snprintf(missing, sizeof(missing), "%s/no-such.csv", dir);
	struct run r = replay((const char *[]){ missing, NULL }, NULL);
	cr_expect_eq(r.status, 2);
	cr_expect(strstr(r.err, "cannot open") && strstr(r.err, missing), "%s", r.err);
	run_free(&r);

	const char *log = spec_log();
	const char *const *bad_args[] = {
		(const char *[]){ NULL },
		(const char *[]){ "--page-size", "3X", "x.csv", NULL },
		(const char *[]){ "--va-size", "0", "x.csv", NULL },
		(const char *[]){ "--defrag", "some", "x.csv", NULL },
		(const char *[]){ "--pages", "-1", "x.csv", NULL },
		(const char *[]){ "--complete-every", "x", "x.csv", NULL },
		(const char *[]){ "--no-such-option", "x.csv", NULL },
		(const char *[]){ "a.csv", "b.csv", NULL },
	};
	for (size_t i = 0; i < sizeof(bad_args) / sizeof(bad_args[0]); i++) {
		r = replay(bad_args[i], NULL);
		cr_expect_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
		cr_expect_str_empty(r.out, "case %zu", i);
		run_free(&r);
	}

	r = replay((const char *[]){ "--help", NULL }, NULL);
	cr_expect_eq(r.status, 0);
	cr_expect(strstr(r.out, "usage: vpmm-replay") != NULL, "%s", r.out);
	cr_expect(strstr(r.out, "--complete-every") != NULL, "%s", r.out);
	run_free(&r);

	/* The log from standard input. */
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "'%s' --page-size 1G --json - < '%s' > '%s/stdin.json'",
		 getenv("VPMM_REPLAY"), log, dir);
	cr_expect_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/stdin.json", dir);
	char *out = slurp(cmd);
	cr_expect_eq(json_u64(out, "peak_mapped_bytes"), 16 * GiB, "%s", out);
	free(out);
}

