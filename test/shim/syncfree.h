/* syncfree.h — what the synchronous-free program's files share
 * (syncfree_prog.c: the helpers, main and most scenarios; syncfree_ends.c:
 * the scenarios where a non-blocking stream ends; syncfree_owed.c: the
 * legacy stream's record with blocking streams only). */
#ifndef SYNCFREE_H
#define SYNCFREE_H

#include "shimtest.h"

#define P ((size_t)64 << 10)

void fakecuda_set_implicit(int on);

/* VPMM_SYNC_FREE=device: every free synchronises. */
bool device_mode(void);
/* cuInit, the primary context current, the controls, the legacy stream's
 * implicit order on. */
void start(void);
/* "Work" on s: an event recorded there, run when the device gets to it. */
CUevent work_on(CUstream s);
/* *a, 4 pages, written on `late` and freed by cuMemFree (the legacy
 * stream's order): the write's event. */
CUevent freed_after_work(CUstream late, CUdeviceptr *a);
/* *f, a page allocated, freed and taken again: a fence (the first
 * malloc after a free always makes one), the last before what follows. */
void fence_now(CUdeviceptr *f);
/* The new owner's write on `next` must not complete before `old`
 * (destroyed). */
void expect_ordered(CUevent old, CUstream next);
/* The same; then b is freed. */
void new_write(CUevent old, CUstream next, CUdeviceptr b);
/* a written late on `late`, freed (`late` destroyed if asked), the same
 * size allocated and written on `next`; whether the memory was reused. */
bool late_write_then(CUstream late, CUstream next, bool destroy_late);
bool late_write(CUstream late, CUstream next);
/* The context synchronisations since the counts given, as the shim and the
 * fake count them. */
void expect_syncs(long long from_hook, long long from_fake, long long n);
/* No synchronisation (with VPMM_SYNC_FREE=device: each counted its own),
 * no failed allocation. */
void expect_fenced(void);
/* A malloc and its free, the free synchronising the context. */
void free_syncs(void);

/* syncfree_owed.c */
void owed(void);
void owed_clean(void);
void owed_obligation(void);

/* syncfree_ends.c */
void destroyed(void);
void destroyed_busy(void);
void destroyed_last(void);
void destroyed_reset(void);
void destroyed_quiet(void);
void destroyed_elsewhere(void);

#endif
