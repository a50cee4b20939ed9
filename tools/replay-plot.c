/* replay-plot.c — vpmm-replay --plot: the pool's live and mapped bytes
 * sampled over the replay, and the operations at which it defragmented or
 * grew, written as one self-contained SVG document (no script, no external
 * style) that a browser shows as it is. Owns the sampling (which points are
 * kept) and the SVG writer. Calls vpmm.h's stats only through the values
 * it is given, and the C library.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

/* ---- sampling ---------------------------------------------------------------- */

static void push_point(struct plot *pl, uint64_t op, uint64_t live, uint64_t mapped)
{
	if (pl->npts == pl->cap_pts) {
		size_t cap = pl->cap_pts ? pl->cap_pts * 2 : 1024;
		struct plot_point *p = realloc(pl->pts, cap * sizeof(*p));
		if (!p) {
			pl->oom = true;
			return;
		}
		pl->pts = p;
		pl->cap_pts = cap;
	}
	pl->pts[pl->npts++] = (struct plot_point){ op, live, mapped };
}

static void push_mark(struct plot *pl, const struct plot_mark *m)
{
	pl->kinds[m->kind]++;
	if (pl->nmarks >= PLOT_MAX_MARKS) {
		pl->unmarked++;
		return;
	}
	if (pl->nmarks == pl->cap_marks) {
		size_t cap = pl->cap_marks ? pl->cap_marks * 2 : 256;
		struct plot_mark *p = realloc(pl->marks, cap * sizeof(*p));
		if (!p) {
			pl->oom = true;
			return;
		}
		pl->marks = p;
		pl->cap_marks = cap;
	}
	pl->marks[pl->nmarks++] = *m;
}

void plot_begin(struct plot *pl, uint64_t nops, const struct vpmm_stats *s0)
{
	memset(pl, 0, sizeof(*pl));
	pl->nops = nops;
	pl->stride = nops / PLOT_SAMPLES + (nops % PLOT_SAMPLES != 0);
	if (!pl->stride)
		pl->stride = 1;
	pl->last = *s0;
	push_point(pl, 0, s0->live, s0->mapped);
}

void plot_sample(struct plot *pl, uint64_t op, const struct vpmm_stats *s)
{
	const struct vpmm_stats *o = &pl->last;
	if (s->live > pl->bucket.live)
		pl->bucket.live = s->live;
	if (s->mapped > pl->bucket.mapped)
		pl->bucket.mapped = s->mapped;
	pl->bucket.op = op;

	bool changed = s->defrags != o->defrags || s->room_growths != o->room_growths ||
		       s->loop_growths != o->loop_growths ||
		       s->handles_created != o->handles_created ||
		       s->handles_remapped != o->handles_remapped;
	if (changed) {
		struct plot_mark m = {
			.op = op, .live = s->live, .mapped = s->mapped,
			.remapped = s->handles_remapped - o->handles_remapped,
			.created = s->handles_created - o->handles_created,
		};
		if (m.remapped)
			m.kind = MARK_REMAP;
		else if (s->loop_growths != o->loop_growths)
			m.kind = MARK_LOOP_GROWTH;
		else if (s->room_growths != o->room_growths)
			m.kind = MARK_ROOM_GROWTH;
		else if (m.created)
			m.kind = MARK_GROWTH;
		else
			m.kind = MARK_REMAP; /* a defragmentation that moved nothing */
		push_mark(pl, &m);
		/* The exact values at the marker; the stretch starts again. */
		push_point(pl, op, s->live, s->mapped);
		pl->bucket = (struct plot_point){ 0 };
	} else if (op % pl->stride == 0 || op == pl->nops) {
		push_point(pl, op, pl->bucket.live, pl->bucket.mapped);
		pl->bucket = (struct plot_point){ 0 };
	}
	pl->last = *s;
}

void plot_free(struct plot *pl)
{
	free(pl->pts);
	free(pl->marks);
	pl->pts = NULL;
	pl->marks = NULL;
}

/* ---- the SVG ------------------------------------------------------------------ */

#define W 1200.0
#define H 540.0
#define X0 100.0 /* the plot area */
#define X1 (W - 300.0) /* the legend to its right */
#define Y0 70.0
#define Y1 (H - 60.0)

static const struct {
	const char *cls, *label, *color;
} kind_style[MARK_KINDS] = {
	[MARK_REMAP] = { "remap", "defragmentation (remap)", "#ff7f0e" },
	[MARK_LOOP_GROWTH] = { "loop-growth", "loop growth", "#2ca02c" },
	[MARK_ROOM_GROWTH] = { "room-growth", "growth (device had room)", "#9467bd" },
	[MARK_GROWTH] = { "growth", "growth", "#7f7f7f" },
};

/* Bytes with a binary unit: "1.5 GiB", "512 B". */
static const char *human(double b, char *buf, size_t n)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	int u = 0;
	while (b >= 1024 && u < 6) {
		b /= 1024;
		u++;
	}
	snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
	return buf;
}

/* 1, 2 or 5 times a power of ten, at least x. */
static double nice(double x)
{
	if (!(x > 0))
		return 1;
	double p = 1; /* the power of ten at or under x; no libm */
	while (p * 10 <= x)
		p *= 10;
	while (p > x)
		p /= 10;
	double f = x / p;
	return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

/* The text as XML character data: markup escaped, control characters and
 * bytes that are not UTF-8 replaced (a path may be anything). */
static void xml_text(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		unsigned c = *p;
		size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
					: (c & 0xf8) == 0xf0 ? 4 : 0;
		bool ok = n > 0 && !(n == 2 && c < 0xc2) && !(n == 4 && c > 0xf4);
		for (size_t i = 1; ok && i < n; i++)
			ok = (p[i] & 0xc0) == 0x80;
		if (ok && n == 3) /* no surrogates, no overlong forms */
			ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
		if (ok && n == 4)
			ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
		if (!ok) {
			fputs("\xef\xbf\xbd", f); /* U+FFFD */
			p++;
			continue;
		}
		if (n > 1) {
			fwrite(p, 1, n, f);
		} else if (c == '&') {
			fputs("&amp;", f);
		} else if (c == '<') {
			fputs("&lt;", f);
		} else if (c == '>') {
			fputs("&gt;", f);
		} else if (c == '"') {
			fputs("&quot;", f);
		} else if (c < 0x20 || c == 0x7f) {
			fputc('?', f);
		} else {
			fputc((int)c, f);
		}
		p += n;
	}
}

struct frame {
	double nops, ytop; /* the axes' ends */
	double unit, ystep; /* bytes: the y labels' unit, the grid's step */
	const char *uname;
};

static double px(const struct frame *fr, double op)
{
	return X0 + (X1 - X0) * op / fr->nops;
}

static double py(const struct frame *fr, double bytes)
{
	return Y1 - (Y1 - Y0) * bytes / fr->ytop;
}

/* y: a unit of 1024^k under the highest value, the grid at nice steps of
 * it up to the first at or above that value. */
static void frame_for(struct frame *fr, double nops, double ymax)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	int k = 0;
	fr->unit = 1;
	while (k < 6 && ymax >= fr->unit * 1024) {
		fr->unit *= 1024;
		k++;
	}
	fr->uname = units[k];
	fr->ystep = nice(ymax / fr->unit / 5) * fr->unit;
	double n = (double)(uint64_t)(ymax / fr->ystep);
	fr->ytop = (n * fr->ystep < ymax ? n + 1 : n) * fr->ystep;
	fr->nops = nops;
}

static void axes(FILE *f, const struct frame *fr)
{
	double unit = fr->unit, ystep = fr->ystep;
	const char *uname = fr->uname;
	fprintf(f, "<g id=\"grid\" stroke=\"#dddddd\" stroke-width=\"1\">\n");
	for (double y = 0; y <= fr->ytop * 1.0000001; y += ystep)
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", X0,
			py(fr, y), X1, py(fr, y));
	fprintf(f, "</g>\n<g id=\"y-axis\" font-size=\"12\" text-anchor=\"end\">\n");
	for (double y = 0; y <= fr->ytop * 1.0000001; y += ystep)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%g %s</text>\n", X0 - 6,
			py(fr, y) + 4, y / unit, uname);
	fprintf(f, "<text transform=\"translate(18 %.1f) rotate(-90)\" "
		   "text-anchor=\"middle\">bytes</text>\n</g>\n", (Y0 + Y1) / 2);

	double xstep = nice(fr->nops / 6);
	if (xstep < 1)
		xstep = 1;
	fprintf(f, "<g id=\"x-axis\" font-size=\"12\" text-anchor=\"middle\">\n");
	for (double x = 0; x <= fr->nops; x += xstep)
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
			   "stroke=\"#888888\"/>\n<text x=\"%.1f\" y=\"%.1f\">%.0f</text>\n",
			px(fr, x), Y1, px(fr, x), Y1 + 5, px(fr, x), Y1 + 20, x);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">operations of the log</text>\n</g>\n",
		(X0 + X1) / 2, H - 18);
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
		   "fill=\"none\" stroke=\"#444444\"/>\n", X0, Y0, X1 - X0, Y1 - Y0);
}

/* A step line: each point's value holds from its operation to the next. */
static void series(FILE *f, const struct frame *fr, const struct plot *pl, bool mapped,
		   const char *id, const char *color)
{
	fprintf(f, "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
		   "stroke-linejoin=\"round\" points=\"", id, color);
	double prev = 0;
	for (size_t i = 0; i < pl->npts; i++) {
		const struct plot_point *p = &pl->pts[i];
		double v = (double)(mapped ? p->mapped : p->live);
		double x = px(fr, (double)p->op);
		if (i)
			fprintf(f, " %.1f,%.1f", x, py(fr, prev));
		fprintf(f, "%s%.1f,%.1f", i ? " " : "", x, py(fr, v));
		prev = v;
	}
	fprintf(f, " %.1f,%.1f\"/>\n", X1, py(fr, prev));
}

static void marker(FILE *f, enum plot_kind k, double x, double y)
{
	const char *c = kind_style[k].color;
	switch (k) {
	case MARK_REMAP:
		fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"", x, y, c);
		break;
	case MARK_LOOP_GROWTH:
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\"",
			x - 3.5, y - 3.5, c);
		break;
	default:
		fprintf(f, "<path d=\"M%.1f %.1fl4.5 8h-9z\" fill=\"%s\"", x, y - 5, c);
		break;
	}
}

static void marks(FILE *f, const struct frame *fr, const struct plot *pl)
{
	char a[32], b[32];
	fprintf(f, "<g id=\"marks\" stroke=\"#ffffff\" stroke-width=\"0.5\">\n");
	for (size_t i = 0; i < pl->nmarks; i++) {
		const struct plot_mark *m = &pl->marks[i];
		marker(f, m->kind, px(fr, (double)m->op), py(fr, (double)m->mapped));
		fprintf(f, " class=\"%s\"><title>operation %" PRIu64 ": %s; handles remapped "
			   "%" PRIu64 ", created %" PRIu64 "; live %s, mapped %s</title>",
			kind_style[m->kind].cls, m->op, kind_style[m->kind].label, m->remapped,
			m->created, human((double)m->live, a, sizeof(a)),
			human((double)m->mapped, b, sizeof(b)));
		fputs(m->kind == MARK_REMAP ? "</circle>\n"
		      : m->kind == MARK_LOOP_GROWTH ? "</rect>\n" : "</path>\n", f);
	}
	fprintf(f, "</g>\n");
}

static void legend(FILE *f, const struct plot *pl)
{
	int rows = 2 + (pl->unmarked != 0);
	for (int k = 0; k < MARK_KINDS; k++)
		rows += pl->kinds[k] != 0;
	double x = X1 + 12, y = Y0 + 22;
	fprintf(f, "<g id=\"legend\" font-size=\"12\">\n<rect x=\"%.1f\" y=\"%.1f\" "
		   "width=\"280\" height=\"%d\" fill=\"#ffffff\" "
		   "stroke=\"#bbbbbb\"/>\n", x, Y0 + 8, rows * 18 + 8);
	x += 8;
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
		   "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">mapped (physical memory "
		   "held)</text>\n", x, y - 4, x + 22, y - 4, x + 30, y);
	y += 18;
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
		   "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">live (handed out)</text>\n",
		x, y - 4, x + 22, y - 4, x + 30, y);
	for (int k = 0; k < MARK_KINDS; k++) {
		if (!pl->kinds[k])
			continue;
		y += 18;
		marker(f, (enum plot_kind)k, x + 11, y - 4);
		fprintf(f, "/><text x=\"%.1f\" y=\"%.1f\">%s: %" PRIu64 "</text>\n", x + 30, y,
			kind_style[k].label, pl->kinds[k]);
	}
	if (pl->unmarked) {
		y += 18;
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">(the first %u marked, %" PRIu64
			   " more not)</text>\n", x + 30, y, PLOT_MAX_MARKS, pl->unmarked);
	}
	fprintf(f, "</g>\n");
}

int plot_write_svg(FILE *f, const struct plot *pl, const char *log_name,
		   const struct vpmm_stats *end)
{
	double ymax = 1;
	for (size_t i = 0; i < pl->npts; i++)
		if ((double)pl->pts[i].mapped > ymax)
			ymax = (double)pl->pts[i].mapped;
	if ((double)end->mapped_peak > ymax)
		ymax = (double)end->mapped_peak;
	struct frame fr;
	frame_for(&fr, pl->nops ? (double)pl->nops : 1, ymax);
	char a[32], b[32], c[32];

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		   "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
		   "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
		W, H, W, H);
	fprintf(f, "<title>vpmm-replay: ");
	xml_text(f, log_name);
	fprintf(f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
	fprintf(f, "<text x=\"%.1f\" y=\"28\" font-size=\"16\" font-weight=\"bold\">"
		   "vpmm-replay: ", X0);
	xml_text(f, log_name);
	fprintf(f, "</text>\n<text x=\"%.1f\" y=\"50\" font-size=\"12\">%" PRIu64
		   " operations; peak live %s, peak mapped %s; page %s</text>\n",
		X0, pl->nops, human((double)end->live_peak, a, sizeof(a)),
		human((double)end->mapped_peak, b, sizeof(b)),
		human((double)end->page_size, c, sizeof(c)));
	axes(f, &fr);
	series(f, &fr, pl, true, "mapped", "#d62728");
	series(f, &fr, pl, false, "live", "#1f77b4");
	marks(f, &fr, pl);
	legend(f, pl);
	fprintf(f, "</svg>\n");
	if (fflush(f) != 0 || ferror(f))
		return -(errno ? errno : EIO);
	return 0;
}
