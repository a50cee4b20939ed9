/* server_requests.c — the socket server's requests (server.h lists them):
 * a line's parsing (framing, version, request name, argument), the table of
 * requests and each one's JSON reply, formatted into a growable buffer. The
 * wire format is in protocol.h; what each reply holds is in
 * docs/vpmm-dump.md.
 *
 * Owns: the request table and the replies. Runs on the server's thread.
 * May call: the hooks of struct vpmm_server_config, vpmm_pool_snapshot and
 * the pool's read-only calls; never blocks on a socket (server.c writes).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protocol.h"
#include "server.h"
#include "server_int.h"
#include "snapshot.h"
#include "vpmm/version.h" /* VPMM_VERSION: the "library" of version and config replies */

/* ---- growable reply buffer ------------------------------------------------ */



static void sb_reserve(struct sbuf *b, size_t more)
{
	if (b->failed || b->len + more + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more + 1)
		cap *= 2;
	char *p = cap <= VPMM_REPLY_MAX ? realloc(b->p, cap) : NULL;
	if (!p) {
		b->failed = true;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	for (int pass = 0; pass < 2 && !b->failed; pass++) {
		size_t room = b->cap - b->len;
		va_start(ap, fmt);
		int n = vsnprintf(b->cap ? b->p + b->len : NULL, b->cap ? room : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->failed = true;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		sb_reserve(b, (size_t)n);
	}
}

/* A JSON string. Paths are bytes: UTF-8 goes as it is, so that a client
 * gets the path back; control bytes, and bytes that are not UTF-8 (which
 * JSON cannot carry), are escaped as \u00XX. */
static void sb_str(struct sbuf *b, const char *s)
{
	sb_printf(b, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		size_t n = c >= 0x80 ? vpmm_utf8_len((const unsigned char *)s) : 0;
		if (c == '"' || c == '\\')
			sb_printf(b, "\\%c", c);
		else if (n) {
			sb_printf(b, "%.*s", (int)n, s);
			s += n - 1;
		} else if (c < 0x20 || c >= 0x7f)
			sb_printf(b, "\\u%04x", c);
		else
			sb_printf(b, "%c", c);
	}
	sb_printf(b, "\"");
}

/* ---- requests --------------------------------------------------------------- */

/* A handler appends the fields of its reply after the common ones and returns
 * NULL, or returns the error sentence (the appended text is then dropped). */
typedef const char *(*handler_fn)(struct server *s, const char *arg, struct sbuf *b,
				  char *err, size_t errlen);

struct request {
	const char *name;
	handler_fn fn;
	const char *usage;
};

static size_t get_pools(struct server *s, vpmm_pool **pools)
{
	size_t n = s->cfg.pools ? s->cfg.pools(pools, MAX_POOLS, s->cfg.arg) : 0;
	return n > MAX_POOLS ? MAX_POOLS : n;
}

static void put_stats(struct sbuf *b, const struct vpmm_stats *st)
{
	const char *sep = "";
#define FIELD(name, v)                                                          \
	do {                                                                    \
		sb_printf(b, "%s\"%s\":%" PRIu64, sep, name, (uint64_t)(v));    \
		sep = ",";                                                      \
	} while (0)
	sb_printf(b, "{");
#define X(n, d) FIELD(#n, st->n); FIELD(#n "_peak", st->n##_peak);
	VPMM_GAUGES(X)
#undef X
#define X(n, d) FIELD(#n, st->n);
	VPMM_COUNTERS(X)
#undef X
	FIELD("page_size", st->page_size);
	FIELD("regions", st->regions);
	FIELD("parked", st->parked);
#undef FIELD
	sb_printf(b, "}");
}

static void put_config(struct sbuf *b, const struct vpmm_config *c)
{
	sb_printf(b,
		  "{\"device\":%d,\"page_size\":%zu,\"grain\":%zu,\"va_size\":%zu,"
		  "\"initial_pages\":%zu,\"handle_size\":%zu,\"growth_split\":%u,\"limit\":%zu,"
		  "\"small_max\":%zu,\"defrag\":\"%s\",\"event_interval_ns\":%" PRIu64 ","
		  "\"background\":%s,\"release\":%s,\"release_threshold\":%zu,"
		  "\"front_entries\":%u,\"front_bytes\":%zu}",
		  c->device, c->page_size, c->grain ? c->grain : c->page_size, c->va_size,
		  c->initial_pages, c->handle_size ? c->handle_size : c->page_size, c->growth_split,
		  c->limit, c->small_max, c->defrag == VPMM_DEFRAG_ALL ? "all" : "lacking",
		  c->event_interval_ns, c->background ? "true" : "false",
		  c->release ? "true" : "false", c->release_threshold, c->front_entries,
		  c->front_bytes);
}

static const char *req_ping(struct server *s, const char *arg, struct sbuf *b, char *err,
			    size_t errlen)
{
	sb_printf(b, ",\"pong\":true");
	return NULL;
}

static const char *req_stats(struct server *s, const char *arg, struct sbuf *b, char *err,
			     size_t errlen)
{
	vpmm_pool *pools[MAX_POOLS];
	size_t n = get_pools(s, pools);
	sb_printf(b, ",\"pools\":[");
	for (size_t i = 0; i < n; i++) {
		struct vpmm_config cfg;
		struct vpmm_stats st;
		vpmm_pool_summary(pools[i], &cfg, &st);
		int device = cfg.device;
		sb_printf(b, "%s{\"device\":%d,\"stats\":", i ? "," : "", device);
		put_stats(b, &st);
		sb_printf(b, "}");
	}
	sb_printf(b, "]");
	return NULL;
}

static const char *req_map(struct server *s, const char *arg, struct sbuf *b, char *err,
			   size_t errlen)
{
	vpmm_pool *pools[MAX_POOLS];
	size_t n = get_pools(s, pools);
	sb_printf(b, ",\"pools\":[");
	for (size_t i = 0; i < n; i++) {
		struct vpmm_snapshot snap;
		if (vpmm_pool_snapshot(pools[i], &snap) != 0)
			return "out of memory copying the region map";
		sb_printf(b, "%s{\"device\":%d,\"config\":", i ? "," : "", snap.cfg.device);
		put_config(b, &snap.cfg);
		sb_printf(b, ",\"stats\":");
		put_stats(b, &snap.stats);
		const struct vpmm_free_split *fs = &snap.free_split;
		sb_printf(b, ",\"free_split\":{\"whole\":%" PRIu64 ",\"whole_handles\":%" PRIu64
			  ",\"stranded\":%" PRIu64 ",\"stranded_handles\":%" PRIu64
			  ",\"largest\":%" PRIu64 "}",
			  fs->whole, fs->whole_handles, fs->stranded, fs->stranded_handles,
			  fs->largest);
		sb_printf(b, ",\"chunks\":[");
		for (size_t c = 0; c < snap.nchunks; c++)
			sb_printf(b, "%s{\"index\":%zu,\"va\":%llu,\"size\":%zu}", c ? "," : "", c,
				  (unsigned long long)snap.chunks[c].va, snap.chunks[c].size);
		sb_printf(b, "],\"regions\":[");
		for (size_t r = 0; r < snap.nregions; r++) {
			const struct vpmm_snap_region *ri = &snap.regions[r];
			sb_printf(b, "%s{\"va\":%llu,\"size\":%zu,\"kind\":\"%s\",\"chunk\":%u",
				  r ? "," : "", (unsigned long long)ri->va, ri->size,
				  vpmm_region_kind_name(ri->kind), ri->chunk);
			if (ri->kind == VPMM_REGION_FREE)
				sb_printf(b, ",\"stream\":%llu,\"settled\":%s,\"parked\":%s",
					  (unsigned long long)(uintptr_t)ri->stream,
					  ri->settled ? "true" : "false", ri->parked ? "true" : "false");
			if (ri->small)
				sb_printf(b, ",\"small\":true");
			sb_printf(b, "}");
		}
		sb_printf(b, "]}");
		vpmm_snapshot_free(&snap);
	}
	sb_printf(b, "]");
	return NULL;
}

static const char *req_config(struct server *s, const char *arg, struct sbuf *b, char *err,
			      size_t errlen)
{
	sb_printf(b, ",\"socket\":");
	sb_str(b, s->path);
#ifdef VPMM_VERSION
	sb_printf(b, ",\"library\":");
	sb_str(b, VPMM_VERSION);
#endif
	/* the trace being written now, whether VPMM_TRACE or a request started it */
	char trace[4096] = "";
	if (s->cfg.trace_status)
		s->cfg.trace_status(trace, sizeof(trace), NULL);
	else if (s->has_env)
		snprintf(trace, sizeof(trace), "%s", s->env.trace);
	sb_printf(b, ",\"trace\":");
	if (trace[0])
		sb_str(b, trace);
	else
		sb_printf(b, "null");
	if (s->has_env) {
		sb_printf(b, ",\"log\":\"%s\",\"disable\":%s",
			  vpmm_log_level_name(s->env.log_level), s->env.disable ? "true" : "false");
		if (s->env.has_release_threshold)
			sb_printf(b, ",\"release_threshold\":%zu", s->env.release_threshold);
		else
			sb_printf(b, ",\"release_threshold\":null");
	}
	vpmm_pool *pools[MAX_POOLS];
	size_t n = get_pools(s, pools);
	sb_printf(b, ",\"pools\":[");
	for (size_t i = 0; i < n; i++) {
		struct vpmm_config cfg;
		struct vpmm_stats st;
		vpmm_pool_summary(pools[i], &cfg, &st);
		sb_printf(b, "%s", i ? "," : "");
		put_config(b, &cfg);
	}
	sb_printf(b, "]");
	return NULL;
}

static const char *req_trim(struct server *s, const char *arg, struct sbuf *b, char *err,
			    size_t errlen)
{
	if (!s->cfg.trim)
		return "unsupported: this process has no trim";
	size_t keep = 0;
	if (arg && *arg && vpmm_parse_size(arg, &keep) != 0)
		return "trim takes the bytes to keep, such as 512M (or nothing: keep none)";
	uint64_t released = 0;
	int rc = s->cfg.trim(keep, &released, s->cfg.arg);
	if (rc < 0) {
		snprintf(err, errlen, "trim failed: %s", strerror(-rc));
		return err;
	}
	sb_printf(b, ",\"released\":%" PRIu64, released);
	return NULL;
}

static const char *req_trace(struct server *s, const char *arg, struct sbuf *b, char *err,
			     size_t errlen)
{
	const struct vpmm_server_config *c = &s->cfg;
	if (!c->trace_start && !c->trace_stop && !c->trace_status && !c->trace_flush)
		return "unsupported: this process has no trace recording";
	if (!arg || !*arg)
		return "trace takes: start PATH | stop | status | flush";
	int rc = 0;
	if (strncmp(arg, "start ", 6) == 0 && arg[6]) {
		if (!c->trace_start)
			return "unsupported: trace start";
		rc = c->trace_start(arg + 6);
	} else if (strcmp(arg, "stop") == 0) {
		if (!c->trace_stop)
			return "unsupported: trace stop";
		rc = c->trace_stop();
	} else if (strcmp(arg, "flush") == 0) {
		if (!c->trace_flush)
			return "unsupported: trace flush";
		rc = c->trace_flush();
	} else if (strcmp(arg, "status") != 0) {
		return "trace takes: start PATH | stop | status | flush";
	}
	if (rc < 0) {
		bool start = strncmp(arg, "start ", 6) == 0;
		snprintf(err, errlen, "trace %s failed: %s", arg,
			 start && c->trace_strerror ? c->trace_strerror(rc) : strerror(-rc));
		return err;
	}
	char path[4096] = "";
	uint64_t events = 0;
	bool active = c->trace_status && c->trace_status(path, sizeof(path), &events);
	sb_printf(b, ",\"active\":%s,\"path\":", active ? "true" : "false");
	if (active)
		sb_str(b, path);
	else
		sb_printf(b, "null");
	sb_printf(b, ",\"events\":%" PRIu64, events);
	return NULL;
}

/* The ipc requests hand the client's pid to the hook and park the
 * descriptors in the client until its reply is sent: serve_line says which
 * client and which request it is serving. */
static struct client *g_serving;
static const char *g_serving_name;

static const char *req_ipc(struct server *s, const char *arg, struct sbuf *b, char *err,
			   size_t errlen)
{
	struct client *c = g_serving;
	if (!s->cfg.ipc)
		return "unsupported: this process shares no memory";
	char fields[8192];
	fields[0] = '\0';
	c->nfds = 0;
	const char *e = s->cfg.ipc(g_serving_name, arg ? arg : "", c->pid, fields, sizeof(fields),
				   c->fds, &c->nfds);
	if (e) {
		vpmm_server_drop_fds(c);
		snprintf(err, errlen, "%s", e);
		return err;
	}
	sb_printf(b, "%s", fields);
	return NULL;
}

static const char *req_help(struct server *s, const char *arg, struct sbuf *b, char *err,
			    size_t errlen);
static const char *req_version(struct server *s, const char *arg, struct sbuf *b, char *err,
			       size_t errlen);

/* Adding a request = one entry here and its handler above. */
static const struct request requests[] = {
	{ "ping", req_ping, "ping" },
	{ "version", req_version, "version" },
	{ "help", req_help, "help" },
	{ "stats", req_stats, "stats" },
	{ "map", req_map, "map" },
	{ "config", req_config, "config" },
	{ "trim", req_trim, "trim [KEEP]" },
	{ "trace", req_trace, "trace start PATH | stop | status | flush" },
	{ "ipc-open", req_ipc, "ipc-open ID TOKEN" },
	{ "ipc-pieces", req_ipc, "ipc-pieces ID TOKEN FIRST" },
	{ "ipc-close", req_ipc, "ipc-close ID TOKEN" },
};

static const char *req_help(struct server *s, const char *arg, struct sbuf *b, char *err,
			    size_t errlen)
{
	sb_printf(b, ",\"requests\":[");
	for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++) {
		sb_printf(b, "%s", i ? "," : "");
		sb_str(b, requests[i].usage);
	}
	sb_printf(b, "]");
	return NULL;
}

static const char *req_version(struct server *s, const char *arg, struct sbuf *b, char *err,
			       size_t errlen)
{
	sb_printf(b, ",\"protocols\":[%d]", VPMM_PROTOCOL);
#ifdef VPMM_VERSION
	sb_printf(b, ",\"library\":");
	sb_str(b, VPMM_VERSION);
#endif
	return NULL;
}

void vpmm_server_reply_error(struct sbuf *b, const char *request, const char *msg)
{
	b->len = 0;
	b->failed = false;
	sb_printf(b, "{\"protocol\":%d,\"ok\":false", VPMM_PROTOCOL);
	if (request) {
		sb_printf(b, ",\"request\":");
		sb_str(b, request);
	}
	sb_printf(b, ",\"error\":");
	sb_str(b, msg);
	sb_printf(b, "}\n");
}

void vpmm_server_drop_fds(struct client *c)
{
	/* Counted out before closed, as vpmm_server_close_named says why. */
	while (c->nfds) {
		unsigned n = c->nfds - 1;
		int fd = c->fds[n];
		__atomic_store_n(&c->nfds, n, __ATOMIC_SEQ_CST);
		close(fd);
	}
}

void vpmm_server_serve_line(struct server *s, struct client *c, char *line, size_t len)
{
	struct sbuf *b = &c->out;
	char err[VPMM_REQUEST_MAX + 512]; /* the request's path and the reason */
	b->len = 0;
	b->failed = false;
	if (len && line[len - 1] == '\r')
		line[--len] = '\0';
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)line[i];
		size_t n = ch >= 0x80 ? vpmm_utf8_len((const unsigned char *)line + i) : 0;
		if (n) { /* a path in UTF-8 */
			i += n - 1;
			continue;
		}
		if (ch < 0x20 || ch > 0x7e) {
			vpmm_server_reply_error(b, NULL,
				    "malformed request: not a line of printable ASCII or UTF-8");
			return;
		}
	}
	/* "vpmm" SP version SP name [SP arg] */
	if (strncmp(line, "vpmm ", 5) != 0) {
		vpmm_server_reply_error(b, NULL, "malformed request: expected \"vpmm <version> <request>\"");
		return;
	}
	char *p = line + 5, *end;
	errno = 0;
	long version = strtol(p, &end, 10);
	if (end == p || (*end != ' ' && *end != '\0') || errno || version < 0) {
		vpmm_server_reply_error(b, NULL, "malformed request: bad protocol version");
		return;
	}
	if (version != VPMM_PROTOCOL) {
		snprintf(err, sizeof(err),
			 "unsupported protocol version %ld: this process speaks version %d",
			 version, VPMM_PROTOCOL);
		vpmm_server_reply_error(b, NULL, err);
		c->closing = true;
		return;
	}
	p = end;
	while (*p == ' ')
		p++;
	char *name = p;
	while (*p && *p != ' ')
		p++;
	char *arg = NULL;
	if (*p) {
		*p++ = '\0';
		arg = p;
	}
	if (!*name) {
		vpmm_server_reply_error(b, NULL, "malformed request: no request name");
		return;
	}
	const struct request *rq = NULL;
	for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++)
		if (strcmp(requests[i].name, name) == 0)
			rq = &requests[i];
	if (!rq) {
		char shown[65];
		snprintf(shown, sizeof(shown), "%s", name);
		snprintf(err, sizeof(err), "unknown request \"%s\" (try: vpmm %d help)", shown,
			 VPMM_PROTOCOL);
		vpmm_server_reply_error(b, NULL, err);
		return;
	}
	sb_printf(b, "{\"protocol\":%d,\"ok\":true,\"request\":\"%s\",\"pid\":%ld", VPMM_PROTOCOL,
		  rq->name, (long)getpid());
	g_serving = c;
	g_serving_name = rq->name;
	const char *e = rq->fn(s, arg, b, err, sizeof(err));
	g_serving = NULL;
	if (e) {
		vpmm_server_reply_error(b, rq->name, e);
		return;
	}
	sb_printf(b, "}\n");
	if (b->failed) {
		vpmm_server_reply_error(b, rq->name, "reply too large or out of memory");
		vpmm_server_drop_fds(c);
	}
	if (b->failed) { /* not even the error fits: drop the connection */
		b->len = 0;
		c->closing = true;
	}
}
