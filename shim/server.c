/* server.c — the per-process Unix-socket server of server.h: socket setup
 * (path rule, directory and peer checks), the poll() loop that serves clients
 * with bounded buffers and deadlines, start, stop and fork. The requests
 * and their replies are server_requests.c's; the wire format is in
 * protocol.h.
 *
 * Owns: the server thread, the listening socket and every client's
 * connection. May call: server_requests.c (through server_int.h) and the
 * hooks of struct vpmm_server_config; nothing else of the shim.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "protocol.h"
#include "server.h"
#include "server_int.h"

#define DEFAULT_CLIENTS 16
#define DEFAULT_TIMEOUT_MS 2000

/* ---- state ---------------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct server *g_server; /* under g_lock */
static _Atomic(struct server *) g_exiting_view; /* for the destructor */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void slog(const struct server *s, enum vpmm_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void slog(const struct server *s, enum vpmm_log_level lvl, const char *fmt, ...)
{
	if (lvl > vpmm_server_log_level(s))
		return;
	char line[512];
	int n = snprintf(line, sizeof(line), "vpmm: server: ");
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, len); /* one write: lines don't interleave */
	(void)w;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- connections ---------------------------------------------------------- */

/* Closes a descriptor the server's table names, out of the table first. A
 * fork meanwhile closes in the child whatever the table names
 * (atfork_child): a number this thread had closed already may name the
 * program's next descriptor there (a fork's pipe, lost in the child). */
void vpmm_server_close_named(int *fd)
{
	int v = *fd;
	__atomic_store_n(fd, -1, __ATOMIC_SEQ_CST);
	if (v >= 0)
		close(v);
}

static void client_close(struct client *c)
{
	vpmm_server_drop_fds(c);
	vpmm_server_close_named(&c->fd);
	c->inlen = 0;
	c->outoff = 0;
	c->closing = false;
	c->eof = false;
	free(c->out.p);
	memset(&c->out, 0, sizeof(c->out));
}

/* A one-shot error to a connection we will not serve; best effort. */
static void refuse(int fd, const char *msg)
{
	struct sbuf b = { 0 };
	vpmm_server_reply_error(&b, NULL, msg);
	if (!b.failed) {
		ssize_t w = send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
		(void)w;
	}
	free(b.p);
	close(fd);
}

static bool peer_allowed(int fd, uid_t *peer_uid, long *peer_pid)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
		return false;
	*peer_uid = cred.uid;
	*peer_pid = (long)cred.pid;
	return cred.uid == geteuid() || cred.uid == 0;
}

static void accept_clients(struct server *s)
{
	for (;;) {
		int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM)
				s->accept_pause_until = now_ms() + 100;
			return; /* EAGAIN or a transient error */
		}
		uid_t uid = (uid_t)-1;
		long pid = 0;
		if (!peer_allowed(fd, &uid, &pid)) {
			char msg[128];
			snprintf(msg, sizeof(msg),
				 "permission denied: uid %ld may not read this process's pool",
				 (long)(int)uid);
			slog(s, VPMM_LOG_INFO, "refused a client of uid %ld", (long)(int)uid);
			refuse(fd, msg);
			continue;
		}
		struct client *slot = NULL;
		for (unsigned i = 0; i < s->nclients && !slot; i++)
			if (s->clients[i].fd < 0)
				slot = &s->clients[i];
		if (!slot) {
			refuse(fd, "busy: too many clients, try again");
			continue;
		}
		slot->fd = fd;
		slot->pid = pid;
		slot->nfds = 0;
		slot->inlen = 0;
		slot->outoff = 0;
		slot->closing = false;
		slot->eof = false;
		slot->out.len = 0;
		slot->deadline_ms = now_ms() + s->cfg.client_timeout_ms;
	}
}

/* Answers every complete line buffered in c->in, one at a time: stops as
 * soon as a reply is pending. */
static void process_input(struct server *s, struct client *c)
{
	if (c->out.len > c->outoff || c->closing)
		return;
	char *nl = memchr(c->in, '\n', c->inlen);
	if (!nl) {
		if (c->inlen >= sizeof(c->in)) {
			char msg[96];
			snprintf(msg, sizeof(msg), "request too long: at most %d bytes with the newline",
				 VPMM_REQUEST_MAX);
			vpmm_server_reply_error(&c->out, NULL, msg);
			c->outoff = 0;
			c->closing = true;
			c->deadline_ms = now_ms() + s->cfg.client_timeout_ms;
		}
		return;
	}
	size_t len = (size_t)(nl - c->in);
	*nl = '\0';
	c->outoff = 0;
	vpmm_server_serve_line(s, c, c->in, len);
	memmove(c->in, nl + 1, c->inlen - len - 1);
	c->inlen -= len + 1;
	c->deadline_ms = now_ms() + s->cfg.client_timeout_ms;
}

/* Whether fd has input waiting now (or is at its end). */
static bool input_waiting(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP));
}

/* A client that has sent everything goes once nothing is left to answer;
 * a request without its newline is dropped. */
static void close_if_done(struct client *c)
{
	if (c->fd >= 0 && c->eof && c->out.len <= c->outoff)
		client_close(c);
}

static void client_read(struct server *s, struct client *c)
{
	while (!c->eof && c->inlen < sizeof(c->in)) {
		ssize_t n = recv(c->fd, c->in + c->inlen, sizeof(c->in) - c->inlen, 0);
		if (n > 0) {
			c->inlen += (size_t)n;
			continue;
		}
		if (n == 0) {
			c->eof = true; /* `echo req | socat`: answer, then close */
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			break;
		client_close(c); /* ECONNRESET and the like: nobody to answer */
		return;
	}
	process_input(s, c);
	close_if_done(c);
}

/* The reply's first bytes and the descriptors, in one message. */
static ssize_t send_with_fds(struct client *c)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * VPMM_IPC_MAX_FDS)];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = {c->out.p + c->outoff, c->out.len - c->outoff};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = CMSG_SPACE(sizeof(int) * c->nfds)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * c->nfds);
	memcpy(CMSG_DATA(cm), c->fds, sizeof(int) * c->nfds);
	return sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void client_write(struct server *s, struct client *c)
{
	while (c->outoff < c->out.len) {
		ssize_t n = c->nfds ? send_with_fds(c)
				    : send(c->fd, c->out.p + c->outoff, c->out.len - c->outoff,
					   MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->outoff += (size_t)n;
			vpmm_server_drop_fds(c); /* the peer has its own copies now */
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		client_close(c); /* EPIPE, ECONNRESET: the client left */
		return;
	}
	if (c->closing) {
		client_close(c);
		return;
	}
	c->out.len = c->outoff = 0;
	/* a big reply's buffer is not kept for an idle connection */
	if (c->out.cap > 65536) {
		free(c->out.p);
		memset(&c->out, 0, sizeof(c->out));
	}
	process_input(s, c); /* pipelined requests */
	close_if_done(c);
}

static void *server_main(void *arg)
{
	struct server *s = arg;
	struct pollfd *pfd = s->pfd = calloc(s->nclients + 2, sizeof(*pfd));
	unsigned *who = s->who = calloc(s->nclients + 2, sizeof(*who));
	if (!pfd || !who) {
		slog(s, VPMM_LOG_ERROR, "out of memory: not serving");
		free(pfd);
		free(who);
		s->pfd = NULL;
		s->who = NULL;
		return NULL;
	}
	for (;;) {
		uint64_t now = now_ms();
		uint64_t next = now + 1000;
		nfds_t n = 0;
		pfd[n++] = (struct pollfd){ .fd = s->wake[0], .events = POLLIN };
		bool accepting = now >= s->accept_pause_until;
		if (accepting)
			pfd[n++] = (struct pollfd){ .fd = s->listen_fd, .events = POLLIN };
		else if (s->accept_pause_until < next)
			next = s->accept_pause_until;
		for (unsigned i = 0; i < s->nclients; i++) {
			struct client *c = &s->clients[i];
			if (c->fd < 0)
				continue;
			if (now >= c->deadline_ms) {
				/* Stuck, slow or silent: closed, unless a request
				 * waits unread while it reads: then the server
				 * was late (a long flush under load), not the
				 * client, and it is read now. */
				if (c->out.len > c->outoff || !input_waiting(c->fd)) {
					client_close(c);
					continue;
				}
				next = now;
			} else if (c->deadline_ms < next) {
				next = c->deadline_ms;
			}
			bool writing = c->out.len > c->outoff;
			pfd[n] = (struct pollfd){ .fd = c->fd,
						  .events = writing ? POLLOUT : POLLIN };
			who[n++] = i;
		}
		if (s->cfg.tick && now >= s->next_tick_ms) {
			s->cfg.tick();
			s->next_tick_ms = now + 1000;
		}
		int rc = poll(pfd, n, (int)(next - now) + 1);
		if (rc < 0) {
			if (errno == EINTR)
				continue;
			slog(s, VPMM_LOG_ERROR, "poll: %s: not serving any more", strerror(errno));
			break;
		}
		if (pfd[0].revents)
			break; /* vpmm_server_stop */
		nfds_t first = 1;
		if (accepting) {
			if (pfd[1].revents & POLLIN)
				accept_clients(s);
			first = 2;
		}
		for (nfds_t k = first; k < n; k++) {
			struct client *c = &s->clients[who[k]];
			if (c->fd != pfd[k].fd || !pfd[k].revents)
				continue;
			if (pfd[k].revents & POLLOUT)
				client_write(s, c);
			else if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR))
				client_read(s, c);
			if (c->fd >= 0 && c->out.len > c->outoff)
				client_write(s, c); /* the reply is often written at once */
		}
	}
	free(pfd);
	free(who);
	return NULL;
}

/* ---- setup ---------------------------------------------------------------- */

/* A set-up failure's one line (the reason and "not serving"); the caller
 * then says nothing more. */
static void setup_err(struct server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void setup_err(struct server *s, const char *fmt, ...)
{
	char msg[480];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	slog(s, VPMM_LOG_ERROR, "%s", msg);
	s->said = true;
}

/* The default directory: created 0700, and it must be ours and private. */
static int private_dir(struct server *s, const char *dir)
{
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		int e = errno;
		setup_err(s, "cannot create %s: %s: not serving", dir, strerror(e));
		return -e;
	}
	struct stat st;
	if (lstat(dir, &st) != 0) {
		int e = errno;
		setup_err(s, "%s: %s: not serving", dir, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
		setup_err(s,
		     "%s is not a private directory (%s, owner uid %ld, mode %03o): not serving",
		     dir, S_ISDIR(st.st_mode) ? "directory" : "not a directory", (long)st.st_uid,
		     (unsigned)(st.st_mode & 0777));
		return -EPERM;
	}
	return 0;
}

/* Removes, in our private default directory, the sockets of processes that
 * are gone (killed, or left through _exit, before their destructor could):
 * "<pid>.sock", a socket of ours, no such pid, nobody listening. */
static void sweep_stale(struct server *s, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	for (int seen = 0; (e = readdir(d)) && seen < 1024; seen++) {
		size_t len = strlen(e->d_name);
		if (len < 6 || len > 30 || strcmp(e->d_name + len - 5, ".sock") != 0 ||
		    strspn(e->d_name, "0123456789") != len - 5)
			continue;
		long pid = strtol(e->d_name, NULL, 10);
		if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		struct stat st;
		int n = snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, e->d_name);
		if (n < 0 || (size_t)n >= sizeof(a.sun_path) || lstat(a.sun_path, &st) != 0 ||
		    !S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
			continue;
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			break;
		int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
		int err = errno;
		close(fd);
		if (rc != 0 && err == ECONNREFUSED && unlink(a.sun_path) == 0)
			slog(s, VPMM_LOG_DEBUG, "removed the stale socket %s", a.sun_path);
	}
	closedir(d);
}

static int choose_path(struct server *s, const char *explicit_path)
{
	char buf[4096];
	int n;
	if (explicit_path && *explicit_path) {
		if (explicit_path[0] == '/') {
			n = snprintf(buf, sizeof(buf), "%s", explicit_path);
		} else {
			char cwd[2048];
			if (!getcwd(cwd, sizeof(cwd)))
				return -errno;
			n = snprintf(buf, sizeof(buf), "%s/%s", cwd, explicit_path);
		}
	} else {
		char dir[2048];
		n = vpmm_socket_dir(dir, sizeof(dir), getenv("XDG_RUNTIME_DIR"),
				    (unsigned long)geteuid());
		if (n < 0 || (size_t)n >= sizeof(dir))
			return -ENAMETOOLONG;
		int rc = private_dir(s, dir);
		if (rc)
			return rc;
		sweep_stale(s, dir);
		n = vpmm_socket_path(buf, sizeof(buf), dir, (long)getpid());
	}
	if (n < 0 || (size_t)n >= sizeof(s->path)) {
		setup_err(s, "socket path too long for a Unix socket (at most %zu bytes): not serving: %s",
		     sizeof(s->path) - 1, buf);
		return -ENAMETOOLONG;
	}
	memcpy(s->path, buf, (size_t)n + 1);
	return 0;
}

/* A file already at the path: a live server's socket is left alone (error),
 * a stale socket is replaced, anything else is not ours to remove. */
static int clear_path(struct server *s, const struct sockaddr_un *addr)
{
	struct stat st;
	if (lstat(s->path, &st) != 0) {
		int e = errno;
		if (e == ENOENT)
			return 0;
		setup_err(s, "%s: %s: not serving", s->path, strerror(e));
		return -e;
	}
	if (!S_ISSOCK(st.st_mode)) {
		setup_err(s, "%s exists and is not a socket: not serving", s->path);
		return -EEXIST;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = connect(fd, (const struct sockaddr *)addr, sizeof(*addr));
	int e = errno;
	close(fd);
	if (rc == 0) {
		setup_err(s, "%s is served by another process: not serving", s->path);
		return -EADDRINUSE;
	}
	if (e != ECONNREFUSED) {
		setup_err(s, "%s: %s: not serving", s->path, strerror(e));
		return -e;
	}
	if (unlink(s->path) != 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int open_socket(struct server *s)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	memcpy(addr.sun_path, s->path, strlen(s->path) + 1);
	int rc = clear_path(s, &addr);
	if (rc)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (const struct sockaddr *)&addr, sizeof(addr)) != 0) {
		int e = errno;
		setup_err(s, "bind %s: %s: not serving", s->path, strerror(e));
		close(fd);
		return -e;
	}
	/* In a default directory nobody else can reach the socket before this
	 * chmod (the directory is 0700); the peer check covers explicit paths. */
	if (chmod(s->path, 0600) != 0 || listen(fd, 16) != 0) {
		int e = errno;
		unlink(s->path);
		close(fd);
		return -e;
	}
	s->listen_fd = fd;
	return 0;
}

static void server_free(struct server *s)
{
	if (!s)
		return;
	for (unsigned i = 0; i < s->nclients; i++)
		client_close(&s->clients[i]);
	free(s->clients);
	vpmm_server_close_named(&s->listen_fd);
	vpmm_server_close_named(&s->wake[0]);
	vpmm_server_close_named(&s->wake[1]);
	free(s);
}

/* The child of a fork has no server thread: it closes what it inherited and
 * forgets the parent's socket (which stays the parent's: not unlinked). The
 * state may have been mid-change in the parent, so nothing is freed. */
static void atfork_child(void)
{
	struct server *s = g_server;
	pthread_mutex_init(&g_lock, NULL);
	g_server = NULL;
	atomic_store(&g_exiting_view, NULL);
	if (!s)
		return;
	for (unsigned i = 0; i < s->nclients; i++) {
		if (s->clients[i].fd >= 0)
			close(s->clients[i].fd);
		for (unsigned k = 0; k < s->clients[i].nfds; k++)
			close(s->clients[i].fds[k]);
	}
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	close(s->wake[0]);
	close(s->wake[1]);
}

static void install_atfork(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

int vpmm_server_start(const struct vpmm_server_config *cfg)
{
	if (cfg->socket && strcmp(cfg->socket, "off") == 0)
		return 1;
	pthread_once(&g_atfork_once, install_atfork);
	pthread_mutex_lock(&g_lock);
	if (g_server) {
		pthread_mutex_unlock(&g_lock);
		return 0;
	}
	int rc = -ENOMEM;
	struct server *s = calloc(1, sizeof(*s));
	if (!s)
		goto out;
	s->cfg = *cfg;
	s->cfg.socket = NULL; /* not kept: the caller's string */
	s->cfg.env = NULL;
	if (cfg->env) {
		s->env = *cfg->env;
		s->has_env = true;
	}
	if (!s->cfg.max_clients)
		s->cfg.max_clients = DEFAULT_CLIENTS;
	if (!s->cfg.client_timeout_ms)
		s->cfg.client_timeout_ms = DEFAULT_TIMEOUT_MS;
	s->listen_fd = s->wake[0] = s->wake[1] = -1;
	s->nclients = s->cfg.max_clients;
	s->clients = calloc(s->nclients, sizeof(*s->clients));
	if (!s->clients)
		goto fail;
	for (unsigned i = 0; i < s->nclients; i++)
		s->clients[i].fd = -1;
	if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
		rc = -errno;
		goto fail;
	}
	rc = choose_path(s, cfg->socket);
	if (rc)
		goto fail;
	rc = open_socket(s);
	if (rc)
		goto fail;
	s->owner = getpid();

	/* Signals go to the program's threads, never to ours. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&s->thread, NULL, server_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e) {
		rc = -e;
		unlink(s->path);
		goto fail;
	}
	g_server = s;
	atomic_store(&g_exiting_view, s);
	slog(s, VPMM_LOG_INFO, "serving %s", s->path);
	pthread_mutex_unlock(&g_lock);
	return 0;
fail:
	if (rc != -ENOMEM && s && !s->said)
		slog(s, VPMM_LOG_WARN, "%s%sno vpmm-dump socket for this process (%s)", s->path,
		     s->path[0] ? ": " : "", strerror(-rc));
	server_free(s);
out:
	pthread_mutex_unlock(&g_lock);
	return rc;
}

void vpmm_server_stop(void)
{
	pthread_mutex_lock(&g_lock);
	struct server *s = g_server;
	g_server = NULL;
	atomic_store(&g_exiting_view, NULL);
	pthread_mutex_unlock(&g_lock);
	if (!s)
		return;
	char one = 1;
	ssize_t w;
	do
		w = write(s->wake[1], &one, 1);
	while (w < 0 && errno == EINTR);
	pthread_join(s->thread, NULL);
	if (s->owner == getpid())
		unlink(s->path);
	server_free(s);
}

const char *vpmm_server_socket(void)
{
	struct server *s = atomic_load(&g_exiting_view);
	return s ? s->path : "";
}

/* At exit only the socket file goes: the thread may be mid-request and the
 * pools are the shim's; the kernel closes descriptors. */
__attribute__((destructor)) static void server_at_exit(void)
{
	struct server *s = atomic_load(&g_exiting_view);
	if (s && s->owner == getpid())
		unlink(s->path);
}
