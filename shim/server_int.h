/* server_int.h — what the two halves of the socket server share: the
 * server's and a client's state, and the request side's entry points
 * (server_requests.c) that the connection side (server.c) calls. Not
 * installed, not for the shim's other rooms: they see server.h only.
 * Includes server.h and protocol.h.
 */
#ifndef VPMM_SERVER_INT_H
#define VPMM_SERVER_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "protocol.h"
#include "server.h"

#define MAX_POOLS 64

/* A growable reply buffer. */
struct sbuf {
	char *p;
	size_t len, cap;
	bool failed; /* out of memory or over VPMM_REPLY_MAX: the reply is lost */
};

struct client {
	int fd; /* -1: free slot */
	char in[VPMM_REQUEST_MAX];
	size_t inlen;
	struct sbuf out;
	size_t outoff;
	bool closing;         /* close once `out` is written */
	bool eof;             /* the client sent all it will (it may have shut
			       * down its writing side only): close once every
			       * complete line is answered */
	long pid;             /* the peer's, from SO_PEERCRED */
	int fds[VPMM_IPC_MAX_FDS]; /* go with the reply's first byte */
	unsigned nfds;
	uint64_t deadline_ms; /* of the current phase (reading or writing) */
};

struct server {
	struct vpmm_server_config cfg;
	struct vpmm_env_options env;
	bool has_env;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd;
	int wake[2]; /* pipe: stop request */
	pid_t owner; /* the process that bound `path` */
	pthread_t thread;
	struct client *clients;
	unsigned nclients;
	uint64_t accept_pause_until; /* out of descriptors: stop accepting a while */
	bool said; /* set-up failed and said why */
	uint64_t next_tick_ms;
	/* The poll set, owned by the thread; held here so that it stays
	 * reachable while the thread runs to the process's exit. */
	struct pollfd *pfd;
	unsigned *who;
};

static inline enum vpmm_log_level vpmm_server_log_level(const struct server *s)
{
	return s && s->has_env ? s->env.log_level : VPMM_LOG_WARN;
}

/* Parses and answers one request line (without its newline) into c->out.
 * Sets c->closing when the connection cannot go on. */
void vpmm_server_serve_line(struct server *s, struct client *c, char *line, size_t len);
/* An error reply (request may be NULL) in place of what b held. */
void vpmm_server_reply_error(struct sbuf *b, const char *request, const char *msg);
/* Closes the descriptors a reply was to carry. */
void vpmm_server_drop_fds(struct client *c);
/* Sets *fd to -1, then closes what it held (if anything): the table never
 * names a closed descriptor, which a fork could meet (server.c). */
void vpmm_server_close_named(int *fd);

#endif
