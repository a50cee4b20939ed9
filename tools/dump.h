/* dump.h — what the parts of vpmm-dump share: its exit statuses, the state
 * every part reads (the interrupt flag, text or exact output), and each
 * part's entry points. The parts:
 *
 *   dump-common.c  messages, printable text, sizes
 *   dump-conn.c    one connection to a process's socket: a request, its reply
 *   dump-list.c    finding a process's socket, and listing every one found
 *   dump-show.c    one process's map: fetched, then as text, --map or --json
 *   dump-torch.c   one process's map as a PyTorch memory snapshot
 *   vpmm-dump.c    the options and main
 *
 * Each may call json.h, protocol.h and the parts listed above it here;
 * vpmm-dump.c calls them all.
 */
#ifndef VPMM_DUMP_H
#define VPMM_DUMP_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "json.h"

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

/* ---- dump-common.c ---------------------------------------------------------- */

extern const char *prog; /* "vpmm-dump", the messages' prefix */
/* Set by SIGINT and SIGTERM: every wait gives up. */
extern volatile sig_atomic_t interrupted;
/* Text output: replies are made printable as they arrive (--json and the
 * snapshot keep them exact; their writers escape). */
extern bool text_output;

/* Control characters become '?': names and strings come from other
 * processes (as root, any user's), and must not drive the terminal. */
void printable(char *s);
/* Every string and key of a reply made printable, for text output. */
void printable_json(struct json *v);
/* "vpmm-dump: MESSAGE" on stderr, made printable. */
void errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether everything written to stdout got there (/dev/full, a closed
 * descriptor): EXIT_OK, or EXIT_FAIL saying why. */
int output_status(void);
/* The region map's size notation: the largest K/M/G/T... unit that divides it. */
const char *exact(char *buf, size_t n, uint64_t v);
/* obj's unsigned number `key`, 0 if it has none. */
uint64_t u64_of(const struct json *obj, const char *key);

/* ---- dump-conn.c ------------------------------------------------------------ */

/* How long a reply may take; listing shortens it. */
extern int reply_timeout_ms;

struct conn {
	int fd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	long peer_pid;
	long peer_uid;
};

uint64_t now_ms(void);
/* Connects (without waiting, when `nowait`: a socket whose backlog is full
 * is then "not answering" at once); returns an exit status with the reason
 * in err. */
int conn_connect(const char *path, struct conn *c, bool nowait, char *err, size_t errlen);
int conn_open(const char *path, struct conn *c, char *err, size_t errlen);
void conn_close(struct conn *c);
/* Sends one request and parses its reply into *reply (freed by the caller
 * with json_free). Returns an exit status with the reason in err. */
int conn_request(struct conn *c, const char *request, struct json *reply, char *err,
		 size_t errlen);
/* A reply line (len bytes, the newline last) into *reply: an exit status,
 * with the reason in err (reply then freed). */
int reply_parse(const char *path, const char *buf, size_t len, struct json *reply, char *err,
		size_t errlen);
/* One request on a fresh connection. */
int ask(const char *path, const char *request, struct json *reply, char *err, size_t errlen);

/* ---- dump-list.c ------------------------------------------------------------ */

/* /proc/PID/comm, or "?" (made printable for text output). */
void command_of(long pid, char *buf, size_t n);
bool process_exists(long pid);
/* Finds the socket of PID: its VPMM_SOCKET, its XDG_RUNTIME_DIR, ours, and
 * the /tmp directories of its uid and ours. Returns an exit status. */
int find_socket(long pid, char *out, size_t n, char *err, size_t errlen);
/* One line (or one JSON entry) per socket found; returns an exit status. */
int list_processes(bool json);

/* ---- dump-show.c ------------------------------------------------------------ */

struct target {
	long pid; /* as the process says */
	char comm[64];
	char socket[PATH_MAX];
	struct json map;    /* reply to "map" */
	struct json config; /* reply to "config" */
};

/* The map and config of the process serving `socket` (want_pid 0: any
 * process); an exit status with the reason in err. */
int fetch(const char *socket, long want_pid, struct target *t, char *err, size_t errlen);
void target_free(struct target *t);

struct region {
	uint64_t va, size, stream, chunk;
	const char *kind;
	bool settled, parked, small;
};

/* A region of a map reply; false if a field it must have is missing. */
bool region_at(const struct json *r, struct region *out);

void show_text(const struct target *t);
void show_map(const struct target *t, bool color);
void show_json(const struct target *t);

/* ---- dump-torch.c ----------------------------------------------------------- */

/* Writes t's map as a PyTorch memory snapshot to `file`, with the trace of
 * `csv` or else the process's own (the last trace_max events); an exit
 * status with the reason in err. */
int torch_snapshot(const struct target *t, const char *file, const char *csv,
		   size_t trace_max, char *err, size_t errlen);

#endif
