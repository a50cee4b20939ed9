/* reset.h — a context that ended under the pool (reset.c). reset.c calls
 * stream.c, front.c and small.c. */
#ifndef VPMM_RESET_H
#define VPMM_RESET_H

#include <stdbool.h>

#include "vpmm.h"

/* Compares the id of the pool's context with the one seen last; where it
 * changed or the context is destroyed, the context ended without the pool
 * being told (a reset through the runtime's private table), and the pool
 * lets go of everything that ended with it (vpi_ctx_ended_locked). One
 * driver call. Only where no caller holds a stream or event pointer: at the
 * top of a public call or of a pass of the background thread. Returns
 * whether it found the context ended. Lock held. */
bool vpi_ctx_check_locked(vpmm_pool *p);
/* The context's streams and events are gone, with all of their work: every
 * event dropped without a driver call, every pending free settled, the
 * parked ones too, the streams forgotten (but the default streams, whose
 * handles name the next context's). Memory stays mapped and live memory
 * live. Lock held. */
void vpi_ctx_ended_locked(vpmm_pool *p);

#endif
