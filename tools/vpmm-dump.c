/* vpmm-dump.c — reads the live region map of programs running under
 * libvpmm.so through their Unix sockets (shim/server.c; protocol in
 * shim/protocol.h): lists them, prints one's header metrics and every region
 * in the region map's notation, as JSON (docs/dump-json.md), as a picture of the
 * address space, or as a PyTorch memory snapshot (a pickle the memory
 * visualizer opens). The manual is docs/vpmm-dump.md.
 *
 * This file owns the options (--help), their checks and main, which picks
 * the part that does the work (dump.h lists them); it calls them all, and
 * options.h and vpmm.h for numbers and sizes.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dump.h"
#include "json.h"
#include "options.h" /* vpmm_parse_digits */
#include "protocol.h"
#include "vpmm.h" /* vpmm_parse_size */
#include "vpmm/version.h"

#define TRACE_MAX_DEFAULT 100000

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: vpmm-dump [OPTIONS]             list the processes with a vpmm socket\n"
"       vpmm-dump [OPTIONS] PID         show the pool of process PID\n"
"       vpmm-dump [OPTIONS] --socket PATH\n"
"       vpmm-dump --trim PID [BYTES]    give free memory beyond BYTES (default 0)\n"
"                                       back to the driver, once its work is done\n"
"\n"
"Reads the GPU memory pool of programs running under libvpmm.so through the\n"
"Unix socket each one serves ($VPMM_SOCKET, else $XDG_RUNTIME_DIR/vpmm/PID.sock,\n"
"else /tmp/vpmm-UID/PID.sock).\n"
"\n"
"Without PID: one line per socket found: pid, command, mapped and live bytes\n"
"(stale sockets of processes that are gone are reported, never removed).\n"
"With PID: the header metrics (reserved VA, mapped, live, reusable, holes,\n"
"zombies and their peaks, the defragmentation counters) and every region in\n"
"ascending VA order: live [X], free [-X] with its stream, hole [*X],\n"
"zombie [~X] (X is the size: 4M = 4 MiB).\n"
"\n"
"Options:\n"
"  --json                one JSON document instead of text (docs/dump-json.md)\n"
"  --map                 a picture of the address space: one bar per VA chunk,\n"
"                        colored on a terminal\n"
"  --watch SECONDS       redraw every SECONDS (0.1 to 86400) until Ctrl-C or an\n"
"                        error; with --json, one document per line\n"
"  --count N             with --watch: stop after N redraws\n"
"  --torch-snapshot FILE write a PyTorch memory snapshot (pickle) for\n"
"                        pytorch.org/memory_viz; includes the allocation trace\n"
"                        if the process records one (VPMM_TRACE)\n"
"  --trace-csv FILE      take the snapshot's trace from this RMM CSV log instead\n"
"  --trace-max N         keep the last N trace events (default %d)\n"
"  --socket PATH         talk to this socket instead of finding PID's\n"
"  --color WHEN          auto (default: if stdout is a terminal), always, never\n"
"  -h, --help            this text\n"
"  --version             the version, and the socket protocol it speaks\n"
"\n"
"Exit status: 0 ok; 1 I/O error or malformed reply; 2 bad usage; 3 no such\n"
"process, no socket or a stale one; 4 permission denied (another user's\n"
"process); 5 the process speaks another protocol version.\n",
		TRACE_MAX_DEFAULT);
}

/* ---- main ---------------------------------------------------------------------- */

/* Says why talking to the process failed, and passes the status on. */
static int failed(int rc, long pid, const char *err)
{
	if (rc == EXIT_GONE && pid && !process_exists(pid))
		errf("process %ld is gone (%s)", pid, err);
	else
		errf("%s", err);
	return rc;
}

enum { O_JSON = 256, O_MAP, O_WATCH, O_COUNT, O_TORCH, O_TRACE_CSV, O_TRACE_MAX, O_SOCKET,
       O_COLOR, O_TRIM, O_VERSION };

static bool parse_count(const char *s, uint64_t *out)
{
	const char *end;
	uint64_t v;
	if (vpmm_parse_digits(s, &v, &end) != 0 || *end)
		return false;
	*out = v;
	return true;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, O_JSON },
		{ "map", no_argument, NULL, O_MAP },
		{ "watch", required_argument, NULL, O_WATCH },
		{ "count", required_argument, NULL, O_COUNT },
		{ "torch-snapshot", required_argument, NULL, O_TORCH },
		{ "trace-csv", required_argument, NULL, O_TRACE_CSV },
		{ "trace-max", required_argument, NULL, O_TRACE_MAX },
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "color", required_argument, NULL, O_COLOR },
		{ "trim", no_argument, NULL, O_TRIM },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	bool json = false, map = false, trim = false;
	size_t keep = 0;
	double watch = 0;
	uint64_t count = 0, trace_max = TRACE_MAX_DEFAULT;
	const char *torch = NULL, *csv = NULL, *socket_path = NULL;
	int color = -1;
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_JSON:
			json = true;
			break;
		case O_MAP:
			map = true;
			break;
		case O_WATCH: {
			char *end;
			errno = 0;
			watch = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(watch >= 0.1 && watch <= 86400)) {
				errf("--watch takes seconds between 0.1 and 86400, not \"%s\"", optarg);
				return EXIT_USAGE;
			}
			break;
		}
		case O_COUNT:
			if (!parse_count(optarg, &count) || !count) {
				errf("--count takes a positive number, not \"%s\"", optarg);
				return EXIT_USAGE;
			}
			break;
		case O_TORCH:
			torch = optarg;
			break;
		case O_TRACE_CSV:
			csv = optarg;
			break;
		case O_TRACE_MAX:
			if (!parse_count(optarg, &trace_max) || !trace_max || trace_max > 100000000) {
				errf("--trace-max takes a number from 1 to 100000000, not \"%s\"", optarg);
				return EXIT_USAGE;
			}
			break;
		case O_SOCKET:
			if (!*optarg) {
				errf("--socket takes a path, not \"\"");
				return EXIT_USAGE;
			}
			socket_path = optarg;
			break;
		case O_TRIM:
			trim = true;
			break;
		case O_COLOR:
			if (!strcmp(optarg, "always"))
				color = 1;
			else if (!strcmp(optarg, "never"))
				color = 0;
			else if (!strcmp(optarg, "auto"))
				color = -1;
			else {
				errf("--color takes auto, always or never, not \"%s\"", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h':
			usage(stdout);
			return output_status();
		case O_VERSION:
			printf("vpmm-dump %s (socket protocol %d)\n", VPMM_VERSION, VPMM_PROTOCOL);
			return output_status();
		default:
			/* optopt holds a long option's code (not a letter) when
			 * its value is missing or unwanted: name it as given. */
			if (optopt > 0 && optopt < 128 && optopt != 'h')
				errf("option -%c: unknown, or it needs a value (see --help)", optopt);
			else
				errf("%s: unknown option, or a value missing or not wanted "
				     "(see --help)", argv[optind - 1]);
			return EXIT_USAGE;
		}
	}
	text_output = !json && !torch;
	long pid = 0;
	if (optind < argc && !(trim && socket_path)) {
		char *end;
		errno = 0;
		pid = strtol(argv[optind], &end, 10);
		if (errno || end == argv[optind] || *end || pid <= 0) {
			errf("\"%s\" is not a process id (see --help)", argv[optind]);
			return EXIT_USAGE;
		}
		optind++;
	}
	if (trim && optind < argc) { /* --trim PID [BYTES]: the bytes to keep */
		if (vpmm_parse_size(argv[optind], &keep) != 0) {
			errf("--trim keeps BYTES such as 512M, not \"%s\"", argv[optind]);
			return EXIT_USAGE;
		}
		optind++;
	}
	if (optind < argc) {
		errf("one process at a time (extra argument \"%s\")", argv[optind]);
		return EXIT_USAGE;
	}
	if (trim && (!pid && !socket_path)) {
		errf("--trim needs a PID or --socket");
		return EXIT_USAGE;
	}
	if (trim && (json || map || watch || torch)) {
		errf("--trim goes alone");
		return EXIT_USAGE;
	}
	if (count && !watch) {
		errf("--count goes with --watch");
		return EXIT_USAGE;
	}
	if (csv && !torch) {
		errf("--trace-csv goes with --torch-snapshot");
		return EXIT_USAGE;
	}
	if (map && json) {
		errf("--map and --json: choose one");
		return EXIT_USAGE;
	}
	if (torch && watch) {
		errf("--torch-snapshot writes one file: it does not go with --watch");
		return EXIT_USAGE;
	}
	if (color < 0)
		color = isatty(STDOUT_FILENO);

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	char err[1024] = "";
	if (!pid && !socket_path) {
		if (torch || map) {
			errf("--torch-snapshot and --map need a PID or --socket");
			return EXIT_USAGE;
		}
		int rc;
		for (uint64_t i = 0;; i++) {
			if (watch && isatty(STDOUT_FILENO))
				printf("\033[H\033[2J");
			rc = list_processes(json);
			if (!watch || rc != EXIT_OK || interrupted || (count && i + 1 >= count))
				break;
			struct timespec ts = { (time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9) };
			nanosleep(&ts, NULL);
			if (interrupted)
				break;
		}
		return rc;
	}

	char path[PATH_MAX];
	if (socket_path) {
		snprintf(path, sizeof(path), "%s", socket_path);
	} else {
		int rc = find_socket(pid, path, sizeof(path), err, sizeof(err));
		if (rc != EXIT_OK) {
			errf("%s", err);
			return rc;
		}
	}
	if (trim) {
		/* Free pages beyond KEEP bytes (default 0) that no work still uses
		 * are unmapped and given back to the driver. */
		char req[64];
		struct json reply;
		uint64_t released = 0;
		/* The bytes as parsed: the text could be longer than a request
		 * (leading zeros), and would be cut. */
		snprintf(req, sizeof(req), "trim %zu", keep);
		int rc = ask(path, req, &reply, err, sizeof(err));
		if (rc != EXIT_OK)
			return failed(rc, pid, err);
		bool ok = json_u64(json_get(&reply, "released"), &released);
		json_free(&reply);
		if (!ok) {
			errf("%s: malformed reply to trim: no \"released\" count", path);
			return EXIT_FAIL;
		}
		printf("released %" PRIu64 " bytes\n", released);
		return output_status();
	}
	for (uint64_t i = 0;; i++) {
		struct target t;
		int rc = fetch(path, pid, &t, err, sizeof(err)); /* pid 0: any */
		if (rc != EXIT_OK)
			return failed(rc, pid, err);
		if (torch) {
			rc = torch_snapshot(&t, torch, csv, trace_max, err, sizeof(err));
			target_free(&t);
			if (rc != EXIT_OK)
				errf("%s", err);
			return rc;
		}
		if (watch && !json && isatty(STDOUT_FILENO))
			printf("\033[H\033[2J");
		if (json)
			show_json(&t);
		else if (map)
			show_map(&t, color);
		else
			show_text(&t);
		target_free(&t);
		if (output_status() != EXIT_OK)
			return EXIT_FAIL;
		if (!watch || interrupted || (count && i + 1 >= count))
			break;
		struct timespec ts = { (time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9) };
		nanosleep(&ts, NULL);
		if (interrupted)
			break;
	}
	return EXIT_OK;
}

