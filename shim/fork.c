/* fork.c — a forked child's fresh start.
 *
 * The child starts with no pools and no driver layer, as if nothing had
 * happened (CUDA itself is unusable in a child of an initialised parent;
 * the first hook call sets up again and the real calls report that). The
 * parent's structures are left alone, not freed: their locks may have been
 * held by threads that do not exist in the child. The socket server
 * (server.c) and the IPC tables (ipc_export.c) forget theirs with handlers
 * of their own.
 *
 * Owns: the handler's registration. May call: devices.h, live_streams.h,
 * process.h.
 */
#include <pthread.h>
#include <stdbool.h>

#include "devices.h"
#include "fork.h"
#include "live_streams.h"
#include "process.h"

static void forked_child(void)
{
	vpmm_devices_forget();
	vpmm_live_streams_forget();
	vpmm_process_forget();
}

void vpmm_fork_watch(void)
{
	static bool registered;
	if (!registered && pthread_atfork(NULL, NULL, forked_child) == 0)
		registered = true;
}
