/* log.c — the shim's diagnostics: "vpmm: " lines on stderr.
 *
 * One write(2) per line, so lines of several threads never interleave and
 * nothing goes through stdio's locks (a hook may run inside a program's own
 * stdio call, in a signal-unsafe moment, or after stdio was shut down at
 * exit). The level is VPMM_LOG, set by dispatch.c once the options are read;
 * until then warnings and errors show.
 */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "shim.h"

int vpmm_log_level = VPMM_LOG_WARN;

void vpmm_log(int level, const char *fmt, ...)
{
	char line[512];
	static const char *const tag[] = {"error: ", "warning: ", "", ""};
	int n, m;
	va_list ap;

	if (!vpmm_log_on(level))
		return;
	n = snprintf(line, sizeof line, "vpmm: %s",
		     level >= 0 && level <= VPMM_LOG_DEBUG ? tag[level] : "");
	if (n < 0)
		return;
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n >= sizeof line - 1)
		n = sizeof line - 2; /* truncated: keep the newline */
	line[n++] = '\n';
	for (const char *p = line; n > 0;) {
		ssize_t w = write(STDERR_FILENO, p, (size_t)n);
		if (w <= 0)
			break;
		p += w;
		n -= (int)w;
	}
}
