/* dump_test.h — what the dump suite's files share (defined in test_dump.c):
 * the host (a pool on the host driver and the socket server, in this
 * process), running programs, the raw protocol, a fake server, trace
 * producers. The suite's tests are in test_*.c, by topic (test_dump.c
 * lists them).
 */
#ifndef DUMP_TEST_H
#define DUMP_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "json.h"
#include "vpmm.h"

#define PAGE ((size_t)64 << 10)

/* A test that may hang ends itself: SIGALRM after `seconds` kills it, and
 * Criterion reports it as crashed, by name. Not Criterion's `.timeout`: its
 * watchdog (2.4.1) loses a request in the runner when two tests with
 * timeouts overlap, and LeakSanitizer fails the whole suite on it. */
#define TEST_DEADLINE(seconds) alarm(seconds)
#define NOBODY 65534

struct host {
	vpmm_driver *drv;
	vpmm_pool *pool;
	char dir[64];   /* a fresh private temporary directory */
	char sock[128]; /* the socket being served */
};

/* The server's list of pools: h's one pool (arg is the struct host). */
size_t one_pool(vpmm_pool **out, size_t cap, void *arg);
/* A pool on the host driver (pages of PAGE), no server. */
void host_pool(struct host *h, size_t va_pages);
/* A pool and its server on `socket` ("" = the default rule, with
 * XDG_RUNTIME_DIR pointing at the temporary directory h->dir). */
void host_open(struct host *h, const char *socket, unsigned timeout_ms, size_t va_pages);
void host_close(struct host *h);
CUdeviceptr alloc(struct host *h, size_t pages, CUstream s);
/* The four kinds at once: [~2][1][3][-2][*...] (the zombie scenario of the
 * pool suite, plus a free on `s`). live_out: the live allocations; returns
 * the freed one. */
CUdeviceptr make_all_kinds(struct host *h, CUstream s, CUdeviceptr live_out[2]);

struct run {
	int status; /* exit status, or 128 + signal */
	char *out, *err;
};

void run_free(struct run *r);
/* Runs argv (NULL-terminated) as uid `as` (-1: ourselves), capturing both
 * outputs; killed after 60 s. */
void run_as(char *const argv[], int as, struct run *r);
void run(char *const argv[], struct run *r);
bool have_file(const char *path);
/* A test's scratch directory (made by mkdtemp) goes, with what is in it. */
void remove_dir(const char *dir);

/* A connection to the socket at path (5 s timeouts), or -errno. */
int dial(const char *path);
bool send_all(int fd, const void *b, size_t n);
/* One reply line (malloc'd, without the newline), or NULL at EOF/timeout. */
char *read_line(int fd);
/* Sends `req` raw and parses the reply; false if none came. */
bool exchange(int fd, const char *req, struct json *reply);
bool reply_ok(const struct json *r);
/* The server closed the connection. */
bool at_eof(int fd);
/* A pid that is not running: a child that has exited and been reaped. */
pid_t dead_pid(void);
/* A socket bound at path and listening. */
int listen_at(const char *path);

/* A server that answers each request of one connection with the next of
 * `replies`, and keeps the requests it got. */
struct fake_seq {
	int fd;
	const char *const *replies;
	char got[4][256];
};
/* Runs argv (as run) against a fake server at path answering `replies`. */
void ask_fake(const char *path, const char *const *replies, char *const argv[], struct run *r,
	      struct fake_seq *f);

/* The next of a fixed sequence of pseudo-random numbers. */
uint32_t rnd(void);

size_t count_lines(const char *path);

/* One record of a VPMM_TRACE file, as shim/trace.c writes it. */
struct trace_rec {
	unsigned tid, hh, mm, ss, us;
	char action[32]; /* "allocate", "free", "allocate failure" */
	unsigned long long ptr, size, stream;
};
/* Whether `line` is a whole record (9 fields); fills r. */
bool trace_rec_parse(const char *line, struct trace_rec *r);

/* Trace events of one thread: allocate and free in turn, stream = id. */
struct producer {
	int id, events;
};
void *produce(void *arg);

#endif
