/* log.c — the shim's diagnostics: "vpmm: " lines on stderr.
 *
 * One write(2) per line, so lines of several threads never interleave and
 * nothing goes through stdio's locks (a hook may run inside a program's own
 * stdio call, in a signal-unsafe moment, or after stdio was shut down at
 * exit). The level is VPMM_LOG, set by process.c once the options are read;
 * until then warnings and errors show.
 *
 * Lines an allocation can bring (out of memory) are rate-limited and never
 * wait for stderr: a program failing allocations in a loop wrote tens of
 * thousands of lines a second, and blocked on a stderr pipe nobody read.
 *
 * Owns: the level shown (vpmm_log_shown) and the rate limit. May call:
 * nothing of the shim but shim.h.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

int vpmm_log_shown = VPMM_LOG_WARN;

/* Writes one line; with `nowait`, only if stderr takes it at once (a
 * pipe with room, a file, a terminal): the descriptor's flags are the
 * program's and stay as they are. False if the line was not written. */
static bool put_line(const char *line, int n, bool nowait)
{
	if (nowait) {
		struct pollfd p = {.fd = STDERR_FILENO, .events = POLLOUT};
		if (poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT))
			return false;
	}
	for (const char *p = line; n > 0;) {
		ssize_t w = write(STDERR_FILENO, p, (size_t)n);
		if (w <= 0)
			return false;
		p += w;
		n -= (int)w;
	}
	return true;
}

static bool vlog(int level, bool nowait, const char *fmt, va_list ap)
{
	char line[512];
	static const char *const tag[] = {"error: ", "warning: ", "", ""};
	int n, m;

	n = snprintf(line, sizeof line, "vpmm: %s",
		     level >= 0 && level <= VPMM_LOG_DEBUG ? tag[level] : "");
	if (n < 0)
		return false;
	m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	if (m < 0)
		return false;
	n += m;
	if ((size_t)n >= sizeof line - 1)
		n = sizeof line - 2; /* truncated: keep the newline */
	line[n++] = '\n';
	return put_line(line, n, nowait);
}

void vpmm_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (!vpmm_log_on(level))
		return;
	va_start(ap, fmt);
	vlog(level, false, fmt, ap);
	va_end(ap);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t vpmm_log_limit_take(struct vpmm_log_limit *l)
{
	uint64_t n = atomic_fetch_add_explicit(&l->seen, 1, memory_order_relaxed) + 1;
	uint64_t now = mono_ns();
	if (n <= VPMM_LOG_BURST) {
		atomic_store_explicit(&l->last_ns, now, memory_order_relaxed);
		return 1;
	}
	uint64_t last = atomic_load_explicit(&l->last_ns, memory_order_relaxed);
	if (now - last < 1000000000u ||
	    !atomic_compare_exchange_strong(&l->last_ns, &last, now)) {
		atomic_fetch_add_explicit(&l->held, 1, memory_order_relaxed);
		return 0;
	}
	return atomic_exchange(&l->held, 0) + 1;
}

void vpmm_log_limited(struct vpmm_log_limit *l, int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	bool written = vlog(level, true, fmt, ap);
	va_end(ap);
	if (!written) /* counted in the next line instead */
		atomic_fetch_add_explicit(&l->held, 1, memory_order_relaxed);
}
