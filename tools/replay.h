/* replay.h — what the parts of vpmm-replay share: the parsed log, the
 * replay's result, and each part's entry points. The parts:
 *
 *   replay-progress.c  the progress line on a terminal (stderr)
 *   replay-log.c     an RMM CSV allocation log parsed into operations
 *   replay-plot.c    live and mapped bytes sampled over the replay, as SVG
 *   replay-run.c     the operations through a pool on the simulated device
 *   replay-report.c  the result as text or JSON
 *   vpmm-replay.c    the options, the pool and the device they make, main
 *
 * Each may call vpmm.h and the parts listed above it here; replay-run.c
 * calls driver_host.h (the simulated device), replay-report.c json.h.
 */
#ifndef VPMM_REPLAY_H
#define VPMM_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "snapshot.h"
#include "vpmm.h"

#define EXIT_INPUT 2 /* usage, unreadable or malformed log, bad option */
#define HEADER "Thread,Time,Action,Pointer,Size,Stream"

/* ---- replay-progress.c ------------------------------------------------------ */

/* A phase ("reading", "replaying") of `total` steps (bytes, operations):
 * shown only if is_long and stderr is a terminal. progress_at() is cheap
 * enough to call every few thousand steps; progress_clear() erases the line
 * before another message (the next update draws it again); progress_end()
 * erases it for good. */
void progress_begin(const char *what, const char *name, uint64_t total, bool is_long);
void progress_at(uint64_t done);
void progress_clear(void);
void progress_end(void);

/* A log is long, and shows progress on a terminal, from this many bytes
 * (while reading) or operations (while replaying). */
#define PROGRESS_MIN_BYTES (4u << 20)
#define PROGRESS_MIN_OPS 100000u

/* ---- replay-log.c ----------------------------------------------------------- */

enum op_kind { OP_ALLOC, OP_FREE };

struct op {
	enum op_kind kind;
	uint32_t stream; /* index into the stream table; 0 = stream 0 */
	size_t id;       /* the allocation it makes or frees */
	uint64_t t_us;   /* the log's Time, in microseconds since its first
			  * line; never less than the operation before's */
};

struct alloc {
	size_t size;     /* requested */
	CUdeviceptr ptr; /* the pool's answer during the replay */
	bool live;       /* allocated by the pool and not yet freed */
};

struct log {
	const char *name;
	struct op *ops;
	size_t nops, cap_ops;
	struct alloc *allocs;
	size_t nallocs, cap_allocs;
	uint64_t *stream_values; /* the log's value of each stream index */
	size_t nstreams, cap_streams; /* [0] is stream 0, used or not */
	bool stream0_used;
	uint64_t log_failures;   /* "allocate failure" lines */
	uint64_t unknown_frees;  /* frees of pointers no live allocate returned */
	uint64_t reallocated;    /* allocates of a pointer still live in the log */
	uint64_t zero_sized;     /* allocates of 0 bytes and frees of null */
	unsigned long untimed_line; /* the first line whose Time is no time of
				     * day (0: none); then t_us is not used */
};

/* Reads the whole log `in` into *lg (lg->name set by the caller, for the
 * messages): 0, or EXIT_INPUT after reporting (1 when out of memory). */
int parse_log(FILE *in, struct log *lg);
/* A decimal number, digits only; false past UINT64_MAX. */
bool parse_dec(const char *s, uint64_t *out);

/* ---- replay-plot.c ---------------------------------------------------------- */

/* What happened at an operation, by the pool's counters (one kind a
 * marker, the first that applies): */
enum plot_kind {
	MARK_REMAP,       /* handles_remapped rose: a defragmentation */
	MARK_LOOP_GROWTH, /* loop_growths rose */
	MARK_ROOM_GROWTH, /* room_growths rose */
	MARK_GROWTH,      /* handles_created rose otherwise */
	MARK_KINDS
};

struct plot_point {
	uint64_t op;            /* operations done */
	uint64_t live, mapped;  /* bytes */
};

struct plot_mark {
	uint64_t op, live, mapped;
	uint64_t remapped, created; /* handles, at this operation */
	enum plot_kind kind;
};

/* The series --plot draws: about PLOT_SAMPLES evenly spaced points, each the
 * highest live and mapped bytes of its stretch of operations, plus every
 * operation at which a counter changed (up to PLOT_MAX_MARKS markers; the
 * rest are counted). */
#define PLOT_SAMPLES 2000u
#define PLOT_MAX_MARKS 5000u

struct plot {
	uint64_t nops, stride;
	struct plot_point *pts;
	size_t npts, cap_pts;
	struct plot_mark *marks;
	size_t nmarks, cap_marks;
	uint64_t kinds[MARK_KINDS]; /* operations of each kind, marked or not */
	uint64_t unmarked;          /* past PLOT_MAX_MARKS */
	struct vpmm_stats last;     /* the counters after the previous operation */
	struct plot_point bucket;   /* this stretch's highest so far */
	bool oom;                   /* a point or marker could not be stored */
};

/* Starts a series for a log of nops operations, from the pool's stats before
 * the first. */
void plot_begin(struct plot *pl, uint64_t nops, const struct vpmm_stats *s0);
/* The pool's stats after operation number op (1 = the first). */
void plot_sample(struct plot *pl, uint64_t op, const struct vpmm_stats *s);
/* Writes the series as an SVG document titled with the log's name: 0, or
 * -errno if writing failed. */
int plot_write_svg(FILE *f, const struct plot *pl, const char *log_name,
		   const struct vpmm_stats *end);
void plot_free(struct plot *pl);

/* ---- replay-run.c ----------------------------------------------------------- */

/* The pool at the first allocation it refused: where its free memory lay
 * and what it could still create. */
struct failure_at {
	uint64_t op;             /* 1-based operation */
	size_t size;             /* requested */
	struct vpmm_free_split split; /* all zero if the snapshot failed */
	bool split_known;
	uint64_t creatable;      /* within the limit and the device's free bytes */
};

struct result {
	uint64_t ops, allocs, frees;
	uint64_t failures;       /* allocations the pool refused */
	int first_failure;       /* its errno */
	struct failure_at first;
	uint64_t free_errors;    /* frees the pool refused (a pool bug) */
	uint64_t check_violations;
	uint64_t peak_requested;
	uint64_t wall_ns;
	struct vpmm_stats stats;
};

/* The clock of the pool's rules that follow time (--clock): */
enum replay_clock {
	CLOCK_LOG,  /* the log's Time column */
	CLOCK_OPS,  /* 1 us an operation (a log whose Time cannot be read) */
	CLOCK_WALL, /* the host's: runs differ with its speed */
};
const char *replay_clock_name(enum replay_clock c);

/* Another process on the simulated device (--tenant): from operation
 * step[i].op on, it holds step[i].bytes. */
struct tenant {
	struct tenant_step {
		uint64_t op;
		size_t bytes;
	} *step;
	size_t n;
};

/* Replays lg's operations through `pool`, each on its stream (streams[i] for
 * the log's stream i: VPMM_NO_STREAM, or NULL for replay() to make it on drv
 * at its first operation), with `tn`'s tenant on drv's device; the device
 * finishes its queued work every `complete_every` operations (0: never); the
 * pool's clock is `clock`'s; `check` runs the pool's check after each;
 * `plot` (or NULL) samples the pool's stats after each. A stream the log
 * names no more is destroyed when the next new stream comes (replay-run.c).
 * Only the loop is timed (sampling included). 0, or -ENOMEM. */
int replay(struct log *lg, vpmm_pool *pool, vpmm_driver *drv, CUstream *streams,
	   const struct tenant *tn, uint64_t complete_every, enum replay_clock clock,
	   bool check, struct plot *plot, struct result *r);

/* ---- replay-report.c -------------------------------------------------------- */

void print_json(FILE *f, const struct log *lg, const struct result *r,
		const struct vpmm_config *cfg, uint64_t complete_every,
		enum replay_clock clock);
void print_text(FILE *f, const struct log *lg, const struct result *r,
		enum replay_clock clock);

#endif
