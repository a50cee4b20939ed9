/* rmm-time.h — the Time column of an RMM allocation log, read alike by
 * vpmm-replay (replay-log.c) and vpmm-dump's trace (dump-torch.c). */
#ifndef VPMM_TOOLS_RMM_TIME_H
#define VPMM_TOOLS_RMM_TIME_H

#include <stdbool.h>
#include <stdint.h>

/* A time of day, H:MM:SS, then '.' or ':' and up to 9 digits of a second
 * (none: whole seconds), in microseconds; false for anything else. */
bool rmm_parse_time(const char *s, uint64_t *us);

#endif
