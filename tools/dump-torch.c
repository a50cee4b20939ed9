/* dump-torch.c — vpmm-dump --torch-snapshot: one process's map as a PyTorch
 * memory snapshot (a pickle that pytorch.org/memory_viz opens), its
 * segments and blocks from the live and free regions, its trace from an
 * RMM CSV log (--trace-csv, else the process's own VPMM_TRACE, flushed
 * first). Calls json.h, pickle.h, dump-common.c, dump-conn.c and
 * dump-show.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dump.h"
#include "json.h"
#include "options.h" /* vpmm_parse_digits */
#include "pickle.h"
#include "rmm-time.h"

struct tev {
	uint64_t time_us, ptr, size, stream;
	int action; /* 0 allocate, 1 free, 2 allocate failure */
};

struct trace {
	struct tev *ev; /* a ring of the last `max` events */
	size_t max, n, start;
	uint64_t skipped; /* malformed lines */
};

static bool hex_field(const char *s, uint64_t *out)
{
	if (!strcmp(s, "(nil)")) {
		*out = 0;
		return true;
	}
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		s += 2;
	if (!*s || strspn(s, "0123456789abcdefABCDEF") != strlen(s) || strlen(s) > 16)
		return false;
	*out = strtoull(s, NULL, 16);
	return true;
}

static bool parse_trace_line(char *line, struct tev *ev)
{
	char *f[6];
	int n = 0;
	for (char *p = line; n < 6; n++) {
		f[n] = p;
		p = strchr(p, ',');
		if (!p) {
			n++;
			break;
		}
		*p++ = '\0';
	}
	if (n != 6)
		return false;
	f[5][strcspn(f[5], "\r\n")] = '\0';
	if (!strcmp(f[2], "allocate"))
		ev->action = 0;
	else if (!strcmp(f[2], "free"))
		ev->action = 1;
	else if (!strcmp(f[2], "allocate failure"))
		ev->action = 2;
	else
		return false;
	/* As vpmm-replay reads it (a fraction after ':' too, as RMM and
	 * bench/workloads.py write it); no time of day: 0. */
	if (!rmm_parse_time(f[1], &ev->time_us))
		ev->time_us = 0;
	const char *end;
	if (vpmm_parse_digits(f[4], &ev->size, &end) != 0 || *end)
		return false; /* no sign: strtoull took "-1" as 2^64 - 1 */
	return hex_field(f[3], &ev->ptr) && hex_field(f[5], &ev->stream);
}

/* One line of f into line (n bytes, NUL-terminated): its length, NUL bytes
 * and the newline counted, or -1 at the end. fgets cannot tell a line
 * holding a NUL byte from a short one: strlen stops at the NUL, and the
 * newline is already read. A line longer than n - 1 bytes is read to its
 * end without being held, and *cut set. */
static ssize_t trace_line(FILE *f, char *line, size_t n, bool *cut)
{
	size_t len = 0;
	int c = EOF;
	*cut = false;
	while (!interrupted && (c = getc_unlocked(f)) != EOF) {
		if (len < n - 1)
			line[len++] = (char)c;
		else
			*cut = true;
		if (c == '\n')
			break;
	}
	line[len] = '\0';
	return len || c != EOF ? (ssize_t)len : -1;
}

static int read_trace(const char *path, size_t max, struct trace *tr, char *err, size_t errlen)
{
	memset(tr, 0, sizeof(*tr));
	/* VPMM_TRACE writes a regular file; a device or a pipe may never end
	 * (/dev/zero read on for ever, one endless line), and a FIFO with no
	 * writer would hold open() itself: opened without waiting, then
	 * looked at. (O_NONBLOCK does nothing to a regular file's reads.) */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return EXIT_FAIL;
	}
	struct stat st;
	FILE *f = NULL;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !(f = fdopen(fd, "r"))) {
		close(fd);
		snprintf(err, errlen, "%s: not a regular file (VPMM_TRACE writes one)", path);
		return EXIT_FAIL;
	}
	tr->max = max ? max : 1;
	tr->ev = calloc(tr->max, sizeof(*tr->ev));
	if (!tr->ev) {
		fclose(f);
		snprintf(err, errlen, "out of memory");
		return EXIT_FAIL;
	}
	/* A trace line is under 128 bytes; one past this is not a trace
	 * line, and is skipped without being held (a 1 GB line). */
	char line[512];
	bool header = true, cut;
	ssize_t got;
	while ((got = trace_line(f, line, sizeof(line), &cut)) >= 0) {
		size_t len = (size_t)got;
		if (interrupted)
			break;
		if (cut) {
			tr->skipped++;
			header = false;
			continue;
		}
		if (header) {
			header = false;
			if (strncmp(line, "Thread,Time,Action,Pointer,Size,Stream", 38) == 0)
				continue;
		}
		if (!len || line[len - 1] != '\n')
			break; /* the last line, being written right now */
		if (strlen(line) != len) { /* a NUL byte inside: a malformed line */
			tr->skipped++;
			continue;
		}
		struct tev ev;
		if (!parse_trace_line(line, &ev)) {
			tr->skipped++;
			continue;
		}
		if (tr->n < tr->max) {
			tr->ev[tr->n++] = ev;
		} else {
			tr->ev[tr->start] = ev;
			tr->start = (tr->start + 1) % tr->max;
		}
	}
	int e = ferror(f) ? errno : 0;
	fclose(f);
	if (e || interrupted) {
		snprintf(err, errlen, "%s: %s", path, e ? strerror(e) : "interrupted");
		free(tr->ev);
		tr->ev = NULL;
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

static int64_t device_of(const struct json *pools, uint64_t ptr)
{
	int64_t first = 0;
	for (size_t p = 0; p < pools->n; p++) {
		int64_t dev = 0;
		json_i64(json_get(&pools->items[p], "device"), &dev);
		if (p == 0)
			first = dev;
		const struct json *chunks = json_get(&pools->items[p], "chunks");
		for (size_t c = 0; chunks && chunks->type == JSON_ARRAY && c < chunks->n; c++) {
			uint64_t va = u64_of(&chunks->items[c], "va");
			uint64_t size = u64_of(&chunks->items[c], "size");
			if (ptr >= va && ptr - va < size)
				return dev;
		}
	}
	return first; /* unknown: the first pool's device */
}

static void pk_trace_entry(struct pickle *pk, const char *action, const struct tev *ev, bool oom)
{
	pk_dict_begin(pk);
	pk_kv_str(pk, "action", action);
	if (oom)
		pk_kv_uint(pk, "device_free", 0);
	else
		pk_kv_uint(pk, "addr", ev->ptr);
	pk_kv_uint(pk, "size", ev->size);
	/* No stream order (the trace's 0xffffffffffffffff) has no stream in
	 * PyTorch's snapshot: 0, the default stream, rather than a number
	 * past any cudaStream_t. */
	pk_kv_uint(pk, "stream", ev->stream == UINT64_MAX ? 0 : ev->stream);
	pk_kv_uint(pk, "time_us", ev->time_us);
	pk_str(pk, "frames");
	pk_list_begin(pk);
	pk_list_end(pk);
	pk_dict_end(pk);
}

/* A segment: a maximal run of address-contiguous live and free regions of one
 * chunk (the mapped memory); holes and zombies are not segments (a zombie's
 * pages are counted at their new address). Blocks: one per region. */
static void pk_segments(struct pickle *pk, const struct json *pools, size_t *nseg, size_t *nblk)
{
	pk_str(pk, "segments");
	pk_list_begin(pk);
	for (size_t p = 0; p < pools->n; p++) {
		const struct json *regions = json_get(&pools->items[p], "regions");
		int64_t dev = 0;
		json_i64(json_get(&pools->items[p], "device"), &dev);
		size_t n = regions && regions->type == JSON_ARRAY ? regions->n : 0;
		for (size_t i = 0; i < n;) {
			struct region r;
			if (!region_at(&regions->items[i], &r) ||
			    (strcmp(r.kind, "live") && strcmp(r.kind, "free"))) {
				i++;
				continue;
			}
			size_t j = i;
			uint64_t total = 0, live = 0, end = r.va;
			for (; j < n; j++) {
				struct region q;
				if (!region_at(&regions->items[j], &q) ||
				    (strcmp(q.kind, "live") && strcmp(q.kind, "free")) ||
				    q.chunk != r.chunk || q.va != end)
					break;
				total += q.size;
				end += q.size;
				if (!strcmp(q.kind, "live"))
					live += q.size;
			}
			pk_dict_begin(pk);
			pk_kv_int(pk, "device", dev);
			pk_kv_uint(pk, "address", r.va);
			pk_kv_uint(pk, "total_size", total);
			pk_kv_uint(pk, "allocated_size", live);
			pk_kv_uint(pk, "active_size", live);
			pk_kv_uint(pk, "requested_size", live);
			pk_kv_uint(pk, "stream", 0);
			pk_kv_str(pk, "segment_type", "large");
			pk_str(pk, "segment_pool_id");
			pk_int(pk, 0);
			pk_int(pk, 0);
			pk_tuple2(pk);
			pk_str(pk, "is_expandable");
			pk_bool(pk, true);
			pk_str(pk, "frames");
			pk_list_begin(pk);
			pk_list_end(pk);
			pk_str(pk, "blocks");
			pk_list_begin(pk);
			for (size_t k = i; k < j; k++) {
				struct region q;
				region_at(&regions->items[k], &q);
				bool is_live = !strcmp(q.kind, "live");
				pk_dict_begin(pk);
				pk_kv_uint(pk, "address", q.va);
				pk_kv_uint(pk, "size", q.size);
				pk_kv_uint(pk, "requested_size", is_live ? q.size : 0);
				pk_kv_str(pk, "state", is_live ? "active_allocated" : "inactive");
				pk_str(pk, "frames");
				pk_list_begin(pk);
				pk_list_end(pk);
				pk_dict_end(pk);
				(*nblk)++;
			}
			pk_list_end(pk);
			pk_dict_end(pk);
			(*nseg)++;
			i = j;
		}
	}
	pk_list_end(pk);
}

int torch_snapshot(const struct target *t, const char *file, const char *csv,
		   size_t trace_max, char *err, size_t errlen)
{
	const struct json *pools = json_get(&t->map, "pools");
	struct trace tr = { 0 };
	char trace_path[PATH_MAX] = "";
	if (csv) {
		snprintf(trace_path, sizeof(trace_path), "%s", csv);
	} else {
		/* The process's own trace, flushed up to now. A process without
		 * trace recording gives a snapshot without a trace; one that
		 * does not answer, or fails to flush, gives none: its trace
		 * would be cut short or missing without a word. */
		struct json st;
		char e2[768];
		int rc = ask(t->socket, "trace flush", &st, e2, sizeof(e2));
		if (rc == EXIT_OK) {
			bool active = false;
			json_bool(json_get(&st, "active"), &active);
			const char *p = json_str(json_get(&st, "path"));
			if (active && p)
				snprintf(trace_path, sizeof(trace_path), "%s", p);
			json_free(&st);
		} else if (!strstr(e2, ": unsupported: ")) {
			snprintf(err, errlen, "%s: snapshot not written (its trace could not be "
				 "flushed: %s)", file, e2);
			return rc;
		}
	}
	if (trace_path[0]) {
		int rc = read_trace(trace_path, trace_max, &tr, err, errlen);
		if (rc != EXIT_OK)
			return rc;
	}
	int64_t ndev = 1;
	for (size_t p = 0; p < pools->n; p++) {
		int64_t dev = 0;
		json_i64(json_get(&pools->items[p], "device"), &dev);
		if (dev >= 0 && dev + 1 > ndev)
			ndev = dev + 1;
	}
	if (ndev > 1024)
		ndev = 1024;
	struct pickle pk = { 0 };
	size_t nseg = 0, nblk = 0;
	pk_begin(&pk);
	pk_dict_begin(&pk);
	pk_segments(&pk, pools, &nseg, &nblk);
	pk_str(&pk, "device_traces");
	pk_list_begin(&pk);
	for (int64_t d = 0; d < ndev; d++) {
		pk_list_begin(&pk);
		for (size_t i = 0; i < tr.n; i++) {
			const struct tev *ev = &tr.ev[(tr.start + i) % tr.max];
			if (device_of(pools, ev->ptr) != d)
				continue;
			if (ev->action == 0) {
				pk_trace_entry(&pk, "alloc", ev, false);
			} else if (ev->action == 1) {
				pk_trace_entry(&pk, "free_requested", ev, false);
				pk_trace_entry(&pk, "free_completed", ev, false);
			} else {
				pk_trace_entry(&pk, "oom", ev, true);
			}
		}
		pk_list_end(&pk);
	}
	pk_list_end(&pk);
	pk_dict_end(&pk);
	pk_end(&pk);
	free(tr.ev);
	if (pk.failed) {
		pk_free(&pk);
		snprintf(err, errlen, "out of memory building the snapshot");
		return EXIT_FAIL;
	}
	FILE *f = fopen(file, "wb");
	if (!f || fwrite(pk.p, 1, pk.len, f) != pk.len || fclose(f) != 0) {
		snprintf(err, errlen, "%s: %s", file, strerror(errno));
		pk_free(&pk);
		return EXIT_FAIL;
	}
	pk_free(&pk);
	fprintf(stderr, "%s: wrote %s: %zu segments, %zu blocks, %zu trace events%s%s\n", prog,
		file, nseg, nblk, tr.n, trace_path[0] ? " from " : "", trace_path);
	if (tr.skipped)
		fprintf(stderr, "%s: %" PRIu64 " malformed trace lines skipped\n", prog, tr.skipped);
	return EXIT_OK;
}

