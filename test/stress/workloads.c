/* workloads.c — the allocation scripts of workloads.h. Each generator
 * calls give() and take(); give() refuses (returns id 0) what would pass the
 * budget, and take(0) does nothing, so that a generator never has to count.
 */
#include "workloads.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct gen {
	const struct wl_params *wp;
	struct script *s;
	uint64_t rng;
	uint8_t *stream_of; /* [id] */
	size_t cap_ids;
	bool oom;
};

static uint64_t rnd(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double unif(struct gen *g)
{
	return (double)(rnd(&g->rng) >> 11) / 9007199254740992.0;
}

static size_t below(struct gen *g, size_t n)
{
	return n ? (size_t)(rnd(&g->rng) % n) : 0;
}

/* lo..hi units, log-uniform, in bytes (not a multiple of anything). */
static size_t logu(struct gen *g, double lo, double hi)
{
	double u = exp(log(lo) + unif(g) * (log(hi) - log(lo)));
	size_t b = (size_t)(u * (double)g->wp->unit);
	return b ? b : 1;
}

static size_t units(struct gen *g, double n)
{
	size_t b = (size_t)(n * (double)g->wp->unit);
	return b ? b : 1;
}

static bool full(const struct gen *g)
{
	return g->oom || g->s->n >= g->wp->max_ops;
}

/* Whether another round of a generator's loop is due: not full, and the
 * last one added something (the budget may refuse everything). */
static bool again(const struct gen *g, size_t *before)
{
	bool moved = g->s->n != *before;
	*before = g->s->n;
	return !full(g) && moved;
}

static bool push(struct gen *g, struct op o)
{
	struct script *s = g->s;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 1024;
		struct op *n = realloc(s->ops, cap * sizeof(*n));
		if (!n) {
			g->oom = true;
			return false;
		}
		s->ops = n;
		s->cap = cap;
	}
	s->ops[s->n++] = o;
	return true;
}

static unsigned pick_stream(struct gen *g, unsigned stream)
{
	if (g->wp->sync_permille && below(g, 1000) < g->wp->sync_permille)
		return W_NO_STREAM;
	return stream % g->wp->nstreams;
}

/* A new allocation of `size` bytes on `stream`: its id, or 0 when it would
 * pass the budget (or the script is long enough). */
static uint32_t give(struct gen *g, size_t size, unsigned stream)
{
	struct script *s = g->s;
	if (full(g) || s->live + size > g->wp->budget)
		return 0;
	if (s->nids + 1 >= g->cap_ids) {
		size_t cap = g->cap_ids ? 2 * g->cap_ids : 1024;
		size_t *sz = realloc(s->sizes, cap * sizeof(*sz));
		if (sz)
			s->sizes = sz;
		uint8_t *so = sz ? realloc(g->stream_of, cap) : NULL;
		if (!so) {
			g->oom = true;
			return 0;
		}
		g->stream_of = so;
		g->cap_ids = cap;
	}
	uint32_t id = s->nids + 1;
	unsigned st = pick_stream(g, stream);
	if (!push(g, (struct op){.id = id, .alloc = 1, .stream = (uint8_t)st, .size = size}))
		return 0;
	s->nids = id;
	s->sizes[id] = size;
	g->stream_of[id] = (uint8_t)(st == W_NO_STREAM ? stream % g->wp->nstreams : st);
	s->live += size;
	if (s->live > s->peak)
		s->peak = s->live;
	return id;
}

static void take(struct gen *g, uint32_t id)
{
	if (!id)
		return;
	unsigned st = g->stream_of[id];
	if (g->wp->nstreams > 1 && g->wp->cross_permille &&
	    below(g, 1000) < g->wp->cross_permille)
		st = (st + 1 + (unsigned)below(g, g->wp->nstreams - 1)) % g->wp->nstreams;
	st = pick_stream(g, st);
	if (push(g, (struct op){.id = id, .alloc = 0, .stream = (uint8_t)st}))
		g->s->live -= g->s->sizes[id];
}

/* ---- LLM serving ------------------------------------------------------------ */

static void llm(struct gen *g)
{
	enum { MAXREQ = 64, LAYERS = 4 };
	uint32_t weights[12], kv[MAXREQ];
	int left[MAXREQ], nreq = 0;
	size_t budget = g->wp->budget;
	size_t before = SIZE_MAX;
	for (int i = 0; i < 12; i++)
		weights[i] = give(g, logu(g, 1, 48), 0);
	while (again(g, &before)) {
		for (int i = 0; i < nreq;)
			if (--left[i] <= 0) {
				take(g, kv[i]);
				kv[i] = kv[--nreq];
				left[i] = left[nreq];
			} else {
				i++;
			}
		size_t longest = 0;
		for (int k = (int)below(g, 4); k > 0 && nreq < MAXREQ; k--) {
			size_t n = logu(g, 1, 64);
			if (g->s->live + n > budget / 2)
				break;
			kv[nreq] = give(g, n, 0);
			left[nreq++] = 4 + (int)below(g, 100);
			if (n > longest)
				longest = n;
		}
		if (longest) { /* prefill of the batch, layer by layer */
			double t = (double)longest / (double)g->wp->unit;
			uint32_t resid = give(g, units(g, t), 0);
			for (int l = 0; l < LAYERS; l++) {
				uint32_t x = give(g, units(g, t), 0);
				uint32_t qkv = give(g, units(g, 1.5 * t), 0);
				take(g, x);
				uint32_t att = give(g, units(g, t), 0);
				take(g, qkv);
				uint32_t gu = give(g, units(g, 2.75 * t), 0);
				uint32_t up = give(g, units(g, 2.75 * t), 0);
				take(g, att);
				uint32_t a = give(g, units(g, 2.75 * t), 0);
				take(g, gu);
				take(g, up);
				uint32_t d = give(g, units(g, t), 0);
				take(g, a);
				take(g, d);
			}
			uint32_t logits = give(g, logu(g, 1, 16), 0);
			take(g, resid);
			take(g, logits);
		}
		if (nreq) { /* decode: small buffers, some under a page */
			uint32_t b[4];
			for (int i = 0; i < 4; i++)
				b[i] = give(g, logu(g, 0.01, 2) * (size_t)(1 + nreq / 16), 0);
			for (int i = 4; i-- > 0;)
				take(g, b[i]);
		}
	}
	for (int i = 0; i < nreq; i++)
		take(g, kv[i]);
	for (int i = 0; i < 12; i++)
		take(g, weights[i]);
}

/* ---- training with a new sequence length every iteration --------------------- */

static void training(struct gen *g)
{
	enum { LAYERS = 6, W = 1 + 3 * LAYERS };
	uint32_t w[W], grads[W] = {0}, saved[4 * LAYERS + 1];
	double wsize[W], total = 0;
	bool have_grads = false;
	for (int i = 0; i < W; i++) {
		wsize[i] = i ? 1 + (double)below(g, 6) : 8;
		total += wsize[i];
		w[i] = give(g, units(g, wsize[i]), 0);
	}
	size_t before = SIZE_MAX;
	while (again(g, &before)) {
		double s = (double)(1 + below(g, 4)) * (0.5 + 0.5 * (double)below(g, 4));
		int n = 0;
		saved[n++] = give(g, units(g, s), 0);
		for (int l = 0; l < LAYERS; l++) {
			saved[n++] = give(g, units(g, s), 0);
			saved[n++] = give(g, units(g, 3 * s), 0);
			uint32_t lse = give(g, logu(g, 0.02, 0.3), 0); /* small */
			saved[n++] = give(g, units(g, s), 0);
			saved[n++] = give(g, units(g, 2.75 * s), 0);
			take(g, lse);
		}
		uint32_t logits = give(g, units(g, 8 * s), 0);
		uint32_t dlogits = give(g, units(g, 8 * s), 0);
		take(g, logits);
		uint32_t dx = give(g, units(g, s), 0);
		take(g, dlogits);
		for (int l = LAYERS; l-- > 0;) {
			for (int k = 1 + 3 * l; !have_grads && k < 4 + 3 * l; k++)
				grads[k] = give(g, units(g, wsize[k]), 0);
			uint32_t da = give(g, units(g, 2.75 * s), 0);
			uint32_t dg = give(g, units(g, 2.75 * s), 0);
			take(g, da);
			uint32_t ndx = give(g, units(g, s), 0);
			take(g, dg);
			for (int k = 0; k < 4; k++)
				take(g, saved[--n]);
			take(g, dx);
			dx = ndx;
		}
		if (!have_grads)
			grads[0] = give(g, units(g, wsize[0]), 0);
		have_grads = true;
		take(g, dx);
		take(g, saved[--n]);
		uint32_t scratch = give(g, units(g, total / 2), 0);
		take(g, scratch);
	}
	for (int i = W; i-- > 0;) {
		take(g, grads[i]);
		take(g, w[i]);
	}
}

/* ---- mixture of experts ----------------------------------------------------- */

static void moe(struct gen *g)
{
	enum { EXPERTS = 8, LAYERS = 4 };
	uint32_t w[LAYERS * (EXPERTS + 1)], kept[LAYERS];
	int nw = 0;
	for (int l = 0; l < LAYERS; l++) {
		w[nw++] = give(g, units(g, 4), 0);
		for (int e = 0; e < EXPERTS; e++)
			w[nw++] = give(g, units(g, 1 + (double)below(g, 3)), 0);
	}
	size_t before = SIZE_MAX;
	while (again(g, &before)) {
		double tokens = (double)(1 + below(g, 4)) * 2;
		for (int l = 0; l < LAYERS; l++) {
			uint32_t x = give(g, units(g, tokens), 0);
			uint32_t scores = give(g, logu(g, 0.05, 0.5), 0);
			double wt[EXPERTS], sum = 0;
			for (int e = 0; e < EXPERTS; e++) {
				/* skewed: a few experts take most tokens */
				double u = unif(g);
				wt[e] = u * u * u + 0.001;
				sum += wt[e];
			}
			uint32_t outs[EXPERTS];
			int no = 0;
			for (int e = 0; e < EXPERTS; e++) {
				double n = 2 * tokens * wt[e] / sum;
				if (n < 0.01)
					continue;
				uint32_t in = give(g, units(g, n), e);
				uint32_t h = give(g, units(g, 2.75 * n), e);
				take(g, in);
				uint32_t a = give(g, units(g, 1.4 * n), e);
				take(g, h);
				outs[no++] = give(g, units(g, n), e);
				take(g, a);
			}
			kept[l] = give(g, units(g, tokens), 0);
			while (no)
				take(g, outs[--no]);
			take(g, scores);
			take(g, x);
		}
		for (int l = LAYERS; l-- > 0;)
			take(g, kept[l]);
	}
	while (nw)
		take(g, w[--nw]);
}

/* ---- scratch on several streams ----------------------------------------------- */

static void scratch(struct gen *g)
{
	enum { Q = 64 };
	unsigned ns = g->wp->nstreams;
	uint32_t q[8][Q];
	int life[8][Q], n[8] = {0}, misses = 0;
	size_t budget = g->wp->budget;
	double top = (double)budget / (double)g->wp->unit / 4;
	if (top > 512)
		top = 512;
	while (!full(g)) {
		unsigned s = (unsigned)below(g, ns);
		for (int i = 0; i < n[s];)
			if (--life[s][i] <= 0) {
				take(g, q[s][i]);
				q[s][i] = q[s][--n[s]];
				life[s][i] = life[s][n[s]];
			} else {
				i++;
			}
		size_t size = below(g, 100) < 3 ? units(g, 2 * top) : logu(g, 1, top);
		while (g->s->live + size > budget) { /* the busiest stream drains its oldest */
			unsigned v = 0;
			for (unsigned k = 1; k < ns; k++)
				if (n[k] > n[v])
					v = k;
			if (!n[v])
				break;
			take(g, q[v][0]);
			memmove(&q[v][0], &q[v][1], (size_t)(n[v] - 1) * sizeof(q[v][0]));
			memmove(&life[v][0], &life[v][1], (size_t)(n[v] - 1) * sizeof(life[v][0]));
			n[v]--;
		}
		if (n[s] == Q) {
			take(g, q[s][0]);
			q[s][0] = q[s][--n[s]];
			life[s][0] = life[s][n[s]];
		}
		uint32_t id = give(g, size, s);
		if (!id && ++misses > 1000)
			break; /* nothing fits any more */
		if (!id)
			continue;
		misses = 0;
		q[s][n[s]] = id;
		life[s][n[s]++] = below(g, 50) == 0 ? 400 : 1 + (int)(-6 * log(1 - unif(g)));
	}
	for (unsigned s = 0; s < ns; s++)
		while (n[s])
			take(g, q[s][--n[s]]);
}

/* ---- the scripts -------------------------------------------------------------- */

const char *workload_name(enum workload w)
{
	static const char *const names[W_COUNT] = {"llm_serving", "training_varlen", "moe",
						   "scratch_streams"};
	return (unsigned)w < W_COUNT ? names[w] : "?";
}

int workload_make(const struct wl_params *wp, struct script *out)
{
	struct gen g = {.wp = wp, .s = out, .rng = wp->seed};
	memset(out, 0, sizeof(*out));
	switch (wp->kind) {
	case W_LLM: llm(&g); break;
	case W_TRAINING: training(&g); break;
	case W_MOE: moe(&g); break;
	default: scratch(&g); break;
	}
	free(g.stream_of);
	if (g.oom || out->live) { /* out->live: a generator left something live */
		script_free(out);
		return -1;
	}
	return 0;
}

void script_free(struct script *s)
{
	free(s->ops);
	free(s->sizes);
	memset(s, 0, sizeof(*s));
}

size_t script_peak(const struct script *s, size_t (*round)(size_t, void *), void *arg)
{
	size_t live = 0, peak = 0;
	for (size_t i = 0; i < s->n; i++) {
		size_t b = round(s->sizes[s->ops[i].id], arg);
		if (s->ops[i].alloc) {
			live += b;
			if (live > peak)
				peak = live;
		} else {
			live -= b;
		}
	}
	return peak;
}
