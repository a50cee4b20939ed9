/* server.h — the per-process Unix-socket server that vpmm-dump talks to.
 *
 * One thread, started by vpmm_server_start() (the shim calls it from its lazy
 * initialisation, never from a constructor), serves the requests of
 * shim/protocol.h on $VPMM_SOCKET, else $XDG_RUNTIME_DIR/vpmm/<pid>.sock,
 * else /tmp/vpmm-<uid>/<pid>.sock:
 *
 *   ping, version, help   liveness, protocol and library version, requests
 *   stats                 struct vpmm_stats of every pool
 *   map                   config + stats + VA chunks + every region, per pool
 *   config                the effective configuration
 *   trim [KEEP]           hook: release free memory beyond KEEP bytes
 *   trace start PATH | stop | status | flush    hooks: trace recording
 *   ipc-open, ipc-pieces, ipc-close    hook: cudaIpc* between processes
 *                         (shim/ipc_export.c); replies carry descriptors
 *
 * Safety: a default directory is created 0700 and refused if it is not ours
 * or is open to group/others; the socket is 0600; a peer whose uid is neither
 * ours nor root's gets an error reply and is closed. Each pool is copied
 * under its lock (vpmm_pool_snapshot) and formatted and written outside it.
 * Clients are served by one poll() loop with non-blocking sockets, at most
 * max_clients at a time, each phase bounded by client_timeout_ms: a slow or
 * hostile client delays neither allocations nor other clients for long.
 * The thread blocks every signal, writes with MSG_NOSIGNAL and never exits
 * the process. The socket is unlinked at exit (a destructor that only
 * unlinks); a process that dies without it leaves a stale socket, which the
 * next server starting in the same default directory removes (a socket of
 * ours whose pid is gone and that nobody answers). A forked child closes the
 * inherited descriptors, leaves the parent's socket alone and may start its
 * own server.
 *
 * Includes allocator/'s options.h and vpmm.h (the pools it reports), no
 * header of the shim.
 */
#ifndef VPMM_SERVER_H
#define VPMM_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "vpmm.h"

struct vpmm_server_config {
	/* VPMM_SOCKET's value: NULL or "" for the default path, "off" for no
	 * server. An explicit path's directory is used as it is. */
	const char *socket;

	/* The process's pools: fills out[0..cap) and returns how many there
	 * are. Called on the server thread; the pools must stay alive until
	 * vpmm_server_stop() (the shim never destroys a pool while serving). */
	size_t (*pools)(vpmm_pool **out, size_t cap, void *arg);
	void *arg;

	/* Shown by the `config` request; copied by vpmm_server_start. May be
	 * NULL. Its log_level also filters the server's own messages. */
	const struct vpmm_env_options *env;

	/* Optional hooks; a request whose hook is NULL answers "unsupported". */
	/* `trim [KEEP]`: release free memory until at most `keep` bytes stay
	 * reusable in each pool (vpmm_pool_trim); `keep` is 0 when the request
	 * names none. */
	int (*trim)(uint64_t keep, uint64_t *released, void *arg);
	int (*trace_start)(const char *path);
	/* trace_start's error in words (NULL: strerror) */
	const char *(*trace_strerror)(int rc);
	int (*trace_stop)(void);
	int (*trace_flush)(void);
	/* true if a trace is being written; its absolute path and event count */
	bool (*trace_status)(char *path, size_t n, uint64_t *events);

	/* `ipc-open`, `ipc-pieces`, `ipc-close` (shim/ipc_export.c): `request` is the
	 * name, `arg` the rest of the line, `peer` the client's pid. Writes the
	 * reply's fields (",\"key\":value...") into `fields` and up to
	 * VPMM_IPC_MAX_FDS descriptors to pass with the reply into fds (the
	 * server closes them once sent, or on failure). Returns NULL, or the
	 * error sentence (then no fds). */
	const char *(*ipc)(const char *request, const char *arg, long peer, char *fields,
			   size_t fields_len, int *fds, unsigned *nfds);
	/* Called on the server thread about once a second. */
	void (*tick)(void);

	unsigned max_clients;       /* 0: 16 */
	unsigned client_timeout_ms; /* 0: 2000; bounds each read and write phase */
};

/* Starts the server thread. 0: serving (or already serving in this process);
 * 1: disabled by socket = "off"; a negative errno if it cannot serve (one
 * line on stderr says why; the program is not otherwise affected). */
int vpmm_server_start(const struct vpmm_server_config *cfg);

/* Stops the thread, closes every descriptor and unlinks the socket. For tests
 * and orderly shutdown; safe when not running. */
void vpmm_server_stop(void);

/* The socket path being served, or "" when none. */
const char *vpmm_server_socket(void);

#endif
