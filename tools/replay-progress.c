/* replay-progress.c — vpmm-replay's progress line: while a long log is read
 * and replayed, and only when standard error is a terminal, a percentage
 * rewritten in place on stderr at most four times a second, erased when the
 * phase ends or before any other message. Nothing at all otherwise, so that
 * pipes, files and tests see no trace of it. Calls only the C library.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "replay.h"

#define UPDATE_NS 250000000u /* at most four updates a second */

static struct {
	bool on;        /* this phase shows progress */
	bool shown;     /* a line is on the terminal now */
	const char *what, *name;
	uint64_t total;
	uint64_t last_ns;
	int last_pct;
} pg;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void draw(int pct)
{
	fprintf(stderr, "\rvpmm-replay: %s %s: %d%%\033[K", pg.what, pg.name, pct);
	fflush(stderr);
	pg.shown = true;
	pg.last_pct = pct;
	pg.last_ns = now_ns();
}

void progress_begin(const char *what, const char *name, uint64_t total, bool is_long)
{
	progress_clear();
	pg.on = is_long && total && isatty(STDERR_FILENO);
	pg.what = what;
	pg.name = name;
	pg.total = total;
	if (pg.on)
		draw(0);
}

void progress_at(uint64_t done)
{
	if (!pg.on)
		return;
	int pct = (int)(done >= pg.total ? 100 : done * 100 / pg.total);
	if (pct != pg.last_pct && now_ns() - pg.last_ns >= UPDATE_NS)
		draw(pct);
}

void progress_clear(void)
{
	if (pg.shown) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
	pg.shown = false;
}

void progress_end(void)
{
	progress_clear();
	pg.on = false;
}
