/* devices.h — one pool per device and the contexts they live in
 * (devices.c): creation on first use, the primary context held for them,
 * peer access, and what a context's end does to them. Includes shim.h only.
 */
#ifndef VPMM_DEVICES_H
#define VPMM_DEVICES_H

#include "shim.h"

#define VPMM_MAX_DEVICES 64

/* The pool of `dev`, created on first use in the current context; NULL when
 * the device passes through (creation failed, or no such device). */
vpmm_pool *vpmm_device_pool_make(int dev);
/* A device's pool if made (NULL if none), and the context it lives in. */
vpmm_pool *vpmm_device_pool(int device, CUcontext *ctx);
/* The context the pool of `dev` lives in (NULL: none yet, or it ended). */
CUcontext vpmm_device_ctx(int dev);
/* Whether the pool of `dev` could not be made (its calls pass through). */
bool vpmm_device_failed(int dev);
/* 1 + the highest device with a pool. */
int vpmm_device_count(void);
/* The device whose pool owns ptr; -1: none. */
int vpmm_owner_device(CUdeviceptr ptr);

/* Whether only `dev`'s own contexts can reach its pool memory, as far as
 * the shim knows: no peer was let access it and no other device has a
 * pool (whose memory a copy on another device's stream could exchange
 * with it). */
bool vpmm_device_alone(int dev);

/* The primary context of `dev`, retained once for the process. */
CUcontext vpmm_primary_of(int dev);
/* The pool of `dev` lost its context: it lives on in `c` (NULL: the current
 * one), the context of the first call that allocates from it. */
void vpmm_adopt_context(int dev, CUcontext c);

/* The context of device's pool made current (pushed if needed), and back. */
CUresult vpmm_push_pool_ctx(int device, bool *pushed);
void vpmm_pop_ctx(bool pushed);

/* The program enabled peer access from the current context to `peer`'s
 * memory: the peer's pool grants the current device. */
void vpmm_peer_enabled(CUcontext peer);
/* The program is about to destroy context `ctx` (cuCtxDestroy), or to reset
 * the primary context of `device` (cuDevicePrimaryCtxReset; ctx NULL): the
 * pools living in it settle what the context's work held and drop the
 * events the driver is about to destroy. */
void vpmm_context_ending(CUcontext ctx, int device);
/* After the program's call that ended it returned `r`. */
void vpmm_context_ended(CUresult r);
/* The program made a handle of its own (cuMemCreate succeeded): memory the
 * pool does not serve. Said once per process. */
void vpmm_own_mapping(const CUmemAllocationProp *prop, size_t size);

/* For fork.c: a forked child starts with no pools. */
void vpmm_devices_forget(void);

#endif
