/* stats.c — printing struct vpmm_stats as text or JSON, from the one
 * declaration of its fields in include/vpmm/stats.h. Calls nothing. */
#include <inttypes.h>

#include "vpmm.h"

void vpmm_stats_print(const struct vpmm_stats *s, FILE *f, bool json)
{
	const char *sep = "";
	if (json)
		fputc('{', f);
#define OUT(name, value)                                                      \
	do {                                                                  \
		if (json)                                                     \
			fprintf(f, "%s\"%s\":%" PRIu64, sep, name, (uint64_t)(value)); \
		else                                                          \
			fprintf(f, "%-20s %" PRIu64 "\n", name, (uint64_t)(value)); \
		sep = ",";                                                    \
	} while (0)
#define X(n, d) OUT(#n, s->n); OUT(#n "_peak", s->n##_peak);
	VPMM_GAUGES(X)
#undef X
#define X(n, d) OUT(#n, s->n);
	VPMM_COUNTERS(X)
#undef X
	OUT("page_size", s->page_size);
	OUT("regions", s->regions);
	OUT("streams", s->streams);
	OUT("events", s->events);
#undef OUT
	if (json)
		fputs("}\n", f);
}
