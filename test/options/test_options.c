/* test_options.c — the VPMM_* options table: size syntax, every variable read
 * into its field, every bad value rejected with one line naming it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "vpmm.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define TIB ((size_t)1 << 40)

/* ---- a fake environment ---------------------------------------------------- */

#define MAX_VARS 32
static const char *env_names[MAX_VARS];
static const char *env_values[MAX_VARS];
static size_t env_n;
static unsigned env_lookups;

static const char *fake_getenv(const char *name)
{
	env_lookups++;
	for (size_t i = 0; i < env_n; i++)
		if (strcmp(env_names[i], name) == 0)
			return env_values[i];
	return NULL;
}

static void env_clear(void)
{
	env_n = 0;
	env_lookups = 0;
}

static void env_set(const char *name, const char *value)
{
	for (size_t i = 0; i < env_n; i++) {
		if (strcmp(env_names[i], name) == 0) {
			env_values[i] = value;
			return;
		}
	}
	cr_assert_lt(env_n, MAX_VARS);
	env_names[env_n] = name;
	env_values[env_n] = value;
	env_n++;
}

/* Every variable the project reads (issues 2, 3, 4, 6, and the pool's
 * small_max). */
static const char *const project_vars[] = {
	"VPMM_PAGES", "VPMM_PAGE_SIZE", "VPMM_GRAIN", "VPMM_VA_SIZE", "VPMM_HANDLE_SIZE",
	"VPMM_GROWTH_SPLIT",
	"VPMM_LIMIT", "VPMM_SMALL_MAX", "VPMM_DEFRAG", "VPMM_REMAP", "VPMM_EVENT_INTERVAL_US",
	"VPMM_FRONT_ENTRIES", "VPMM_LOOP_GROWTH", "VPMM_DISABLE",
	"VPMM_LOG", "VPMM_SOCKET", "VPMM_TRACE", "VPMM_RELEASE_THRESHOLD",
	"VPMM_SYNC_FREE",
};
#define N_PROJECT_VARS (sizeof(project_vars) / sizeof(project_vars[0]))

static bool is_pool_var(const char *name)
{
	static const char *const pool_vars[] = {
		"VPMM_PAGES", "VPMM_PAGE_SIZE", "VPMM_GRAIN", "VPMM_VA_SIZE",
		"VPMM_HANDLE_SIZE", "VPMM_GROWTH_SPLIT", "VPMM_LIMIT", "VPMM_SMALL_MAX",
		"VPMM_DEFRAG", "VPMM_EVENT_INTERVAL_US", "VPMM_FRONT_ENTRIES",
		"VPMM_LOOP_GROWTH",
	};
	for (size_t i = 0; i < sizeof(pool_vars) / sizeof(pool_vars[0]); i++)
		if (strcmp(pool_vars[i], name) == 0)
			return true;
	return false;
}

/* ---- vpmm_parse_size -------------------------------------------------------- */

struct size_case {
	const char *s;
	size_t want;
};

Test(size, accepts_decimal_and_suffixes)
{
	static const struct size_case ok[] = {
		{ "0", 0 },
		{ "1", 1 },
		{ "2097152", 2 * MIB },
		{ "512B", 512 },
		{ "512b", 512 },
		{ "64K", 64 * KIB },
		{ "64k", 64 * KIB },
		{ "64KB", 64 * KIB },
		{ "64KiB", 64 * KIB },
		{ "2M", 2 * MIB },
		{ "2MiB", 2 * MIB },
		{ "2mib", 2 * MIB },
		{ "2MIB", 2 * MIB },
		{ "2mb", 2 * MIB },
		{ "2Mb", 2 * MIB },
		{ "1G", GIB },
		{ "10g", 10 * GIB },
		{ "8T", 8 * TIB },
		{ "0M", 0 },
		{ "007K", 7 * KIB },
		{ "16777215T", ((size_t)1 << 24) * TIB - TIB },
		{ "18446744073709551615", SIZE_MAX },
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		size_t v = 12345;
		int rc = vpmm_parse_size(ok[i].s, &v);
		cr_expect_eq(rc, 0, "\"%s\": rc %d", ok[i].s, rc);
		cr_expect_eq(v, ok[i].want, "\"%s\": %zu, want %zu", ok[i].s, v,
			     ok[i].want);
	}
}

Test(size, rejects_malformed)
{
	static const char *const bad[] = {
		"", " 2M", "2M ", "2 M", "\t2M", "2M\n", "-1", "+1", "M", "KB",
		"2X", "3X", "2MM", "2iB", "2Mi", "2MiBx", "2MBB", "0x10", "0X10",
		"1.5G", "1,5G", "16E", "1P", "2KB2", "1e9", "ten", "2 MiB",
		"99999999999999999999X", /* syntax errors win over range */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t v = 12345;
		int rc = vpmm_parse_size(bad[i], &v);
		cr_expect_eq(rc, -EINVAL, "\"%s\": rc %d, want -EINVAL", bad[i], rc);
		cr_expect_eq(v, 12345, "\"%s\": output written on error", bad[i]);
	}
	size_t v = 1;
	cr_expect_eq(vpmm_parse_size(NULL, &v), -EINVAL);
}

Test(size, rejects_overflow_with_erange)
{
	static const char *const big[] = {
		"99999999999999999999", "18446744073709551616",
		"16777216T", "17179869184G", "17592186044416M",
		"18014398509481984K", "99999999999999999999999999T",
	};
	for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
		size_t v = 12345;
		int rc = vpmm_parse_size(big[i], &v);
		cr_expect_eq(rc, -ERANGE, "\"%s\": rc %d, want -ERANGE", big[i], rc);
		cr_expect_eq(v, 12345);
	}
}

/* ---- defaults ---------------------------------------------------------------- */

Test(config, defaults)
{
	struct vpmm_config c;
	memset(&c, 0xab, sizeof(c));
	vpmm_config_default(&c);
	cr_expect_eq(c.page_size, 0);
	cr_expect_eq(c.va_size, 8 * TIB);
	cr_expect_eq(c.initial_pages, 0);
	cr_expect_eq(c.handle_size, GIB);
	cr_expect_eq(c.growth_split, 16);
	cr_expect_eq(c.limit, 0);
	cr_expect_eq(c.small_max, 2 * MIB);
	cr_expect_eq(c.grain, 64 * KIB);
	cr_expect_eq(c.device, 0);
	cr_expect_eq(c.defrag, VPMM_DEFRAG_LACKING);
	cr_expect_eq(c.event_interval_ns, 50000);

	struct vpmm_env_options o;
	memset(&o, 0xab, sizeof(o));
	vpmm_env_options_default(&o);
	cr_expect_not(o.disable);
	cr_expect_eq(o.log_level, VPMM_LOG_WARN);
	cr_expect_not(o.socket_off);
	cr_expect_str_empty(o.socket);
	cr_expect_str_empty(o.trace);
	cr_expect_not(o.has_release_threshold);
}

static void expect_config_eq(const struct vpmm_config *a, const struct vpmm_config *b)
{
	cr_expect_eq(a->page_size, b->page_size);
	cr_expect_eq(a->va_size, b->va_size);
	cr_expect_eq(a->initial_pages, b->initial_pages);
	cr_expect_eq(a->handle_size, b->handle_size);
	cr_expect_eq(a->limit, b->limit);
	cr_expect_eq(a->small_max, b->small_max);
	cr_expect_eq(a->device, b->device);
	cr_expect_eq(a->defrag, b->defrag);
	cr_expect_eq(a->event_interval_ns, b->event_interval_ns);
}

Test(config, empty_environment_gives_defaults)
{
	struct vpmm_config c, d;
	char err[256] = "untouched";
	env_clear();
	memset(&c, 0xab, sizeof(c));
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0);
	vpmm_config_default(&d);
	expect_config_eq(&c, &d);
	cr_expect_str_empty(err, "err not cleared on success: %s", err);
	cr_expect_gt(env_lookups, 0, "the fake getenv was never asked");
}

Test(config, empty_value_is_unset)
{
	struct vpmm_config c, d;
	struct vpmm_env_options o;
	char err[256];
	env_clear();
	for (size_t i = 0; i < N_PROJECT_VARS; i++)
		env_set(project_vars[i], "");
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	vpmm_config_default(&d);
	expect_config_eq(&c, &d);
	cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_not(o.disable);
	cr_expect_not(o.socket_off);
	cr_expect_str_empty(o.socket);
	cr_expect_str_empty(o.trace);
	cr_expect_not(o.has_release_threshold);
}

/* The table's default column says what the default functions set. */
Test(config, documented_defaults_parse_to_the_defaults)
{
	size_t n;
	const struct vpmm_option_info *t = vpmm_options_table(&n);
	struct vpmm_config c, d;
	struct vpmm_env_options o, od;
	char err[256];
	size_t parsed = 0;

	env_clear();
	for (size_t i = 0; i < n; i++) {
		if (t[i].def[0] == '(')
			continue; /* "(keep all)", "(none)": descriptions of unset */
		env_set(t[i].name, t[i].def);
		parsed++;
	}
	cr_assert_geq(parsed, 9);
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	vpmm_config_default(&d);
	expect_config_eq(&c, &d);
	cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
	vpmm_env_options_default(&od);
	cr_expect_eq(o.disable, od.disable);
	cr_expect_eq(o.log_level, od.log_level);
}

/* ---- every variable into its field ------------------------------------------- */

Test(config, every_pool_variable)
{
	struct vpmm_config c;
	char err[256];
	env_clear();
	env_set("VPMM_PAGES", "16384");
	env_set("VPMM_PAGE_SIZE", "4M");
	env_set("VPMM_VA_SIZE", "1T");
	env_set("VPMM_HANDLE_SIZE", "64MiB");
	env_set("VPMM_LIMIT", "20G");
	env_set("VPMM_SMALL_MAX", "512K");
	env_set("VPMM_GRAIN", "4K");
	env_set("VPMM_GROWTH_SPLIT", "3");
	env_set("VPMM_DEFRAG", "all");
	env_set("VPMM_EVENT_INTERVAL_US", "7");
	env_set("VPMM_FRONT_ENTRIES", "256");
	env_set("VPMM_LOOP_GROWTH", "40");
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.initial_pages, 16384);
	cr_expect_eq(c.page_size, 4 * MIB);
	cr_expect_eq(c.va_size, TIB);
	cr_expect_eq(c.handle_size, 64 * MIB);
	cr_expect_eq(c.limit, 20 * GIB);
	cr_expect_eq(c.small_max, 512 * KIB);
	cr_expect_eq(c.grain, 4 * KIB);
	cr_expect_eq(c.growth_split, 3);
	cr_expect_eq(c.defrag, VPMM_DEFRAG_ALL);
	cr_expect_eq(c.event_interval_ns, 7000);
	cr_expect_eq(c.front_entries, 256);
	cr_expect_eq(c.loop_growth, 40);
	cr_expect_eq(c.device, 0);

	env_clear();
	env_set("VPMM_DEFRAG", "LACKING");
	env_set("VPMM_EVENT_INTERVAL_US", "0");
	env_set("VPMM_PAGE_SIZE", "0");
	env_set("VPMM_FRONT_ENTRIES", "0");
	env_set("VPMM_LOOP_GROWTH", "0");
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.front_entries, 0);
	cr_expect_eq(c.loop_growth, 0);
	cr_expect_eq(c.defrag, VPMM_DEFRAG_LACKING);
	cr_expect_eq(c.event_interval_ns, 0);
	cr_expect_eq(c.page_size, 0);
}

Test(config, every_process_variable)
{
	struct vpmm_env_options o;
	char err[256];
	env_clear();
	env_set("VPMM_DISABLE", "1");
	env_set("VPMM_LOG", "debug");
	env_set("VPMM_SOCKET", "/run/user/1000/my.sock");
	env_set("VPMM_TRACE", "/tmp/trace.csv");
	env_set("VPMM_RELEASE_THRESHOLD", "1G");
	cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect(o.disable);
	cr_expect_eq(o.log_level, VPMM_LOG_DEBUG);
	cr_expect_not(o.socket_off);
	cr_expect_str_eq(o.socket, "/run/user/1000/my.sock");
	cr_expect_str_eq(o.trace, "/tmp/trace.csv");
	cr_expect(o.has_release_threshold);
	cr_expect_eq(o.release_threshold, GIB);

	env_clear();
	env_set("VPMM_SOCKET", "off");
	env_set("VPMM_LOG", "ERROR");
	env_set("VPMM_RELEASE_THRESHOLD", "0");
	cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect(o.socket_off);
	cr_expect_str_empty(o.socket);
	cr_expect_eq(o.log_level, VPMM_LOG_ERROR);
	cr_expect(o.has_release_threshold, "0 is a threshold (release everything), not unset");
	cr_expect_eq(o.release_threshold, 0);
}

Test(config, bool_spellings)
{
	static const char *const yes[] = { "1", "yes", "true", "on", "YES", "True", "ON" };
	static const char *const no[] = { "0", "no", "false", "off", "NO", "False", "Off" };
	struct vpmm_env_options o;
	char err[256];
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		env_clear();
		env_set("VPMM_DISABLE", yes[i]);
		cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
		cr_expect(o.disable, "\"%s\" read as false", yes[i]);
		env_set("VPMM_DISABLE", no[i]);
		cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
		cr_expect_not(o.disable, "\"%s\" read as true", no[i]);
	}
}

Test(config, log_levels)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	struct vpmm_env_options o;
	char err[256];
	for (int i = 0; i < 4; i++) {
		env_clear();
		env_set("VPMM_LOG", names[i]);
		cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq((int)o.log_level, i);
		cr_expect_str_eq(vpmm_log_level_name(o.log_level), names[i]);
	}
}

Test(config, socket_path_length_limit)
{
	struct vpmm_env_options o;
	char err[256];
	char path[VPMM_SOCKET_PATH_MAX + 1];

	memset(path, 'a', sizeof(path));
	path[0] = '/';
	path[VPMM_SOCKET_PATH_MAX - 1] = '\0'; /* 107 bytes: fits sun_path */
	env_clear();
	env_set("VPMM_SOCKET", path);
	cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_str_eq(o.socket, path);

	path[VPMM_SOCKET_PATH_MAX - 1] = 'a';
	path[VPMM_SOCKET_PATH_MAX] = '\0'; /* 108 bytes: does not */
	cr_expect_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect(strncmp(err, "VPMM_SOCKET=", 12) == 0, "%s", err);
}

Test(config, groups_read_only_their_variables)
{
	struct vpmm_config c;
	struct vpmm_env_options o;
	char err[256];
	env_clear();
	env_set("VPMM_LOG", "bogus");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	env_clear();
	env_set("VPMM_PAGES", "bogus");
	cr_expect_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s", err);
}

Test(config, null_getenv_reads_the_process_environment)
{
	struct vpmm_config c;
	struct vpmm_env_options o;
	char err[256];
	/* Criterion runs each test in its own process: setenv stays here. */
	cr_assert_eq(setenv("VPMM_PAGES", "7", 1), 0);
	cr_assert_eq(setenv("VPMM_LOG", "info", 1), 0);
	cr_assert_eq(vpmm_config_from_env(&c, NULL, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.initial_pages, 7);
	cr_assert_eq(vpmm_env_options_from_env(&o, NULL, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(o.log_level, VPMM_LOG_INFO);
}

/* ---- bad values ----------------------------------------------------------------- */

struct bad_case {
	const char *var;
	const char *value;
	const char *says; /* expected in the message after "VAR=\"value\": " */
};

static const struct bad_case bad_cases[] = {
	{ "VPMM_PAGES", "x", "expected a whole number" },
	{ "VPMM_PAGES", "-1", "expected a whole number" },
	{ "VPMM_PAGES", "2M", "expected a whole number" },
	{ "VPMM_PAGES", " 1", "expected a whole number" },
	{ "VPMM_PAGES", "99999999999999999999", "too large" },
	{ "VPMM_PAGE_SIZE", "3X", "expected a size such as 2M or 2097152" },
	{ "VPMM_PAGE_SIZE", "3M", "power of two" },
	{ "VPMM_PAGE_SIZE", "16E", "expected a size" },
	{ "VPMM_PAGE_SIZE", "99999999999999999999", "too large" },
	{ "VPMM_VA_SIZE", "0", "at least 1G" },
	{ "VPMM_VA_SIZE", "64K", "at least 1G" },
	{ "VPMM_VA_SIZE", "1023M", "at least 1G" },
	{ "VPMM_GROWTH_SPLIT", "4097", "must be at most 4096" },
	{ "VPMM_GROWTH_SPLIT", "4294967296", "must be at most 4096" },
	{ "VPMM_GROWTH_SPLIT", "4294967312", "must be at most 4096" },
	{ "VPMM_VA_SIZE", "abc", "expected a size" },
	{ "VPMM_HANDLE_SIZE", "1.5G", "expected a size" },
	{ "VPMM_LIMIT", "-1", "expected a size" },
	{ "VPMM_LIMIT", "2 G", "expected a size" },
	{ "VPMM_SMALL_MAX", "1M+", "expected a size" },
	{ "VPMM_DEFRAG", "some", "expected one of: lacking, all" },
	{ "VPMM_DEFRAG", "lacking ", "expected one of: lacking, all" },
	{ "VPMM_EVENT_INTERVAL_US", "50us", "expected a whole number" },
	{ "VPMM_EVENT_INTERVAL_US", "18446744073709551615", "too large" },
	{ "VPMM_FRONT_ENTRIES", "257", "must be at most 256" },
	{ "VPMM_FRONT_ENTRIES", "-1", "expected a whole number" },
	{ "VPMM_LOOP_GROWTH", "1001", "must be at most 1000" },
	{ "VPMM_LOOP_GROWTH", "15%", "expected a whole number" },
	{ "VPMM_DISABLE", "2", "expected 1/0, yes/no, true/false or on/off" },
	{ "VPMM_DISABLE", "yess", "expected 1/0" },
	{ "VPMM_LOG", "verbose", "expected one of: error, warn, info, debug" },
	{ "VPMM_RELEASE_THRESHOLD", "1 G", "expected a size" },
	{ "VPMM_RELEASE_THRESHOLD", "all", "expected a size" },
	{ "VPMM_SOCKET", " ", "spaces at its start or end" },
	{ "VPMM_SOCKET", "off ", "spaces at its start or end" },
	{ "VPMM_SOCKET", " /tmp/x.sock", "spaces at its start or end" },
	{ "VPMM_TRACE", "/tmp/t.csv ", "spaces at its start or end" },
};

Test(errors, each_bad_value_names_variable_and_value)
{
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const struct bad_case *b = &bad_cases[i];
		char err[512] = "";
		char prefix[256];
		int rc;

		env_clear();
		env_set(b->var, b->value);
		if (is_pool_var(b->var)) {
			struct vpmm_config c;
			memset(&c, 0x5a, sizeof(c));
			rc = vpmm_config_from_env(&c, fake_getenv, err, sizeof(err));
			cr_expect_eq(c.va_size, (size_t)0x5a5a5a5a5a5a5a5a,
				     "%s: cfg written on error", b->var);
		} else {
			struct vpmm_env_options o;
			memset(&o, 0x5a, sizeof(o));
			rc = vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err));
			cr_expect_eq(o.release_threshold, (size_t)0x5a5a5a5a5a5a5a5a,
				     "%s: options written on error", b->var);
		}
		cr_expect_eq(rc, -EINVAL, "%s=\"%s\": rc %d", b->var, b->value, rc);
		snprintf(prefix, sizeof(prefix), "%s=\"%s\": ", b->var, b->value);
		cr_expect(strncmp(err, prefix, strlen(prefix)) == 0,
			  "message \"%s\" does not start with \"%s\"", err, prefix);
		cr_expect(strstr(err, b->says) != NULL,
			  "message \"%s\" does not say \"%s\"", err, b->says);
		cr_expect(strchr(err, '\n') == NULL, "message has a newline: %s", err);
	}
}

Test(errors, trace_path_too_long)
{
	static char path[VPMM_TRACE_PATH_MAX + 10];
	struct vpmm_env_options o;
	char err[256];
	memset(path, 'p', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	env_clear();
	env_set("VPMM_TRACE", path);
	cr_expect_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect(strncmp(err, "VPMM_TRACE=\"ppp", 15) == 0, "%s", err);
	cr_expect(strstr(err, "...") != NULL, "long value not cut: %s", err);
	cr_expect(strstr(err, "too long") != NULL, "%s", err);
}

/* A value cut to fit the message says so, however its bytes are escaped
 * (31 control bytes and "XYZ" showed as 22 escapes and nothing more). */
Test(errors, a_value_cut_short_ends_in_dots)
{
	struct vpmm_config c;
	char err[256], v[40];
	memset(v, 1, 31);
	strcpy(v + 31, "XYZ");
	env_clear();
	env_set("VPMM_PAGES", v);
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "\\x01...\"") != NULL, "%s", err);
	cr_expect(strstr(err, "XYZ") == NULL, "%s", err);
	env_set("VPMM_PAGES", "12X");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "VPMM_PAGES=\"12X\"") != NULL, "%s", err);
}

/* A handle holds whole pages: one smaller than the page (the default 1G
 * under VPMM_PAGE_SIZE=2G, or a granularity of 2G) is one page, as 0 is.
 * VPMM_PAGE_SIZE=2G alone was refused, blaming VPMM_HANDLE_SIZE. */
Test(config, a_handle_below_the_page_is_one_page)
{
	struct vpmm_config c;
	struct vpmm_units u;
	char err[256] = "";
	env_clear();
	env_set("VPMM_PAGE_SIZE", "2G");
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(vpmm_config_check(&c, 2 * MIB, err, sizeof err), 0, "%s", err);
	vpmm_config_units(&c, 2 * MIB, &u);
	cr_expect_eq(u.handle, 2 * GIB);
	env_clear();
	cr_assert_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(vpmm_config_check(&c, 2 * GIB, err, sizeof err), 0, "%s", err);
	vpmm_config_units(&c, 2 * GIB, &u);
	cr_expect_eq(u.handle, 2 * GIB);
	vpmm_config_units(&c, 4 * MIB, &u);
	cr_expect_eq(u.handle, GIB, "the default kept where it is a page or more");
}

Test(errors, message_stays_one_line)
{
	struct vpmm_config c;
	char err[256];
	env_clear();
	env_set("VPMM_PAGES", "1\n2\"\\");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect(strchr(err, '\n') == NULL, "%s", err);
	cr_expect(strstr(err, "VPMM_PAGES=\"1\\x0a2\\x22\\x5c\"") != NULL, "%s", err);
}

Test(errors, small_or_missing_error_buffer)
{
	struct vpmm_config c;
	char err[12];
	memset(err, 'z', sizeof(err));
	env_clear();
	env_set("VPMM_PAGE_SIZE", "3X");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, 8), -EINVAL);
	cr_expect_str_eq(err, "VPMM_PA");
	cr_expect_eq(err[9], 'z', "wrote past errlen");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, NULL, 0), -EINVAL);
}

Test(errors, first_bad_variable_fails_the_whole_read)
{
	struct vpmm_config c;
	char err[256];
	vpmm_config_default(&c);
	env_clear();
	env_set("VPMM_PAGES", "4");
	env_set("VPMM_LIMIT", "lots");
	cr_expect_eq(vpmm_config_from_env(&c, fake_getenv, err, sizeof(err)), -EINVAL);
	cr_expect_eq(c.initial_pages, 0, "a good variable was applied despite the error");
	cr_expect(strstr(err, "VPMM_LIMIT") != NULL, "%s", err);
}

/* ---- the table ------------------------------------------------------------------- */

Test(table, covers_every_project_variable_once)
{
	size_t n;
	const struct vpmm_option_info *t = vpmm_options_table(&n);
	cr_expect_eq(n, N_PROJECT_VARS);
	for (size_t v = 0; v < N_PROJECT_VARS; v++) {
		size_t found = 0;
		for (size_t i = 0; i < n; i++)
			found += strcmp(t[i].name, project_vars[v]) == 0;
		cr_expect_eq(found, 1, "%s appears %zu times", project_vars[v], found);
	}
	for (size_t i = 0; i < n; i++) {
		cr_expect(strncmp(t[i].name, "VPMM_", 5) == 0, "%s", t[i].name);
		cr_expect(t[i].desc && strlen(t[i].desc) > 10, "%s: no description", t[i].name);
		cr_expect(t[i].def && t[i].def[0], "%s: no default", t[i].name);
		cr_expect(strchr(t[i].desc, '\n') == NULL, "%s: description not one line", t[i].name);
		cr_expect(!strcmp(t[i].type, "size") || !strcmp(t[i].type, "count") ||
			  !strcmp(t[i].type, "enum") || !strcmp(t[i].type, "bool") ||
			  !strcmp(t[i].type, "string"),
			  "%s: type %s", t[i].name, t[i].type);
	}
}

Test(table, print_lists_name_default_description)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	vpmm_options_print(f);
	cr_assert_eq(fclose(f), 0);

	size_t n;
	const struct vpmm_option_info *t = vpmm_options_table(&n);
	size_t lines = 0;
	for (const char *p = buf; *p; p++)
		lines += *p == '\n';
	cr_expect_eq(lines, n);
	for (size_t i = 0; i < n; i++) {
		const char *line = strstr(buf, t[i].name);
		cr_assert_not_null(line, "%s not printed", t[i].name);
		const char *eol = strchr(line, '\n');
		const char *d = strstr(line, t[i].def);
		const char *desc = strstr(line, t[i].desc);
		cr_expect(d && d < eol, "%s: default not on its line", t[i].name);
		cr_expect(desc && desc < eol, "%s: description not on its line", t[i].name);
	}
	free(buf);
}

/* "off" in any case turns the socket off, as other words are read. */
Test(config, socket_off_in_any_case)
{
	const char *offs[] = {"off", "OFF", "Off"};
	for (size_t i = 0; i < 3; i++) {
		struct vpmm_env_options o;
		char err[256] = "";
		env_clear();
		env_set("VPMM_SOCKET", offs[i]);
		cr_assert_eq(vpmm_env_options_from_env(&o, fake_getenv, err, sizeof(err)), 0, "%s",
			     err);
		cr_expect(o.socket_off, "VPMM_SOCKET=%s did not turn the socket off", offs[i]);
		cr_expect_str_eq(o.socket, "");
	}
}

/* The checks that need the driver's granularity: each names the variable
 * at fault and its value. */
Test(config, checks_against_the_granularity_name_the_variable)
{
	const size_t K = 1024, M = K * K, G = M * K;
	struct {
		size_t page, handle, va, grain, pages;
		const char *says;
	} bad[] = {
		{32 * K, 0, G, 0, 0, "VPMM_PAGE_SIZE=32K is not a multiple of the driver's granularity 64K"},
		{96 * K, 0, G, 0, 0, "VPMM_PAGE_SIZE=96K"},
		{2 * G, 3 * G, G, 0, 0, "VPMM_HANDLE_SIZE=3G is not a whole number of pages of 2G"},
		{0, 96 * K, G, 0, 0, "VPMM_HANDLE_SIZE=96K"},
		{0, 0, SIZE_MAX, 0, 0, "VPMM_VA_SIZE="},
		{0, 0, G, 256, 0, "VPMM_GRAIN=256"},
		{0, 0, G, 100, 0, "VPMM_GRAIN=100"},
		{192 * K, 0, G, 128 * K, 0, "VPMM_GRAIN=128K"},
		{0, 0, G, 0, SIZE_MAX, "VPMM_PAGES=18446744073709551615"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct vpmm_config c;
		char err[256] = "";
		vpmm_config_default(&c);
		c.page_size = bad[i].page;
		c.handle_size = bad[i].handle;
		c.va_size = bad[i].va;
		c.grain = bad[i].grain;
		c.initial_pages = bad[i].pages;
		cr_expect_eq(vpmm_config_check(&c, 64 * K, err, sizeof err), -EINVAL, "case %zu", i);
		cr_expect(strstr(err, bad[i].says) != NULL, "case %zu: \"%s\" does not say \"%s\"",
			  i, err, bad[i].says);
		cr_expect(vpmm_config_check(&c, 64 * K, NULL, 0) == -EINVAL);
	}
	struct vpmm_config c;
	char err[8] = "x";
	vpmm_config_default(&c);
	cr_expect_eq(vpmm_config_check(&c, 2 * M, err, sizeof err), 0, "%s", err);
	cr_expect_eq(vpmm_config_check(&c, 0, err, sizeof err), -EINVAL, "no granularity");
}

/* Values with which every allocation would fail are refused, naming the
 * variable and the rule (VPMM_LIMIT=1 and a page larger than the device
 * were accepted; VPMM_PAGES over VPMM_LIMIT was blamed on the pages). */
Test(config, impossible_values_are_refused_naming_the_variable)
{
	const size_t K = 1024, M = K * K, G = M * K;
	struct {
		size_t page, limit, pages, total;
		const char *says;
	} bad[] = {
		{0, 1, 0, 0, "VPMM_LIMIT=1 is less than one page of 64K"},
		{2 * M, M, 0, 0, "VPMM_LIMIT=1M is less than one page of 2M"},
		{0, 64 * K, 2, 0, "VPMM_LIMIT=64K is less than the VPMM_PAGES=2 pages of 64K"},
		{512 * M, 0, 0, 256 * M, "VPMM_PAGE_SIZE=512M is more than the device's memory (256M)"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct vpmm_config c;
		char err[256] = "";
		vpmm_config_default(&c);
		c.page_size = bad[i].page;
		c.limit = bad[i].limit;
		c.initial_pages = bad[i].pages;
		cr_expect_eq(vpmm_config_check_device(&c, 64 * K, bad[i].total, err, sizeof err),
			     -EINVAL, "case %zu", i);
		cr_expect(strstr(err, bad[i].says) != NULL, "case %zu: \"%s\" does not say \"%s\"",
			  i, err, bad[i].says);
	}
	/* at the edges: fine */
	struct vpmm_config c;
	char err[256] = "";
	vpmm_config_default(&c);
	c.limit = 128 * K;
	c.initial_pages = 2;
	cr_expect_eq(vpmm_config_check_device(&c, 64 * K, 256 * M, err, sizeof err), 0, "%s", err);
	c.page_size = 256 * M;
	c.limit = 512 * M;
	cr_expect_eq(vpmm_config_check_device(&c, 64 * K, 256 * M, err, sizeof err), 0, "%s", err);
	c.page_size = G;
	c.limit = 0;
	cr_expect_eq(vpmm_config_check_device(&c, 64 * K, 0, err, sizeof err), 0, "unknown total");
}

struct seen {
	char given[8][48], meant[8][48];
	size_t n;
};

static void note_misspelled(const char *given, const char *meant, void *arg)
{
	struct seen *s = arg;
	cr_assert_lt(s->n, 8);
	snprintf(s->given[s->n], sizeof s->given[0], "%s", given);
	snprintf(s->meant[s->n], sizeof s->meant[0], "%s", meant);
	s->n++;
}

/* Names one slip from an option are reported with the option; the options
 * themselves, other programs' VPMM_ names and everything else are not. */
Test(table, misspelled_names_are_reported_with_the_option_meant)
{
	char *env[] = {"VPMM_PAGESIZE=1G", "VPMM_DISABLED=1", "vpmm_disable=1",
		       "VPMM_HANDEL_SIZE=8M", "VPMM_PAGE_SIZE=2M", "VPMM_LIB=/x/libvpmm.so",
		       "VPMM_STRESS_SEED=3", "VPMM_REPLAY=/bin/true", "PATH=/bin", "VPMM_",
		       "VPMM_LOG", "VPMM_PAGE_S\xc4\xb0ZE=1M", "VPMM_\xd0\x9cOG=1", NULL};
	struct seen s = {0};
	cr_assert_eq(vpmm_options_misspelled(env, note_misspelled, &s), 6);
	/* a look-alike letter of another alphabet is one slip, whatever its
	 * bytes (the Turkish dotted capital I, a Cyrillic capital M) */
	const char *want[6][2] = {{"VPMM_PAGESIZE", "VPMM_PAGE_SIZE"},
				  {"VPMM_DISABLED", "VPMM_DISABLE"},
				  {"vpmm_disable", "VPMM_DISABLE"},
				  {"VPMM_HANDEL_SIZE", "VPMM_HANDLE_SIZE"},
				  {"VPMM_PAGE_S\xc4\xb0ZE", "VPMM_PAGE_SIZE"},
				  {"VPMM_\xd0\x9cOG", "VPMM_LOG"}};
	for (size_t i = 0; i < 6; i++) {
		cr_expect_str_eq(s.given[i], want[i][0]);
		cr_expect_str_eq(s.meant[i], want[i][1]);
	}
	cr_assert_eq(vpmm_options_misspelled(NULL, note_misspelled, &s), 0);
}
