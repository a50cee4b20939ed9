/* oom.c — what a refusal of the pool reports: one error line (rate limited),
 * and for PyTorch's allocator the text its exception carries. Both say
 * what was asked, what the pool holds, where its free memory lies and
 * what the device has left, read once at the refusal, so that the line
 * and the exception agree and a refusal walks the pool's regions once.
 *
 * Where the free memory lies (vpmm_free_split) answers "out of memory with
 * this much free": only wholly free handles move. It needs a copy of every
 * region, made only on a refusal that is reported; when the host cannot
 * make it, the reports leave the split out.
 *
 * May call: snapshot.h, devices.h (the pool of a device), process.h
 * (VPMM_LIMIT), resolve.h (the real cuMemGetInfo), streams.h (the device's
 * context, for a state read after the call), options.h (sizes as text),
 * the log.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "devices.h"
#include "oom.h"
#include "process.h"
#include "resolve.h"
#include "shim.h"
#include "snapshot.h"
#include "streams.h"

struct oom_state {
	bool known;              /* read at a refusal, not yet described */
	int dev;
	size_t size;             /* the request refused */
	struct vpmm_stats ps;
	struct vpmm_free_split fs;
	bool split_known;        /* fs read (the copy of the regions was made) */
	size_t dev_free, dev_total;
	bool dev_known;          /* the driver answered cuMemGetInfo */
};

/* This thread's last refusal through PyTorch's allocator, until described
 * or forgotten: torch.c ends every failed call with one or the other, so a
 * state found at a failure is that call's. */
static __thread struct oom_state last_refusal;

static void read_state(vpmm_pool *pool, int dev, size_t size, struct oom_state *o)
{
	struct vpmm_snapshot sn;
	memset(o, 0, sizeof *o);
	o->dev = dev;
	o->size = size;
	if (vpmm_pool_snapshot(pool, &sn) == 0) {
		o->ps = sn.stats;
		o->fs = sn.free_split;
		o->split_known = true;
		vpmm_snapshot_free(&sn);
	} else {
		vpmm_pool_stats(pool, &o->ps);
	}
	o->dev_known = vpmm_real.mem_get_info &&
		       vpmm_real.mem_get_info(&o->dev_free, &o->dev_total) == CUDA_SUCCESS;
	o->known = true;
}

/* The one line: the pool already tried everything it could (waited for
 * every stream's frees, remapped, returned empty slabs). */
static void log_line(struct vpmm_log_limit *limit, uint64_t take, const struct oom_state *o)
{
	char more[96] = "", limit_s[64] = "", split_s[160] = "", dev_s[64];
	if (take > 1)
		snprintf(more, sizeof more, " (and %" PRIu64 " more since the last such line)",
			 take - 1);
	else if (atomic_load_explicit(&limit->seen, memory_order_relaxed) == VPMM_LOG_BURST)
		snprintf(more, sizeof more, " (more: one line a second, with their count)");
	if (vpmm_process_config()->limit)
		snprintf(limit_s, sizeof limit_s, ", VPMM_LIMIT %zu", vpmm_process_config()->limit);
	if (o->ps.reusable && o->split_known)
		snprintf(split_s, sizeof split_s,
			 " (%" PRIu64 " in %" PRIu64 " wholly free handles, %" PRIu64
			 " stranded in %" PRIu64 " partly live ones, largest free region %" PRIu64 ")",
			 o->fs.whole, o->fs.whole_handles, o->fs.stranded, o->fs.stranded_handles,
			 o->fs.largest);
	if (o->dev_known)
		snprintf(dev_s, sizeof dev_s, "device free %zu of %zu", o->dev_free, o->dev_total);
	else
		snprintf(dev_s, sizeof dev_s, "device free unknown");
	vpmm_log_limited(limit, VPMM_LOG_ERROR,
			 "device %d: out of memory: requested %zu bytes; live %" PRIu64
			 ", mapped %" PRIu64 ", reusable %" PRIu64 "%s, %s%s%s",
			 o->dev, o->size, o->ps.live, o->ps.mapped, o->ps.reusable, split_s, dev_s,
			 limit_s, more);
}

void vpmm_oom_refused(vpmm_pool *pool, int dev, size_t size, bool for_torch)
{
	static struct vpmm_log_limit limit;
	uint64_t take = 0;
	if (vpmm_log_on(VPMM_LOG_ERROR))
		take = vpmm_log_limit_take(&limit);
	if (!take && !for_torch)
		return;
	struct oom_state o;
	read_state(pool, dev, size, &o);
	if (take)
		log_line(&limit, take, &o);
	if (for_torch)
		last_refusal = o;
}

void vpmm_oom_forget(void)
{
	last_refusal.known = false;
}

void vpmm_oom_describe(int dev, size_t size, char *buf, size_t n)
{
	struct oom_state o;
	char a[32], b[32], c[32];
	int k;
	/* The pool's refusal of this very request; else (the driver's own
	 * allocator refused a call the pool did not serve) the pool as it is,
	 * read in the device's context. */
	bool refused = last_refusal.known && last_refusal.dev == dev && last_refusal.size == size;
	if (refused)
		o = last_refusal;
	last_refusal.known = false;
	if (!n)
		return;
	buf[0] = '\0';
	if (!refused) {
		struct vpmm_ctx_scope sc = {false};
		vpmm_pool *pool = vpmm_device_pool(dev, NULL);
		if (!pool || vpmm_enter_device(dev, &sc) != CUDA_SUCCESS)
			return;
		read_state(pool, dev, size, &o);
		vpmm_leave(&sc);
	}
	k = snprintf(buf, n, "; the pool holds %s live and %s reusable",
		     vpmm_size_human(o.ps.live, a, sizeof a), vpmm_size_human(o.ps.reusable, b, sizeof b));
	if (k > 0 && (size_t)k < n && o.ps.reusable && o.split_known)
		k += snprintf(buf + k, n - (size_t)k,
			      " (%s in wholly free handles, %s stranded in handles that also "
			      "hold live memory; the largest free region %s)",
			      vpmm_size_human(o.fs.whole, a, sizeof a), vpmm_size_human(o.fs.stranded, b, sizeof b),
			      vpmm_size_human(o.fs.largest, c, sizeof c));
	if (k > 0 && (size_t)k < n && o.dev_known)
		snprintf(buf + k, n - (size_t)k, "; the device has %s free of %s",
			 vpmm_size_human(o.dev_free, a, sizeof a), vpmm_size_human(o.dev_total, b, sizeof b));
}
