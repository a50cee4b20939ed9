/* replay-log.c — vpmm-replay's reader of an allocation log in RMM's CSV
 * format, parsed whole before the pool is touched (a malformed line stops
 * everything, naming FILE:LINE), with its progress on a terminal. Calls
 * replay.h's types and replay-progress.c.
 *
 * The log: a header `Thread,Time,Action,Pointer,Size,Stream`, then one line per
 * event. RMM's logging_resource_adaptor writes Pointer and Stream in hex, with
 * "0x" (older releases, via fmt) or without (newer releases, via %llx); both
 * are read as hexadecimal. They are only identities, so a log that writes them
 * in decimal replays the same, except for two values: 0 is the default
 * stream, and 0xffffffffffffffff (what VPMM_TRACE writes for cudaMalloc and
 * cudaFree when the pool took them without stream order) is VPMM_NO_STREAM. Thread is not
 * used. Time, a time of day (H:MM:SS with a fraction after '.' or ':', as
 * RMM, VPMM_TRACE and bench/workloads.py write it), is the pool's clock in
 * the replay: read as microseconds since the first line, a day added where
 * it passes midnight, never going back (threads write out of order). A log
 * whose Time is no such time replays on a clock of 1 us an operation (the
 * report names the clock and the line). Action is `allocate`, `free` or
 * `allocate failure` (skipped, counted).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "replay.h"
#include "rmm-time.h"

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

bool parse_dec(const char *s, uint64_t *out)
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

/* The six columns in order, split as the lines are: an empty field
 * ("Thread,,Time,...") or a seventh is no header. */
static bool is_header(char *line)
{
	static const char *const cols[] = { "Thread", "Time", "Action",
					    "Pointer", "Size", "Stream" };
	char *f[7];
	if (split(line, f, 7) != 6)
		return false;
	for (size_t i = 0; i < 6; i++)
		if (strcasecmp(trim(f[i]), cols[i]) != 0)
			return false;
	return true;
}

struct parser {
	struct log *log;
	struct map live;    /* log pointer -> allocation id */
	struct map streams; /* log stream value (non-zero) -> index */
	unsigned long line;
	unsigned warnings;
	bool timed;         /* a line's time was read: first_us is set */
	uint64_t first_us;  /* the first line's time of day */
	uint64_t now_us;    /* the log's time at the last line, since the first */
};

#define DAY_US 86400000000ull

/* The log's clock at this line (parser.now_us), from its Time field: the
 * first line is 0; a time of day up to 12 hours after the one the clock
 * stands at moves it on (past midnight too), one before it (a thread
 * writing late) leaves it. */
static void line_time(struct parser *ps, const char *f)
{
	uint64_t tod;
	if (ps->log->untimed_line)
		return;
	if (!rmm_parse_time(f, &tod)) {
		ps->log->untimed_line = ps->line;
		return;
	}
	if (!ps->timed) {
		ps->timed = true;
		ps->first_us = tod;
	}
	uint64_t at = (ps->first_us + ps->now_us) % DAY_US; /* the clock's time of day */
	uint64_t ahead = (tod + DAY_US - at) % DAY_US;
	if (ahead < DAY_US / 2)
		ps->now_us += ahead;
}

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
	progress_clear();
	fprintf(stderr, "%s:%lu: warning: %s of %.40s, %s\n", ps->log->name,
		ps->line, what, ptr,
		strcmp(what, "free") == 0
			? "which no live allocate returned (ignored)"
			: "which is still live (its free is missing from the log)");
}

static int push_op(struct parser *ps, enum op_kind kind, uint32_t stream, size_t id)
{
	struct log *lg = ps->log;
	if (lg->nops == lg->cap_ops &&
	    grow((void **)&lg->ops, &lg->cap_ops, sizeof(*lg->ops)))
		return -ENOMEM;
	lg->ops[lg->nops++] = (struct op){ kind, stream, id, ps->now_us };
	return 0;
}

#define FAIL(...)                                                              \
	do {                                                                   \
		progress_clear();                                              \
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

	line_time(ps, f[1]);
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
		return push_op(ps, OP_ALLOC, sidx, id);
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
	return push_op(ps, OP_FREE, sidx, id);
}

static bool blank(const char *s)
{
	for (; *s; s++)
		if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n')
			return false;
	return true;
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
int parse_log(FILE *in, struct log *lg)
{
	struct parser st = { .log = lg }, *ps = &st;
	static char buf[LINE_MAX_BYTES + 1];
	ssize_t len;
	bool header = false;
	int rc = 0;

	lg->nstreams = 1;
	struct stat sb;
	bool sized = fstat(fileno(in), &sb) == 0 && S_ISREG(sb.st_mode);
	progress_begin("reading", lg->name, sized ? (uint64_t)sb.st_size : 0,
		       sized && (uint64_t)sb.st_size >= PROGRESS_MIN_BYTES);
	while ((len = read_line(in, buf)) != -1) {
		char *line = buf;
		if ((++ps->line & 16383) == 0 && sized) {
			off_t at = ftello(in);
			progress_at(at > 0 ? (uint64_t)at : 0);
		}
		if (len == -2) {
			progress_clear();
			fprintf(stderr, "%s:%lu: a line longer than %d bytes: not an allocation log\n",
				lg->name, ps->line, LINE_MAX_BYTES - 1);
			rc = EXIT_INPUT;
			break;
		}
		if ((size_t)len != strlen(buf)) {
			progress_clear();
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
				progress_clear();
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
			progress_clear();
			fprintf(stderr, "%s:%lu: out of memory\n", lg->name, ps->line);
			rc = 1;
			break;
		}
		if (e) {
			rc = EXIT_INPUT;
			break;
		}
	}
	progress_end();
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

