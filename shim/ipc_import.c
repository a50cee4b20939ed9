/* ipc_import.c — cudaIpc* on pool memory: the opener's side. The owner's
 * side (the handle's making, the table of exports, the socket requests
 * that hand out the pages' descriptors) is ipc_export.c.
 *
 * Owns: the opener's table of imports, fetching the descriptors from the
 * owner's socket (SCM_RIGHTS), importing and mapping them whole in a
 * reservation of its own, and closing. May call: process.h (the driver
 * layer), ipc_int.h, server.h and protocol.h (the socket's limits and
 * protocol version), the log.
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

#include "ipc.h"
#include "ipc_int.h"
#include "process.h"
#include "protocol.h"
#include "server.h"
#include "shim.h"

/* ---- the opener's table ----------------------------------------------------------- */

struct import {
	CUdeviceptr ptr; /* what cuIpcOpenMemHandle returned */
	CUdeviceptr va;  /* our reservation, all of it mapped */
	size_t len;
	long owner;
	uint64_t id, token;
	struct import *next;
};

static pthread_mutex_t imp_lock = PTHREAD_MUTEX_INITIALIZER; /* guards imports */
static struct import *imports;

void vpmm_ipc_imports_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	imp_lock = fresh;
	imports = NULL;
}

/* ---- the opener ------------------------------------------------------------------- */


static int owner_connect(long pid)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (vpmm_ipc_socket_path(a.sun_path, sizeof a.sun_path, pid) != 0)
		return -ENAMETOOLONG;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct timeval tv = {IPC_TIMEOUT_S, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* One request, one reply line; descriptors that come with it are appended
 * to fds (those beyond `cap` are closed). Returns 0 or a negative errno. */
static int ask(int fd, const char *line, char *reply, size_t cap, int *fds, unsigned fdcap,
	       unsigned *nfds)
{
	size_t len = strlen(line), off = 0;
	while (off < len) {
		ssize_t n = send(fd, line + off, len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		off += (size_t)n;
	}
	size_t got = 0;
	for (;;) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * VPMM_IPC_MAX_FDS)];
			struct cmsghdr align;
		} u;
		struct iovec iov = {reply + got, cap - 1 - got};
		struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
				     .msg_controllen = sizeof u.buf};
		if (got + 1 >= cap)
			return -EMSGSIZE;
		ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -ECONNRESET;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int d;
				memcpy(&d, CMSG_DATA(cm) + i * sizeof(int), sizeof d);
				if (*nfds < fdcap)
					fds[(*nfds)++] = d;
				else
					close(d);
			}
		}
		got += (size_t)n;
		reply[got] = '\0';
		if (memchr(reply, '\n', got))
			return 0;
	}
}

static bool field_u64(const char *json, const char *key, uint64_t *out)
{
	char k[32];
	snprintf(k, sizeof k, "\"%s\":", key);
	const char *p = strstr(json, k);
	return p && sscanf(p + strlen(k), "%" SCNu64, out) == 1;
}

/* The owner's error sentence, for our log line. */
static const char *reply_error(const char *json, char *buf, size_t n)
{
	const char *p = strstr(json, "\"error\":\"");
	size_t i = 0;
	if (p)
		for (p += 9; *p && *p != '"' && i + 1 < n; p++)
			buf[i++] = *p;
	buf[i] = '\0';
	return i ? buf : "no answer";
}

static void tell_closed(long owner, uint64_t id, uint64_t token)
{
	int fd = owner_connect(owner);
	if (fd < 0)
		return; /* gone: nothing to keep alive there */
	char line[128], reply[512];
	unsigned nfds = 0;
	snprintf(line, sizeof line, "vpmm %d ipc-close %" PRIu64 " %" PRIu64 "\n", VPMM_PROTOCOL,
		 id, token);
	ask(fd, line, reply, sizeof reply, NULL, 0, &nfds);
	close(fd);
}

struct fetched {
	int fds[VPMM_IPC_MAX_FDS];
	unsigned n;
	uint64_t sizes[VPMM_IPC_MAX_FDS];
};

/* Parses one ipc-open/ipc-pieces reply: its sizes, matched to its fds. */
static int parse_batch(const char *reply, struct fetched *f, uint64_t *offset, uint64_t *size,
		       uint64_t *npieces)
{
	const char *p = strstr(reply, "\"pieces\":[");
	if (!strstr(reply, "\"ok\":true") || !p || !field_u64(reply, "offset", offset) ||
	    !field_u64(reply, "size", size) || !field_u64(reply, "npieces", npieces))
		return -EPROTO;
	unsigned k = 0;
	for (p += 10; *p && *p != ']'; k++) {
		char *end;
		unsigned long long v = strtoull(p, &end, 10);
		if (end == p || k >= f->n)
			return -EPROTO;
		f->sizes[k] = v;
		p = *end == ',' ? end + 1 : end;
	}
	return k == f->n ? 0 : -EPROTO;
}

bool vpmm_ipc_open(CUdeviceptr *out, const CUipcMemHandle *handle, unsigned flags,
		   CUresult *res)
{
	struct ipc_wire w;
	(void)flags; /* lazy peer access: the opener's device is granted below */
	if (vpmm_tls_inside || !handle)
		return false;
	memcpy(&w, handle, sizeof w);
	if (memcmp(w.magic, IPC_MAGIC, sizeof w.magic) != 0)
		return false; /* the driver's own handle */
	if (!vpmm_active()) {
		vpmm_log(VPMM_LOG_ERROR,
			 "cudaIpcOpenMemHandle: the handle names libvpmm memory of process %d, which only opens with libvpmm active",
			 (int)w.pid);
		*res = CUDA_ERROR_INVALID_HANDLE;
		return true;
	}
	if (!out) {
		*res = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	vpmm_ipc_watch_fork();
	if (w.pid == (int32_t)getpid()) { /* as the driver: not in its own process */
		*res = CUDA_ERROR_INVALID_CONTEXT;
		return true;
	}
	vpmm_driver *drv = vpmm_process_driver();
	struct fetched *f = calloc(1, sizeof *f);
	struct import *im = calloc(1, sizeof *im);
	CUmemGenericAllocationHandle *hs = NULL;
	uint64_t *sizes = NULL;
	char line[160], reply[16384], ebuf[200];
	uint64_t offset = 0, size = 0, npieces = 0, len = 0;
	size_t nh = 0, mapped = 0;
	bool opened = false, reserved = false;
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	int fd = -1, e = 0;

	if (!f || !im)
		goto fail;
	fd = owner_connect(w.pid);
	if (fd < 0) {
		vpmm_log(VPMM_LOG_ERROR,
			 "cudaIpcOpenMemHandle: cannot reach process %d's vpmm socket (%s): is it alive and under libvpmm?",
			 (int)w.pid, strerror(-fd));
		r = CUDA_ERROR_INVALID_HANDLE;
		goto fail;
	}
	do { /* batches of descriptors until every piece is here */
		if (!opened)
			snprintf(line, sizeof line, "vpmm %d ipc-open %" PRIu64 " %" PRIu64 "\n",
				 VPMM_PROTOCOL, w.id, w.token);
		else
			snprintf(line, sizeof line,
				 "vpmm %d ipc-pieces %" PRIu64 " %" PRIu64 " %zu\n", VPMM_PROTOCOL,
				 w.id, w.token, nh);
		e = ask(fd, line, reply, sizeof reply, f->fds, VPMM_IPC_MAX_FDS, &f->n);
		if (!e && !strstr(reply, "\"ok\":true")) {
			vpmm_log(VPMM_LOG_ERROR, "cudaIpcOpenMemHandle: process %d says: %s",
				 (int)w.pid, reply_error(reply, ebuf, sizeof ebuf));
			r = CUDA_ERROR_INVALID_HANDLE;
			goto fail;
		}
		opened |= !e;
		uint64_t said = 0;
		if (!e)
			e = parse_batch(reply, f, &offset, &size, &said);
		/* The first reply fixes the count; later ones must agree. */
		if (!e && hs && said != npieces)
			e = -EPROTO;
		npieces = said;
		if (!e && (!f->n || !npieces || npieces > VPMM_IPC_MAX_PIECES ||
			   nh + f->n > npieces))
			e = -EPROTO;
		if (e) {
			vpmm_log(VPMM_LOG_ERROR, "cudaIpcOpenMemHandle: process %d: %s", (int)w.pid,
				 strerror(-e));
			r = CUDA_ERROR_INVALID_HANDLE;
			goto fail;
		}
		if (!hs && (!(hs = calloc(npieces, sizeof *hs)) ||
			    !(sizes = calloc(npieces, sizeof *sizes))))
			goto fail;
		for (unsigned i = 0; i < f->n; i++) {
			if (!f->sizes[i] || f->sizes[i] > UINT64_MAX / 2 - len) {
				r = CUDA_ERROR_INVALID_HANDLE;
				goto fail;
			}
			r = drv->import_fd(drv, f->fds[i], &hs[nh]);
			if (r != CUDA_SUCCESS)
				goto fail;
			sizes[nh++] = f->sizes[i];
			len += f->sizes[i];
		}
		while (f->n)
			close(f->fds[--f->n]);
	} while (nh < npieces);
	if (offset > len || size > len - offset) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto fail;
	}

	r = drv->va_reserve(drv, len, &im->va);
	if (r != CUDA_SUCCESS)
		goto fail;
	reserved = true;
	CUdeviceptr at = im->va;
	for (; mapped < nh; mapped++) {
		r = drv->map(drv, at, sizes[mapped], hs[mapped]);
		if (r != CUDA_SUCCESS)
			goto fail;
		at += sizes[mapped];
	}
	int dev = -1; /* the calling thread's device */
	r = drv->set_access(drv, im->va, len, &dev, 1);
	if (r != CUDA_SUCCESS) {
		vpmm_log(VPMM_LOG_ERROR,
			 "cudaIpcOpenMemHandle: mapping process %d's pages failed (CUresult %d)",
			 (int)w.pid, (int)r);
		goto fail;
	}
	/* The mappings hold the memory now. */
	for (size_t i = 0; i < nh; i++)
		drv->mem_release(drv, hs[i]);
	close(fd);
	im->ptr = im->va + offset;
	im->len = len;
	im->owner = w.pid;
	im->id = w.id;
	im->token = w.token;
	pthread_mutex_lock(&imp_lock);
	im->next = imports;
	imports = im;
	pthread_mutex_unlock(&imp_lock);
	free(hs);
	free(sizes);
	free(f);
	*out = im->ptr;
	*res = CUDA_SUCCESS;
	VPMM_LOGF(VPMM_LOG_DEBUG, "ipc: opened %" PRIu64 " bytes of process %d at %#llx (%zu pieces)",
		  size, (int)w.pid, (unsigned long long)im->ptr, nh);
	return true;

fail:
	while (f && f->n)
		close(f->fds[--f->n]);
	if (mapped) {
		CUdeviceptr end = im->va;
		for (size_t i = 0; i < mapped; i++)
			end += sizes[i];
		drv->unmap(drv, im->va, end - im->va);
	}
	if (reserved)
		drv->va_free(drv, im->va, len);
	for (size_t i = 0; i < nh; i++)
		drv->mem_release(drv, hs[i]);
	if (fd >= 0)
		close(fd);
	if (opened)
		tell_closed(w.pid, w.id, w.token);
	free(hs);
	free(sizes);
	free(f);
	free(im);
	*res = r == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : r;
	return true;
}

bool vpmm_ipc_close(CUdeviceptr ptr, CUresult *res)
{
	if (vpmm_tls_inside)
		return false;
	pthread_mutex_lock(&imp_lock);
	struct import **l = &imports;
	while (*l && (*l)->ptr != ptr)
		l = &(*l)->next;
	struct import *im = *l;
	if (im)
		*l = im->next;
	pthread_mutex_unlock(&imp_lock);
	if (!im)
		return false; /* the driver's own */
	vpmm_driver *drv = vpmm_process_driver();
	CUresult r = drv->unmap(drv, im->va, im->len);
	if (r != CUDA_SUCCESS) {
		/* Still mapped here: the owner must not reuse the pages. */
		pthread_mutex_lock(&imp_lock);
		im->next = imports;
		imports = im;
		pthread_mutex_unlock(&imp_lock);
		*res = r;
		return true;
	}
	drv->va_free(drv, im->va, im->len);
	tell_closed(im->owner, im->id, im->token);
	free(im);
	*res = CUDA_SUCCESS;
	return true;
}
