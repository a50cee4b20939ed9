/* api.c — the library's own exported API, declared in the public
 * vpmm/vpmm.h (which says what each function promises): vpmm_version and
 * the vpmm_shim_* calls (whether the shim is active, a pool's stats, check,
 * layout, trim, the socket served, the hook counts).
 *
 * Owns: nothing but these entry points. May call: devices.h (the pools),
 * process.h, server.h, the counters, resolve.h (a trim waits for the
 * context's work).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "devices.h"
#include "process.h"
#include "resolve.h"
#include "server.h"
#include "shim.h"

/* ---- trim ------------------------------------------------------------------------ */

/* Trims the pool of `dev` in its own context: the bytes released, or a
 * negative errno. `wait`: the context's work completes first, and every
 * free that waited on it settles. */
static long long trim_one(int dev, size_t keep, bool wait)
{
	vpmm_pool *p = vpmm_device_pool(dev, NULL);
	bool pushed = false;
	if (!p)
		return -ENODEV;
	/* trimming closes streams' epochs: events of the pool's context */
	CUresult r = vpmm_push_pool_ctx(dev, &pushed);
	long long n = -EIO;
	if (r == CUDA_SUCCESS) {
		if (wait) {
			vpmm_pool_poll(p, true);
			if (vpmm_real.ctx_synchronize() == CUDA_SUCCESS)
				vpmm_pool_poll(p, false);
		}
		n = vpmm_pool_trim(p, keep);
	}
	vpmm_pop_ctx(pushed);
	return n;
}

long long vpmm_shim_trim(int device, size_t keep, unsigned flags)
{
	int ndev = vpmm_device_count();
	bool wait = flags & VPMM_TRIM_WAIT;
	long long sum = 0;
	if (flags & ~VPMM_TRIM_WAIT)
		return -EINVAL;
	if (device >= 0)
		return trim_one(device, keep, wait);
	for (int i = 0; i < ndev; i++) {
		long long n = trim_one(i, keep, wait);
		if (n == -ENODEV)
			continue;
		if (n < 0)
			return n;
		sum += n;
	}
	return sum;
}

/* ---- the rest ------------------------------------------------------------------- */

/* Declared in vpmm/vpmm.h, which says what each one promises. */

const char *vpmm_version(void)
{
	return VPMM_VERSION;
}

/* 1 when allocations go to the pool, 0 when everything passes through. */
int vpmm_shim_active(void)
{
	return vpmm_active();
}

/* The stats of `device`'s pool: 0, or -ENODEV when it has none (yet). */
int vpmm_shim_stats(int device, struct vpmm_stats *out)
{
	vpmm_pool *p = vpmm_device_pool(device, NULL);
	if (!out)
		return -EINVAL;
	if (!p)
		return -ENODEV;
	vpmm_pool_stats(p, out);
	return 0;
}

/* vpmm_pool_check() of the device's pool: the number of broken invariants
 * (each written to log, which may be NULL), or -ENODEV without a pool. */
long vpmm_shim_check(int device, FILE *log)
{
	vpmm_pool *p = vpmm_device_pool(device, NULL);
	return p ? (long)vpmm_pool_check(p, log) : -ENODEV;
}

/* The stats as one JSON object; returns the length it needed (snprintf-like)
 * or a negative errno. */
long vpmm_shim_stats_json(int device, char *buf, size_t len)
{
	struct vpmm_stats s;
	char *text = NULL;
	size_t n = 0;
	FILE *f;
	int e = vpmm_shim_stats(device, &s);
	if (e)
		return e;
	f = open_memstream(&text, &n);
	if (!f)
		return -ENOMEM;
	vpmm_stats_print(&s, f, true);
	if (fclose(f) || !text) {
		free(text);
		return -ENOMEM;
	}
	while (n && text[n - 1] == '\n')
		text[--n] = '\0';
	if (buf && len)
		snprintf(buf, len, "%s", text);
	free(text);
	return (long)n;
}

/* The region map of `device`'s pool (vpmm_pool_layout's format). */
long vpmm_shim_layout(int device, char *buf, size_t len, size_t unit)
{
	vpmm_pool *p = vpmm_device_pool(device, NULL);
	if (!p)
		return -ENODEV;
	return (long)vpmm_pool_layout(p, buf, len, unit);
}

const char *vpmm_shim_socket(void)
{
	return vpmm_server_socket();
}

/* How often a hook (or counter: "pool_malloc", "passthrough", ...) ran;
 * ULLONG_MAX for a name that is none. */
unsigned long long vpmm_shim_hook_calls(const char *name)
{
	return vpmm_count_total(name);
}
