/* dump_test.h — what the dump suite's files share (defined in test_dump.c):
 * the host (a pool on the host driver and the socket server, in this
 * process), running programs, the raw protocol, trace producers.
 */
#ifndef DUMP_TEST_H
#define DUMP_TEST_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"
#include "vpmm.h"

#define PAGE ((size_t)64 << 10)
#define NOBODY 65534

struct host {
	vpmm_driver *drv;
	vpmm_pool *pool;
	char dir[64];   /* a fresh private temporary directory */
	char sock[128]; /* the socket being served */
};

/* A pool on the host driver (pages of PAGE), no server. */
void host_pool(struct host *h, size_t va_pages);
/* A pool and its server on `socket` ("" = the default rule, with
 * XDG_RUNTIME_DIR pointing at the temporary directory h->dir). */
void host_open(struct host *h, const char *socket, unsigned timeout_ms, size_t va_pages);
void host_close(struct host *h);
CUdeviceptr alloc(struct host *h, size_t pages, CUstream s);

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

size_t count_lines(const char *path);

/* Trace events of one thread: allocate and free in turn, stream = id. */
struct producer {
	int id, events;
};
void *produce(void *arg);

#endif
