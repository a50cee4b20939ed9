/* ipc.h — cudaIpc* on pool memory between processes that both run the
 * shim (ipc_export.c: the owner's side; ipc_import.c: the opener's).
 * Includes shim.h only.
 */
#ifndef VPMM_IPC_H
#define VPMM_IPC_H

#include "shim.h"

/* Each returns true when it handled the call (the result in *res), false
 * when the call is the driver's own (not pool memory, not our handle). */
bool vpmm_ipc_get(CUipcMemHandle *handle, CUdeviceptr ptr, CUresult *res);
bool vpmm_ipc_open(CUdeviceptr *out, const CUipcMemHandle *handle, unsigned flags,
		   CUresult *res);
bool vpmm_ipc_close(CUdeviceptr ptr, CUresult *res);
/* Whether cudaIpcGetMemHandle on pool memory at ptr would succeed: a live
 * allocation, and this process's socket at its default path. */
bool vpmm_ipc_exportable(CUdeviceptr ptr);
/* A free of pool memory that was shared: 1 when it was deferred until the
 * last opener closes (the caller reports success), -1 when the program
 * freed it before and it is only kept for the openers (a double free), 0
 * when the pool frees it now. */
int vpmm_ipc_defer_free(int device, CUdeviceptr ptr, CUstream stream);
/* The server's ipc-* requests and its once-a-second tick (server.h). */
const char *vpmm_ipc_serve(const char *request, const char *arg, long peer, char *fields,
			   size_t len, int *fds, unsigned *nfds);
void vpmm_ipc_tick(void);

#endif
