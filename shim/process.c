/* process.c — the shim's process state: the options, read once on first
 * use, the cuda driver layer built over the real entry points, and the
 * observers started with it (vpmm-dump's socket server, the VPMM_TRACE
 * recorder).
 *
 * Owns: vpmm_active() (whether the shim routes anything), the pool options
 * every device's pool is made with, the driver layer, the teardown flag and
 * the recursion guard vpmm_tls_inside. The VPMM_* variables themselves are
 * parsed by allocator/options.c, whose one table names every variable (the
 * pool's and the process's), so that a misspelling of either is caught and
 * the documentation lists them together.
 * May call: resolve.h, devices.h (the server's view of the pools), fork.h,
 * server.h, trace.h, ipc.h (the server's ipc requests), live_streams.h
 * (the fences' wrappers on the driver layer), the public API's
 * vpmm_shim_trim.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h> /* environ */

#include "devices.h"
#include "fork.h"
#include "ipc.h"
#include "live_streams.h"
#include "process.h"
#include "resolve.h"
#include "server.h"
#include "shim.h"
#include "trace.h"

static struct {
	pthread_mutex_t lock;
	atomic_int ready;      /* options read and setup done (active or not) */
	bool active;
	atomic_bool torn_down; /* the driver said DEINITIALIZED */
	struct vpmm_config cfg;
	bool sync_device;      /* VPMM_SYNC_FREE=device */
	vpmm_driver *drv;
} st = {.lock = PTHREAD_MUTEX_INITIALIZER};

__thread int vpmm_tls_inside;

/* ---- setup ------------------------------------------------------------------ */

static const char *env_get(const char *name)
{
	return getenv(name);
}

static void warn_misspelled(const char *given, const char *meant, void *arg)
{
	(void)arg;
	vpmm_log(VPMM_LOG_WARN, "%s is not a libvpmm variable and does nothing: %s?", given,
		 meant);
}

/* ---- vpmm-dump's server and the trace ------------------------------------------ */

/* The server's view of the pools (any thread; pools are never destroyed). */
static size_t server_pools(vpmm_pool **out, size_t cap, void *arg)
{
	size_t n = 0;
	int ndev = vpmm_device_count();
	for (int i = 0; i < ndev && n < cap; i++) {
		vpmm_pool *p = vpmm_device_pool(i, NULL);
		if (p)
			out[n++] = p;
	}
	return n;
}

static int server_trim(uint64_t keep, uint64_t *released, void *arg)
{
	long long n = vpmm_shim_trim(-1, keep > SIZE_MAX ? SIZE_MAX : (size_t)keep, 0);
	*released = n > 0 ? (uint64_t)n : 0;
	return n < 0 ? (int)n : 0;
}

static void start_observers(const struct vpmm_env_options *o)
{
	if (o->trace[0]) {
		int e = vpmm_trace_open(o->trace);
		if (e)
			vpmm_log(VPMM_LOG_ERROR, "VPMM_TRACE=%s: %s: not tracing", o->trace,
				 vpmm_trace_strerror(e));
	}
	struct vpmm_server_config sc = {
		.socket = o->socket_off ? "off" : o->socket,
		.pools = server_pools,
		.env = o,
		.trim = server_trim,
		.trace_start = vpmm_trace_open,
		.trace_strerror = vpmm_trace_strerror,
		.trace_stop = vpmm_trace_close,
		.trace_flush = vpmm_trace_flush,
		.trace_status = vpmm_trace_status,
		.ipc = vpmm_ipc_serve,
		.tick = vpmm_ipc_tick,
	};
	vpmm_server_start(&sc); /* says why on stderr if it cannot serve */
}

/* Reads the options and builds the driver layer; st.active says whether it
 * all worked. Every way out before the end leaves the shim passing through. */
static void setup_locked(void)
{
	char err[256] = "";
	struct vpmm_env_options o;
	CUresult r;

	vpmm_env_options_default(&o);
	if (vpmm_env_options_from_env(&o, env_get, err, sizeof err))
		goto bad_option;
	vpmm_log_shown = (int)o.log_level;
	vpmm_options_misspelled(environ, warn_misspelled, NULL);
	if (o.disable) {
		VPMM_LOGF(VPMM_LOG_INFO, "VPMM_DISABLE is set: passing everything through");
		return;
	}
	vpmm_config_default(&st.cfg);
	if (vpmm_config_from_env(&st.cfg, env_get, err, sizeof err))
		goto bad_option;
	/* In a program, zombies are unmapped and memory beyond the release
	 * threshold given back by the pool's own thread, off the callers'. */
	st.cfg.background = true;
	st.cfg.release = o.has_release_threshold;
	st.cfg.release_threshold = o.release_threshold;
	st.sync_device = o.sync_free == VPMM_SYNC_FREE_DEVICE;
	vpmm_resolve();
	if (!vpmm_real.libcuda)
		return; /* resolve.c said why */
	if (!vpmm_real.ctx_get_current || !vpmm_real.ctx_get_device ||
	    !vpmm_real.ctx_synchronize || !vpmm_real.ctx_push || !vpmm_real.ctx_pop ||
	    !vpmm_real.stream_is_capturing || !vpmm_real.stream_synchronize) {
		vpmm_log(VPMM_LOG_WARN, "libcuda lacks context or stream entry points: passing everything through");
		return;
	}
	r = vpmm_driver_cuda_create(vpmm_real_entry, NULL, &st.drv);
	if (r != CUDA_SUCCESS) {
		vpmm_log(VPMM_LOG_WARN, "libcuda lacks the virtual memory entry points (CUresult %d): passing everything through",
			 (int)r);
		return;
	}
	vpmm_fence_wrap_driver(st.drv);
	vpmm_fork_watch();
	st.active = true;
	start_observers(&o);
	VPMM_LOGF(VPMM_LOG_INFO, "active (driver version %d, log level %s)",
		  vpmm_real.driver_version, vpmm_log_level_name(o.log_level));
	return;

bad_option:
	vpmm_log(VPMM_LOG_ERROR, "%s; passing everything through", err);
}

bool vpmm_active(void)
{
	if (atomic_load_explicit(&st.ready, memory_order_acquire))
		return st.active;
	pthread_mutex_lock(&st.lock);
	if (!atomic_load_explicit(&st.ready, memory_order_relaxed)) {
		setup_locked();
		atomic_store_explicit(&st.ready, 1, memory_order_release);
	}
	pthread_mutex_unlock(&st.lock);
	return st.active;
}

vpmm_driver *vpmm_process_driver(void)
{
	return vpmm_active() ? st.drv : NULL;
}

const struct vpmm_config *vpmm_process_config(void)
{
	return &st.cfg;
}

bool vpmm_process_sync_device(void)
{
	return st.sync_device;
}

bool vpmm_torn_down(void)
{
	return atomic_load_explicit(&st.torn_down, memory_order_relaxed);
}

void vpmm_set_torn_down(void)
{
	atomic_store(&st.torn_down, true);
}

void vpmm_process_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	st.lock = fresh;
	st.drv = NULL;
	st.active = false;
	atomic_store(&st.torn_down, false);
	atomic_store(&st.ready, 0);
}
