/* dump-list.c — finding programs running under libvpmm.so: the socket of
 * one process (from its environment, else the directories the socket rule
 * names), and the list of every socket found, each asked for its stats at
 * once. Calls json.h, options.h (sizes as text), protocol.h, dump-common.c
 * and dump-conn.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "dump.h"
#include "json.h"
#include "options.h"
#include "protocol.h"

#define LIST_TIMEOUT_MS 2000 /* while listing, for all processes at once: a
			      * stuck process must not hold up the list */

/* ---- processes -------------------------------------------------------------- */

void command_of(long pid, char *buf, size_t n)
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

bool process_exists(long pid)
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

int find_socket(long pid, char *out, size_t n, char *err, size_t errlen)
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

int list_processes(bool json)
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
				       vpmm_size_human(mapped, a, sizeof(a)), vpmm_size_human(live, b, sizeof(b)), npools,
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

