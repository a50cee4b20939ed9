/* streams.h — the streams and contexts of a call (streams.c): which stream
 * the pool keys, which context a call runs in (made current for it and
 * back), and the program's stream destroys. Includes shim.h and resolve.h.
 */
#ifndef VPMM_STREAMS_H
#define VPMM_STREAMS_H

#include "resolve.h"
#include "shim.h"

/* How a call reached us: decides the default stream's meaning and what to
 * do when the thread has no context. */
enum vpmm_via {
	VPMM_VIA_DRIVER,      /* cu* wrapper: legacy default stream */
	VPMM_VIA_DRIVER_PTSZ, /* cu*_ptsz wrapper: per-thread default stream */
	VPMM_VIA_RUNTIME,     /* runtime hook: may initialise the runtime */
	VPMM_VIA_RUNTIME_PTSZ,
	VPMM_VIA_TORCH,       /* CUDAPluggableAllocator: the device is given */
};

struct vpmm_ctx_scope {
	bool pushed;
	/* The context of the entered stream, once entered: an explicit
	 * stream's own, or for the default streams (and none) the current
	 * one, since NULL and CU_STREAM_LEGACY name the current context's
	 * default stream. NULL where unknown. */
	CUcontext stream_ctx;
};

static inline bool vpmm_default_stream(CUstream s)
{
	return !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The stream as the pool should key it: one handle per stream. */
static inline CUstream vpmm_pool_stream(CUstream s, enum vpmm_via via)
{
	if (s == VPMM_NO_STREAM || s == CU_STREAM_LEGACY)
		return s == CU_STREAM_LEGACY ? NULL : s;
	if (!s && (via == VPMM_VIA_DRIVER_PTSZ || via == VPMM_VIA_RUNTIME_PTSZ))
		return CU_STREAM_PER_THREAD;
	return s;
}

/* 1 capturing, 0 not, <0 the query failed (the real call will say why). */
static inline int vpmm_capturing(CUstream s)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	if (vpmm_real.stream_is_capturing(s, &cs) != CUDA_SUCCESS)
		return -1;
	return cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Makes the context of `s` current for the call (pushing it if another one
 * is) and gives its device. */
CUresult vpmm_enter(CUstream s, int *device, struct vpmm_ctx_scope *sc);
/* Makes a context of device `dev` current for the call: the current one if
 * it is on `dev`, else the device's primary context, pushed. */
CUresult vpmm_enter_device(int dev, struct vpmm_ctx_scope *sc);
/* Undoes what vpmm_enter or vpmm_enter_device pushed. */
static inline void vpmm_leave(struct vpmm_ctx_scope *sc)
{
	CUcontext c;
	if (sc->pushed)
		vpmm_real.ctx_pop(&c);
	sc->pushed = false;
}
/* Whether the entered stream belongs to another context than the one the
 * pool of `dev` lives in (streams.c says why that matters). */
bool vpmm_foreign_stream(const struct vpmm_ctx_scope *sc, int dev);

/* The program is destroying stream s: every pool retires it first. */
void vpmm_stream_destroying(CUstream s);
/* Streams died without a destroy (their context ended): the threads'
 * remembered streams and contexts are stale. */
void vpmm_streams_forget(void);

#endif
