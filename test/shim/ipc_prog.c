/* ipc_prog.c — cudaIpc* and peer access through the driver API, as an
 * unmodified program calls them (linked with the fake libcuda.so.1; the IPC
 * entry points also through cuGetProcAddress). `ipc_prog SCENARIO [HANDLE]`:
 *
 *   share    the owner: exports pool memory, starts `ipc_prog open HANDLE`
 *            (itself, same environment) and talks to it over its stdin and
 *            stdout; checks both see the same bytes, that a free while the
 *            other has it open keeps the memory out of reuse until it closes,
 *            that an opener that dies without closing is noticed, and that a
 *            stale handle is refused
 *   open, open-die, open-stale    the other process's roles
 *   refuse   what is not ours passes through; without the socket, no export
 *   peer     peer access reaches pool pages mapped before and after
 *
 * IPC_SIZE=BYTES sets the size of the shared allocations (default 3 MiB).
 *
 * Without the shim (SHIMTEST_EXPECT=real) the fake driver refuses IPC on its
 * memory, as the real one does on VMM memory, and peers see nothing of the
 * pool: the scenarios check that instead.
 */
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shimtest.h"

extern char **environ;

/* Many 64 KiB pages: several handles; IPC_SIZE (bytes) makes it more. */
static size_t SZ = (size_t)3 << 20;

static CUcontext ctx_of(int dev)
{
	CUcontext c;
	CUdevice d;
	CHECK_EQ(cuDeviceGet(&d, dev), CUDA_SUCCESS);
	CHECK_EQ(cuDevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
	return c;
}

static void start(int dev)
{
	CHECK_EQ(cuInit(0), CUDA_SUCCESS);
	CHECK_EQ(cuCtxSetCurrent(ctx_of(dev)), CUDA_SUCCESS);
	controls_init();
}

static void to_hex(const CUipcMemHandle *h, char *out)
{
	for (size_t i = 0; i < sizeof h->reserved; i++)
		sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, CUipcMemHandle *h)
{
	CHECK(strlen(s) == 2 * sizeof h->reserved);
	for (size_t i = 0; i < sizeof h->reserved; i++) {
		unsigned v;
		CHECK(sscanf(s + 2 * i, "%2x", &v) == 1);
		h->reserved[i] = (char)v;
	}
}

static unsigned char pat(size_t i)
{
	return (unsigned char)(i * 13 + 5);
}

/* ---- the other process ------------------------------------------------------ */

struct child {
	pid_t pid;
	FILE *in, *out; /* its stdin (we write), its stdout (we read) */
};

static struct child spawn_role(const char *role, const CUipcMemHandle *h)
{
	char hex[2 * sizeof h->reserved + 1];
	char *argv[] = {"/proc/self/exe", (char *)role, hex, NULL};
	int to[2], from[2];
	posix_spawn_file_actions_t fa;
	struct child c;
	to_hex(h, hex);
	CHECK(pipe(to) == 0 && pipe(from) == 0);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, to[0], 0);
	posix_spawn_file_actions_adddup2(&fa, from[1], 1);
	posix_spawn_file_actions_addclose(&fa, to[1]);
	posix_spawn_file_actions_addclose(&fa, from[0]);
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	CHECK(n > 0);
	self[n] = '\0';
	argv[0] = self;
	CHECK_EQ(posix_spawn(&c.pid, self, &fa, NULL, argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);
	close(to[0]);
	close(from[1]);
	c.in = fdopen(to[1], "w");
	c.out = fdopen(from[0], "r");
	CHECK(c.in && c.out);
	setvbuf(c.in, NULL, _IOLBF, 0);
	return c;
}

static void expect_line(struct child *c, const char *want)
{
	char line[256];
	CHECK(fgets(line, sizeof line, c->out));
	if (strncmp(line, want, strlen(want)) != 0) {
		fprintf(stderr, "FAIL: the other process said \"%s\", expected \"%s\"\n", line, want);
		exit(1);
	}
}

static int child_exit(struct child *c)
{
	int st;
	fclose(c->in);
	fclose(c->out);
	CHECK(waitpid(c->pid, &st, 0) == c->pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void role_open(const char *hex, const char *how)
{
	CUipcMemHandle h;
	CUdeviceptr p = 0;
	start(0);
	from_hex(hex, &h);
	CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (!strcmp(how, "stale")) {
		CHECK_EQ(r, CUDA_ERROR_INVALID_HANDLE);
		printf("refused\n");
		return;
	}
	CHECK_EQ(r, CUDA_SUCCESS);
	const unsigned char *b = (const unsigned char *)(uintptr_t)p;
	for (size_t i = 0; i < SZ; i += 4097)
		CHECK_EQ(b[i], pat(i));
	((unsigned char *)(uintptr_t)p)[SZ - 1] = 0x5a;
	((unsigned char *)(uintptr_t)p)[0] = 0xa5;
	printf("opened\n");
	fflush(stdout);
	if (!strcmp(how, "die"))
		_exit(0); /* no close: the owner must notice */
	char line[64];
	CHECK(fgets(line, sizeof line, stdin));
	CHECK(!strncmp(line, "close", 5));
	/* still the same bytes: the owner freed it meanwhile, nobody reused it */
	for (size_t i = 4097; i < SZ - 1; i += 4097)
		CHECK_EQ(b[i], pat(i));
	CHECK_EQ(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
	CHECK_EQ(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE); /* the fake's answer */
	printf("closed\n");
}

/* ---- the owner ---------------------------------------------------------------- */

/* Waits up to 5 s for the pool's live bytes to reach `want`. */
static bool live_becomes(size_t want)
{
	for (int i = 0; i < 500; i++) {
		if (pool_stats(0).live == want)
			return true;
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	return false;
}

static void share(void)
{
	start(0);
	CUdeviceptr a, b, c;
	CUipcMemHandle h, hc;
	CHECK_EQ(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	unsigned char *ab = (unsigned char *)(uintptr_t)a;
	for (size_t i = 0; i < SZ; i++)
		ab[i] = pat(i);
	CUresult r = cuIpcGetMemHandle(&h, a);
	if (!expect_pool()) {
		CHECK_EQ(r, CUDA_ERROR_INVALID_VALUE); /* the driver's own answer */
		printf("no ipc without the shim\n");
		CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
		return;
	}
	CHECK_EQ(r, CUDA_SUCCESS);
	/* An inner pointer names the same allocation. */
	CUipcMemHandle h2;
	CHECK_EQ(cuIpcGetMemHandle(&h2, a + 4096), CUDA_SUCCESS);
	CHECK(!memcmp(&h, &h2, sizeof h));

	struct child o = spawn_role("open", &h);
	expect_line(&o, "opened");
	CHECK_EQ(ab[SZ - 1], 0x5a);
	CHECK_EQ(ab[0], 0xa5);
	/* Freed while open there: the pages stay out of reuse. */
	size_t live0 = pool_stats(0).live;
	CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
	CHECK_EQ(pool_stats(0).live, live0);
	/* Freed, though kept for the other process: a second free is the
	 * program's error, and it has no handle any more. */
	CHECK_EQ(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(cuIpcGetMemHandle(&h2, a), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(pool_stats(0).live, live0);
	CHECK_EQ(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	CHECK(b + SZ <= a || a + SZ <= b);
	for (size_t i = 0; i < SZ; i++)
		((unsigned char *)(uintptr_t)b)[i] = 0xee;
	fprintf(o.in, "close\n");
	expect_line(&o, "closed");
	CHECK_EQ(child_exit(&o), 0);
	/* The close arrived: the deferred free happened, once the work
	 * queued before the free ran (the device catches up). */
	CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK(live_becomes(live0));

	/* The old handle is stale now. */
	struct child s = spawn_role("open-stale", &h);
	expect_line(&s, "refused");
	CHECK_EQ(child_exit(&s), 0);

	/* An opener that exits without closing. */
	CHECK_EQ(cuMemAlloc(&c, SZ), CUDA_SUCCESS);
	unsigned char *cb = (unsigned char *)(uintptr_t)c;
	for (size_t i = 0; i < SZ; i++)
		cb[i] = pat(i);
	CHECK_EQ(cuIpcGetMemHandle(&hc, c), CUDA_SUCCESS);
	CHECK(memcmp(&h, &hc, sizeof h) != 0);
	struct child d = spawn_role("open-die", &hc);
	expect_line(&d, "opened");
	CHECK_EQ(child_exit(&d), 0);
	size_t live1 = pool_stats(0).live;
	CHECK_EQ(cuMemFree(c), CUDA_SUCCESS);
	CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK(live_becomes(live1 - SZ));
	CHECK_EQ(cuMemFree(b), CUDA_SUCCESS);
	printf("share ok\n");
}

/* One request on our own vpmm socket; the reply line into buf. */
static void own_socket_ask(const char *line, char *buf, size_t n)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof a.sun_path, "/tmp/vpmm-%lu/%ld.sock",
		 (unsigned long)geteuid(), (long)getpid());
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(fd >= 0);
	CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(send(fd, line, strlen(line), 0) == (ssize_t)strlen(line));
	size_t got = 0;
	while (got + 1 < n && !memchr(buf, '\n', got)) {
		ssize_t r = recv(fd, buf + got, n - 1 - got, 0);
		CHECK(r > 0);
		got += (size_t)r;
		buf[got] = '\0';
	}
	close(fd);
}

static void refuse(void)
{
	start(0);
	CUipcMemHandle h;
	CUdeviceptr p = 0;
	memset(&h, 0x11, sizeof h);
	/* not ours: the driver answers */
	CHECK_EQ(cuIpcGetMemHandle(&h, (CUdeviceptr)0x1000), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ(cuIpcOpenMemHandle(&p, h, 0), CUDA_ERROR_INVALID_HANDLE);
	CHECK_EQ(cuIpcCloseMemHandle((CUdeviceptr)0x1000), CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr a;
	CHECK_EQ(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	const char *sock = getenv("VPMM_SOCKET");
	if (expect_pool() && sock && !strcmp(sock, "off")) {
		/* nobody could ask us for the pages */
		CHECK_EQ(cuIpcGetMemHandle(&h, a), CUDA_ERROR_NOT_SUPPORTED);
	} else if (expect_pool()) {
		CHECK_EQ(cuIpcGetMemHandle(&h, a), CUDA_SUCCESS);
		/* our own handle in our own process: refused, as the driver does */
		CHECK_EQ(cuIpcOpenMemHandle(&p, h, 0), CUDA_ERROR_INVALID_CONTEXT);
		/* freed pool memory has no handle */
		CUdeviceptr q;
		CHECK_EQ(cuMemAlloc(&q, SZ), CUDA_SUCCESS);
		CHECK_EQ(cuMemFree(q), CUDA_SUCCESS);
		CHECK_EQ(cuIpcGetMemHandle(&h, q), CUDA_ERROR_INVALID_VALUE);
		/* Bad requests on the socket: an error each, nothing handed out. */
		static const struct {
			const char *line, *says;
		} bad[] = {
			{"vpmm 1 ipc-open\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-open x y\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-open 1 12345\n", "no such shared allocation"},
			{"vpmm 1 ipc-pieces 1 2\n", "takes ID TOKEN FIRST"},
			{"vpmm 1 ipc-pieces 1 2 0\n", "no such shared allocation"},
			{"vpmm 1 ipc-open 1 2 junk\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-open -1 2\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-open 1  2\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-pieces 1 2 -1\n", "takes ID TOKEN FIRST"},
			{"vpmm 1 ipc-pieces 1 2 12345678901234567890123\n", "takes ID TOKEN FIRST"},
			{"vpmm 1 ipc-close 1 2 3\n", "takes ID TOKEN"},
			{"vpmm 1 ipc-close 99 1\n", "no such shared allocation"},
		};
		for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
			char reply[1024] = "";
			own_socket_ask(bad[i].line, reply, sizeof reply);
			if (!strstr(reply, "\"ok\":false") || !strstr(reply, bad[i].says)) {
				fprintf(stderr, "FAIL: %s -> %s\n", bad[i].line, reply);
				exit(1);
			}
		}
	}
	CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
	printf("refuse ok\n");
}

/* Opens a handle of a process under the shim while this one has it off. */
static void open_disabled(void)
{
	start(0);
	CUdeviceptr a;
	CUipcMemHandle h;
	CHECK_EQ(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	CHECK_EQ(cuIpcGetMemHandle(&h, a), CUDA_SUCCESS);
	/* The child runs with VPMM_DISABLE=1. */
	setenv("VPMM_DISABLE", "1", 1);
	struct child s = spawn_role("open-stale", &h);
	expect_line(&s, "refused");
	CHECK_EQ(child_exit(&s), 0);
	CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
	printf("disabled ok\n");
}

typedef int (*accessible_t)(CUdeviceptr, int);

static void peer(void)
{
	start(0);
	accessible_t acc;
	LOOKUP(acc, dlopen("libcuda.so.1", RTLD_NOW), "fakecuda_accessible");
	CHECK(acc);
	CUcontext c0 = ctx_of(0), c1 = ctx_of(1);
	CUdeviceptr a, b, big, x;
	CHECK_EQ(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	CHECK(!acc(a, 1));
	/* Device 1 may access device 0's memory, also through cuGetProcAddress. */
	CUresult (*enable)(CUcontext, unsigned) = NULL;
	CUdriverProcAddressQueryResult q;
	CHECK_EQ(cuGetProcAddress("cuCtxEnablePeerAccess", (void **)&enable, 12000, 0, &q),
		 CUDA_SUCCESS);
	CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	CHECK_EQ(enable(c0, 0), CUDA_SUCCESS);
	CHECK_EQ(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	CHECK_EQ(cuCtxSetCurrent(c0), CUDA_SUCCESS);
	bool pool = expect_pool();
	for (size_t o = 0; o < SZ; o += 65536)
		CHECK_EQ(acc(a + o, 1), pool);
	/* Pages mapped later, and remapped ones: free a, ask for more. */
	CHECK_EQ(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
	CHECK_EQ(cuMemAlloc(&big, 4 * SZ), CUDA_SUCCESS);
	for (size_t o = 0; o < 4 * SZ; o += 65536)
		CHECK_EQ(acc(big + o, 1), pool);
	for (size_t o = 0; o < SZ; o += 65536)
		CHECK_EQ(acc(b + o, 1), pool);
	/* Enabled before device 1 has a pool: its pool grants device 0. */
	CHECK_EQ(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
	CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	CHECK_EQ(cuMemAlloc(&x, SZ), CUDA_SUCCESS);
	for (size_t o = 0; o < SZ; o += 65536)
		CHECK_EQ(acc(x + o, 0), pool);
	CHECK_EQ(cuMemFree(x), CUDA_SUCCESS);
	CHECK_EQ(cuCtxSetCurrent(c0), CUDA_SUCCESS);
	CHECK_EQ(cuMemFree(b), CUDA_SUCCESS);
	CHECK_EQ(cuMemFree(big), CUDA_SUCCESS);
	printf("peer ok\n");
}

int main(int argc, char **argv)
{
	const char *s = argc > 1 ? argv[1] : "";
	const char *size = getenv("IPC_SIZE");
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (size)
		SZ = strtoull(size, NULL, 0);
	if (!strcmp(s, "share"))
		share();
	else if (!strcmp(s, "open") && argc > 2)
		role_open(argv[2], "");
	else if (!strcmp(s, "open-die") && argc > 2)
		role_open(argv[2], "die");
	else if (!strcmp(s, "open-stale") && argc > 2)
		role_open(argv[2], "stale");
	else if (!strcmp(s, "refuse"))
		refuse();
	else if (!strcmp(s, "disabled"))
		open_disabled();
	else if (!strcmp(s, "peer"))
		peer();
	else {
		fprintf(stderr, "usage: ipc_prog share|refuse|disabled|peer\n");
		return 2;
	}
	return 0;
}
