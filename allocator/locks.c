/* locks.c — the count of the pool's locks each thread holds (vpi.h,
 * vpi_mutex_lock), by which the public calls refuse a signal handler that
 * interrupted the pool. Calls nothing; every room that locks reads it. */
#include "vpi.h"

__thread unsigned vpi_tls_locks;
