/* oom.h — what a refusal of the pool reports (oom.c): the out-of-memory
 * log line and the text of the exception PyTorch raises. Includes shim.h.
 */
#ifndef VPMM_OOM_H
#define VPMM_OOM_H

#include "shim.h"

/* The pool of device `dev` refused `size` bytes (ENOMEM), in the call's
 * context. Reads the pool's state once, under one hold of its lock, and
 * the device's free memory: for the log line (at most a burst, then one a
 * second) and, when `for_torch`, for vpmm_oom_describe() on this thread.
 * Reads the pool's regions once: on every refusal for PyTorch, rate
 * limited otherwise. */
void vpmm_oom_refused(vpmm_pool *pool, int dev, size_t size, bool for_torch);

/* For the exception PyTorch raises: after "tried to allocate `size` bytes",
 * what device `dev`'s pool held when it refused that request on this
 * thread, where its free memory lay and what the device had free, in
 * binary units ("" with no pool). When the pool did not refuse it (the
 * driver's own allocator did, for a call the pool did not serve), the
 * pool as it is now. Forgets the refusal. */
void vpmm_oom_describe(int dev, size_t size, char *buf, size_t n);
/* Forgets this thread's last refusal (a failure that is not described). */
void vpmm_oom_forget(void);

#endif
