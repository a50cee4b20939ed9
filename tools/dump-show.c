/* dump-show.c — one process's pool as vpmm-dump shows it: the map and
 * config replies fetched, then printed as text (header metrics and every
 * region in the region map's notation), as a picture of the address space (--map)
 * or as one JSON document (--json, docs/dump-json.md). Calls json.h,
 * protocol.h, options.h (sizes as text), dump-common.c, dump-conn.c and
 * dump-list.c.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "dump.h"
#include "json.h"
#include "options.h"
#include "protocol.h"

/* ---- one process: fetching ---------------------------------------------------- */

int fetch(const char *socket, long want_pid, struct target *t, char *err, size_t errlen)
{
	struct conn c;
	memset(t, 0, sizeof(*t));
	snprintf(t->socket, sizeof(t->socket), "%s", socket);
	int st = conn_open(socket, &c, err, errlen);
	if (st != EXIT_OK)
		return st;
	if (want_pid > 0 && c.peer_pid > 0 && c.peer_pid != want_pid) {
		snprintf(err, errlen, "%.300s is served by process %ld, not %ld", socket, c.peer_pid,
			 want_pid);
		conn_close(&c);
		return EXIT_GONE;
	}
	st = conn_request(&c, "map", &t->map, err, errlen);
	if (st == EXIT_OK) {
		st = conn_request(&c, "config", &t->config, err, errlen);
		if (st != EXIT_OK)
			json_free(&t->map);
	}
	conn_close(&c);
	if (st != EXIT_OK)
		return st;
	const struct json *pools = json_get(&t->map, "pools");
	if (!pools || pools->type != JSON_ARRAY) {
		snprintf(err, errlen, "%.300s: malformed map reply (no pools)", socket);
		json_free(&t->map);
		json_free(&t->config);
		return EXIT_FAIL;
	}
	int64_t pid = want_pid;
	json_i64(json_get(&t->map, "pid"), &pid);
	t->pid = (long)pid;
	command_of(t->pid, t->comm, sizeof(t->comm));
	if (text_output) {
		printable_json(&t->map);
		printable_json(&t->config);
		printable(t->socket);
	}
	return EXIT_OK;
}

void target_free(struct target *t)
{
	json_free(&t->map);
	json_free(&t->config);
}

bool region_at(const struct json *r, struct region *out)
{
	memset(out, 0, sizeof(*out));
	out->kind = json_str(json_get(r, "kind"));
	if (!out->kind || !json_u64(json_get(r, "va"), &out->va) ||
	    !json_u64(json_get(r, "size"), &out->size) ||
	    !json_u64(json_get(r, "chunk"), &out->chunk))
		return false;
	json_u64(json_get(r, "stream"), &out->stream);    /* free regions only */
	json_bool(json_get(r, "settled"), &out->settled); /* likewise */
	json_bool(json_get(r, "parked"), &out->parked);   /* likewise */
	json_bool(json_get(r, "small"), &out->small);     /* live slabs only */
	return true;
}

static const char *symbol_prefix(const char *kind)
{
	if (strcmp(kind, "free") == 0)
		return "-";
	if (strcmp(kind, "hole") == 0)
		return "*";
	if (strcmp(kind, "zombie") == 0)
		return "~";
	return "";
}

/* ---- one process: text ------------------------------------------------------- */

static const char *const gauges[] = { "reserved", "mapped", "live", "reusable", "holes", "zombies" };

static bool is_gauge(const char *key)
{
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
		size_t n = strlen(gauges[i]);
		if (strncmp(key, gauges[i], n) == 0 && (!key[n] || strcmp(key + n, "_peak") == 0))
			return true;
	}
	return !strcmp(key, "page_size") || !strcmp(key, "regions") || !strcmp(key, "parked");
}

static void print_header(const struct target *t)
{
	const char *trace = json_str(json_get(&t->config, "trace"));
	printf("pid %ld (%s)  socket %s  protocol %d", t->pid, t->comm, t->socket, VPMM_PROTOCOL);
	if (trace)
		printf("  trace %s", trace);
	printf("\n");
}

static void print_pool_head(const struct json *pool)
{
	const struct json *cfg = json_get(pool, "config");
	const struct json *st = json_get(pool, "stats");
	char a[32], b[32], c[32], d[32];
	int64_t dev = 0;
	json_i64(json_get(pool, "device"), &dev);
	uint64_t limit = u64_of(cfg, "limit");
	printf("\ndevice %" PRId64 ": page %s, VA chunk %s, handle %s, limit %s, defrag %s\n", dev,
	       exact(a, sizeof(a), u64_of(cfg, "page_size")),
	       exact(b, sizeof(b), u64_of(cfg, "va_size")),
	       exact(c, sizeof(c), u64_of(cfg, "handle_size") ? u64_of(cfg, "handle_size")
							      : u64_of(cfg, "page_size")),
	       limit ? exact(d, sizeof(d), limit) : "none",
	       json_str(json_get(cfg, "defrag")) ? json_str(json_get(cfg, "defrag")) : "?");
	printf("  %-10s %14s %14s\n", "", "now", "peak");
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
		char key[32];
		snprintf(key, sizeof(key), "%s_peak", gauges[i]);
		printf("  %-10s %14s %14s\n", gauges[i], vpmm_size_human(u64_of(st, gauges[i]), a, sizeof(a)),
		       vpmm_size_human(u64_of(st, key), b, sizeof(b)));
	}
	/* Where the free memory lies (the map's reply only). */
	const struct json *fs = json_get(pool, "free_split");
	if (fs && fs->type == JSON_OBJECT)
		printf("  free: %s in %" PRIu64 " wholly free handles, %s stranded in %" PRIu64
		       " partly live ones;\n"
		       "        the largest free region %s\n",
		       vpmm_size_human(u64_of(fs, "whole"), a, sizeof(a)), u64_of(fs, "whole_handles"),
		       vpmm_size_human(u64_of(fs, "stranded"), b, sizeof(b)), u64_of(fs, "stranded_handles"),
		       vpmm_size_human(u64_of(fs, "largest"), c, sizeof(c)));
	/* The counters: every other field, so new ones show up by themselves. */
	printf("  counters:");
	int col = 11;
	for (size_t i = 0; st && st->type == JSON_OBJECT && i < st->n; i++) {
		if (is_gauge(st->keys[i]) || st->items[i].type != JSON_NUMBER)
			continue;
		char item[96];
		int n = snprintf(item, sizeof(item), " %s %s", st->keys[i], st->items[i].text);
		if (col + n > 78) {
			printf("\n           ");
			col = 11;
		}
		printf("%s", item);
		col += n;
	}
	printf("\n");
}

static void print_regions(const struct json *pool)
{
	const struct json *regions = json_get(pool, "regions");
	const struct json *chunks = json_get(pool, "chunks");
	size_t n = regions && regions->type == JSON_ARRAY ? regions->n : 0;
	char a[32], sym[48];
	printf("  regions, ascending VA: %zu\n", n);
	uint64_t chunk = UINT64_MAX;
	for (size_t i = 0; i < n; i++) {
		struct region r;
		if (!region_at(&regions->items[i], &r)) {
			printf("    (malformed region %zu)\n", i);
			continue;
		}
		if (r.chunk != chunk) {
			chunk = r.chunk;
			uint64_t cva = 0, csize = 0;
			for (size_t c = 0; chunks && chunks->type == JSON_ARRAY && c < chunks->n; c++) {
				if (u64_of(&chunks->items[c], "index") == chunk) {
					cva = u64_of(&chunks->items[c], "va");
					csize = u64_of(&chunks->items[c], "size");
				}
			}
			printf("    -- VA chunk %" PRIu64 ": 0x%016" PRIx64 ", %s --\n", chunk, cva,
			       exact(a, sizeof(a), csize));
		}
		snprintf(sym, sizeof(sym), "[%s%s]", symbol_prefix(r.kind), exact(a, sizeof(a), r.size));
		bool more = !strcmp(r.kind, "free") || r.small;
		printf("    0x%016" PRIx64 "  %-12s %-*s", r.va, sym, more ? 7 : 0, r.kind);
		if (strcmp(r.kind, "free") == 0) {
			if (r.settled)
				printf(" settled (any stream)");
			else
				printf(" stream 0x%" PRIx64, r.stream);
			if (r.parked)
				printf(", in the stream's cache");
		} else if (r.small) {
			printf(" sub-grain blocks");
		}
		printf("\n");
	}
}

static void print_layout(const struct json *pool)
{
	const struct json *regions = json_get(pool, "regions");
	char a[32];
	uint64_t chunk = UINT64_MAX;
	printf("  layout: ");
	for (size_t i = 0; regions && regions->type == JSON_ARRAY && i < regions->n; i++) {
		struct region r;
		if (!region_at(&regions->items[i], &r))
			continue;
		if (chunk != UINT64_MAX && r.chunk != chunk)
			printf(" | ");
		chunk = r.chunk;
		printf("[%s%s]", symbol_prefix(r.kind), exact(a, sizeof(a), r.size));
	}
	printf("\n");
}

void show_text(const struct target *t)
{
	const struct json *pools = json_get(&t->map, "pools");
	print_header(t);
	if (!pools->n)
		printf("\nno pool yet (the process has not allocated GPU memory through the pool)\n");
	for (size_t i = 0; i < pools->n; i++) {
		print_pool_head(&pools->items[i]);
		print_layout(&pools->items[i]);
		print_regions(&pools->items[i]);
	}
}

/* ---- one process: the picture -------------------------------------------------- */

enum { K_LIVE, K_FREE, K_HOLE, K_ZOMBIE, K_NONE };

static int kind_index(const char *kind)
{
	if (!strcmp(kind, "live"))
		return K_LIVE;
	if (!strcmp(kind, "free"))
		return K_FREE;
	if (!strcmp(kind, "hole"))
		return K_HOLE;
	if (!strcmp(kind, "zombie"))
		return K_ZOMBIE;
	return K_NONE;
}

static int term_width(void)
{
	struct winsize ws;
	if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
		return ws.ws_col;
	return 80;
}

void show_map(const struct target *t, bool color)
{
	static const char ch[] = { '#', '-', '.', '~', ' ' };
	static const char *const on[] = { "\033[42;30m", "\033[44;37m", "\033[100;37m",
					   "\033[45;37m", "" };
	const struct json *pools = json_get(&t->map, "pools");
	int cols = term_width() - 6;
	if (cols > 128)
		cols = 128;
	print_header(t);
	for (size_t p = 0; p < pools->n; p++) {
		const struct json *pool = &pools->items[p];
		const struct json *regions = json_get(pool, "regions");
		const struct json *chunks = json_get(pool, "chunks");
		int64_t dev = 0;
		json_i64(json_get(pool, "device"), &dev);
		uint64_t page = u64_of(json_get(pool, "config"), "page_size");
		if (!page)
			page = 1;
		for (size_t c = 0; chunks && chunks->type == JSON_ARRAY && c < chunks->n; c++) {
			uint64_t idx = u64_of(&chunks->items[c], "index");
			uint64_t cva = u64_of(&chunks->items[c], "va");
			uint64_t csize = u64_of(&chunks->items[c], "size");
			/* The bar spans the chunk up to its last region that is not a
			 * hole: an 8 TiB reservation would otherwise be one dot. */
			uint64_t used = 0;
			for (size_t i = 0; regions && i < regions->n; i++) {
				struct region r;
				if (region_at(&regions->items[i], &r) && r.chunk == idx &&
				    kind_index(r.kind) != K_HOLE && r.va + r.size - cva > used)
					used = r.va + r.size - cva;
			}
			char a[32], b[32], cs[32];
			if (!used) {
				printf("\ndevice %" PRId64 " chunk %" PRIu64 " 0x%016" PRIx64
				       ": %s, all hole\n", dev, idx, cva, exact(a, sizeof(a), csize));
				continue;
			}
			uint64_t ncells = used / page;
			if (ncells > (uint64_t)cols * 16)
				ncells = (uint64_t)cols * 16;
			if (ncells == 0)
				ncells = 1;
			uint64_t cell = used / ncells + (used % ncells != 0);
			/* Whole pages; a page past any chunk (a bad reply) would
			 * wrap to 0: one cell then. */
			cell = cell % page ? cell + (page - cell % page) : cell;
			if (cell < used / ncells)
				cell = used;
			ncells = used / cell + (used % cell != 0);
			printf("\ndevice %" PRId64 " chunk %" PRIu64 " 0x%016" PRIx64
			       ": %s used of %s, one cell = %s\n", dev, idx, cva,
			       vpmm_size_human(used, a, sizeof(a)), exact(b, sizeof(b), csize),
			       vpmm_size_human(cell, cs, sizeof(cs)));
			size_t ri = 0;
			for (uint64_t i = 0; i < ncells; i++) {
				uint64_t lo = cva + i * cell, hi = lo + cell;
				uint64_t bytes[5] = { 0 };
				/* regions are in VA order: advance a cursor */
				while (ri < regions->n) {
					struct region r;
					if (region_at(&regions->items[ri], &r) &&
					    (r.chunk != idx || r.va + r.size > lo))
						break;
					ri++;
				}
				for (size_t j = ri; j < regions->n; j++) {
					struct region r;
					if (!region_at(&regions->items[j], &r) || r.chunk != idx)
						continue;
					if (r.va >= hi)
						break;
					uint64_t s = r.va > lo ? r.va : lo;
					uint64_t e = r.va + r.size < hi ? r.va + r.size : hi;
					if (e > s)
						bytes[kind_index(r.kind)] += e - s;
				}
				int k = K_NONE;
				uint64_t best = 0;
				for (int j = 0; j < 4; j++) {
					if (bytes[j] > best) { /* ties keep the earlier: live first */
						best = bytes[j];
						k = j;
					}
				}
				if (i % (uint64_t)cols == 0)
					printf("%s  |", i ? "|\n" : "");
				if (color && k != K_NONE)
					printf("%s%c\033[0m", on[k], ch[k]);
				else
					putchar(ch[k]);
			}
			printf("|\n");
			if (used < csize)
				printf("  + %s of never-used VA\n", vpmm_size_human(csize - used, a, sizeof(a)));
		}
	}
	if (color)
		printf("\n%s#\033[0m live  %s-\033[0m free  %s.\033[0m hole  %s~\033[0m zombie"
		       "  (a cell shows the kind covering most of it)\n", on[0], on[1], on[2], on[3]);
	else
		printf("\n# live  - free  . hole  ~ zombie  (a cell shows the kind covering most of it)\n");
}

/* ---- one process: JSON --------------------------------------------------------- */

void show_json(const struct target *t)
{
	printf("{\"vpmm_dump\":1,\"protocol\":%d,\"pid\":%ld,\"command\":", VPMM_PROTOCOL, t->pid);
	json_write_string(stdout, t->comm);
	printf(",\"socket\":");
	json_write_string(stdout, t->socket);
	printf(",\"time\":%lld,\"process\":{", (long long)time(NULL));
	/* the config reply minus the envelope */
	bool first = true;
	for (size_t i = 0; i < t->config.n; i++) {
		const char *k = t->config.keys[i];
		if (!strcmp(k, "protocol") || !strcmp(k, "ok") || !strcmp(k, "request") ||
		    !strcmp(k, "pid") || !strcmp(k, "pools"))
			continue;
		printf("%s", first ? "" : ",");
		first = false;
		json_write_string(stdout, k);
		putchar(':');
		json_write(stdout, &t->config.items[i]);
	}
	printf("},\"pools\":");
	json_write(stdout, json_get(&t->map, "pools"));
	printf("}\n");
}

