/* trace.h — VPMM_TRACE: every allocation and free written to a file in RMM's
 * CSV log format (the one tools/vpmm-replay reads):
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     4242,13:05:09.123456,allocate,0x7f3a40000000,1048576,0x0
 *     4242,13:05:09.123901,free,0x7f3a40000000,1048576,0x0
 *
 * Thread is the kernel thread id, Time the local time of day with
 * microseconds, Action `allocate`, `free` or `allocate failure` (Pointer
 * 0x0), Pointer and Stream in hexadecimal with 0x, Size in bytes.
 *
 * Cost: vpmm_trace_event() formats nothing and never writes: it copies the
 * event into a shared lock-free ring (one compare-and-swap to claim a slot);
 * a background thread formats and writes the ring every 50 ms, or sooner when
 * it fills. If the ring is full the caller waits for the writer: no event is
 * dropped. The file is complete after vpmm_trace_close(), which a destructor
 * runs at exit; vpmm_trace_flush() makes it complete up to now. A write that
 * fails (a full disk; the file size limit of ulimit -f, where the trace
 * stops rather than raise SIGXFSZ) stops the trace with one line on
 * stderr, and the file keeps whole lines only. A forked
 * child does not trace (the parent's file and buffered events stay the
 * parent's); it may open a trace of its own, but not the parent's file
 * (-EBUSY: it would truncate it).
 *
 * Includes no header of the project.
 */
#ifndef VPMM_TRACE_H
#define VPMM_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

enum vpmm_trace_action {
	VPMM_TRACE_ALLOCATE,
	VPMM_TRACE_FREE,
	VPMM_TRACE_ALLOCATE_FAILURE,
};

/* Starts writing to `path` (truncated; %p in it is the process id),
 * closing a trace already open. 0, or a negative errno, and then a trace
 * already open goes on: -EBUSY for a file another process traces to (a
 * forked or spawned worker with the same VPMM_TRACE), -EINVAL for anything
 * but a regular file (a FIFO would stall the program on its reader),
 * -ELOOP for a symbolic link, -EPERM for another user's file, -EMLINK for
 * a file with other names (a link could make us truncate any file). */
int vpmm_trace_open(const char *path);
/* vpmm_trace_open()'s error in words. */
const char *vpmm_trace_strerror(int rc);
/* Whether a trace is open: lets a caller skip work done only for the trace
 * (finding a freed allocation's size). */
bool vpmm_trace_on(void);
/* Records one event; does nothing when no trace is open. Thread-safe.
 * stream is the one the pool took the call on; VPMM_NO_STREAM (a call the
 * pool took without stream order: cudaMalloc and cudaFree where the fences
 * cannot stand, the per-thread stream, another context's) is written as
 * 0xffffffffffffffff, which vpmm-replay reads as such, where 0x0 would
 * replay it on the legacy stream. */
void vpmm_trace_event(enum vpmm_trace_action action, CUdeviceptr ptr, size_t size,
		      CUstream stream);
/* Writes every event recorded so far. 0, or the negative errno of a write
 * error (the trace is then stopped), or -ETIMEDOUT when the writer held the
 * file for 2 s (a slow disk): the caller is never held longer. */
int vpmm_trace_flush(void);
/* Writes what is left and closes the file. 0, or a negative errno of a write
 * error since the trace was opened. Safe when no trace is open. */
int vpmm_trace_close(void);
/* Whether a trace is open; if so its absolute path and the events recorded. */
bool vpmm_trace_status(char *path, size_t n, uint64_t *events);

#endif
