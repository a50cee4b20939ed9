/* capture.h — stream capture (CUDA graphs) and the pool (capture.c): the
 * captures in progress that the shim saw begin, the capture hooks of the
 * driver (hooks.c forwards each exported cu* hook to the function of its
 * name with vpmm_ in front), and the frees of pool memory held back until
 * the capture that would have refused them ends. Includes shim.h and
 * streams.h.
 */
#ifndef VPMM_CAPTURE_H
#define VPMM_CAPTURE_H

#include "shim.h"
#include "streams.h"

/* A free of pool memory (ptr, a pool's) that a capture forbids now: on a
 * stream being captured, on the legacy stream while a blocking stream is
 * captured, or synchronous (`stream` VPMM_NO_STREAM) while a capture
 * forbids this thread to synchronise the context. Returns true when it was
 * deferred (*res = CUDA_SUCCESS): it is made once that capture ended, as
 * the free it was. False: free it now. */
bool vpmm_capture_defer(CUdeviceptr ptr, CUstream stream, enum vpmm_via via,
			CUresult *res);
/* Whether a capture forbids this thread the calls that are potentially
 * unsafe during capture (a synchronous malloc or free, a context
 * synchronisation): its own capture not begun relaxed, or, in the global
 * interaction mode, another thread's capture begun global. One atomic load
 * while no such capture is in progress. */
bool vpmm_capture_forbids_sync(void);
/* Makes the deferred frees whose capture ended; one atomic load when none
 * is waiting. */
void vpmm_capture_poll(void);
/* The program destroyed stream s (result r of the real call): a capture on
 * it is over, and frees deferred on it are made once no capture forbids
 * synchronising the context. */
void vpmm_capture_stream_destroyed(CUstream s, CUresult r);

/* The driver's capture entry points under the shim. */
CUresult vpmm_cuStreamBeginCapture(CUstream s);
CUresult vpmm_cuStreamBeginCapture_ptsz(CUstream s);
CUresult vpmm_cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
CUresult vpmm_cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
CUresult vpmm_cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
					  const vpmm_edge_data *data, size_t n,
					  CUstreamCaptureMode mode);
CUresult vpmm_cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
					       const vpmm_edge_data *data, size_t n,
					       CUstreamCaptureMode mode);
CUresult vpmm_cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult vpmm_cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);

#endif
