/* ipc_export.c — cudaIpc* on pool memory, between processes that both run
 * the shim: the owner's side. The opener's side is ipc_import.c.
 *
 * Owns: the owner's table of exported allocations (who has them open, frees
 * deferred while they do), cuIpcGetMemHandle on pool memory, the owner's
 * side of the ipc-* socket requests and its tick, and the forked child's
 * fresh start of both sides.
 *
 * Why not the driver's own IPC: cuIpcGetMemHandle refuses memory made with
 * the VMM API (docs/cuda.md). What the VMM API shares is a physical
 * handle, as a file descriptor, and a descriptor crosses processes only over
 * a Unix socket (SCM_RIGHTS). So the 64-byte handle names the owner's pid,
 * an export id and a random token; the opener asks the owner's vpmm socket
 * (the one vpmm-dump uses) for the descriptors of the handles under the
 * allocation, maps them whole in a reservation of its own and returns the
 * allocation's address inside it.
 *
 * Keeping pages alive: the driver keeps imported memory alive while the
 * opener maps it, but the owner's pool would hand a freed allocation's pages
 * to its next malloc. So a free of an allocation that is open elsewhere is
 * deferred (an event records where the free's stream was) until the last
 * opener closes it or exits; the pool then frees it as settled memory.
 *
 * Pointers the pool does not own pass through to the driver both ways; a
 * handle of ours opened without the shim fails in the driver (it is no
 * handle the driver made), one opened with the shim off fails here, with a
 * log line saying why.
 *
 * May call: devices.h, alloc.h (what is live), process.h, resolve.h,
 * server.h (the socket served), live_streams.h (the fence of a deferred
 * free), ipc_import.c (ipc_int.h), the log.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "alloc.h"
#include "devices.h"
#include "ipc.h"
#include "ipc_int.h"
#include "live_streams.h"
#include "process.h"
#include "protocol.h"
#include "resolve.h"
#include "server.h"
#include "shim.h"

/* ---- the owner's table ---------------------------------------------------------- */

struct opener {
	long pid;
	unsigned opens; /* > 0 */
	struct opener *next;
};

struct export {
	uint64_t id;
	int device;
	CUdeviceptr base;
	size_t size;
	struct opener *openers;
	/* The program freed it while open elsewhere: the pool frees it once
	 * no opener is left, after `ev` (recorded on the free's stream; NULL
	 * for a synchronous free) completed. */
	bool freed;
	CUevent ev;
	struct export *next;
};

#define EXPORT_BUCKETS 256

static struct {
	pthread_mutex_t lock; /* guards everything below; no driver call or
			       * socket I/O is made while holding it */
	struct export *bucket[EXPORT_BUCKETS]; /* by base */
	uint64_t next_id;
	uint64_t token;
} own = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Exports alive: a free looks at the table only when there is any. */
static atomic_uint nexports;

static unsigned bucket_of(CUdeviceptr base)
{
	return (unsigned)((base >> 9) * 0x9E3779B97F4A7C15ull >> 56) % EXPORT_BUCKETS;
}

/* own.lock held. At most one export of a base is live (not freed); freed
 * ones stay until their last opener closes. */
static struct export *export_by_base(CUdeviceptr base, int device, bool freed)
{
	for (struct export *e = own.bucket[bucket_of(base)]; e; e = e->next)
		if (e->base == base && e->device == device && e->freed == freed)
			return e;
	return NULL;
}

static struct export *export_by_id(uint64_t id)
{
	for (unsigned b = 0; b < EXPORT_BUCKETS; b++)
		for (struct export *e = own.bucket[b]; e; e = e->next)
			if (e->id == id)
				return e;
	return NULL;
}

static void export_unlink(struct export *e)
{
	for (struct export **l = &own.bucket[bucket_of(e->base)]; *l; l = &(*l)->next)
		if (*l == e) {
			*l = e->next;
			atomic_fetch_sub(&nexports, 1);
			return;
		}
}

static struct opener **opener_link(struct export *e, long pid)
{
	struct opener **l = &e->openers;
	while (*l && (*l)->pid != pid)
		l = &(*l)->next;
	return l;
}

/* Deferred frees whose openers are gone, waiting for their event (tick
 * polls them: the server thread never blocks on the device). own.lock. */
static struct export *finishing;

/* The deferred free, now that nobody has the allocation open: on the
 * server's thread, in the pool's context, once the free's stream reached
 * the free. Returns false (and changes nothing) while that work runs. */
static bool try_finish(struct export *e)
{
	vpmm_driver *drv = vpmm_process_driver();
	vpmm_pool *pool = vpmm_device_pool(e->device, NULL);
	bool pushed = false;
	if (!pool || !drv) {
		free(e);
		return true;
	}
	if (vpmm_push_pool_ctx(e->device, &pushed) != CUDA_SUCCESS)
		return false;
	if (e->ev) {
		CUresult r = drv->event_query(drv, e->ev);
		if (r == CUDA_ERROR_NOT_READY) {
			vpmm_pop_ctx(pushed);
			return false;
		}
		drv->event_destroy(drv, e->ev);
	}
	vpmm_fence_freeing();
	int rc = vpmm_pool_free(pool, e->base, VPMM_NO_STREAM);
	vpmm_pop_ctx(pushed);
	VPMM_LOGF(VPMM_LOG_DEBUG, "ipc: %#llx freed after its last opener (%d)",
		  (unsigned long long)e->base, rc);
	free(e);
	return true;
}

static void finish_free(struct export *e)
{
	if (try_finish(e))
		return;
	pthread_mutex_lock(&own.lock);
	e->next = finishing;
	finishing = e;
	atomic_fetch_add(&nexports, 1); /* keeps the tick looking */
	pthread_mutex_unlock(&own.lock);
}

int vpmm_ipc_defer_free(int device, CUdeviceptr ptr, CUstream stream)
{
	if (!atomic_load_explicit(&nexports, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&own.lock);
	bool again = export_by_base(ptr, device, true) != NULL;
	for (struct export *f = finishing; f && !again; f = f->next)
		again = f->base == ptr && f->device == device;
	struct export *e = export_by_base(ptr, device, false);
	if (e && !e->openers) {
		export_unlink(e); /* a later handle names a new export */
		free(e);
		e = NULL;
	}
	pthread_mutex_unlock(&own.lock);
	if (again)
		return -1; /* freed already, kept only for its openers */
	if (!e)
		return 0;
	/* Where the free's stream is now, before the export says "freed": the
	 * pool must not hand the memory out before that work is done. Without
	 * an event, the CPU waits now: for the whole context where the free
	 * was on the legacy stream, whose order over the blocking streams
	 * holds through its actions only (a fenced free queues none). */
	vpmm_driver *drv = vpmm_process_driver();
	CUevent ev = NULL;
	if (stream != VPMM_NO_STREAM) {
		if (drv->event_create(drv, &ev) != CUDA_SUCCESS) {
			ev = NULL;
		} else if (drv->event_record(drv, ev, stream) != CUDA_SUCCESS) {
			drv->event_destroy(drv, ev);
			ev = NULL;
		}
		if (!ev && stream)
			vpmm_real.stream_synchronize(stream);
		else if (!ev)
			vpmm_real.ctx_synchronize();
	}
	/* Looked up again: the last opener may have closed meanwhile. */
	pthread_mutex_lock(&own.lock);
	e = export_by_base(ptr, device, false);
	bool deferred = e && e->openers;
	if (deferred) {
		e->ev = ev;
		e->freed = true;
	} else if (e) {
		export_unlink(e);
		free(e);
	}
	pthread_mutex_unlock(&own.lock);
	if (!deferred) {
		if (ev)
			drv->event_destroy(drv, ev);
		return 0;
	}
	VPMM_LOGF(VPMM_LOG_INFO, "ipc: %#llx freed while open in another process: kept until closed",
		  (unsigned long long)ptr);
	return 1;
}

/* A forked child: nothing of the parent's sharing is its own, and the
 * locks may have been held by threads the child does not have. */
static void ipc_atfork_child(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	own.lock = fresh;
	memset(own.bucket, 0, sizeof own.bucket); /* the parent's, left as they are */
	own.next_id = 0;
	own.token = 0;
	finishing = NULL;
	vpmm_ipc_imports_forget();
	atomic_store(&nexports, 0);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void install_atfork(void)
{
	pthread_atfork(NULL, NULL, ipc_atfork_child);
}

void vpmm_ipc_watch_fork(void)
{
	pthread_once(&atfork_once, install_atfork);
}

int vpmm_ipc_socket_path(char *buf, size_t n, long pid)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int m = vpmm_socket_dir(dir, sizeof dir, getenv("XDG_RUNTIME_DIR"),
				(unsigned long)geteuid());
	if (m < 0 || (size_t)m >= sizeof dir)
		return -ENAMETOOLONG;
	m = vpmm_socket_path(buf, n, dir, pid);
	return m < 0 || (size_t)m >= n ? -ENAMETOOLONG : 0;
}

/* Whether this process serves its socket at the default path, where
 * openers look for it (that path into want). */
static bool socket_at_default(char *want, size_t n)
{
	want[0] = '\0';
	return vpmm_ipc_socket_path(want, n, (long)getpid()) == 0 &&
	       strcmp(vpmm_server_socket(), want) == 0;
}

bool vpmm_ipc_exportable(CUdeviceptr ptr)
{
	char want[sizeof(((struct sockaddr_un *)0)->sun_path)];
	CUdeviceptr base;
	size_t size;
	int device = vpmm_owner_device(ptr);
	if (device < 0 || vpmm_find_live(ptr, &base, &size) != VPMM_POOL_LIVE ||
	    !socket_at_default(want, sizeof want))
		return false;
	/* freed by the program, kept only for other processes: refused */
	pthread_mutex_lock(&own.lock);
	bool gone = export_by_base(base, device, true) && !export_by_base(base, device, false);
	pthread_mutex_unlock(&own.lock);
	return !gone;
}

bool vpmm_ipc_get(CUipcMemHandle *handle, CUdeviceptr ptr, CUresult *res)
{
	if (vpmm_tls_inside || !vpmm_active())
		return false;
	int device = vpmm_owner_device(ptr);
	if (device < 0)
		return false; /* not ours: the driver's own IPC */
	CUdeviceptr base;
	size_t size;
	if (!handle || vpmm_find_live(ptr, &base, &size) != VPMM_POOL_LIVE) {
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	vpmm_ipc_watch_fork();
	char want[sizeof(((struct sockaddr_un *)0)->sun_path)];
	if (!socket_at_default(want, sizeof want)) {
		vpmm_log(VPMM_LOG_ERROR,
			 "cudaIpcGetMemHandle on pool memory needs this process's vpmm socket at %s (VPMM_SOCKET is off or elsewhere)",
			 want);
		*res = CUDA_ERROR_NOT_SUPPORTED;
		return true;
	}
	struct export *fresh = calloc(1, sizeof *fresh);
	pthread_mutex_lock(&own.lock);
	if (!own.token && getrandom(&own.token, sizeof own.token, 0) != sizeof own.token)
		own.token = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&own ^ 0x5bd1e995u;
	if (export_by_base(base, device, true) && !export_by_base(base, device, false)) {
		/* freed by the program, kept only for other processes */
		pthread_mutex_unlock(&own.lock);
		free(fresh);
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	struct export *e = export_by_base(base, device, false);
	if (!e && fresh) {
		e = fresh;
		fresh = NULL;
		e->id = ++own.next_id;
		e->device = device;
		e->base = base;
		e->size = size;
		unsigned b = bucket_of(base);
		e->next = own.bucket[b];
		own.bucket[b] = e;
		atomic_fetch_add(&nexports, 1);
	}
	struct ipc_wire w = {.magic = IPC_MAGIC, .token = own.token, .base = base, .size = size,
			     .pid = (int32_t)getpid(), .device = device};
	if (e)
		w.id = e->id;
	pthread_mutex_unlock(&own.lock);
	free(fresh);
	if (!e) {
		*res = CUDA_ERROR_OUT_OF_MEMORY;
		return true;
	}
	memcpy(handle, &w, sizeof w);
	*res = CUDA_SUCCESS;
	return true;
}

/* ---- the owner's requests (server thread) ---------------------------------------- */

static const char *serve_pieces(struct export *snapshot, size_t first, char *fields, size_t len,
				int *fds, unsigned *nfds, char *err, size_t errlen)
{
	vpmm_driver *drv = vpmm_process_driver();
	vpmm_pool *pool = vpmm_device_pool(snapshot->device, NULL);
	struct vpmm_piece pc[VPMM_IPC_MAX_FDS];
	struct vpmm_extent ext;
	bool pushed = false;
	if (!pool || !drv)
		return "the allocation's pool is gone";
	int n = vpmm_pool_pieces(pool, snapshot->base, first, pc, VPMM_IPC_MAX_FDS, &ext);
	if (n < 0 || ext.base != snapshot->base)
		return "the shared allocation is no longer live";
	vpmm_push_pool_ctx(snapshot->device, &pushed);
	for (int i = 0; i < n; i++) {
		CUresult r = drv->export_fd(drv, pc[i].handle, &fds[i]);
		if (r != CUDA_SUCCESS) {
			vpmm_pop_ctx(pushed);
			while (*nfds)
				close(fds[--*nfds]);
			snprintf(err, errlen,
				 "cannot export the pages (CUresult %d): the driver made them unshareable",
				 (int)r);
			return err;
		}
		++*nfds;
	}
	vpmm_pop_ctx(pushed);
	size_t at = (size_t)snprintf(fields, len,
				     ",\"offset\":%zu,\"size\":%zu,\"npieces\":%zu,\"first\":%zu,\"pieces\":[",
				     ext.offset, ext.size, ext.npieces, first);
	for (int i = 0; i < n && at < len; i++)
		at += (size_t)snprintf(fields + at, len - at, "%s%zu", i ? "," : "", pc[i].size);
	if (at < len)
		at += (size_t)snprintf(fields + at, len - at, "]");
	if (at >= len) {
		while (*nfds)
			close(fds[--*nfds]);
		return "reply too long";
	}
	return NULL;
}

/* Exactly `want` decimal numbers, one space apart, none past 2^64 - 1:
 * sscanf() took signs, junk after them and values that wrap. */
static bool numbers(const char *s, uint64_t *v, int want)
{
	for (int i = 0; i < want; i++) {
		if (i && *s++ != ' ')
			return false;
		if (vpmm_parse_digits(s, &v[i], &s) != 0)
			return false;
	}
	return *s == '\0';
}

const char *vpmm_ipc_serve(const char *request, const char *arg, long peer, char *fields,
			   size_t len, int *fds, unsigned *nfds)
{
	static char err[160];
	bool pieces = strcmp(request, "ipc-pieces") == 0;
	bool open = strcmp(request, "ipc-open") == 0;
	uint64_t v[3] = {0, 0, 0};
	if (!numbers(arg, v, pieces ? 3 : 2) || (pieces && v[2] > SIZE_MAX))
		return pieces ? "ipc-pieces takes ID TOKEN FIRST" : "takes ID TOKEN";
	uint64_t id = v[0], token = v[1];
	size_t first = (size_t)v[2];
	struct export snap, *done = NULL;
	const char *e = NULL;
	if (peer <= 0) /* another pid namespace: its exit could not be seen */
		return "the peer's process id is unknown here";
	pthread_mutex_lock(&own.lock);
	struct export *x = token == own.token ? export_by_id(id) : NULL;
	struct opener **l = x ? opener_link(x, peer) : NULL;
	if (!x || (open && x->freed)) {
		e = "no such shared allocation here (freed, or named by another process)";
	} else if (open) {
		if (!*l && (*l = calloc(1, sizeof **l)))
			(*l)->pid = peer;
		if (*l)
			(*l)->opens++;
		else
			e = "out of memory";
	} else if (!*l) {
		e = "this process has not opened that allocation";
	} else if (!pieces) { /* ipc-close */
		struct opener *o = *l;
		if (--o->opens == 0) {
			*l = o->next;
			free(o);
		}
		if (!x->openers && x->freed) {
			export_unlink(x);
			done = x;
		}
	}
	if (x)
		snap = *x;
	pthread_mutex_unlock(&own.lock);
	if (done)
		finish_free(done);
	if (e || (!open && !pieces))
		return e;
	e = serve_pieces(&snap, open ? 0 : first, fields, len, fds, nfds, err, sizeof err);
	if (e && open) { /* the open did not happen */
		pthread_mutex_lock(&own.lock);
		x = export_by_id(id);
		l = x ? opener_link(x, peer) : NULL;
		if (l && *l && --(*l)->opens == 0) {
			struct opener *o = *l;
			*l = o->next;
			free(o);
		}
		pthread_mutex_unlock(&own.lock);
	}
	return e;
}

/* Whether pid runs: a zombie (exited, not yet reaped by its parent, which
 * may be us) has unmapped everything already. */
static bool alive(long pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *close = strrchr(buf, ')');
	return !(close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
}

/* Openers that exited without closing close now; deferred frees whose
 * work completed finish. */
void vpmm_ipc_tick(void)
{
	if (!atomic_load_explicit(&nexports, memory_order_acquire))
		return;
	struct export *done = NULL;
	pthread_mutex_lock(&own.lock);
	struct export *waiting = finishing;
	finishing = NULL;
	for (struct export *x = waiting; x; x = x->next)
		atomic_fetch_sub(&nexports, 1);
	for (unsigned b = 0; b < EXPORT_BUCKETS; b++) {
		for (struct export **xl = &own.bucket[b]; *xl;) {
			struct export *x = *xl;
			for (struct opener **l = &x->openers; *l;) {
				if (!alive((*l)->pid)) {
					struct opener *o = *l;
					*l = o->next;
					free(o);
				} else {
					l = &(*l)->next;
				}
			}
			if (x->freed && !x->openers) {
				*xl = x->next;
				atomic_fetch_sub(&nexports, 1);
				x->next = done;
				done = x;
			} else {
				xl = &x->next;
			}
		}
	}
	pthread_mutex_unlock(&own.lock);
	while (waiting) {
		struct export *x = waiting;
		waiting = x->next;
		finish_free(x);
	}
	while (done) {
		struct export *x = done;
		done = x->next;
		finish_free(x);
	}
}
