/* replay_test.h — what the replay suite's files share (defined in
 * test_replay.c): a scratch directory, logs written there, the built
 * vpmm-replay run on them, numbers read from its JSON.
 */
#ifndef REPLAY_TEST_H
#define REPLAY_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define GiB ((uint64_t)1 << 30)
#define MiB ((uint64_t)1 << 20)
#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

/* The test's scratch directory (made by the suite's setup, then removed). */
extern char dir[];

/* Writes `text` to DIR/name; returns the path (static buffer per call slot). */
const char *write_file(const char *name, const char *text);
/* The whole file (malloc'd). */
char *slurp(const char *path);

struct run {
	int status; /* exit status, or -1 if killed */
	char *out, *err;
	uint64_t cpu_ns;  /* user and system time of the run */
	uint64_t rss_kib; /* its peak resident memory */
};

/* CPU seconds a run may take before the kernel stops it (0: no limit). */
extern unsigned run_cpu_limit_s;

void run_free(struct run *r);
/* Runs `prog` with args (NULL-terminated) and only PATH plus `env` (NULL-
 * terminated, may be NULL) in its environment: no VPMM_* of ours leaks in. */
struct run run_prog(const char *prog, const char *const *args, const char *const *env);
/* Runs $VPMM_REPLAY so. */
struct run replay(const char *const *args, const char *const *env);
/* The value of "key": N in a JSON object (fails the test when absent). */
uint64_t json_u64(const char *json, const char *key);

/* A log of lines built with printf formats. */
struct logbuf {
	char *buf;
	size_t len;
	FILE *f;
};

void log_open(struct logbuf *l);
void log_add(struct logbuf *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes the log to DIR/name; returns the path. */
const char *log_write(struct logbuf *l, const char *name);
/* The design's scenario in GiB on one stream: +10 +1 -10 +4 +11, as RMM's
 * adaptor writes it (thread, time, action, pointer, size, stream). */
const char *spec_log(void);

#endif
