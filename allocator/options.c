/* options.c — the one table of VPMM_* environment variables: their names,
 * types, defaults and descriptions, and the parsing of each into struct
 * vpmm_config (pool options) or struct vpmm_env_options (process options).
 *
 * A value is read whole or rejected whole: no leading or trailing spaces, no
 * partial numbers, no hexadecimal (a size is decimal digits with an optional
 * K/M/G/T suffix, powers of 1024). An empty value is the same as unset, so
 * `VPMM_X= prog` restores the default.
 *
 * Calls nothing in allocator/.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "options.h"
#include "vpmm.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define TIB ((size_t)1 << 40)

#define DEFAULT_VA_SIZE (8 * TIB)
#define DEFAULT_EVENT_INTERVAL_US 50u

enum opt_type { T_SIZE, T_COUNT, T_ENUM, T_BOOL, T_STRING };
enum opt_group { G_POOL, G_PROCESS };

/* Indexed by enum vpmm_defrag_policy, enum vpmm_remap_policy and enum
 * vpmm_log_level. */
static const char *const defrag_names[] = { "lacking", "all", NULL };
static const char *const remap_names[] = { "pressure", "always", NULL };
static const char *const log_names[] = { "error", "warn", "info", "debug", NULL };
/* Indexed by enum vpmm_sync_free. */
static const char *const sync_free_names[] = { "events", "device", NULL };

/* THE table. X(id, name, group, type, choices, default text, description).
 * The default text must describe what vpmm_config_default() and
 * vpmm_env_options_default() set; the options test checks that it does. */
#define VPMM_OPTION_TABLE(X)                                                   \
	X(PAGES, "VPMM_PAGES", G_POOL, T_COUNT, NULL, "0",                     \
	  "pages mapped when the pool is created (0: all on demand)")          \
	X(PAGE_SIZE, "VPMM_PAGE_SIZE", G_POOL, T_SIZE, NULL, "0",              \
	  "page: the unit of physical memory the pool maps and moves; a "      \
	  "power of two, a multiple of the driver's granularity (0: the "      \
	  "granularity, typically 2M)")                                        \
	X(GRAIN, "VPMM_GRAIN", G_POOL, T_SIZE, NULL, "64K",                    \
	  "rounding unit of allocations, a power of two from 512 up to the "  \
	  "page (0, or the page or more: whole pages); under the page, "      \
	  "neighbours share a page's tail")                                    \
	X(VA_SIZE, "VPMM_VA_SIZE", G_POOL, T_SIZE, NULL, "8T",                 \
	  "virtual address space reserved per chunk, at least 1G; more "       \
	  "chunks (1024 in all) are reserved on demand")                       \
	X(HANDLE_SIZE, "VPMM_HANDLE_SIZE", G_POOL, T_SIZE, NULL, "1G",         \
	  "largest physical handle created when the pool grows (0, or less "   \
	  "than a page: one page)")                                            \
	X(GROWTH_SPLIT, "VPMM_GROWTH_SPLIT", G_POOL, T_COUNT, NULL, "16",      \
	  "a growth of S bytes in a pool holding M is made of handles of "     \
	  "about S/k, k = 1 + N*M/(M+S) (one handle in an empty pool, about "  \
	  "S/N once the pool is much larger; a power of two of pages, at most " \
	  "VPMM_HANDLE_SIZE), at most 4096; 0: every handle is "               \
	  "VPMM_HANDLE_SIZE")                                                  \
	X(LIMIT, "VPMM_LIMIT", G_POOL, T_SIZE, NULL, "0",                      \
	  "most physical bytes the pool maps; beyond it allocations fail as "  \
	  "out of memory (0: no limit)")                                       \
	X(SMALL_MAX, "VPMM_SMALL_MAX", G_POOL, T_SIZE, NULL, "2M",             \
	  "requests up to this size and under a grain are carved in size "     \
	  "classes from shared slabs (0: none)")                               \
	X(DEFRAG, "VPMM_DEFRAG", G_POOL, T_ENUM, defrag_names, "lacking",      \
	  "what a defragmentation remaps: lacking (only what the request "     \
	  "lacks) or all (every free page)")                                   \
	X(REMAP, "VPMM_REMAP", G_POOL, T_ENUM, remap_names, "pressure",       \
	  "when a request no free range fits remaps free pages: pressure "     \
	  "(only as memory runs out: while the device and VPMM_LIMIT leave "   \
	  "16 times the request and the pool holds under 1/100 free, it "      \
	  "grows instead, in handles of at most 1/256 of that room, or "       \
	  "1/(32 (n + 1)) while n, the allocations live, is under 7; while "   \
	  "they leave 4 times the pool, in handles of at most 64 MiB; "        \
	  "while twice the pool, a request goes to a free region's start "     \
	  "until a loop misses its places) or always (the least memory at "    \
	  "every moment)")                                                     \
	X(EVENT_INTERVAL_US, "VPMM_EVENT_INTERVAL_US", G_POOL, T_COUNT, NULL,  \
	  "50",                                                                \
	  "microseconds: a free records a new event on its stream only if "    \
	  "the last one is older (0: every free); while a single stream is "   \
	  "the only one taking memory, at least 10 ms")                        \
	X(FRONT_ENTRIES, "VPMM_FRONT_ENTRIES", G_POOL, T_COUNT, NULL, "16",     \
	  "allocations each stream keeps parked for reuse without the pool "   \
	  "lock, at most 256 (0: none)")                                       \
	X(LOOP_GROWTH, "VPMM_LOOP_GROWTH", G_POOL, T_COUNT, NULL, "15",         \
	  "a request whose defragmentation repeats a loop exactly (a training " \
	  "step) grows the pool instead, by up to this percent of the rest of " \
	  "it in all, at most 1000; 0: always remap")                           \
	X(DISABLE, "VPMM_DISABLE", G_PROCESS, T_BOOL, NULL, "0",               \
	  "1: pass every call through to CUDA unchanged")                      \
	X(LOG, "VPMM_LOG", G_PROCESS, T_ENUM, log_names, "warn",               \
	  "messages written to stderr: error, warn, info or debug")            \
	X(SOCKET, "VPMM_SOCKET", G_PROCESS, T_STRING, NULL, "(per process)",   \
	  "path of the vpmm-dump socket, or off (default: "                    \
	  "$XDG_RUNTIME_DIR/vpmm/PID.sock, else /tmp/vpmm-UID/PID.sock)")      \
	X(TRACE, "VPMM_TRACE", G_PROCESS, T_STRING, NULL, "(none)",            \
	  "file to write every allocation and free to, in RMM's CSV log "      \
	  "format (for vpmm-replay); a regular file, %p in its name the "      \
	  "process id (one file per process)")                                 \
	X(RELEASE_THRESHOLD, "VPMM_RELEASE_THRESHOLD", G_PROCESS, T_SIZE,      \
	  NULL, "(keep all)",                                                  \
	  "free bytes kept mapped; free pages beyond it are released to the "  \
	  "driver once their events completed")                               \
	X(SYNC_FREE, "VPMM_SYNC_FREE", G_PROCESS, T_ENUM, sync_free_names,     \
	  "events",                                                            \
	  "what cudaFree and cuMemFree wait for: events (on the device: the "  \
	  "legacy default stream waits for every non-blocking stream, which "  \
	  "wait for it before the memory is reused; the host goes on; as "     \
	  "device where the shim may not know every stream) or device "        \
	  "(synchronise the context, as the real calls)")

enum opt_id {
#define X(id, name, group, type, choices, def, desc) OPT_##id,
	VPMM_OPTION_TABLE(X)
#undef X
	OPT_COUNT
};

struct opt_spec {
	enum opt_group group;
	enum opt_type type;
	const char *const *choices;
};

#define TYPE_NAME(t) TYPE_NAME_##t
#define TYPE_NAME_T_SIZE "size"
#define TYPE_NAME_T_COUNT "count"
#define TYPE_NAME_T_ENUM "enum"
#define TYPE_NAME_T_BOOL "bool"
#define TYPE_NAME_T_STRING "string"

static const struct vpmm_option_info info_table[OPT_COUNT] = {
#define X(id, name, group, type, choices, def, desc)                           \
	[OPT_##id] = { name, TYPE_NAME(type), def, desc },
	VPMM_OPTION_TABLE(X)
#undef X
};

static const struct opt_spec spec_table[OPT_COUNT] = {
#define X(id, name, group, type, choices, def, desc)                           \
	[OPT_##id] = { group, type, choices },
	VPMM_OPTION_TABLE(X)
#undef X
};

const struct vpmm_option_info *vpmm_options_table(size_t *n)
{
	if (n)
		*n = OPT_COUNT;
	return info_table;
}

void vpmm_options_print(FILE *f)
{
	int wname = 0, wdef = 0;
	for (size_t i = 0; i < OPT_COUNT; i++) {
		int ln = (int)strlen(info_table[i].name);
		int ld = (int)strlen(info_table[i].def);
		wname = ln > wname ? ln : wname;
		wdef = ld > wdef ? ld : wdef;
	}
	for (size_t i = 0; i < OPT_COUNT; i++)
		fprintf(f, "  %-*s  %-*s  %s\n", wname, info_table[i].name, wdef,
			info_table[i].def, info_table[i].desc);
}

/* ---- defaults -------------------------------------------------------------- */

void vpmm_config_default(struct vpmm_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->page_size = 0;
	cfg->va_size = DEFAULT_VA_SIZE;
	cfg->initial_pages = 0;
	cfg->handle_size = GIB;
	cfg->growth_split = 16;
	cfg->limit = 0;
	cfg->small_max = 2 * MIB;
	cfg->grain = 64 * KIB;
	cfg->front_entries = 16;
	cfg->loop_growth = 15;
	cfg->front_bytes = GIB;
	cfg->device = 0;
	cfg->defrag = VPMM_DEFRAG_LACKING;
	cfg->remap = VPMM_REMAP_PRESSURE;
	cfg->event_interval_ns = (uint64_t)DEFAULT_EVENT_INTERVAL_US * 1000u;
}

void vpmm_env_options_default(struct vpmm_env_options *o)
{
	memset(o, 0, sizeof(*o));
	o->disable = false;
	o->log_level = VPMM_LOG_WARN;
	o->socket_off = false;
	o->has_release_threshold = false;
	o->sync_free = VPMM_SYNC_FREE_EVENTS;
}

const char *vpmm_log_level_name(enum vpmm_log_level level)
{
	if ((unsigned)level > VPMM_LOG_DEBUG)
		return "?";
	return log_names[level];
}

/* ---- scalar parsers ------------------------------------------------------- */

static int lower(int c)
{
	return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

int vpmm_parse_digits(const char *s, uint64_t *out, const char **end)
{
	uint64_t v = 0;
	bool range = false;
	const char *p = s;

	if (!is_digit(*p))
		return -EINVAL;
	for (; is_digit(*p); p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			range = true;
		else
			v = v * 10 + d;
	}
	*end = p;
	*out = v;
	return range ? -ERANGE : 0;
}

int vpmm_parse_size(const char *s, size_t *out)
{
	uint64_t v;
	const char *p;
	unsigned shift = 0;

	if (!s)
		return -EINVAL;
	int rc = vpmm_parse_digits(s, &v, &p);
	if (rc == -EINVAL)
		return rc;
	switch (lower(*p)) {
	case 'k': shift = 10; break;
	case 'm': shift = 20; break;
	case 'g': shift = 30; break;
	case 't': shift = 40; break;
	default: break;
	}
	if (shift) {
		p++;
		if (lower(p[0]) == 'i' && lower(p[1]) == 'b')
			p += 2;
		else if (lower(p[0]) == 'b')
			p++;
	} else if (lower(*p) == 'b') {
		p++; /* "512B" */
	}
	if (*p)
		return -EINVAL; /* syntax errors win over range errors */
	if (rc == -ERANGE || v > (uint64_t)SIZE_MAX || v > ((uint64_t)SIZE_MAX >> shift))
		return -ERANGE;
	*out = (size_t)(v << shift);
	return 0;
}

static int parse_count(const char *s, uint64_t *out)
{
	const char *end;
	uint64_t v;
	int rc = vpmm_parse_digits(s, &v, &end);
	if (rc == -EINVAL || *end)
		return -EINVAL;
	if (rc)
		return rc;
	*out = v;
	return 0;
}

static bool str_ieq(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if (lower((unsigned char)*a) != lower((unsigned char)*b))
			return false;
	return *a == *b;
}

static int parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "1", "yes", "true", "on" };
	static const char *const no[] = { "0", "no", "false", "off" };
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (str_ieq(s, yes[i])) {
			*out = true;
			return 0;
		}
		if (str_ieq(s, no[i])) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_enum(const char *s, const char *const *choices, int *out)
{
	for (int i = 0; choices[i]; i++) {
		if (str_ieq(s, choices[i])) {
			*out = i;
			return 0;
		}
	}
	return -EINVAL;
}

/* ---- reading the environment ------------------------------------------------ */

union opt_value {
	size_t size;
	uint64_t count;
	int choice;
	bool flag;
	const char *str; /* points into the environment: copy before returning */
};

struct opt_read {
	bool set[OPT_COUNT];
	union opt_value val[OPT_COUNT];
};

/* The value as it may appear inside one line of an error message: quoted,
 * control and non-ASCII bytes escaped, long values cut. */
static void quote_value(const char *v, char *buf, size_t n)
{
	size_t o = 0;
	const size_t keep = 64;

	if (n < 8) {
		if (n)
			buf[0] = '\0';
		return;
	}
	buf[o++] = '"';
	for (size_t i = 0; v[i]; i++) {
		unsigned char c = (unsigned char)v[i];
		bool escaped = c < 0x20 || c >= 0x7f || c == '"' || c == '\\';
		/* This byte, then room for "...", the quote and the NUL: a value
		 * cut short always says so. */
		if (i == keep || o + (escaped ? 4 : 1) + 5 > n) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (escaped)
			o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	buf[o++] = '"';
	buf[o] = '\0';
}

static void set_error(char *err, size_t errlen, enum opt_id id, const char *value,
		      const char *what)
{
	char q[96];
	if (!err || errlen == 0)
		return;
	quote_value(value, q, sizeof(q));
	snprintf(err, errlen, "%s=%s: %s", info_table[id].name, q, what);
}

static void enum_expectation(const char *const *choices, char *buf, size_t n)
{
	size_t o = (size_t)snprintf(buf, n, "expected one of:");
	for (int i = 0; choices[i] && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, "%s %s", i ? "," : "", choices[i]);
}

/* What a value of `id` must look like, for error messages. */
static const char *expectation(enum opt_id id, int rc, char *buf, size_t n)
{
	const struct opt_spec *sp = &spec_table[id];
	switch (sp->type) {
	case T_SIZE:
		if (rc == -ERANGE)
			return "too large (sizes stop below 16 EiB)";
		return "expected a size such as 2M or 2097152 "
		       "(decimal, optional K/M/G/T suffix, powers of 1024)";
	case T_COUNT:
		if (rc == -ERANGE)
			return "too large";
		return "expected a whole number such as 0 or 16384";
	case T_BOOL:
		return "expected 1/0, yes/no, true/false or on/off";
	case T_ENUM:
		enum_expectation(sp->choices, buf, n);
		return buf;
	case T_STRING:
		return "too long";
	}
	return "invalid";
}

/* A path that starts or ends with white space is a quoting slip: no one
 * names a file " x". */
static bool edge_space(const char *s)
{
	size_t n = strlen(s);
	return n && (*s == ' ' || *s == '\t' || s[n - 1] == ' ' || s[n - 1] == '\t');
}

/* Checks that need only the value itself (cross-option checks and those
 * needing the driver's granularity belong to the pool). NULL if fine. */
static const char *validate(enum opt_id id, const union opt_value *v)
{
	switch (id) {
	case OPT_VA_SIZE:
		/* Each chunk is one reservation, VPMM_MAX_CHUNKS at most:
		 * tiny chunks run out of address space, not memory. */
		if (v->size < GIB)
			return "must be at least 1G (such as 8T): the pool reserves at most "
			       "1024 chunks of it";
		break;
	case OPT_GROWTH_SPLIT:
		if (v->count > VPMM_GROWTH_SPLIT_MAX)
			return "must be at most 4096";
		break;
	case OPT_PAGE_SIZE:
		if (v->size & (v->size - 1))
			return "must be a power of two (such as 2M or 1G), or 0 for "
			       "the driver's granularity";
		break;
	case OPT_EVENT_INTERVAL_US:
		if (v->count > UINT64_MAX / 1000u)
			return "too large";
		break;
	case OPT_FRONT_ENTRIES:
		if (v->count > VPMM_FRONT_ENTRIES_MAX)
			return "must be at most 256";
		break;
	case OPT_LOOP_GROWTH:
		if (v->count > VPMM_LOOP_GROWTH_MAX)
			return "must be at most 1000 (percent)";
		break;
	case OPT_SOCKET:
		if (str_ieq(v->str, "off"))
			break;
		if (edge_space(v->str))
			return "spaces at its start or end: expected a path or off";
		if (strlen(v->str) >= VPMM_SOCKET_PATH_MAX)
			return "too long for a Unix socket path (at most 107 bytes), "
			       "expected a path or off";
		break;
	case OPT_TRACE:
		if (edge_space(v->str))
			return "spaces at its start or end: expected a path";
		if (strlen(v->str) >= VPMM_TRACE_PATH_MAX)
			return "too long for a path";
		break;
	default:
		break;
	}
	return NULL;
}

_Static_assert(VPMM_FRONT_ENTRIES_MAX == 256, "validate() says at most 256");
_Static_assert(VPMM_GROWTH_SPLIT_MAX == 4096, "validate() says at most 4096");
_Static_assert(VPMM_LOOP_GROWTH_MAX == 1000, "validate() says at most 1000");

static const char *std_getenv(const char *name)
{
	return getenv(name);
}

static int read_group(enum opt_group group, vpmm_getenv_fn getenv_fn,
		      struct opt_read *r, char *err, size_t errlen)
{
	char buf[128];

	if (!getenv_fn)
		getenv_fn = std_getenv;
	memset(r, 0, sizeof(*r));
	if (err && errlen)
		err[0] = '\0';

	for (int i = 0; i < OPT_COUNT; i++) {
		const struct opt_spec *sp = &spec_table[i];
		union opt_value *v = &r->val[i];
		int rc = 0;

		if (sp->group != group)
			continue;
		const char *s = getenv_fn(info_table[i].name);
		if (!s || !*s)
			continue;

		switch (sp->type) {
		case T_SIZE: rc = vpmm_parse_size(s, &v->size); break;
		case T_COUNT: rc = parse_count(s, &v->count); break;
		case T_BOOL: rc = parse_bool(s, &v->flag); break;
		case T_ENUM: rc = parse_enum(s, sp->choices, &v->choice); break;
		case T_STRING: v->str = s; break;
		}
		if (rc) {
			set_error(err, errlen, (enum opt_id)i, s,
				  expectation((enum opt_id)i, rc, buf, sizeof(buf)));
			return -EINVAL;
		}
		const char *bad = validate((enum opt_id)i, v);
		if (bad) {
			set_error(err, errlen, (enum opt_id)i, s, bad);
			return -EINVAL;
		}
		r->set[i] = true;
	}
	return 0;
}

int vpmm_config_from_env(struct vpmm_config *cfg,
			 const char *(*getenv_fn)(const char *name),
			 char *err, size_t errlen)
{
	struct opt_read r;
	struct vpmm_config c;

	int rc = read_group(G_POOL, getenv_fn, &r, err, errlen);
	if (rc)
		return rc;
	vpmm_config_default(&c);
	if (r.set[OPT_PAGES])
		c.initial_pages = (size_t)r.val[OPT_PAGES].count;
	if (r.set[OPT_PAGE_SIZE])
		c.page_size = r.val[OPT_PAGE_SIZE].size;
	if (r.set[OPT_VA_SIZE])
		c.va_size = r.val[OPT_VA_SIZE].size;
	if (r.set[OPT_HANDLE_SIZE])
		c.handle_size = r.val[OPT_HANDLE_SIZE].size;
	if (r.set[OPT_LIMIT])
		c.limit = r.val[OPT_LIMIT].size;
	if (r.set[OPT_GROWTH_SPLIT])
		c.growth_split = (unsigned)r.val[OPT_GROWTH_SPLIT].count;
	if (r.set[OPT_GRAIN])
		c.grain = r.val[OPT_GRAIN].size;
	if (r.set[OPT_SMALL_MAX])
		c.small_max = r.val[OPT_SMALL_MAX].size;
	if (r.set[OPT_DEFRAG])
		c.defrag = (enum vpmm_defrag_policy)r.val[OPT_DEFRAG].choice;
	if (r.set[OPT_REMAP])
		c.remap = (enum vpmm_remap_policy)r.val[OPT_REMAP].choice;
	if (r.set[OPT_EVENT_INTERVAL_US])
		c.event_interval_ns = r.val[OPT_EVENT_INTERVAL_US].count * 1000u;
	if (r.set[OPT_FRONT_ENTRIES])
		c.front_entries = (unsigned)r.val[OPT_FRONT_ENTRIES].count;
	if (r.set[OPT_LOOP_GROWTH])
		c.loop_growth = r.val[OPT_LOOP_GROWTH].count;
	*cfg = c;
	return 0;
}

int vpmm_env_options_from_env(struct vpmm_env_options *o, vpmm_getenv_fn getenv_fn,
			      char *err, size_t errlen)
{
	struct opt_read r;

	int rc = read_group(G_PROCESS, getenv_fn, &r, err, errlen);
	if (rc)
		return rc;
	/* Written only now, so that a failure leaves *o as it was. */
	vpmm_env_options_default(o);
	if (r.set[OPT_DISABLE])
		o->disable = r.val[OPT_DISABLE].flag;
	if (r.set[OPT_LOG])
		o->log_level = (enum vpmm_log_level)r.val[OPT_LOG].choice;
	if (r.set[OPT_SOCKET]) {
		if (str_ieq(r.val[OPT_SOCKET].str, "off"))
			o->socket_off = true;
		else
			snprintf(o->socket, sizeof(o->socket), "%s",
				 r.val[OPT_SOCKET].str);
	}
	if (r.set[OPT_TRACE])
		snprintf(o->trace, sizeof(o->trace), "%s", r.val[OPT_TRACE].str);
	if (r.set[OPT_RELEASE_THRESHOLD]) {
		o->has_release_threshold = true;
		o->release_threshold = r.val[OPT_RELEASE_THRESHOLD].size;
	}
	if (r.set[OPT_SYNC_FREE])
		o->sync_free = (enum vpmm_sync_free)r.val[OPT_SYNC_FREE].choice;
	return 0;
}

/* ---- checks between options ----------------------------------------------- */

const char *vpmm_size_text(size_t v, char *buf, size_t n)
{
	static const char suffix[] = "KMGT";
	int i = -1;
	while (i < 3 && v && v % 1024 == 0) {
		v /= 1024;
		i++;
	}
	if (i < 0)
		snprintf(buf, n, "%zu", v);
	else
		snprintf(buf, n, "%zu%c", v, suffix[i]);
	return buf;
}

const char *vpmm_size_human(uint64_t v, char *buf, size_t n)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double d = (double)v;
	int i = 0;
	for (; d >= 1024 && i < 6; i++)
		d /= 1024;
	if (i)
		snprintf(buf, n, "%.2f %s", d, unit[i]);
	else
		snprintf(buf, n, "%" PRIu64 " B", v);
	return buf;
}

#define CHECK_FAIL(...)                                                       \
	do {                                                                  \
		if (err && errlen)                                            \
			snprintf(err, errlen, __VA_ARGS__);                   \
		return -EINVAL;                                               \
	} while (0)

void vpmm_config_units(const struct vpmm_config *cfg, size_t gran, struct vpmm_units *u)
{
	u->page = cfg->page_size ? cfg->page_size : gran;
	/* A handle holds whole pages: less than one page is one, as 0 is
	 * (VPMM_PAGE_SIZE=2G, or a granularity of 2G, with the default 1G). */
	u->handle = cfg->handle_size > u->page ? cfg->handle_size : u->page;
	u->grain = cfg->grain && cfg->grain < u->page ? cfg->grain : u->page;
}

int vpmm_config_check(const struct vpmm_config *cfg, size_t gran, char *err, size_t errlen)
{
	char a[32], b[32];
	struct vpmm_units u;
	if (!gran)
		CHECK_FAIL("the driver reports no allocation granularity");
	vpmm_config_units(cfg, gran, &u);
	size_t page = u.page, handle = u.handle, grain = u.grain;
	if (page % gran)
		CHECK_FAIL("VPMM_PAGE_SIZE=%s is not a multiple of the driver's granularity %s",
			   vpmm_size_text(page, a, sizeof a), vpmm_size_text(gran, b, sizeof b));
	if (handle % page)
		CHECK_FAIL("VPMM_HANDLE_SIZE=%s is not a whole number of pages of %s "
			   "(VPMM_PAGE_SIZE, else the driver's granularity)",
			   vpmm_size_text(handle, a, sizeof a), vpmm_size_text(page, b, sizeof b));
	if (!cfg->va_size || cfg->va_size > SIZE_MAX - page)
		CHECK_FAIL("VPMM_VA_SIZE=%s: expected 1G to 16E, less a page",
			   vpmm_size_text(cfg->va_size, a, sizeof a));
	if (grain < 512 || (grain & (grain - 1)) || page % grain)
		CHECK_FAIL("VPMM_GRAIN=%s: expected a power of two from 512 that divides the "
			   "page of %s (or 0: whole pages)",
			   vpmm_size_text(cfg->grain, a, sizeof a), vpmm_size_text(page, b, sizeof b));
	if (cfg->initial_pages > SIZE_MAX / page)
		CHECK_FAIL("VPMM_PAGES=%zu: more pages of %s than memory can hold",
			   cfg->initial_pages, vpmm_size_text(page, b, sizeof b));
	/* Every allocation would fail: not one page fits under the limit. */
	if (cfg->limit && cfg->limit < page)
		CHECK_FAIL("VPMM_LIMIT=%s is less than one page of %s (VPMM_PAGE_SIZE, else the "
			   "driver's granularity): nothing could be mapped",
			   vpmm_size_text(cfg->limit, a, sizeof a), vpmm_size_text(page, b, sizeof b));
	if (cfg->limit && cfg->initial_pages > cfg->limit / page)
		CHECK_FAIL("VPMM_LIMIT=%s is less than the VPMM_PAGES=%zu pages of %s mapped up "
			   "front", vpmm_size_text(cfg->limit, a, sizeof a), cfg->initial_pages,
			   vpmm_size_text(page, b, sizeof b));
	return 0;
}

int vpmm_config_check_device(const struct vpmm_config *cfg, size_t gran, size_t total,
			     char *err, size_t errlen)
{
	char a[32], b[32];
	struct vpmm_units u;
	int rc = vpmm_config_check(cfg, gran, err, errlen);
	if (rc || !total)
		return rc;
	vpmm_config_units(cfg, gran, &u);
	if (u.page > total)
		CHECK_FAIL("VPMM_PAGE_SIZE=%s is more than the device's memory (%s): not one "
			   "page could be mapped", vpmm_size_text(u.page, a, sizeof a),
			   vpmm_size_text(total, b, sizeof b));
	return 0;
}

/* ---- misspelled names ------------------------------------------------------ */

/* Edits (insert, delete, replace, swap two neighbours) between a and b,
 * letters compared in either case, stopping past `most`. */
static unsigned edits(const char *a, const char *b, unsigned most)
{
	enum { MAX = 48 };
	size_t n = strlen(a), m = strlen(b);
	if (n >= MAX || m >= MAX || (n > m ? n - m : m - n) > most)
		return most + 1;
	unsigned d[MAX][MAX];
	for (size_t i = 0; i <= n; i++)
		d[i][0] = (unsigned)i;
	for (size_t j = 0; j <= m; j++)
		d[0][j] = (unsigned)j;
	for (size_t i = 1; i <= n; i++)
		for (size_t j = 1; j <= m; j++) {
			unsigned cost = lower((unsigned char)a[i - 1]) != lower((unsigned char)b[j - 1]);
			unsigned v = d[i - 1][j - 1] + cost;
			if (d[i - 1][j] + 1 < v)
				v = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < v)
				v = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && lower((unsigned char)a[i - 1]) == lower((unsigned char)b[j - 2]) &&
			    lower((unsigned char)a[i - 2]) == lower((unsigned char)b[j - 1]) &&
			    d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	return d[n][m];
}

size_t vpmm_options_misspelled(char *const *env,
			       void (*report)(const char *given, const char *meant, void *arg),
			       void *arg)
{
	size_t found = 0;
	for (; env && *env; env++) {
		char name[48];
		const char *eq = strchr(*env, '=');
		size_t n = eq ? (size_t)(eq - *env) : strlen(*env);
		if (n < 5 || n >= sizeof(name))
			continue;
		if (strncasecmp(*env, "VPMM_", 5) != 0)
			continue;
		memcpy(name, *env, n);
		name[n] = '\0';
		/* A letter of another alphabet that looks like ours (the
		 * Turkish capital dotted I in VPMM_PAGE_SİZE) is one slip,
		 * not as many as it has bytes: each non-ASCII character is
		 * compared as one byte that matches no letter. */
		char folded[sizeof(name)];
		size_t k = 0;
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char)name[i];
			folded[k++] = c < 0x80 ? (char)c : '\x01';
			if (c >= 0xc0)
				while (i + 1 < n && ((unsigned char)name[i + 1] & 0xc0) == 0x80)
					i++;
		}
		folded[k] = '\0';
		/* One slip: at two, VPMM_LIB (our scripts') read as VPMM_LOG. */
		const char *best = NULL;
		unsigned best_d = 2;
		bool exact = false;
		for (size_t i = 0; i < OPT_COUNT && !exact; i++) {
			exact = strcmp(name, info_table[i].name) == 0;
			unsigned d = edits(folded, info_table[i].name, 1);
			if (d < best_d) {
				best_d = d;
				best = info_table[i].name;
			}
		}
		if (exact || !best)
			continue; /* ours, or another program's VPMM_ name */
		found++;
		if (report)
			report(name, best, arg);
	}
	return found;
}
