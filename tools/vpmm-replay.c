/* vpmm-replay.c — replays an allocation log in RMM's CSV format through a
 * vpmm pool on the unbacked host driver (no memory is touched, so logs of
 * hundreds of GB replay on any machine) and reports how much memory the pool
 * had to map for it, and how fast it was. The whole log is parsed first (a
 * malformed line stops everything before the pool is touched), then
 * replayed in a tight loop that alone is timed.
 *
 * This file owns the options (--help), the pool and the simulated device
 * they make, and main, which parses the log, replays it and reports: the
 * parts that do each (replay.h). It calls them all, vpmm.h, options.h and
 * driver_host.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver_host.h"
#include "options.h"
#include "replay.h"
#include "vpmm.h"
#include "vpmm/version.h"

/* Whether everything written to stdout got there (/dev/full, a closed
 * descriptor); says why when not. */
static bool stdout_ok(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return true;
	fprintf(stderr, "vpmm-replay: writing the output: %s\n", strerror(errno ? errno : EIO));
	return false;
}

/* The --plot file, opened for writing before the log is read, so that a
 * path that cannot be written costs no replay; never the log itself. Not
 * truncated until the image is written (plot_empty), and removed if this
 * run made it and wrote nothing (plot_drop): a malformed log or settings
 * that make no pool once emptied the image already there. *created: the
 * file is new. */
static FILE *open_plot(const char *path, FILE *log, bool *created)
{
	struct stat a, b;
	if (stat(path, &a) == 0 && fstat(fileno(log), &b) == 0 && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino) {
		fprintf(stderr, "vpmm-replay: --plot %s: that is the log\n", path);
		return NULL;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	*created = fd >= 0;
	if (fd < 0 && errno == EEXIST)
		fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) /* a dangling link: its target made */
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (*created)
			unlink(path);
		fprintf(stderr, "vpmm-replay: cannot write the plot %s: %s\n", path, strerror(e));
	}
	return f;
}

/* The image about to be written: the file starts empty. */
static void plot_empty(FILE *f)
{
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode))
		(void)!ftruncate(fileno(f), 0);
}

/* Nothing to write: the file as it was, or none if this run made it. */
static void plot_drop(FILE *f, const char *path, bool created)
{
	fclose(f);
	if (created)
		unlink(path);
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fputs(
"usage: vpmm-replay [OPTIONS] LOG.csv\n"
"\n"
"Replays an allocation log in RMM's CSV format (the header\n"
"" HEADER ", as rmm::mr::logging_resource_adaptor and VPMM_TRACE\n"
"write it) through a vpmm pool on a simulated device that touches no memory,\n"
"and prints the peak live and peak mapped bytes, their ratio, the pages created\n"
"and remapped, the defragmentations and the time per operation. LOG may be '-'\n"
"for standard input. Pointers and streams are read as hexadecimal (0x optional).\n"
"Stream 0 is the default stream, 0xffffffffffffffff means no stream order\n"
"(what VPMM_TRACE writes for a call the pool took without one), every other\n"
"value is a stream of its own.\n"
"\n"
"Pool options (defaults: the VPMM_* variables, else the library's defaults;\n"
"each stands for its variable and is checked by the same rules):\n"
"  --page-size SIZE      page size (default: the granularity)\n"
"  --va-size SIZE        VA reserved per chunk (default 8T)\n"
"  --pages N             pages mapped at creation (default 0)\n"
"  --handle-size SIZE    largest physical handle (default 1G; less than a page:\n"
"                        one page)\n"
"  --grain SIZE          allocation rounding unit (default 64K; the page: the\n"
"                        whole pages)\n"
"  --small-max SIZE      requests up to this share slabs of size classes\n"
"  --limit SIZE          most bytes the pool may map (default 0: none)\n"
"  --defrag lacking|all  what a defragmentation remaps (default lacking)\n"
"  --remap pressure|always\n"
"                        remap only as the device fills (default), or always\n"
"                        before growing\n"
"  --growth-split N      VPMM_GROWTH_SPLIT: handles a growth is split into\n"
"  --event-interval-us N a free records an event only if its stream's last one\n"
"                        is older than N us (default 50; 0: every free)\n"
"  --front N             entries of each stream's cache of freed allocations\n"
"                        (default 0, whatever VPMM_FRONT_ENTRIES says: the\n"
"                        pool itself is measured)\n"
"Simulated device:\n"
"  --granularity SIZE    allocation granularity, a power of two from 4K\n"
"                        (default 2M)\n"
"  --capacity SIZE       device memory (default 1024T)\n"
"  --tenant OP:SIZE[,OP:SIZE...]\n"
"                        another process holds SIZE of the device from\n"
"                        operation OP on (0 = the first), e.g. 0:60G,9000:40G\n"
"  --clock log|wall      the clock of the pool's rules that follow time (the\n"
"                        event interval, reads of the device's free memory):\n"
"                        the log's Time column (default; 1 us an operation\n"
"                        where it holds no time of day), so that runs repeat,\n"
"                        or the host's, as the replay runs\n"
"  --complete-every N    the device finishes all queued work after every N\n"
"                        operations (default 1; 0: never, so other streams'\n"
"                        memory is reused only through defragmentation waits)\n",
	      f);
	fputs("Output:\n"
"  --json                one JSON object: peak_live_bytes (rounded to pages),\n"
"                        peak_requested_bytes (as logged), peak_mapped_bytes,\n"
"                        ratio, ops, pages_created, pages_remapped, defrags,\n"
"                        ns_per_op, failures, unknown_frees, ...\n"
"  --plot FILE.svg       also draw live and mapped bytes over the log's\n"
"                        operations, defragmentations and growths marked, as\n"
"                        an SVG image (the pool's stats read after every\n"
"                        operation: the time per operation includes them)\n"
"  --check               run the pool's consistency check after every operation\n"
"                        (slow); exit 1 if it finds anything\n"
"  -h, --help            this text\n"
"  --version             the version\n"
"\n"
"SIZE: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. 2M, 1G.\n"
"Exit status: 0 replayed (allocation failures are counted, not fatal);\n"
"1 the pool could not be created or the check failed; 2 bad usage or a\n"
"malformed or unreadable log (the message names FILE:LINE), or a --plot\n"
"file that cannot be written.\n"
"On a terminal, a long log's reading and replay show their progress on\n"
"standard error.\n", f);
}

enum {
	O_PAGE_SIZE = 256, O_VA_SIZE, O_PAGES, O_HANDLE_SIZE, O_LIMIT, O_DEFRAG,
	O_GRAIN, O_SMALL_MAX, O_REMAP, O_GROWTH_SPLIT, O_TENANT,
	O_EVENT_INTERVAL, O_FRONT, O_GRANULARITY, O_CAPACITY, O_CLOCK, O_COMPLETE_EVERY, O_JSON,
	O_PLOT, O_CHECK, O_VERSION,
};

static bool size_arg(const char *opt, const char *s, size_t *out)
{
	int rc = vpmm_parse_size(s, out);
	if (rc == 0)
		return true;
	fprintf(stderr, "vpmm-replay: %s \"%s\": %s\n", opt, s,
		rc == -ERANGE ? "too large"
			      : "expected a size such as 2M or 2097152");
	return false;
}

/* --granularity: what the host driver takes, a power of two from 4K;
 * --capacity: at least one byte (0 once meant the default, unsaid). */
static bool device_arg(const char *opt, const char *s, bool granularity, size_t *out)
{
	if (!size_arg(opt, s, out))
		return false;
	if (granularity && (*out < 4096 || (*out & (*out - 1)))) {
		fprintf(stderr, "vpmm-replay: %s \"%s\": expected a power of two from 4K\n", opt, s);
		return false;
	}
	if (!granularity && !*out) {
		fprintf(stderr, "vpmm-replay: %s \"%s\": expected more than 0\n", opt, s);
		return false;
	}
	return true;
}

/* --tenant OP:SIZE[,OP:SIZE...], operations in ascending order. */
static bool tenant_arg(const char *opt, const char *s, struct tenant *t)
{
	free(t->step);
	t->step = NULL;
	t->n = 0;
	char *copy = strdup(s), *save = NULL, *item;
	/* strtok_r passes over empty items: ",", "0:1G,,5:2G" and a comma at
	 * either end are no schedule. */
	size_t len = strlen(s);
	bool ok = copy && len && s[0] != ',' && s[len - 1] != ',' && !strstr(s, ",,");
	for (item = copy ? strtok_r(copy, ",", &save) : NULL; ok && item;
	     item = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(item, ':');
		struct tenant_step st;
		struct tenant_step *grown;
		if (!colon) {
			ok = false;
			break;
		}
		*colon = '\0';
		if (!parse_dec(item, &st.op) || vpmm_parse_size(colon + 1, &st.bytes) ||
		    (t->n && st.op < t->step[t->n - 1].op) ||
		    !(grown = realloc(t->step, (t->n + 1) * sizeof(*grown)))) {
			ok = false;
			break;
		}
		t->step = grown;
		t->step[t->n++] = st;
	}
	free(copy);
	if (!ok) {
		/* a refused schedule leaves none behind */
		free(t->step);
		t->step = NULL;
		t->n = 0;
		fprintf(stderr, "vpmm-replay: %s \"%s\": expected OP:SIZE[,OP:SIZE...] "
				"with operations in ascending order, e.g. 0:60G,5000:70G\n",
			opt, s);
	}
	return ok;
}

static bool count_arg(const char *opt, const char *s, uint64_t *out)
{
	if (parse_dec(s, out))
		return true;
	fprintf(stderr, "vpmm-replay: %s \"%s\": expected a whole number\n", opt, s);
	return false;
}

/* The pool options, by the VPMM_* variable each one stands for. Their values
 * are read through the options table, as the environment's are, so that
 * --page-size 3M and VPMM_PAGE_SIZE=3M are judged alike (they were not: the
 * option took a page that is no power of two, and a VA of 1K). */
static const struct {
	int opt;
	const char *var;
} pool_opts[] = {
	{ O_PAGE_SIZE, "VPMM_PAGE_SIZE" },
	{ O_VA_SIZE, "VPMM_VA_SIZE" },
	{ O_PAGES, "VPMM_PAGES" },
	{ O_HANDLE_SIZE, "VPMM_HANDLE_SIZE" },
	{ O_GRAIN, "VPMM_GRAIN" },
	{ O_SMALL_MAX, "VPMM_SMALL_MAX" },
	{ O_LIMIT, "VPMM_LIMIT" },
	{ O_DEFRAG, "VPMM_DEFRAG" },
	{ O_REMAP, "VPMM_REMAP" },
	{ O_GROWTH_SPLIT, "VPMM_GROWTH_SPLIT" },
	{ O_EVENT_INTERVAL, "VPMM_EVENT_INTERVAL_US" },
	{ O_FRONT, "VPMM_FRONT_ENTRIES" },
};
#define NPOOL_OPTS (sizeof(pool_opts) / sizeof(pool_opts[0]))
static const char *pool_given[NPOOL_OPTS]; /* the option's text, or NULL */

/* A VPMM_ variable one slip from a setting is read by nothing: said, as
 * the preloaded library says it. */
static void warn_misspelled(const char *given, const char *meant, void *arg)
{
	(void)arg;
	fprintf(stderr, "vpmm-replay: warning: %s is not a libvpmm variable and does nothing: %s?\n",
		given, meant);
}

static const char *pool_getenv(const char *name)
{
	for (size_t i = 0; i < NPOOL_OPTS; i++) {
		if (strcmp(name, pool_opts[i].var) != 0)
			continue;
		if (pool_given[i])
			return pool_given[i];
		/* One thread replays: the per-stream caches only add the lag
		 * of their flush to cross-stream reuse, so the replay measures
		 * the pool itself unless --front asks for them. */
		if (pool_opts[i].opt == O_FRONT)
			return "0";
	}
	return getenv(name);
}

/* Stores a pool option's value; false for an empty one, which the
 * environment would take for "the default". */
static bool pool_arg(int opt, const char *name, const char *value)
{
	for (size_t i = 0; i < NPOOL_OPTS; i++)
		if (pool_opts[i].opt == opt) {
			if (!*value) {
				fprintf(stderr, "vpmm-replay: --%s: an empty value\n", name);
				return false;
			}
			pool_given[i] = value;
			return true;
		}
	return false;
}

/* The option a message about `var` came from, for the reader's sake. */
static const char *option_of(const char *msg, const struct option *longopts)
{
	for (size_t i = 0; i < NPOOL_OPTS; i++) {
		size_t n = strlen(pool_opts[i].var);
		if (!pool_given[i] || strncmp(msg, pool_opts[i].var, n) != 0 || msg[n] != '=')
			continue;
		for (size_t k = 0; longopts[k].name; k++)
			if (longopts[k].val == pool_opts[i].opt)
				return longopts[k].name;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "page-size", required_argument, NULL, O_PAGE_SIZE },
		{ "va-size", required_argument, NULL, O_VA_SIZE },
		{ "pages", required_argument, NULL, O_PAGES },
		{ "handle-size", required_argument, NULL, O_HANDLE_SIZE },
		{ "grain", required_argument, NULL, O_GRAIN },
		{ "small-max", required_argument, NULL, O_SMALL_MAX },
		{ "limit", required_argument, NULL, O_LIMIT },
		{ "defrag", required_argument, NULL, O_DEFRAG },
		{ "remap", required_argument, NULL, O_REMAP },
		{ "growth-split", required_argument, NULL, O_GROWTH_SPLIT },
		{ "tenant", required_argument, NULL, O_TENANT },
		{ "event-interval-us", required_argument, NULL, O_EVENT_INTERVAL },
		{ "front", required_argument, NULL, O_FRONT },
		{ "granularity", required_argument, NULL, O_GRANULARITY },
		{ "capacity", required_argument, NULL, O_CAPACITY },
		{ "clock", required_argument, NULL, O_CLOCK },
		{ "complete-every", required_argument, NULL, O_COMPLETE_EVERY },
		{ "json", no_argument, NULL, O_JSON },
		{ "plot", required_argument, NULL, O_PLOT },
		{ "check", no_argument, NULL, O_CHECK },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct vpmm_config cfg;
	struct vpmm_host_options host = { .granularity = 2u << 20,
					  .capacity = (size_t)1 << 50,
					  .unbacked = true };
	uint64_t complete_every = 1;
	enum replay_clock clock = CLOCK_LOG;
	struct tenant tenant = { 0 };
	bool json = false, check = false;
	const char *plot_path = NULL;
	char err[256];
	int c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		const char *name = NULL;
		for (size_t i = 0; longopts[i].name; i++)
			if (longopts[i].val == c)
				name = longopts[i].name;
		char opt[32];
		snprintf(opt, sizeof(opt), "--%s", name ? name : "?");
		bool ok = true;
		switch (c) {
		case O_PAGE_SIZE:
		case O_VA_SIZE:
		case O_PAGES:
		case O_HANDLE_SIZE:
		case O_GRAIN:
		case O_SMALL_MAX:
		case O_LIMIT:
		case O_DEFRAG:
		case O_REMAP:
		case O_GROWTH_SPLIT:
		case O_EVENT_INTERVAL:
		case O_FRONT:
			ok = pool_arg(c, name, optarg);
			break;
		case O_GRANULARITY: ok = device_arg(opt, optarg, true, &host.granularity); break;
		case O_CAPACITY: ok = device_arg(opt, optarg, false, &host.capacity); break;
		case O_TENANT: ok = tenant_arg(opt, optarg, &tenant); break;
		case O_COMPLETE_EVERY: ok = count_arg(opt, optarg, &complete_every); break;
		case O_CLOCK:
			if (strcmp(optarg, "log") == 0) {
				clock = CLOCK_LOG;
			} else if (strcmp(optarg, "wall") == 0) {
				clock = CLOCK_WALL;
			} else {
				fprintf(stderr, "vpmm-replay: --clock \"%s\": expected log or wall\n",
					optarg);
				ok = false;
			}
			break;
		case O_JSON: json = true; break;
		case O_CHECK: check = true; break;
		case O_PLOT:
			plot_path = optarg;
			if (!*optarg || strcmp(optarg, "-") == 0) {
				fprintf(stderr, "vpmm-replay: --plot \"%s\": expected a file "
						"name (the report goes to standard output)\n",
					optarg);
				ok = false;
			}
			break;
		case 'h':
			usage(stdout);
			return stdout_ok() ? 0 : 1;
		case O_VERSION:
			printf("vpmm-replay %s\n", VPMM_VERSION);
			return stdout_ok() ? 0 : 1;
		default: ok = false; break;
		}
		if (!ok) {
			fprintf(stderr, "Try 'vpmm-replay --help'.\n");
			free(tenant.step);
			return EXIT_INPUT;
		}
	}
	if (optind + 1 != argc) {
		fprintf(stderr, "vpmm-replay: %s\n",
			optind == argc ? "no log given" : "one log at a time");
		usage(stderr);
		free(tenant.step);
		return EXIT_INPUT;
	}
	vpmm_options_misspelled(environ, warn_misspelled, NULL);
	if (vpmm_config_from_env(&cfg, pool_getenv, err, sizeof(err))) {
		const char *o = option_of(err, longopts);
		fprintf(stderr, "vpmm-replay: %s%s%s%s\n", o ? "--" : "", o ? o : "", o ? ": " : "",
			err);
		free(tenant.step);
		return EXIT_INPUT;
	}

	struct log lg = { .name = argv[optind] };
	FILE *in = stdin;
	if (strcmp(lg.name, "-") == 0) {
		lg.name = "<stdin>";
	} else if (!(in = fopen(lg.name, "r"))) {
		fprintf(stderr, "vpmm-replay: cannot open %s: %s\n", lg.name,
			strerror(errno));
		free(tenant.step);
		return EXIT_INPUT;
	}
	FILE *plot_file = NULL;
	bool plot_created = false;
	if (plot_path && !(plot_file = open_plot(plot_path, in, &plot_created))) {
		if (in != stdin)
			fclose(in);
		free(tenant.step);
		return EXIT_INPUT;
	}
	int rc = parse_log(in, &lg);
	if (in != stdin)
		fclose(in);
	if (rc) {
		if (plot_file)
			plot_drop(plot_file, plot_path, plot_created);
		free(lg.stream_values);
		free(lg.ops);
		free(lg.allocs);
		free(tenant.step);
		return rc;
	}

	vpmm_driver *drv = NULL;
	vpmm_pool *pool = NULL;
	CUstream *streams = NULL;
	CUresult cr = vpmm_driver_host_create(&host, &drv);
	if (cr != CUDA_SUCCESS) {
		fprintf(stderr, "vpmm-replay: cannot create the simulated device "
				"(granularity %zu, capacity %zu): CUresult %d\n",
			host.granularity, host.capacity, (int)cr);
		rc = 1;
		goto out;
	}
	int prc = vpmm_pool_create(&cfg, drv, &pool);
	if (prc) {
		/* The variables' names; each has its option (--page-size for
		 * VPMM_PAGE_SIZE, and so on). */
		char why[256] = "";
		if (prc == -EINVAL)
			vpmm_config_check(&cfg, host.granularity, why, sizeof(why));
		const char *o = option_of(why, longopts);
		fprintf(stderr, "vpmm-replay: cannot create the pool: %s%s%s%s (page size "
				"%zu, granularity %zu, pages %zu, va size %zu)\n",
			o ? "--" : "", o ? o : "", o ? ": " : "", why[0] ? why : strerror(-prc),
			cfg.page_size, host.granularity, cfg.initial_pages, cfg.va_size);
		rc = 1;
		goto out;
	}
	streams = calloc(lg.nstreams, sizeof(*streams)); /* made by replay() */
	if (!streams) {
		fprintf(stderr, "vpmm-replay: out of memory\n");
		rc = 1;
		goto out;
	}
	for (size_t i = 1; i < lg.nstreams; i++)
		if (lg.stream_values[i] == UINT64_MAX)
			streams[i] = VPMM_NO_STREAM;

	struct result r = { 0 };
	struct plot plot = { 0 };
	/* A Time that is no time of day (tests write "t"): 1 us an
	 * operation, which --json reports as the clock "operations". */
	if (clock == CLOCK_LOG && lg.untimed_line)
		clock = CLOCK_OPS;
	if (replay(&lg, pool, drv, streams, &tenant, complete_every, clock, check,
		   plot_file ? &plot : NULL, &r)) {
		fprintf(stderr, "vpmm-replay: out of memory for the streams\n");
		rc = 1;
		goto out;
	}
	if (plot_file) {
		int e = -ENOMEM;
		if (!plot.oom) {
			plot_empty(plot_file);
			e = plot_write_svg(plot_file, &plot, lg.name, &r.stats);
		}
		if (fclose(plot_file) != 0 && !e)
			e = -(errno ? errno : EIO);
		plot_file = NULL;
		if (e) {
			fprintf(stderr, "vpmm-replay: writing the plot %s: %s\n", plot_path,
				strerror(-e));
			rc = 1;
		}
		plot_free(&plot);
	}
	if (json)
		print_json(stdout, &lg, &r, &cfg, complete_every, clock);
	else
		print_text(stdout, &lg, &r, clock);
	if (r.check_violations || r.free_errors)
		rc = 1;
out:
	if (plot_file)
		plot_drop(plot_file, plot_path, plot_created);
	if (pool)
		vpmm_pool_destroy(pool);
	if (drv)
		drv->destroy(drv);
	free(streams);
	free(tenant.step);
	free(lg.stream_values);
	free(lg.ops);
	free(lg.allocs);
	if (!stdout_ok() && !rc)
		rc = 1; /* a report that did not reach its reader */
	return rc;
}

