/* live_streams.h — every stream the program made, and the fences that let
 * a synchronous free (cudaFree, cuMemFree) keep its promise without
 * stopping the host (live_streams.c keeps the table, fence.c the fences).
 * Includes shim.h only.
 */
#ifndef VPMM_LIVE_STREAMS_H
#define VPMM_LIVE_STREAMS_H

#include "shim.h"

/* Most non-blocking streams a context may have for a fence; with more, a
 * synchronous free synchronises the context instead (the cost of a fence
 * grows with them: a capture query each on every synchronous call, a
 * record and a wait each when a fence is owed). PyTorch's first
 * torch.cuda.Stream() makes 128, its stream pools. Which costs less depends
 * on whether the GPU or the host sets the program's pace, measured in
 * docs/shim.md, "Fences or a synchronisation". */
#define VPMM_FENCE_STREAMS_MAX 256

/* The program made stream `s` in the current context with `flags`
 * (cuStreamCreate, cuStreamCreateWithPriority). */
void vpmm_live_stream_created(CUstream s, unsigned flags);
/* The program made a stream the fences cannot order, or a context with one
 * (a green context, its stream): from now on every synchronous free
 * synchronises. */
void vpmm_live_streams_untrackable(const char *why);
/* A hook was handed stream `s` (not a default stream): one the tracker
 * never saw made means streams are made behind its back, so from now on
 * every synchronous free synchronises. */
void vpmm_live_stream_seen(CUstream s);
/* The program is destroying `s`. */
void vpmm_live_stream_destroying(CUstream s);
/* The program made context `ctx` on device `dev`: counted as a context
 * with a stream there (its legacy stream) until it ends. */
void vpmm_live_streams_ctx_made(CUcontext ctx, int dev);
/* Context `ctx` ends: its streams with it. */
void vpmm_live_streams_ctx_end(CUcontext ctx);
/* The primary context of `dev` is reset: its streams end. Which context
 * that is the shim may not know; the streams of every context of `dev` are
 * forgotten, and if they were of more than one, the table is no longer
 * trusted. */
void vpmm_live_streams_device_reset(int dev);
/* For fork.c: the child starts with none. */
void vpmm_live_streams_forget(void);

/* Whether the fences can stand for a synchronisation of `ctx` (the
 * current context): every stream of it known, none of its non-blocking
 * streams or the legacy stream capturing, at most VPMM_FENCE_STREAMS_MAX
 * non-blocking ones, no stream of another context on device `dev`. */
bool vpmm_fence_possible(CUcontext ctx, int dev);
/* Before a free on the legacy default stream: the free owes the legacy
 * stream a wait for the work queued so far on every non-blocking stream of
 * `ctx` (the current context), made before the next record there or
 * reuse in its order, and a record, made by the next malloc on it that
 * may hand out memory freed since the last fence; the blocking streams it
 * waits for by itself. [va, va + size) is the memory it gives back (size
 * 0: not known, and the next malloc fences whatever it hands out).
 * CUDA_SUCCESS, or the driver's error (the caller synchronises instead,
 * and says what it frees with vpmm_fence_freed_range or _freeing). */
CUresult vpmm_fence_free(CUcontext ctx, CUdeviceptr va, size_t size);
/* A non-blocking stream `s` was just made in the current context: it
 * waits for the legacy stream's work so far, since memory handed out
 * before may still be pending there (a fence it missed). */
void vpmm_fence_new_stream(CUstream s);
/* After a synchronous malloc of [va, va + size) on the legacy default
 * stream: the record the frees owed (vpmm_fence_owed), and every
 * non-blocking stream of `ctx` (current) waits for the work queued so far
 * on the legacy stream, unless nothing since they last did can have left
 * that memory pending there (fence.c: obligations, freed ranges), then
 * neither the record; nor the waits once the record is found complete.
 * The blocking streams wait for it by themselves. */
CUresult vpmm_fence_malloc(CUcontext ctx, CUdeviceptr va, size_t size);
/* After any other malloc on the legacy default stream of `ctx` (the
 * current context; NULL: asks which it is):
 * the record on it that the synchronous frees since the last one owe, if
 * any, so that work queued later on a blocking stream waits for the work
 * queued on any blocking stream before those frees. */
CUresult vpmm_fence_owed(CUcontext ctx);

/* A stream capture is about to begin: the waits that frees still owe the
 * legacy streams (of every context) are made now, while every stream may
 * still be recorded on, and until vpmm_fence_capture_began a synchronous
 * free makes its waits at once. */
void vpmm_fence_capture_begins(void);
/* The capture's begin returned (begun or refused). */
void vpmm_fence_capture_began(void);
/* For fork.c, through vpmm_live_streams_forget: the child starts with no
 * capture beginning and no handle pending (another thread of the parent
 * may have held the handle set's lock at the fork). */
void vpmm_fence_forget(void);
/* A free through the shim, about to give memory back to the pool: the
 * next synchronous malloc's fence is due again (vpmm_fence_malloc). */
void vpmm_fence_freeing(void);
/* Whether a free on the legacy stream that no fence told should say which
 * range it gives back (vpmm_fence_freed_range) rather than call
 * vpmm_fence_freeing: while non-blocking streams exist. */
bool vpmm_fence_wants_ranges(void);
/* A free on the legacy stream, about to give [va, va + size) back to the
 * pool: a synchronous malloc of memory overlapping it is fenced again. */
void vpmm_fence_freed_range(CUdeviceptr va, size_t size);
/* Puts the fences in front of the pool's driver `d` (the shim's, once):
 * its records on the legacy stream make the wait for the non-blocking
 * streams that synchronous frees still owe, and its waits on the legacy
 * stream and its mappings of moved pages make the next synchronous
 * malloc's fence due. */
void vpmm_fence_wrap_driver(vpmm_driver *d);

#endif
