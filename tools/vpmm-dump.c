/* vpmm-dump.c — reads the live region map of programs running under
 * libvpmm.so through their Unix sockets (shim/server.c; protocol in
 * shim/protocol.h): lists them, prints one's header metrics and every region
 * in the spec's symbols, as JSON (docs/dump-json.md), as a picture of the
 * address space, or as a PyTorch memory snapshot (a pickle the memory
 * visualizer opens). The manual is docs/vpmm-dump.md.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include "options.h" /* vpmm_parse_digits */
#include "vpmm.h" /* vpmm_parse_size */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "pickle.h"
#include "protocol.h"
#include "vpmm/version.h"

/* Exit statuses (also in --help and docs/vpmm-dump.md). */
enum {
	EXIT_OK = 0,
	EXIT_FAIL = 1,     /* I/O error, malformed reply, cannot write a file */
	EXIT_USAGE = 2,
	EXIT_GONE = 3,     /* no such process, no socket, stale socket */
	EXIT_DENIED = 4,   /* the socket or the process belongs to another user */
	EXIT_PROTOCOL = 5, /* the process speaks another protocol version */
};

#define REPLY_TIMEOUT_MS 10000
#define LIST_TIMEOUT_MS 2000 /* while listing, for all processes at once: a
			      * stuck process must not hold up the list */
#define TRACE_MAX_DEFAULT 100000

static const char *prog = "vpmm-dump";
static int reply_timeout_ms = REPLY_TIMEOUT_MS;
static volatile sig_atomic_t interrupted;

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

/* Control characters become '?': names and strings come from other
 * processes (as root, any user's), and must not drive the terminal. */
static void printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

/* Text output: replies are made printable as they arrive (--json and the
 * snapshot keep them exact; their writers escape). */
static bool text_output;

static void errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errf(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printable(msg);
	fprintf(stderr, "%s: %s\n", prog, msg);
}

/* Whether everything written to stdout got there (/dev/full, a closed
 * descriptor): EXIT_OK, or EXIT_FAIL saying why. */
static int output_status(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return EXIT_OK;
	errf("writing the output: %s", strerror(errno ? errno : EIO));
	return EXIT_FAIL;
}

/* ---- sizes ------------------------------------------------------------------ */

/* "12.50 MiB" */
static const char *human(char *buf, size_t n, uint64_t v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double d = (double)v;
	int i = 0;
	while (d >= 1024.0 && i < 6) {
		d /= 1024.0;
		i++;
	}
	if (i == 0)
		snprintf(buf, n, "%" PRIu64 " B", v);
	else
		snprintf(buf, n, "%.2f %s", d, unit[i]);
	return buf;
}

/* The spec's size notation: the largest K/M/G/T... unit that divides it. */
static const char *exact(char *buf, size_t n, uint64_t v)
{
	static const char suffix[] = "KMGTPE";
	int i = -1;
	while (v >= 1024 && v % 1024 == 0 && i < 5) {
		v /= 1024;
		i++;
	}
	if (i < 0)
		snprintf(buf, n, "%" PRIu64, v);
	else
		snprintf(buf, n, "%" PRIu64 "%c", v, suffix[i]);
	return buf;
}

/* ---- talking to a process -------------------------------------------------- */

struct conn {
	int fd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	long peer_pid;
	long peer_uid;
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Connects (without waiting, when `nowait`: a socket whose backlog is full
 * is then "not answering" at once); returns an exit status with the reason
 * in err. */
static int conn_connect(const char *path, struct conn *c, bool nowait, char *err, size_t errlen)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	c->fd = -1;
	if (strlen(path) >= sizeof(addr.sun_path)) {
		snprintf(err, errlen, "%s: path too long for a Unix socket", path);
		return EXIT_USAGE;
	}
	strcpy(addr.sun_path, path);
	snprintf(c->path, sizeof(c->path), "%s", path);
	struct stat st; /* connect() calls any other file "refused": stale */
	if (stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s: not a socket", path);
		return EXIT_FAIL;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nowait ? SOCK_NONBLOCK : 0), 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return EXIT_FAIL;
	}
	struct timeval tv = { .tv_sec = reply_timeout_ms / 1000 };
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc;
	do
		rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
	while (rc != 0 && errno == EINTR && !interrupted);
	if (rc != 0) {
		int e = errno;
		close(fd);
		switch (e) {
		case ENOENT:
			snprintf(err, errlen, "%s: no such socket", path);
			return EXIT_GONE;
		case ECONNREFUSED:
			snprintf(err, errlen,
				 "%s: nobody serves this socket (stale: its process is gone "
				 "or stopped serving)", path);
			return EXIT_GONE;
		case EACCES:
		case EPERM:
			snprintf(err, errlen,
				 "%s: permission denied (the socket belongs to another user)", path);
			return EXIT_DENIED;
		case EAGAIN:
			snprintf(err, errlen, "%s: no reply (its backlog is full)", path);
			return EXIT_FAIL;
		default:
			snprintf(err, errlen, "%s: %s", path, strerror(e));
			return EXIT_FAIL;
		}
	}
	struct ucred cred;
	socklen_t len = sizeof(cred);
	c->peer_pid = c->peer_uid = -1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
		c->peer_pid = cred.pid;
		c->peer_uid = (long)cred.uid;
	}
	c->fd = fd;
	return EXIT_OK;
}

static int conn_open(const char *path, struct conn *c, char *err, size_t errlen)
{
	return conn_connect(path, c, false, err, errlen);
}

static void conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

static int reply_parse(const char *path, const char *buf, size_t len, struct json *reply,
		       char *err, size_t errlen);

/* Sends one request and parses its reply into *reply (freed by the caller
 * with json_free). Returns an exit status with the reason in err. */
static int conn_request(struct conn *c, const char *request, struct json *reply, char *err,
			size_t errlen)
{
	char line[VPMM_REQUEST_MAX];
	int n = snprintf(line, sizeof(line), "vpmm %d %s\n", VPMM_PROTOCOL, request);
	memset(reply, 0, sizeof(*reply));
	if (n < 0 || (size_t)n >= sizeof(line)) {
		snprintf(err, errlen, "request too long");
		return EXIT_USAGE;
	}
	size_t off = 0;
	while (off < (size_t)n) {
		ssize_t w = send(c->fd, line + off, (size_t)n - off, MSG_NOSIGNAL);
		if (w > 0) {
			off += (size_t)w;
		} else if (w < 0 && errno == EINTR && !interrupted) {
			continue;
		} else {
			break; /* the server may have refused us: read its reason */
		}
	}
	char *buf = NULL;
	size_t len = 0, cap = 0;
	uint64_t deadline = now_ms() + (uint64_t)reply_timeout_ms;
	int status = EXIT_OK;
	for (;;) {
		if (len && buf[len - 1] == '\n')
			break;
		uint64_t now = now_ms();
		if (now >= deadline) {
			snprintf(err, errlen, "%s: no reply within %d s", c->path,
				 reply_timeout_ms / 1000);
			status = EXIT_FAIL;
			goto out;
		}
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int pr = poll(&p, 1, (int)(deadline - now));
		if (pr < 0 && errno == EINTR) {
			if (interrupted) {
				snprintf(err, errlen, "interrupted");
				status = EXIT_FAIL;
				goto out;
			}
			continue;
		}
		if (pr <= 0)
			continue;
		if (len + 65536 > cap) {
			size_t nc = cap ? cap * 2 : 65536;
			if (nc > VPMM_REPLY_MAX + 65536) {
				snprintf(err, errlen, "%s: reply longer than %zu bytes", c->path,
					 (size_t)VPMM_REPLY_MAX);
				status = EXIT_FAIL;
				goto out;
			}
			char *nb = realloc(buf, nc);
			if (!nb) {
				snprintf(err, errlen, "out of memory");
				status = EXIT_FAIL;
				goto out;
			}
			buf = nb;
			cap = nc;
		}
		ssize_t r = recv(c->fd, buf + len, cap - len, 0);
		if (r > 0) {
			len += (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0 && len == 0)
			snprintf(err, errlen, "%s: the process closed the connection without a reply",
				 c->path);
		else if (r == 0)
			snprintf(err, errlen, "%s: truncated reply", c->path);
		else
			snprintf(err, errlen, "%s: %s", c->path, strerror(errno));
		status = EXIT_FAIL;
		goto out;
	}
	status = reply_parse(c->path, buf, len, reply, err, errlen);
out:
	free(buf);
	return status;
}

/* A reply line (len bytes, the newline last) into *reply: an exit status,
 * with the reason in err (reply then freed). */
static int reply_parse(const char *path, const char *buf, size_t len, struct json *reply,
		       char *err, size_t errlen)
{
	int status = EXIT_OK;
	char perr[160];
	if (json_parse(buf, len - 1, reply, perr, sizeof(perr)) || reply->type != JSON_OBJECT) {
		snprintf(err, errlen, "%s: malformed reply (%s)", path,
			 reply->type == JSON_OBJECT ? perr : "not a JSON object");
		status = EXIT_FAIL;
		goto out;
	}
	int64_t proto = -1;
	bool ok = false;
	bool has_proto = json_i64(json_get(reply, "protocol"), &proto);
	json_bool(json_get(reply, "ok"), &ok);
	const char *e = json_str(json_get(reply, "error"));
	if (!has_proto || proto < 1) { /* {} or the like: not a vpmm reply */
		snprintf(err, errlen, "%s: malformed reply (no protocol version)", path);
		status = EXIT_FAIL;
		goto out;
	}
	if (proto != VPMM_PROTOCOL) {
		snprintf(err, errlen,
			 "%s: the process speaks vpmm protocol %" PRId64 ", this vpmm-dump speaks %d:"
			 " use the vpmm-dump that came with the process's libvpmm%s%s",
			 path, proto, VPMM_PROTOCOL, e ? " (it said: " : "", e ? e : "");
		if (e)
			strncat(err, ")", errlen - strlen(err) - 1);
		status = EXIT_PROTOCOL;
		goto out;
	}
	if (!ok) {
		e = e ? e : "(no reason given)";
		snprintf(err, errlen, "%s: %s", path, e);
		if (strncmp(e, "permission denied", 17) == 0)
			status = EXIT_DENIED;
		else if (strncmp(e, "unsupported protocol version", 28) == 0)
			status = EXIT_PROTOCOL;
		else
			status = EXIT_FAIL;
		goto out;
	}
out:
	if (status != EXIT_OK)
		json_free(reply);
	return status;
}

/* One request on a fresh connection. */
static int ask(const char *path, const char *request, struct json *reply, char *err,
	       size_t errlen)
{
	struct conn c;
	int st = conn_open(path, &c, err, errlen);
	if (st == EXIT_OK)
		st = conn_request(&c, request, reply, err, errlen);
	conn_close(&c);
	return st;
}

/* ---- processes -------------------------------------------------------------- */

static void command_of(long pid, char *buf, size_t n)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
	snprintf(buf, n, "?");
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, (int)n, f))
		buf[strcspn(buf, "\n")] = '\0';
	fclose(f);
	if (text_output)
		printable(buf); /* --json keeps it exact; its writer escapes */
}

/* Every string and key of a reply made printable, for text output. */
static void printable_json(struct json *v)
{
	if (v->type == JSON_STRING && v->text)
		printable(v->text);
	for (size_t i = 0; (v->type == JSON_ARRAY || v->type == JSON_OBJECT) && i < v->n; i++) {
		if (v->type == JSON_OBJECT && v->keys[i])
			printable(v->keys[i]);
		printable_json(&v->items[i]);
	}
}



static bool process_exists(long pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%ld", pid);
	struct stat st;
	return stat(path, &st) == 0;
}

/* The value of NAME in /proc/PID/environ (readable for our own processes). */
static bool environ_of(long pid, const char *name, char *buf, size_t n)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	size_t cap = 1 << 16, len = 0;
	char *env = malloc(cap + 1);
	bool found = false;
	if (!env) {
		close(fd);
		return false;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= (1u << 24))
				break;
			char *ne = realloc(env, cap * 2 + 1);
			if (!ne)
				break;
			env = ne;
			cap *= 2;
		}
		ssize_t r = read(fd, env + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	env[len] = '\0';
	size_t nl = strlen(name);
	for (size_t i = 0; i < len; i += strlen(env + i) + 1) {
		if (strncmp(env + i, name, nl) == 0 && env[i + nl] == '=') {
			snprintf(buf, n, "%s", env + i + nl + 1);
			found = true;
			break;
		}
	}
	free(env);
	return found;
}

static bool is_socket(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Finds the socket of PID: its VPMM_SOCKET, its XDG_RUNTIME_DIR, ours, and
 * the /tmp directories of its uid and ours. Returns an exit status. */
/* Adds "<dir of xdg/uid>/<pid>.sock" to the candidates if it fits. */
static void candidate(char cand[][PATH_MAX], int *nc, const char *xdg, unsigned long uid, long pid)
{
	char dir[PATH_MAX];
	int n = vpmm_socket_dir(dir, sizeof(dir), xdg, uid);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return;
	n = vpmm_socket_path(cand[*nc], PATH_MAX, dir, pid);
	if (n > 0 && n < PATH_MAX)
		(*nc)++;
}

static int find_socket(long pid, char *out, size_t n, char *err, size_t errlen)
{
	char cand[6][PATH_MAX];
	int nc = 0;
	char val[PATH_MAX];
	char comm[64];
	if (!process_exists(pid)) {
		snprintf(err, errlen, "no process %ld", pid);
		return EXIT_GONE;
	}
	command_of(pid, comm, sizeof(comm));
	if (environ_of(pid, "VPMM_SOCKET", val, sizeof(val)) && val[0]) {
		if (strcasecmp(val, "off") == 0) {
			snprintf(err, errlen, "process %ld (%s) runs with VPMM_SOCKET=off: no socket",
				 pid, comm);
			return EXIT_GONE;
		}
		if (val[0] == '/') {
			snprintf(cand[nc++], PATH_MAX, "%s", val);
		} else {
			/* Bound relative to the directory the process started
			 * in (its current one, unless it moved since). */
			char link[64], cwd[PATH_MAX];
			snprintf(link, sizeof(link), "/proc/%ld/cwd", pid);
			ssize_t k = readlink(link, cwd, sizeof(cwd) - 1);
			if (k > 0) {
				cwd[k] = '\0';
				int m = snprintf(cand[nc], PATH_MAX, "%s/%s", cwd, val);
				/* Past a socket address's 108 bytes, through the
				 * process's own link to its directory. */
				if (m >= (int)sizeof(((struct sockaddr_un *)0)->sun_path))
					m = snprintf(cand[nc], PATH_MAX, "%s/%s", link, val);
				if (m > 0 && m < PATH_MAX)
					nc++;
			}
		}
	}
	if (environ_of(pid, "XDG_RUNTIME_DIR", val, sizeof(val)) && val[0] == '/')
		candidate(cand, &nc, val, 0, pid);
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && xdg[0] == '/')
		candidate(cand, &nc, xdg, 0, pid);
	char proc[64];
	struct stat st;
	snprintf(proc, sizeof(proc), "/proc/%ld", pid);
	if (stat(proc, &st) == 0)
		candidate(cand, &nc, NULL, (unsigned long)st.st_uid, pid);
	candidate(cand, &nc, NULL, (unsigned long)geteuid(), pid);
	for (int i = 0; i < nc; i++) {
		if (is_socket(cand[i]) && strlen(cand[i]) < n) {
			memcpy(out, cand[i], strlen(cand[i]) + 1);
			return EXIT_OK;
		}
	}
	/* A directory we may not enter hides the socket: say so. */
	for (int i = 0; i < nc; i++) {
		if (access(cand[i], F_OK) != 0 && errno == EACCES) {
			snprintf(err, errlen,
				 "process %ld (%s): permission denied looking for %.300s (another user's "
				 "process?)", pid, comm, cand[i]);
			return EXIT_DENIED;
		}
	}
	snprintf(err, errlen,
		 "process %ld (%s) has no vpmm socket: it is not running under libvpmm.so, has "
		 "VPMM_SOCKET=off or elsewhere (use --socket), or has not allocated GPU memory "
		 "yet (looked for %.300s)", pid, comm, nc ? cand[nc - 1] : "?");
	return EXIT_GONE;
}

/* ---- listing ---------------------------------------------------------------- */

struct found {
	char path[PATH_MAX];
	dev_t dev;
	ino_t ino;
};

static void add_dir(const char *dir, struct found **list, size_t *n, size_t *cap)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 6 || strcmp(e->d_name + len - 5, ".sock") != 0 ||
		    strspn(e->d_name, "0123456789") != len - 5)
			continue;
		char path[PATH_MAX];
		struct stat st;
		if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path) ||
		    lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode))
			continue;
		bool dup = false;
		for (size_t i = 0; i < *n && !dup; i++)
			dup = (*list)[i].dev == st.st_dev && (*list)[i].ino == st.st_ino;
		if (dup)
			continue;
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 16;
			struct found *nl = realloc(*list, nc * sizeof(*nl));
			if (!nl)
				break;
			*list = nl;
			*cap = nc;
		}
		struct found *f = &(*list)[(*n)++];
		snprintf(f->path, sizeof(f->path), "%s", path);
		f->dev = st.st_dev;
		f->ino = st.st_ino;
	}
	closedir(d);
}

static void add_glob(const char *pattern, struct found **list, size_t *n, size_t *cap)
{
	glob_t g;
	if (glob(pattern, GLOB_ONLYDIR | GLOB_NOSORT, NULL, &g) != 0)
		return;
	for (size_t i = 0; i < g.gl_pathc; i++)
		add_dir(g.gl_pathv[i], list, n, cap);
	globfree(&g);
}

static long pid_of_path(const char *path)
{
	const char *b = strrchr(path, '/');
	return strtol(b ? b + 1 : path, NULL, 10);
}

static int sum_pools(const struct json *reply, uint64_t *mapped, uint64_t *live, size_t *npools)
{
	const struct json *pools = json_get(reply, "pools");
	*mapped = *live = 0;
	*npools = 0;
	if (!pools || pools->type != JSON_ARRAY)
		return -1;
	for (size_t i = 0; i < pools->n; i++) {
		const struct json *st = json_get(&pools->items[i], "stats");
		uint64_t m = 0, l = 0;
		json_u64(json_get(st, "mapped"), &m);
		json_u64(json_get(st, "live"), &l);
		*mapped += m;
		*live += l;
	}
	*npools = pools->n;
	return 0;
}

/* One socket's answer while listing. */
struct answer {
	struct conn c;
	int status; /* an exit status once done */
	bool done;
	char *buf;
	size_t len, cap;
	struct json reply; /* when status is EXIT_OK */
	char err[512];
};

static void answer_fail(struct answer *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void answer_fail(struct answer *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->err, sizeof(a->err), fmt, ap);
	va_end(ap);
	a->status = EXIT_FAIL;
	a->done = true;
}

/* Reads what a's socket has; done once its reply line is whole. */
static void answer_read(struct answer *a)
{
	for (;;) {
		if (a->len + 4096 > a->cap) {
			size_t nc = a->cap ? a->cap * 2 : 16384;
			char *nb = nc <= VPMM_REPLY_MAX ? realloc(a->buf, nc) : NULL;
			if (!nb) {
				answer_fail(a, "%s: reply too long", a->c.path);
				return;
			}
			a->buf = nb;
			a->cap = nc;
		}
		ssize_t r = recv(a->c.fd, a->buf + a->len, a->cap - a->len, MSG_DONTWAIT);
		if (r > 0) {
			char *nl = memchr(a->buf + a->len, '\n', (size_t)r);
			a->len += (size_t)r;
			if (nl) {
				a->status = reply_parse(a->c.path, a->buf, (size_t)(nl - a->buf) + 1,
							&a->reply, a->err, sizeof(a->err));
				a->done = true;
				return;
			}
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r == 0 && a->len == 0)
			answer_fail(a, "%s: the process closed the connection without a reply",
				    a->c.path);
		else if (r == 0)
			answer_fail(a, "%s: truncated reply", a->c.path);
		else
			answer_fail(a, "%s: %s", a->c.path, strerror(errno));
		return;
	}
}

/* Sends `request` to every socket at once and gathers the replies within
 * one reply timeout in all: a silent process costs the listing one
 * timeout, not one each. */
static void ask_all(const struct found *list, size_t n, const char *request, struct answer *a)
{
	char line[64];
	int ln = snprintf(line, sizeof(line), "vpmm %d %s\n", VPMM_PROTOCOL, request);
	struct pollfd *p = calloc(n ? n : 1, sizeof(*p));
	size_t *who = calloc(n ? n : 1, sizeof(*who));
	for (size_t i = 0; i < n; i++) {
		memset(&a[i], 0, sizeof(a[i]));
		a[i].status = conn_connect(list[i].path, &a[i].c, true, a[i].err, sizeof(a[i].err));
		a[i].done = a[i].status != EXIT_OK;
		if (!a[i].done) {
			/* a few bytes into an empty socket; if refused, its
			 * reason is read */
			ssize_t w = send(a[i].c.fd, line, (size_t)ln, MSG_NOSIGNAL | MSG_DONTWAIT);
			(void)w;
		}
	}
	uint64_t deadline = now_ms() + (uint64_t)reply_timeout_ms;
	for (;;) {
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (!a[i].done) {
				p[k] = (struct pollfd){ .fd = a[i].c.fd, .events = POLLIN };
				who[k++] = i;
			}
		uint64_t now = now_ms();
		if (!k || !p || !who)
			break;
		if (now >= deadline || interrupted) {
			for (size_t j = 0; j < k; j++)
				answer_fail(&a[who[j]], interrupted ? "interrupted" :
					    "%s: no reply within %d s", a[who[j]].c.path,
					    reply_timeout_ms / 1000);
			break;
		}
		int pr = poll(p, (nfds_t)k, (int)(deadline - now));
		if (pr < 0 && errno != EINTR)
			break;
		for (size_t j = 0; pr > 0 && j < k; j++)
			if (p[j].revents)
				answer_read(&a[who[j]]);
	}
	for (size_t i = 0; i < n; i++) {
		if (!a[i].done)
			answer_fail(&a[i], "%s: no reply", list[i].path);
		conn_close(&a[i].c);
		free(a[i].buf);
		a[i].buf = NULL;
	}
	free(p);
	free(who);
}

static int list_processes(bool json)
{
	reply_timeout_ms = LIST_TIMEOUT_MS;
	struct found *list = NULL;
	size_t n = 0, cap = 0;
	char dir[PATH_MAX], dir2[PATH_MAX] = "";
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && xdg[0] == '/') {
		vpmm_socket_dir(dir2, sizeof(dir2), xdg, 0);
		add_dir(dir2, &list, &n, &cap);
	}
	vpmm_socket_dir(dir, sizeof(dir), NULL, (unsigned long)geteuid());
	add_dir(dir, &list, &n, &cap);
	if (geteuid() == 0) { /* root may look at everyone's */
		add_glob("/tmp/vpmm-*", &list, &n, &cap);
		add_glob("/run/user/*/vpmm", &list, &n, &cap);
	}
	if (json)
		printf("{\"vpmm_dump\":1,\"protocol\":%d,\"processes\":[", VPMM_PROTOCOL);
	else if (n)
		printf("%-8s %-16s %12s %12s %5s  %s\n", "PID", "COMMAND", "MAPPED", "LIVE", "POOLS",
		       "SOCKET / STATUS");
	struct answer *ans = calloc(n ? n : 1, sizeof(*ans));
	if (!ans) {
		errf("out of memory");
		free(list);
		return EXIT_FAIL;
	}
	ask_all(list, n, "stats", ans);
	for (size_t i = 0; i < n; i++) {
		long pid = pid_of_path(list[i].path);
		char comm[64], a[32], b[32];
		const char *err = ans[i].err;
		struct json reply = ans[i].reply;
		command_of(pid, comm, sizeof(comm));
		int st = ans[i].status;
		uint64_t mapped = 0, live = 0;
		size_t npools = 0;
		const char *status = "ok";
		if (st == EXIT_OK) {
			int64_t rpid = pid;
			json_i64(json_get(&reply, "pid"), &rpid);
			pid = (long)rpid;
			command_of(pid, comm, sizeof(comm));
			sum_pools(&reply, &mapped, &live, &npools);
			json_free(&reply);
		} else if (st == EXIT_GONE) {
			status = process_exists(pid) ? "not answering" : "stale (process gone)";
			if (!process_exists(pid))
				snprintf(comm, sizeof(comm), "-");
		} else if (st == EXIT_DENIED) {
			status = "permission denied";
		} else if (st == EXIT_PROTOCOL) {
			status = "other protocol version";
		} else {
			status = "error";
		}
		if (json) {
			printf("%s{\"pid\":%ld,\"command\":", i ? "," : "", pid);
			json_write_string(stdout, comm);
			printf(",\"socket\":");
			json_write_string(stdout, list[i].path);
			printf(",\"status\":");
			json_write_string(stdout, status);
			if (st == EXIT_OK)
				printf(",\"pools\":%zu,\"mapped\":%" PRIu64 ",\"live\":%" PRIu64, npools,
				       mapped, live);
			else {
				printf(",\"error\":");
				json_write_string(stdout, err);
			}
			printf("}");
		} else {
			char shown[PATH_MAX];
			snprintf(shown, sizeof(shown), "%s", list[i].path);
			printable(shown); /* a name another user chose */
			if (st == EXIT_OK)
				printf("%-8ld %-16s %12s %12s %5zu  %s\n", pid, comm,
				       human(a, sizeof(a), mapped), human(b, sizeof(b), live), npools,
				       shown);
			else
				printf("%-8ld %-16s %12s %12s %5s  %s: %s\n", pid, comm, "-", "-", "-",
				       shown, status);
		}
	}
	if (json)
		printf("]}\n");
	else if (!n)
		printf("no process with a vpmm socket (looked in %s%s%s%s)\n", dir2,
		       dir2[0] ? " and " : "", dir, geteuid() == 0 ? ", /tmp/vpmm-*, /run/user/*/vpmm" : "");
	free(ans);
	free(list);
	return output_status();
}

/* ---- one process: fetching ---------------------------------------------------- */

struct target {
	long pid; /* as the process says */
	char comm[64];
	char socket[PATH_MAX];
	struct json map;    /* reply to "map" */
	struct json config; /* reply to "config" */
};

static int fetch(const char *socket, long want_pid, struct target *t, char *err, size_t errlen)
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

static void target_free(struct target *t)
{
	json_free(&t->map);
	json_free(&t->config);
}

struct region {
	uint64_t va, size, stream, chunk;
	const char *kind;
	bool settled, parked, small;
};

static bool region_at(const struct json *r, struct region *out)
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

static uint64_t u64_of(const struct json *obj, const char *key)
{
	uint64_t v = 0;
	json_u64(json_get(obj, key), &v);
	return v;
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
		printf("  %-10s %14s %14s\n", gauges[i], human(a, sizeof(a), u64_of(st, gauges[i])),
		       human(b, sizeof(b), u64_of(st, key)));
	}
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
			printf(" sub-page blocks");
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

static void show_text(const struct target *t)
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

static void show_map(const struct target *t, bool color)
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
			       human(a, sizeof(a), used), exact(b, sizeof(b), csize),
			       human(cs, sizeof(cs), cell));
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
				printf("  + %s of never-used VA\n", human(a, sizeof(a), csize - used));
		}
	}
	if (color)
		printf("\n%s#\033[0m live  %s-\033[0m free  %s.\033[0m hole  %s~\033[0m zombie"
		       "  (a cell shows the kind covering most of it)\n", on[0], on[1], on[2], on[3]);
	else
		printf("\n# live  - free  . hole  ~ zombie  (a cell shows the kind covering most of it)\n");
}

/* ---- one process: JSON --------------------------------------------------------- */

static void show_json(const struct target *t)
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

/* ---- one process: PyTorch snapshot ------------------------------------------- */

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
	unsigned h = 0, m = 0, s = 0, us = 0;
	ev->time_us = 0;
	if (sscanf(f[1], "%u:%u:%u.%u", &h, &m, &s, &us) == 4)
		ev->time_us = (((uint64_t)h * 60 + m) * 60 + s) * 1000000u + us;
	char *end;
	errno = 0;
	ev->size = strtoull(f[4], &end, 10);
	if (errno || end == f[4] || *end)
		return false;
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
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
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
	 * line, and is skipped without being held (a /dev/zero, a 1 GB line). */
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
	pk_kv_uint(pk, "stream", ev->stream);
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

static int torch_snapshot(const struct target *t, const char *file, const char *csv,
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
		json_u64(json_get(&reply, "released"), &released);
		printf("released %" PRIu64 " bytes\n", released);
		json_free(&reply);
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
