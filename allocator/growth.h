/* growth.h — whether and how the pool grows without remapping (growth.c),
 * from what the device's free memory and VPMM_LIMIT leave. Lock held.
 */
#ifndef VPMM_GROWTH_H
#define VPMM_GROWTH_H

#include <stddef.h>

#include "vpmm.h"

#define GROWTH_ROOM_RATIO 16     /* room needed per byte grown without remapping */
#define GROWTH_HANDLE_RATIO 256  /* room needed per byte of a new handle */
#define GROWTH_SPARE_PERMILLE 20 /* free share of the pool that stops growth */

/* What the device's free memory and VPMM_LIMIT leave the pool. */
size_t vpi_growth_headroom(vpmm_pool *p);
/* 0: a defragmentation serves `need` bytes. Else the pool has room: it
 * grows by what the request lacks, in handles of at most the result. */
size_t vpi_growth_room(vpmm_pool *p, size_t need);
/* The largest handle a growth may make now (SIZE_MAX: no headroom bound). */
size_t vpi_growth_handle_cap(vpmm_pool *p);
/* The pool created `bytes`; the driver refused a growth (out of memory). */
void vpi_growth_created(vpmm_pool *p, size_t bytes);
void vpi_growth_refused(vpmm_pool *p);

#endif
