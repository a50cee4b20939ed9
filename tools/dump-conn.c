/* dump-conn.c — one connection to the socket of a program running under
 * libvpmm.so (shim/server.c; the protocol is shim/protocol.h): connecting,
 * saying why one fails (gone, stale, another user's, another protocol), a
 * request and its reply, read within the reply timeout. Calls json.h,
 * protocol.h and dump-common.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dump.h"
#include "json.h"
#include "protocol.h"

int reply_timeout_ms = REPLY_TIMEOUT_MS;

uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Connects (without waiting, when `nowait`: a socket whose backlog is full
 * is then "not answering" at once); returns an exit status with the reason
 * in err. */
int conn_connect(const char *path, struct conn *c, bool nowait, char *err, size_t errlen)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	c->fd = -1;
	size_t plen = strlen(path);
	if (plen >= sizeof(addr.sun_path)) {
		snprintf(err, errlen, "%s: path too long for a Unix socket", path);
		return EXIT_USAGE;
	}
	/* c->path is as long as sun_path (dump.h) */
	memcpy(addr.sun_path, path, plen + 1);
	memcpy(c->path, path, plen + 1);
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

int conn_open(const char *path, struct conn *c, char *err, size_t errlen)
{
	return conn_connect(path, c, false, err, errlen);
}

void conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

/* Sends one request and parses its reply into *reply (freed by the caller
 * with json_free). Returns an exit status with the reason in err. */
int conn_request(struct conn *c, const char *request, struct json *reply, char *err,
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
int reply_parse(const char *path, const char *buf, size_t len, struct json *reply,
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
int ask(const char *path, const char *request, struct json *reply, char *err, size_t errlen)
{
	struct conn c;
	int st = conn_open(path, &c, err, errlen);
	if (st == EXIT_OK)
		st = conn_request(&c, request, reply, err, errlen);
	conn_close(&c);
	return st;
}
