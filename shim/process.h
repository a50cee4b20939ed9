/* process.h — the shim's process state (process.c): the options, read once,
 * the cuda driver layer built over the real entry points, and whether the
 * shim routes anything at all. Includes shim.h only.
 */
#ifndef VPMM_PROCESS_H
#define VPMM_PROCESS_H

#include "shim.h"

/* Whether the shim routes anything (options valid, not disabled, libcuda
 * and the cuda driver layer set up). Reads the options once; cheap after.
 * When false, cuGetProcAddress and dlsym hand out real pointers untouched. */
bool vpmm_active(void);

/* The driver layer, NULL while the shim is not active. */
vpmm_driver *vpmm_process_driver(void);

/* The pool options every device's pool is made with (VPMM_* variables);
 * valid once vpmm_active() said true. */
const struct vpmm_config *vpmm_process_config(void);
/* VPMM_SYNC_FREE=device: synchronous frees synchronise the context. */
bool vpmm_process_sync_device(void);

/* The driver said CUDA_ERROR_DEINITIALIZED (the process is ending): frees
 * of pool memory succeed quietly from then on. */
bool vpmm_torn_down(void);
void vpmm_set_torn_down(void);

/* For fork.c: a forked child starts as if nothing had been set up. */
void vpmm_process_forget(void);

#endif
