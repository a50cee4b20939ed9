/* vpmm-replay.c — replays an allocation log in RMM's CSV format through a
 * vpmm pool on the unbacked host driver (no memory is touched, so logs of
 * hundreds of GB replay on any machine) and reports how much memory the pool
 * had to map for it, and how fast it was.
 *
 * The log: a header `Thread,Time,Action,Pointer,Size,Stream`, then one line per
 * event. RMM's logging_resource_adaptor writes Pointer and Stream in hex, with
 * "0x" (older releases, via fmt) or without (newer releases, via %llx); both
 * are read as hexadecimal. They are only identities, so a log that writes them
 * in decimal replays the same, except for two values: 0 is the default
 * stream, and 0xffffffffffffffff (what VPMM_TRACE writes for cudaMalloc and
 * cudaFree, which have no stream order) is VPMM_NO_STREAM. Thread and Time are
 * not used. Action is `allocate`, `free` or `allocate failure` (skipped,
 * counted).
 *
 * The whole log is parsed first (a malformed line stops everything before the
 * pool is touched), then replayed in a tight loop that alone is timed.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "driver_host.h"
#include "json.h"
#include "options.h"
#include "vpmm.h"
#include "vpmm/version.h"

#define EXIT_INPUT 2 /* usage, unreadable or malformed log, bad option */
#define HEADER "Thread,Time,Action,Pointer,Size,Stream"
#define MAX_WARNINGS 10

/* ---- a map from 64-bit keys (never 0) to indexes -------------------------- */

struct map {
	uint64_t *keys; /* 0 = empty slot */
	size_t *vals;
	size_t cap, n; /* cap: a power of two */
};

static size_t map_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return (size_t)k;
}

static size_t *map_find(struct map *m, uint64_t key)
{
	if (!m->cap)
		return NULL;
	for (size_t i = map_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key)
			return &m->vals[i];
		if (m->keys[i] == 0)
			return NULL;
	}
}

static int map_grow(struct map *m)
{
	size_t cap = m->cap ? m->cap * 2 : 1024;
	uint64_t *keys = calloc(cap, sizeof(*keys));
	size_t *vals = malloc(cap * sizeof(*vals));
	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (size_t j = 0; j < m->cap; j++) {
		if (!m->keys[j])
			continue;
		size_t i = map_hash(m->keys[j]) & (cap - 1);
		while (keys[i])
			i = (i + 1) & (cap - 1);
		keys[i] = m->keys[j];
		vals[i] = m->vals[j];
	}
	free(m->keys);
	free(m->vals);
	m->keys = keys;
	m->vals = vals;
	m->cap = cap;
	return 0;
}

/* Inserts or overwrites. */
static int map_put(struct map *m, uint64_t key, size_t val)
{
	size_t *v = map_find(m, key);
	if (v) {
		*v = val;
		return 0;
	}
	if ((m->n + 1) * 2 > m->cap && map_grow(m))
		return -ENOMEM;
	size_t i = map_hash(key) & (m->cap - 1);
	while (m->keys[i])
		i = (i + 1) & (m->cap - 1);
	m->keys[i] = key;
	m->vals[i] = val;
	m->n++;
	return 0;
}

/* Linear probing deletion by shifting back the entries that follow. */
static void map_del(struct map *m, uint64_t key)
{
	size_t mask = m->cap - 1, i;
	if (!m->cap)
		return;
	for (i = map_hash(key) & mask; m->keys[i] != key; i = (i + 1) & mask)
		if (!m->keys[i])
			return;
	for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
		size_t home = map_hash(m->keys[j]) & mask;
		/* j's entry may fill the gap at i unless its home lies in (i, j]. */
		bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
		if (stays)
			continue;
		m->keys[i] = m->keys[j];
		m->vals[i] = m->vals[j];
		i = j;
	}
	m->keys[i] = 0;
	m->n--;
}

static void map_free(struct map *m)
{
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

/* ---- the parsed log --------------------------------------------------------- */

enum op_kind { OP_ALLOC, OP_FREE };

struct op {
	enum op_kind kind;
	uint32_t stream; /* index into the stream table; 0 = stream 0 */
	size_t id;       /* the allocation it makes or frees */
};

struct alloc {
	size_t size;     /* requested */
	CUdeviceptr ptr; /* the pool's answer during the replay */
	bool live;       /* allocated by the pool and not yet freed */
};

struct log {
	const char *name;
	struct op *ops;
	size_t nops, cap_ops;
	struct alloc *allocs;
	size_t nallocs, cap_allocs;
	uint64_t *stream_values; /* the log's value of each stream index */
	size_t nstreams, cap_streams; /* [0] is stream 0, used or not */
	bool stream0_used;
	uint64_t log_failures;   /* "allocate failure" lines */
	uint64_t unknown_frees;  /* frees of pointers no live allocate returned */
	uint64_t reallocated;    /* allocates of a pointer still live in the log */
	uint64_t zero_sized;     /* allocates of 0 bytes and frees of null */
};

static int grow(void **p, size_t *cap, size_t elem)
{
	size_t ncap = *cap ? *cap * 2 : 4096;
	void *np = realloc(*p, ncap * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = ncap;
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' ||
		     s[n - 1] == '\n'))
		s[--n] = '\0';
	return s;
}

/* Hex with or without 0x; "(nil)" is glibc's %p of NULL. */
static bool parse_hex(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int digits = 0;

	if (strcmp(s, "(nil)") == 0) {
		*out = 0;
		return true;
	}
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		s += 2;
	for (; *s; s++, digits++) {
		int c = *s, d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return false;
		if (digits >= 16 && v >> 60)
			return false;
		v = v << 4 | (uint64_t)d;
	}
	if (!digits)
		return false;
	*out = v;
	return true;
}

static bool parse_dec(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*out = v;
	return true;
}

static bool is_header(char *line)
{
	static const char *const cols[] = { "Thread", "Time", "Action",
					    "Pointer", "Size", "Stream" };
	char *save = NULL;
	size_t i = 0;
	for (char *f = strtok_r(line, ",", &save); f; f = strtok_r(NULL, ",", &save), i++)
		if (i >= 6 || strcasecmp(trim(f), cols[i]) != 0)
			return false;
	return i == 6;
}

/* Splits at commas, in place; returns the number of fields (stops at max). */
static size_t split(char *line, char **fields, size_t max)
{
	size_t n = 0;
	char *p = line;
	for (;;) {
		char *comma = strchr(p, ',');
		if (n < max)
			fields[n] = p;
		n++;
		if (!comma)
			break;
		*comma = '\0';
		p = comma + 1;
	}
	return n;
}

struct parser {
	struct log *log;
	struct map live;    /* log pointer -> allocation id */
	struct map streams; /* log stream value (non-zero) -> index */
	unsigned long line;
	unsigned warnings;
};

static int stream_index(struct parser *ps, uint64_t value, uint32_t *out)
{
	if (value == 0) {
		ps->log->stream0_used = true;
		*out = 0;
		return 0;
	}
	size_t *v = map_find(&ps->streams, value);
	if (v) {
		*out = (uint32_t)*v;
		return 0;
	}
	if (ps->log->nstreams >= UINT32_MAX)
		return -ENOMEM;
	struct log *lg = ps->log;
	if (lg->nstreams >= lg->cap_streams &&
	    grow((void **)&lg->stream_values, &lg->cap_streams,
		 sizeof(*lg->stream_values)))
		return -ENOMEM;
	if (map_put(&ps->streams, value, lg->nstreams))
		return -ENOMEM;
	lg->stream_values[lg->nstreams] = value;
	*out = (uint32_t)lg->nstreams++;
	return 0;
}

static void warn_line(struct parser *ps, const char *what, const char *ptr)
{
	if (++ps->warnings > MAX_WARNINGS)
		return;
	fprintf(stderr, "%s:%lu: warning: %s of %.40s, %s\n", ps->log->name,
		ps->line, what, ptr,
		strcmp(what, "free") == 0
			? "which no live allocate returned (ignored)"
			: "which is still live (its free is missing from the log)");
}

static int push_op(struct log *lg, enum op_kind kind, uint32_t stream, size_t id)
{
	if (lg->nops == lg->cap_ops &&
	    grow((void **)&lg->ops, &lg->cap_ops, sizeof(*lg->ops)))
		return -ENOMEM;
	lg->ops[lg->nops++] = (struct op){ kind, stream, id };
	return 0;
}

#define FAIL(...)                                                              \
	do {                                                                   \
		fprintf(stderr, "%s:%lu: ", lg->name, ps->line);               \
		fprintf(stderr, __VA_ARGS__);                                  \
		fputc('\n', stderr);                                           \
		return -EINVAL;                                                \
	} while (0)

/* One data line. -EINVAL (reported) on a malformed line, -ENOMEM. */
static int parse_line(struct parser *ps, char *line)
{
	struct log *lg = ps->log;
	char *f[6];
	uint64_t ptr, size, stream;
	uint32_t sidx;

	size_t n = split(line, f, 6);
	if (n != 6)
		FAIL("expected 6 comma-separated fields (%s), found %zu", HEADER, n);
	for (int i = 0; i < 6; i++)
		f[i] = trim(f[i]);

	const char *action = f[2];
	bool alloc = strcasecmp(action, "allocate") == 0;
	bool failure = strcasecmp(action, "allocate failure") == 0;
	if (!alloc && !failure && strcasecmp(action, "free") != 0)
		FAIL("unknown action \"%.40s\" (expected allocate, free or "
		     "allocate failure)", action);
	if (!parse_hex(f[3], &ptr))
		FAIL("bad pointer \"%.40s\" (expected hexadecimal such as "
		     "0x7f3a40000000)", f[3]);
	if (!parse_dec(f[4], &size) || size > SIZE_MAX)
		FAIL("bad size \"%.40s\" (expected a number of bytes)", f[4]);
	if (!parse_hex(f[5], &stream))
		FAIL("bad stream \"%.40s\" (expected hexadecimal such as 0x0)", f[5]);

	if (failure) {
		lg->log_failures++;
		return 0;
	}
	if (stream_index(ps, stream, &sidx))
		return -ENOMEM;

	if (alloc) {
		if (ptr == 0) {
			lg->zero_sized += size == 0;
			if (size != 0)
				FAIL("allocate returned a null pointer for %" PRIu64
				     " bytes", size);
			return 0;
		}
		if (map_find(&ps->live, ptr)) {
			/* Its free was not logged: the old allocation stays live. */
			lg->reallocated++;
			warn_line(ps, "allocate", f[3]);
		}
		if (lg->nallocs == lg->cap_allocs &&
		    grow((void **)&lg->allocs, &lg->cap_allocs, sizeof(*lg->allocs)))
			return -ENOMEM;
		size_t id = lg->nallocs++;
		lg->allocs[id] = (struct alloc){ (size_t)size, 0, false };
		if (map_put(&ps->live, ptr, id))
			return -ENOMEM;
		if (size == 0) {
			lg->zero_sized++; /* the pool takes no 0-byte requests */
			return 0;
		}
		return push_op(lg, OP_ALLOC, sidx, id);
	}

	if (ptr == 0) {
		lg->zero_sized++;
		return 0;
	}
	size_t *idp = map_find(&ps->live, ptr);
	if (!idp) {
		lg->unknown_frees++;
		warn_line(ps, "free", f[3]);
		return 0;
	}
	size_t id = *idp;
	map_del(&ps->live, ptr);
	if (lg->allocs[id].size == 0)
		return 0;
	return push_op(lg, OP_FREE, sidx, id);
}

static bool blank(const char *s)
{
	for (; *s; s++)
		if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n')
			return false;
	return true;
}

/* Whether everything written to stdout got there (/dev/full, a closed
 * descriptor); says why when not. */
static bool stdout_ok(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return true;
	fprintf(stderr, "vpmm-replay: writing the output: %s\n", strerror(errno ? errno : EIO));
	return false;
}

/* A log line is under 200 bytes: this bounds what one line may take
 * (/dev/zero, a sparse file) before it is refused. */
#define LINE_MAX_BYTES 4096

/* One line into buf (LINE_MAX_BYTES + 1 bytes: at most LINE_MAX_BYTES - 1
 * of text, its newline, a NUL): its length, -1 at the end, or -2 for a
 * longer line (buf holds its start). */
static ssize_t read_line(FILE *in, char *buf)
{
	size_t n = 0;
	int c;
	while ((c = getc_unlocked(in)) != EOF) {
		if (c == '\n') {
			buf[n++] = '\n';
			break;
		}
		if (n == LINE_MAX_BYTES - 1) {
			buf[n] = '\0';
			return -2;
		}
		buf[n++] = (char)c;
	}
	buf[n] = '\0';
	return n || c != EOF ? (ssize_t)n : -1;
}

/* 0, or EXIT_INPUT after reporting. */
static int parse_log(FILE *in, struct log *lg)
{
	struct parser st = { .log = lg }, *ps = &st;
	static char buf[LINE_MAX_BYTES + 1];
	ssize_t len;
	bool header = false;
	int rc = 0;

	lg->nstreams = 1;
	while ((len = read_line(in, buf)) != -1) {
		char *line = buf;
		ps->line++;
		if (len == -2) {
			fprintf(stderr, "%s:%lu: a line longer than %d bytes: not an allocation log\n",
				lg->name, ps->line, LINE_MAX_BYTES - 1);
			rc = EXIT_INPUT;
			break;
		}
		if ((size_t)len != strlen(buf)) {
			fprintf(stderr, "%s:%lu: a NUL byte in the line\n", lg->name,
				ps->line);
			rc = EXIT_INPUT;
			break;
		}
		if (ps->line == 1 && (unsigned char)line[0] == 0xef &&
		    (unsigned char)line[1] == 0xbb && (unsigned char)line[2] == 0xbf)
			line += 3; /* a UTF-8 byte order mark */
		if (blank(line))
			continue;
		if (!header) {
			if (!is_header(line)) {
				fprintf(stderr, "%s:%lu: expected the header %s\n",
					lg->name, ps->line, HEADER);
				rc = EXIT_INPUT;
				break;
			}
			header = true;
			continue;
		}
		/* Several adaptors appending to one file repeat the header. */
		char *t = trim(line);
		if (strlen(t) < 64 && strncasecmp(t, "Thread,", 7) == 0) {
			char copy[64];
			snprintf(copy, sizeof(copy), "%s", t);
			if (is_header(copy))
				continue;
		}
		int e = parse_line(ps, line);
		if (e == -ENOMEM) {
			fprintf(stderr, "%s:%lu: out of memory\n", lg->name, ps->line);
			rc = 1;
			break;
		}
		if (e) {
			rc = EXIT_INPUT;
			break;
		}
	}
	if (!rc && ferror(in)) {
		fprintf(stderr, "%s: read error: %s\n", lg->name, strerror(errno));
		rc = EXIT_INPUT;
	}
	if (!rc && !header) {
		fprintf(stderr, "%s:%lu: empty log, expected the header %s\n",
			lg->name, ps->line + 1, HEADER);
		rc = EXIT_INPUT;
	}
	if (ps->warnings > MAX_WARNINGS)
		fprintf(stderr, "%s: %u more warnings not shown\n", lg->name,
			ps->warnings - MAX_WARNINGS);
	map_free(&ps->live);
	map_free(&ps->streams);
	return rc;
}

/* ---- the replay ----------------------------------------------------------- */

struct result {
	uint64_t ops, allocs, frees;
	uint64_t failures;       /* allocations the pool refused */
	int first_failure;       /* its errno */
	uint64_t free_errors;    /* frees the pool refused (a pool bug) */
	uint64_t check_violations;
	uint64_t peak_requested;
	uint64_t wall_ns;
	struct vpmm_stats stats;
};

/* Another process on the simulated device (--tenant): from operation
 * step[i].op on, it holds step[i].bytes. */
struct tenant {
	struct tenant_step {
		uint64_t op;
		size_t bytes;
	} *step;
	size_t n;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void replay(struct log *lg, vpmm_pool *pool, vpmm_driver *drv,
		   const CUstream *streams, const struct tenant *tn,
		   uint64_t complete_every, bool check, struct result *r)
{
	uint64_t live = 0, since = 0;
	size_t next_step = 0;

	uint64_t t0 = now_ns();
	for (size_t i = 0; i < lg->nops; i++) {
		const struct op *op = &lg->ops[i];
		while (next_step < tn->n && tn->step[next_step].op <= i)
			vpmm_host_set_tenant(drv, tn->step[next_step++].bytes);
		struct alloc *a = &lg->allocs[op->id];
		CUstream s = streams[op->stream];

		if (op->kind == OP_ALLOC) {
			int rc = vpmm_pool_malloc(pool, a->size, s, &a->ptr);
			r->ops++;
			if (rc == 0) {
				a->live = true;
				r->allocs++;
				live += a->size;
				if (live > r->peak_requested)
					r->peak_requested = live;
			} else {
				if (!r->failures++)
					r->first_failure = -rc;
			}
		} else {
			if (!a->live)
				continue; /* its allocation failed in the replay */
			r->ops++;
			if (vpmm_pool_free(pool, a->ptr, s) == 0) {
				r->frees++;
				live -= a->size;
			} else {
				r->free_errors++;
			}
			a->live = false;
		}
		if (complete_every && ++since >= complete_every) {
			vpmm_host_complete_all(drv);
			since = 0;
		}
		if (check) {
			size_t bad = vpmm_pool_check(pool, stderr);
			if (bad && !r->check_violations)
				fprintf(stderr, "%s: the pool check failed after "
						"operation %zu\n", lg->name, i + 1);
			r->check_violations += bad;
		}
	}
	r->wall_ns = now_ns() - t0;
	vpmm_pool_stats(pool, &r->stats);
}

/* ---- output ---------------------------------------------------------------- */

static const char *human(uint64_t b, char *buf, size_t n)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)b;
	int u = 0;
	while (v >= 1024 && u < 6) {
		v /= 1024;
		u++;
	}
	snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", v, units[u]);
	return buf;
}


/* Distinct streams the log used. */
static size_t streams_used(const struct log *lg)
{
	return lg->nstreams - 1 + lg->stream0_used;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

static void print_json(FILE *f, const struct log *lg, const struct result *r,
		       const struct vpmm_config *cfg, uint64_t complete_every)
{
	const struct vpmm_stats *s = &r->stats;
	fprintf(f, "{\"log\": ");
	json_write_string(f, lg->name);
	fprintf(f, ", \"ops\": %" PRIu64 ", \"allocs\": %" PRIu64
		   ", \"frees\": %" PRIu64 ", \"failures\": %" PRIu64
		   ", \"log_failures\": %" PRIu64 ", \"unknown_frees\": %" PRIu64
		   ", \"reallocated\": %" PRIu64 ", \"zero_sized\": %" PRIu64
		   ", \"streams\": %zu",
		r->ops, r->allocs, r->frees, r->failures, lg->log_failures,
		lg->unknown_frees, lg->reallocated, lg->zero_sized, streams_used(lg));
	fprintf(f, ", \"peak_requested_bytes\": %" PRIu64
		   ", \"peak_live_bytes\": %" PRIu64
		   ", \"peak_mapped_bytes\": %" PRIu64,
		r->peak_requested, s->live_peak, s->mapped_peak);
	if (s->live_peak)
		fprintf(f, ", \"ratio\": %.6f", ratio(s->mapped_peak, s->live_peak));
	else
		fprintf(f, ", \"ratio\": null");
	fprintf(f, ", \"pages_created\": %" PRIu64 ", \"pages_remapped\": %" PRIu64
		   ", \"defrags\": %" PRIu64 ", \"page_size\": %" PRIu64
		   ", \"reserved_peak_bytes\": %" PRIu64
		   ", \"driver_calls\": %" PRIu64,
		s->pages_created, s->pages_remapped, s->defrags, s->page_size,
		s->reserved_peak, s->driver_calls);
	fprintf(f, ", \"handles_created\": %" PRIu64 ", \"handles_remapped\": %" PRIu64
		   ", \"zombies_reclaimed\": %" PRIu64 ", \"front_hits\": %" PRIu64
		   ", \"loop_growths\": %" PRIu64 ", \"loop_hints\": %" PRIu64
		   ", \"events_recorded\": %" PRIu64 ", \"room_growths\": %" PRIu64
		   ", \"growth_refusals\": %" PRIu64,
		s->handles_created, s->handles_remapped, s->zombies_reclaimed, s->front_hits,
		s->loop_growths, s->loop_hints, s->events_recorded, s->room_growths,
		s->growth_refusals);
	fprintf(f, ", \"defrag\": \"%s\", \"remap\": \"%s\", \"complete_every\": %" PRIu64,
		cfg->defrag == VPMM_DEFRAG_ALL ? "all" : "lacking",
		cfg->remap == VPMM_REMAP_ALWAYS ? "always" : "pressure", complete_every);
	fprintf(f, ", \"wall_ns\": %" PRIu64 ", \"ns_per_op\": %.1f",
		r->wall_ns, r->ops ? (double)r->wall_ns / (double)r->ops : 0.0);
	if (r->check_violations)
		fprintf(f, ", \"check_violations\": %" PRIu64, r->check_violations);
	fprintf(f, "}\n");
}

static void print_text(FILE *f, const struct log *lg, const struct result *r)
{
	const struct vpmm_stats *s = &r->stats;
	char a[32], b[32];

	fprintf(f, "log                 %s: %zu operations on %zu stream%s\n",
		lg->name, lg->nops, streams_used(lg), streams_used(lg) == 1 ? "" : "s");
	fprintf(f, "page size           %s\n", human(s->page_size, a, sizeof(a)));
	fprintf(f, "operations          %" PRIu64 " (allocations %" PRIu64 ", frees %"
		   PRIu64 ")\n", r->ops, r->allocs, r->frees);
	fprintf(f, "peak requested      %" PRIu64 " bytes (%s): sizes as logged\n",
		r->peak_requested, human(r->peak_requested, a, sizeof(a)));
	fprintf(f, "peak live           %" PRIu64 " bytes (%s): rounded to pages\n",
		s->live_peak, human(s->live_peak, a, sizeof(a)));
	fprintf(f, "peak mapped         %" PRIu64 " bytes (%s)\n", s->mapped_peak,
		human(s->mapped_peak, b, sizeof(b)));
	if (s->live_peak)
		fprintf(f, "mapped / live       %.3f\n", ratio(s->mapped_peak, s->live_peak));
	fprintf(f, "pages created       %" PRIu64 "\n", s->pages_created);
	fprintf(f, "pages remapped      %" PRIu64 "\n", s->pages_remapped);
	fprintf(f, "defragmentations    %" PRIu64 "\n", s->defrags);
	fprintf(f, "time per operation  %.1f ns (%.3f s in all)\n",
		r->ops ? (double)r->wall_ns / (double)r->ops : 0.0,
		(double)r->wall_ns / 1e9);
	if (r->failures)
		fprintf(f, "failed allocations  %" PRIu64 " (first: %s); their frees "
			   "were skipped\n", r->failures, strerror(r->first_failure));
	if (lg->log_failures)
		fprintf(f, "log failures        %" PRIu64 " 'allocate failure' lines "
			   "skipped\n", lg->log_failures);
	if (lg->unknown_frees)
		fprintf(f, "unknown frees       %" PRIu64 " ignored\n", lg->unknown_frees);
	if (lg->reallocated)
		fprintf(f, "missing frees       %" PRIu64 " pointers allocated again "
			   "while live\n", lg->reallocated);
	if (lg->zero_sized)
		fprintf(f, "zero-sized          %" PRIu64 " skipped\n", lg->zero_sized);
	if (r->free_errors)
		fprintf(f, "refused frees       %" PRIu64 "\n", r->free_errors);
	if (r->check_violations)
		fprintf(f, "check violations    %" PRIu64 "\n", r->check_violations);
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
"usage: vpmm-replay [OPTIONS] LOG.csv\n"
"\n"
"Replays an allocation log in RMM's CSV format (the header\n"
"" HEADER ", as rmm::mr::logging_resource_adaptor and VPMM_TRACE\n"
"write it) through a vpmm pool on a simulated device that touches no memory,\n"
"and prints the peak live and peak mapped bytes, their ratio, the pages created\n"
"and remapped, the defragmentations and the time per operation. LOG may be '-'\n"
"for standard input. Pointers and streams are read as hexadecimal (0x optional).\n"
"Stream 0 is the default stream, 0xffffffffffffffff means no stream order\n"
"(cudaMalloc/cudaFree in a VPMM_TRACE), every other value is a stream of its own.\n"
"\n"
"Pool options (defaults: the VPMM_* variables, else the library's defaults;\n"
"each stands for its variable and is checked by the same rules):\n"
"  --page-size SIZE      page size (default: the granularity)\n"
"  --va-size SIZE        VA reserved per chunk (default 8T)\n"
"  --pages N             pages mapped at creation (default 0)\n"
"  --handle-size SIZE    largest physical handle (default 1G)\n"
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
"                        is older than N us (default 50; 0 makes runs repeatable)\n"
"  --front N             entries of each stream's cache of freed allocations\n"
"                        (default 0, whatever VPMM_FRONT_ENTRIES says: the\n"
"                        pool itself is measured)\n"
"Simulated device:\n"
"  --granularity SIZE    allocation granularity (default 2M)\n"
"  --capacity SIZE       device memory (default 1P)\n"
"  --tenant OP:SIZE[,OP:SIZE...]\n"
"                        another process holds SIZE of the device from\n"
"                        operation OP on (0 = the first), e.g. 0:60G,9000:40G\n"
"  --complete-every N    the device finishes all queued work after every N\n"
"                        operations (default 1; 0: never, so other streams'\n"
"                        memory is reused only through defragmentation waits)\n"
"Output:\n"
"  --json                one JSON object: peak_live_bytes (rounded to pages),\n"
"                        peak_requested_bytes (as logged), peak_mapped_bytes,\n"
"                        ratio, ops, pages_created, pages_remapped, defrags,\n"
"                        ns_per_op, failures, unknown_frees, ...\n"
"  --check               run the pool's consistency check after every operation\n"
"                        (slow); exit 1 if it finds anything\n"
"  -h, --help            this text\n"
"  --version             the version\n"
"\n"
"SIZE: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. 2M, 1G.\n"
"Exit status: 0 replayed (allocation failures are counted, not fatal);\n"
"1 the pool could not be created or the check failed; 2 bad usage or a\n"
"malformed or unreadable log (the message names FILE:LINE).\n");
}

enum {
	O_PAGE_SIZE = 256, O_VA_SIZE, O_PAGES, O_HANDLE_SIZE, O_LIMIT, O_DEFRAG,
	O_GRAIN, O_SMALL_MAX, O_REMAP, O_GROWTH_SPLIT, O_TENANT,
	O_EVENT_INTERVAL, O_FRONT, O_GRANULARITY, O_CAPACITY, O_COMPLETE_EVERY, O_JSON,
	O_CHECK, O_VERSION,
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

/* --tenant OP:SIZE[,OP:SIZE...], operations in ascending order. */
static bool tenant_arg(const char *opt, const char *s, struct tenant *t)
{
	free(t->step);
	t->step = NULL;
	t->n = 0;
	char *copy = strdup(s), *save = NULL, *item;
	bool ok = copy && *s;
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
		{ "complete-every", required_argument, NULL, O_COMPLETE_EVERY },
		{ "json", no_argument, NULL, O_JSON },
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
	struct tenant tenant = { 0 };
	bool json = false, check = false;
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
		case O_GRANULARITY: ok = size_arg(opt, optarg, &host.granularity); break;
		case O_CAPACITY: ok = size_arg(opt, optarg, &host.capacity); break;
		case O_TENANT: ok = tenant_arg(opt, optarg, &tenant); break;
		case O_COMPLETE_EVERY: ok = count_arg(opt, optarg, &complete_every); break;
		case O_JSON: json = true; break;
		case O_CHECK: check = true; break;
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
	int rc = parse_log(in, &lg);
	if (in != stdin)
		fclose(in);
	if (rc) {
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
		fprintf(stderr, "vpmm-replay: cannot create the pool: %s (page size "
				"%zu, granularity %zu, pages %zu, va size %zu)\n",
			why[0] ? why : strerror(-prc), cfg.page_size, host.granularity,
			cfg.initial_pages, cfg.va_size);
		rc = 1;
		goto out;
	}
	streams = calloc(lg.nstreams, sizeof(*streams));
	if (!streams) {
		fprintf(stderr, "vpmm-replay: out of memory\n");
		rc = 1;
		goto out;
	}
	streams[0] = (CUstream)0;
	for (size_t i = 1; i < lg.nstreams; i++)
		streams[i] = lg.stream_values[i] == UINT64_MAX
				     ? VPMM_NO_STREAM
				     : vpmm_host_stream_create(drv);

	struct result r = { 0 };
	replay(&lg, pool, drv, streams, &tenant, complete_every, check, &r);
	if (json)
		print_json(stdout, &lg, &r, &cfg, complete_every);
	else
		print_text(stdout, &lg, &r);
	if (r.check_violations || r.free_errors)
		rc = 1;
out:
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
