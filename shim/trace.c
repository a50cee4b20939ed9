/* trace.c — the VPMM_TRACE recorder of trace.h: a bounded multi-producer
 * ring that the hooks append to without locks or I/O, and the writer thread
 * that turns it into RMM CSV lines.
 *
 * The ring is a sequence-numbered array (each slot says whether it is free for
 * position p, or holds the event of position p): producers claim a position
 * with one compare-and-swap on `tail` and publish by storing the slot's
 * sequence; the single consumer (whoever holds drain_lock) walks from `head`.
 * `inflight` counts producers between their "is a trace open?" check and
 * their publication, so closing waits for them and never loses or misfiles an
 * event. The ring is allocated on the first open and never freed, so a late
 * producer can never touch freed memory.
 *
 * Owns: the ring, the trace file and the writer thread. May call: nothing
 * of the shim (with server.c, part of the static library vpmm_server).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "trace.h"

#define RING_SLOTS (1u << 16)
#define FLUSH_EVERY_MS 50
#define FLUSH_WAIT_S 2 /* vpmm_trace_flush's wait for the writer, at most */
#define OUT_BUF (64 * 1024)
#define LINE_MAX_LEN 128

struct slot {
	_Atomic uint64_t seq;
	uint64_t ns; /* CLOCK_REALTIME */
	uint64_t ptr, size, stream;
	uint32_t tid;
	uint32_t action;
};

static struct slot *ring; /* allocated once, never freed */
static _Atomic uint64_t tail;
static uint64_t head; /* under drain_lock */
static atomic_bool enabled;
static atomic_int inflight;

static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;   /* open/close */
static pthread_mutex_t drain_lock = PTHREAD_MUTEX_INITIALIZER; /* the consumer */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond = PTHREAD_COND_INITIALIZER;
static bool writer_stop;   /* under wake_lock */
static bool writer_kick;   /* under wake_lock */
static bool writer_running; /* under ctl_lock */
static pthread_t writer;

/* under ctl_lock (path, owner) or drain_lock (fd, err, out) */
static int fd = -1;
static int write_err;
static pid_t owner;
static char path_abs[PATH_MAX];
static char parent_path[PATH_MAX]; /* a forked child: the parent's trace */
static char out[OUT_BUF];
static size_t outlen;
static uint64_t file_off; /* bytes of whole lines in the file */
static bool err_said;     /* the write error was reported */
static time_t cached_sec = (time_t)-1;
static struct tm cached_tm;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static __thread uint32_t my_tid;

static uint32_t thread_id(void)
{
	if (!my_tid)
		my_tid = (uint32_t)syscall(SYS_gettid);
	return my_tid;
}

static int drain_locked(void);

static void kick_writer(void)
{
	pthread_mutex_lock(&wake_lock);
	writer_kick = true;
	pthread_cond_signal(&wake_cond);
	pthread_mutex_unlock(&wake_lock);
}

void vpmm_trace_event(enum vpmm_trace_action action, CUdeviceptr ptr, size_t size,
		      CUstream stream)
{
	if (!atomic_load_explicit(&enabled, memory_order_relaxed))
		return;
	atomic_fetch_add(&inflight, 1);
	if (!atomic_load(&enabled)) {
		atomic_fetch_sub(&inflight, 1);
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t pos = atomic_load_explicit(&tail, memory_order_relaxed);
	struct slot *s;
	for (;;) {
		s = &ring[pos & (RING_SLOTS - 1)];
		uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
		int64_t diff = (int64_t)(seq - pos);
		if (diff == 0) {
			if (atomic_compare_exchange_weak_explicit(&tail, &pos, pos + 1,
								  memory_order_relaxed,
								  memory_order_relaxed))
				break;
		} else if (diff < 0) {
			/* Full: the writer is behind. Wait for it rather than
			 * drop an event; give up only if tracing stopped. */
			if (pthread_mutex_trylock(&drain_lock) == 0) {
				drain_locked();
				pthread_mutex_unlock(&drain_lock);
			} else {
				kick_writer();
			}
			if (!atomic_load(&enabled)) {
				atomic_fetch_sub(&inflight, 1);
				return;
			}
			struct timespec nap = { 0, 50 * 1000 };
			nanosleep(&nap, NULL);
			pos = atomic_load_explicit(&tail, memory_order_relaxed);
		} else {
			pos = atomic_load_explicit(&tail, memory_order_relaxed);
		}
	}
	s->ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	s->ptr = (uint64_t)ptr;
	s->size = (uint64_t)size;
	s->stream = (uint64_t)(uintptr_t)stream;
	s->tid = thread_id();
	s->action = (uint32_t)action;
	atomic_store_explicit(&s->seq, pos + 1, memory_order_release);
	atomic_fetch_sub(&inflight, 1);
	if ((pos & (RING_SLOTS / 4 - 1)) == RING_SLOTS / 4 - 1)
		kick_writer(); /* a quarter of the ring since the last nudge */
}

/* ---- the consumer (drain_lock held) --------------------------------------- */

/* How many of the next `want` bytes may be written: past the file size
 * limit (ulimit -f) a write would raise SIGXFSZ, which the kernel sends to
 * the whole process, and whose default action kills it. Blocking it in
 * this thread would not keep it from another thread, and ignoring it
 * would change the program's disposition for its own writes: so the trace
 * never starts a write at the limit, and stops there with EFBIG. */
static size_t room_under_limit(size_t want)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return want;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	uint64_t at = pos >= 0 ? (uint64_t)pos : file_off;
	if (at >= (uint64_t)rl.rlim_cur)
		return 0;
	uint64_t room = (uint64_t)rl.rlim_cur - at;
	return want < room ? want : (size_t)room;
}

/* Writes the buffer (whole lines). The file keeps whole lines only: the
 * lines that fit under the file size limit are written, and a failed or
 * short write (a full disk) is cut back to the end of the last whole line. */
static void out_write(void)
{
	size_t len = room_under_limit(outlen);
	if (len < outlen)
		while (len && out[len - 1] != '\n')
			len--;
	size_t off = 0;
	while (off < len && !write_err) {
		ssize_t n = write(fd, out + off, len - off);
		if (n > 0)
			off += (size_t)n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
			write_err = n < 0 ? errno : EIO;
	}
	if (write_err && off) {
		size_t whole = off;
		while (whole && out[whole - 1] != '\n')
			whole--;
		if (whole < off && ftruncate(fd, (off_t)(file_off + whole)) == 0)
			off = whole;
	}
	if (!write_err && len < outlen)
		write_err = EFBIG;
	file_off += off;
	outlen = 0;
}

static void format_event(const struct slot *s)
{
	static const char *const names[] = {
		[VPMM_TRACE_ALLOCATE] = "allocate",
		[VPMM_TRACE_FREE] = "free",
		[VPMM_TRACE_ALLOCATE_FAILURE] = "allocate failure",
	};
	time_t sec = (time_t)(s->ns / 1000000000u);
	if (sec != cached_sec) {
		localtime_r(&sec, &cached_tm);
		cached_sec = sec;
	}
	if (outlen + LINE_MAX_LEN > sizeof(out))
		out_write();
	const char *name = s->action < 3 ? names[s->action] : "allocate";
	int n = snprintf(out + outlen, sizeof(out) - outlen,
			 "%u,%02d:%02d:%02d.%06u,%s,0x%llx,%llu,0x%llx\n", s->tid,
			 cached_tm.tm_hour, cached_tm.tm_min, cached_tm.tm_sec,
			 (unsigned)(s->ns % 1000000000u / 1000u), name,
			 (unsigned long long)s->ptr, (unsigned long long)s->size,
			 (unsigned long long)s->stream);
	if (n > 0 && (size_t)n < sizeof(out) - outlen)
		outlen += (size_t)n;
}

/* Formats and writes the events published before the call (those
 * published meanwhile wait for the next call: producers that keep up with
 * the writer cannot hold it, and whoever waits on drain_lock, for ever).
 * Returns -errno of a write error (tracing then stops, said in one line). */
static int drain_locked(void)
{
	if (fd < 0)
		return 0;
	uint64_t end = atomic_load_explicit(&tail, memory_order_acquire);
	while (head != end && !write_err) {
		struct slot *s = &ring[head & (RING_SLOTS - 1)];
		if (atomic_load_explicit(&s->seq, memory_order_acquire) != head + 1)
			break; /* claimed and not yet published */
		struct slot copy = { .ns = s->ns, .ptr = s->ptr, .size = s->size,
				     .stream = s->stream, .tid = s->tid, .action = s->action };
		atomic_store_explicit(&s->seq, head + RING_SLOTS, memory_order_release);
		head++;
		format_event(&copy);
	}
	out_write();
	if (write_err) {
		atomic_store(&enabled, false);
		if (!err_said) {
			err_said = true;
			char msg[PATH_MAX + 80];
			int n = snprintf(msg, sizeof(msg),
					 "vpmm: error: trace %s: %s: tracing stopped\n", path_abs,
					 strerror(write_err));
			if (n > 0) {
				ssize_t w = write(STDERR_FILENO, msg,
						  (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
				(void)w;
			}
		}
		return -write_err;
	}
	return 0;
}

static void *writer_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&wake_lock);
		if (!writer_stop && !writer_kick) {
			struct timespec until;
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += FLUSH_EVERY_MS * 1000000L;
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&wake_cond, &wake_lock, &until);
		}
		bool stop = writer_stop;
		writer_kick = false;
		pthread_mutex_unlock(&wake_lock);
		if (stop)
			return NULL;
		pthread_mutex_lock(&drain_lock);
		drain_locked();
		pthread_mutex_unlock(&drain_lock);
	}
}

/* ---- control ---------------------------------------------------------------- */

static void atfork_child(void)
{
	/* The parent's file, ring contents and writer stay the parent's. */
	atomic_store(&enabled, false);
	atomic_store(&inflight, 0);
	pthread_mutex_init(&ctl_lock, NULL);
	pthread_mutex_init(&drain_lock, NULL);
	pthread_mutex_init(&wake_lock, NULL);
	pthread_cond_init(&wake_cond, NULL);
	if (fd >= 0) {
		close(fd);
		memcpy(parent_path, path_abs, sizeof(parent_path));
	}
	fd = -1;
	writer_running = false;
	path_abs[0] = '\0';
}

static void install_atfork(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

static void absolute(const char *p, char *buf, size_t n)
{
	char cwd[PATH_MAX];
	int len = -1;
	if (p[0] != '/' && getcwd(cwd, sizeof(cwd)))
		len = snprintf(buf, n, "%s/%s", cwd, p);
	if (len < 0 || (size_t)len >= n)
		snprintf(buf, n, "%s", p); /* as given: still names the file */
}

static int close_locked(void)
{
	if (fd < 0)
		return 0;
	atomic_store(&enabled, false);
	/* A producer between its check and its publication. Bounded: exit()
	 * from a signal handler that interrupted one on this very thread
	 * would wait for ever; its event, and those after it, are lost. */
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (atomic_load(&inflight) > 0) {
		sched_yield();
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000000ll + (t.tv_nsec - t0.tv_nsec) >= 2000000000ll)
			break;
	}
	if (writer_running) {
		pthread_mutex_lock(&wake_lock);
		writer_stop = true;
		pthread_cond_signal(&wake_cond);
		pthread_mutex_unlock(&wake_lock);
		pthread_join(writer, NULL);
		writer_running = false;
	}
	pthread_mutex_lock(&drain_lock);
	int rc = drain_locked();
	if (!rc && write_err)
		rc = -write_err;
	/* Out of `fd` before closed: a fork meanwhile closes in the child
	 * whatever `fd` names (atfork_child), and the number may be the
	 * program's again once closed. */
	int f = fd;
	__atomic_store_n(&fd, -1, __ATOMIC_SEQ_CST);
	if (close(f) != 0 && !rc)
		rc = -errno;
	pthread_mutex_unlock(&drain_lock);
	path_abs[0] = '\0';
	return rc;
}

/* `path` with each %p replaced by the process id, so that processes that
 * share a VPMM_TRACE (torchrun's workers) write a file each; %% is a %. */
static int with_pid(const char *path, char *buf, size_t n)
{
	size_t o = 0;
	buf[0] = '\0';
	for (const char *c = path; *c; c++) {
		int k;
		if (c[0] == '%' && c[1] == 'p') {
			k = snprintf(buf + o, n - o, "%ld", (long)getpid());
			c++;
		} else if (c[0] == '%' && c[1] == '%') {
			k = snprintf(buf + o, n - o, "%%");
			c++;
		} else {
			k = snprintf(buf + o, n - o, "%c", *c);
		}
		if (k < 0 || (size_t)k >= n - o)
			return -1;
		o += (size_t)k;
	}
	return 0;
}

int vpmm_trace_open(const char *path)
{
	static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
	if (!path || !*path)
		return -EINVAL;
	pthread_once(&atfork_once, install_atfork);
	pthread_mutex_lock(&ctl_lock);
	int rc = 0;
	if (!ring) {
		ring = calloc(RING_SLOTS, sizeof(*ring));
		if (!ring) {
			rc = -ENOMEM;
			goto out;
		}
	}
	char named[PATH_MAX], abs_path[PATH_MAX];
	if (with_pid(path, named, sizeof(named)) != 0) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	path = named;
	absolute(path, abs_path, sizeof(abs_path));
	if (parent_path[0] && strcmp(abs_path, parent_path) == 0) {
		rc = -EBUSY; /* a forked child would truncate its parent's trace */
		goto out;
	}
	/* Not blocking: a FIFO without a reader would hold the caller (the
	 * socket's server thread) in open() for ever. Not through a symbolic
	 * link, and only a file of ours with no other name: a link another
	 * user left in /tmp would have us truncate whatever it points to. */
	int f = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY,
		     0644);
	if (f < 0) {
		rc = errno == ENXIO ? -EINVAL : -errno; /* a FIFO or socket */
		goto out;
	}
	struct stat st, now;
	if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode))
		rc = -EINVAL;
	else if (st.st_uid != geteuid())
		rc = -EPERM;
	else if (st.st_nlink > 1)
		rc = -EMLINK;
	if (rc) {
		close(f);
		goto out;
	}
	/* The file the trace writes now, by whatever name: closed before the
	 * truncation, else its last events would land past the new header. A
	 * bad path returned above and left the running trace alone. */
	if (fd >= 0 && fstat(fd, &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino)
		close_locked();
	/* Another process writes it (a worker started with the same
	 * VPMM_TRACE): truncating would wipe its trace and interleave ours. */
	if (flock(f, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
		rc = -EBUSY; /* (a file system without locks: traced unguarded) */
		close(f);
		goto out;
	}
	if (ftruncate(f, 0) != 0 || fcntl(f, F_SETFL, 0) != 0) {
		rc = -errno;
		close(f);
		goto out;
	}
	close_locked();
	/* No producer is inside (enabled is false, inflight drained). */
	for (uint32_t i = 0; i < RING_SLOTS; i++)
		atomic_store_explicit(&ring[i].seq, i, memory_order_relaxed);
	atomic_store(&tail, 0);
	pthread_mutex_lock(&drain_lock);
	head = 0;
	fd = f;
	write_err = 0;
	err_said = false;
	file_off = 0;
	outlen = 0;
	memcpy(out, header, sizeof(header) - 1);
	outlen = sizeof(header) - 1;
	out_write();
	rc = -write_err;
	pthread_mutex_unlock(&drain_lock);
	if (rc) {
		__atomic_store_n(&fd, -1, __ATOMIC_SEQ_CST); /* before the close, as above */
		close(f);
		goto out;
	}
	memcpy(path_abs, abs_path, sizeof(path_abs));
	owner = getpid();
	writer_stop = false;
	writer_kick = false;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&writer, NULL, writer_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	/* Without a writer thread the trace still works: flushes and a full
	 * ring drain it (see vpmm_trace_flush), just less smoothly. */
	writer_running = e == 0;
	atomic_store(&enabled, true);
out:
	pthread_mutex_unlock(&ctl_lock);
	return rc;
}

const char *vpmm_trace_strerror(int rc)
{
	if (rc == -EBUSY)
		return "another process traces to this file (%p in the name makes one "
		       "file per process)";
	if (rc == -ELOOP)
		return "a symbolic link (refused: the trace is written only to a file itself)";
	if (rc == -EPERM)
		return "owned by another user (refused)";
	if (rc == -EMLINK)
		return "the file has other names (hard links; refused)";
	return rc == -EINVAL ? "not a regular file" : strerror(-rc);
}

bool vpmm_trace_on(void)
{
	return atomic_load_explicit(&enabled, memory_order_relaxed);
}

int vpmm_trace_flush(void)
{
	/* Bounded: the writer holds the lock for one drain at most, but a
	 * caller (the socket's server thread) must not wait behind a slow
	 * disk for ever either. */
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FLUSH_WAIT_S;
	int e = pthread_mutex_timedlock(&drain_lock, &until);
	if (e)
		return -e;
	int rc = drain_locked();
	pthread_mutex_unlock(&drain_lock);
	return rc;
}

int vpmm_trace_close(void)
{
	pthread_mutex_lock(&ctl_lock);
	int rc = close_locked();
	pthread_mutex_unlock(&ctl_lock);
	return rc;
}

bool vpmm_trace_status(char *path, size_t n, uint64_t *events)
{
	pthread_mutex_lock(&ctl_lock);
	bool on = fd >= 0 && atomic_load(&enabled);
	if (path && n)
		snprintf(path, n, "%s", on ? path_abs : "");
	if (events)
		*events = on ? atomic_load(&tail) : 0;
	pthread_mutex_unlock(&ctl_lock);
	return on;
}

__attribute__((destructor)) static void trace_at_exit(void)
{
	if (fd >= 0 && owner == getpid())
		vpmm_trace_close();
}
