// share.cu — an unmodified CUDA program for the sharing checks on a
// real GPU (scripts/gpu-share.sh). `share ipc` and `share peer`; with the
// shim (EXPECT_POOL=1) the pool must have served the memory, without it the
// same program checks the driver's own behaviour.
//
//   ipc   the owner allocates several buffers (one of 1 GiB over several
//         handles, one of 8 KiB in a shared sub-page slab), fills them by
//         kernel, exports them with cudaIpcGetMemHandle and starts itself as
//         the opener (`share ipc-open HEX...`), which opens each, checks the
//         owner's pattern by kernel, writes its own and closes. The owner then
//         checks the opener's pattern. Under the shim the owner also frees one
//         buffer while it is open elsewhere and allocates after it: the freed
//         memory must not be reused until the opener closed (the opener checks
//         the owner's pattern once more after the owner's reallocation).
//         Across the shim's edge (SHIM_LIB names libvpmm.so): a handle of
//         pool memory opened in a process without the shim fails with an
//         error (the driver does not know it), and a handle of plain
//         cudaMalloc memory opened in a process under the shim works (the
//         shim passes it through to the driver).
//   peer  two GPUs: GPU 1 enables peer access to GPU 0, a kernel on GPU 1
//         reads GPU 0's buffers; then GPU 0 frees every other buffer and
//         allocates one larger than any gap (the pool remaps: pages_remapped
//         grows), and GPU 1 reads that one too. One GPU: prints SKIP, exit 0.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string>
#include <vector>

#include "check.h"

extern char **environ;


static const size_t KiB = 1024, MiB = 1 << 20;

__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad)
{
	unsigned long long local = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		local += p[i] != (seed ^ (uint32_t)(i * 2654435761u));
	if (local)
		atomicAdd(bad, local);
}

static unsigned long long mismatches(const void *p, size_t bytes, uint32_t seed)
{
	unsigned long long *bad, h = 0;
	CK(cudaMalloc(&bad, sizeof *bad));
	CK(cudaMemset(bad, 0, sizeof *bad));
	check<<<256, 256>>>((const uint32_t *)p, bytes / 4, seed, bad);
	CK(cudaGetLastError());
	CK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
	CK(cudaFree(bad));
	return h;
}

static void put(void *p, size_t bytes, uint32_t seed)
{
	fill<<<256, 256>>>((uint32_t *)p, bytes / 4, seed);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
}

// The pool's counters through the shim's own API, when it is loaded.
static long long pool_stat(int dev, const char *name)
{
	typedef long (*json_fn)(int, char *, size_t);
	json_fn f = (json_fn)dlsym(RTLD_DEFAULT, "vpmm_shim_stats_json");
	char buf[8192], key[64];
	if (!f || f(dev, buf, sizeof buf) <= 0)
		return -1;
	snprintf(key, sizeof key, "\"%s\":", name);
	const char *at = strstr(buf, key);
	return at ? atoll(at + strlen(key)) : -1;
}

static bool expect_pool(void)
{
	const char *e = getenv("EXPECT_POOL");
	return e && !strcmp(e, "1");
}

// ---- ipc ---------------------------------------------------------------------------

static const size_t sizes[] = {1024 * MiB, 96 * MiB, 8 * KiB, 3 * MiB};
static const int NBUF = sizeof sizes / sizeof sizes[0];

static void to_hex(const cudaIpcMemHandle_t *h, char *out)
{
	for (size_t i = 0; i < sizeof h->reserved; i++)
		sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, cudaIpcMemHandle_t *h)
{
	REQUIRE(strlen(s) == 2 * sizeof h->reserved);
	for (size_t i = 0; i < sizeof h->reserved; i++) {
		unsigned v;
		REQUIRE(sscanf(s + 2 * i, "%2x", &v) == 1);
		h->reserved[i] = (char)v;
	}
}

static void ipc_open(int argc, char **argv)
{
	REQUIRE(argc == 2 + NBUF);
	void *p[NBUF];
	for (int i = 0; i < NBUF; i++) {
		cudaIpcMemHandle_t h;
		from_hex(argv[2 + i], &h);
		CK(cudaIpcOpenMemHandle(&p[i], h, cudaIpcMemLazyEnablePeerAccess));
		unsigned long long bad = mismatches(p[i], sizes[i], 100 + i);
		if (bad) {
			fprintf(stderr, "FAIL opener: buffer %d (%zu bytes): %llu words differ\n", i,
				sizes[i], bad);
			exit(1);
		}
		put(p[i], sizes[i], 200 + i);
	}
	printf("opened\n");
	fflush(stdout);
	char line[64];
	REQUIRE(fgets(line, sizeof line, stdin)); // the owner freed and reallocated
	// Buffer 1 was freed by the owner while we had it: still our pattern.
	REQUIRE(mismatches(p[1], sizes[1], 201) == 0);
	for (int i = 0; i < NBUF; i++)
		CK(cudaIpcCloseMemHandle(p[i]));
	printf("closed\n");
}

// `share ipc-one HEX`: opens the handle of buffer 0; prints "opened" (the
// first opener's pattern checked) or "refused <error>".
static void ipc_one(const char *hex)
{
	cudaIpcMemHandle_t h;
	void *p = NULL;
	from_hex(hex, &h);
	cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		printf("refused %s\n", cudaGetErrorName(e));
		cudaGetLastError();
		return;
	}
	// the first opener's pattern: it wrote over the owner's
	REQUIRE(mismatches(p, sizes[0], 200) == 0);
	CK(cudaIpcCloseMemHandle(p));
	printf("opened\n");
}

// Runs `self ipc-one HEX` with LD_PRELOAD set to `preload` (NULL: unset);
// returns its first line.
static std::string run_one(const char *self, const char *hex, const char *preload)
{
	std::vector<std::string> env;
	for (char **e = environ; *e; e++)
		if (strncmp(*e, "LD_PRELOAD=", 11) && strncmp(*e, "EXPECT_POOL=", 12))
			env.push_back(*e);
	if (preload)
		env.push_back(std::string("LD_PRELOAD=") + preload);
	std::vector<char *> envp;
	for (auto &e : env)
		envp.push_back((char *)e.c_str());
	envp.push_back(NULL);
	char *argv[] = {(char *)self, (char *)"ipc-one", (char *)hex, NULL};
	int from[2];
	REQUIRE(pipe(from) == 0);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, from[1], 1);
	posix_spawn_file_actions_addclose(&fa, from[0]);
	pid_t pid;
	REQUIRE(posix_spawn(&pid, self, &fa, NULL, argv, envp.data()) == 0);
	close(from[1]);
	FILE *out = fdopen(from[0], "r");
	char line[256] = "";
	if (!fgets(line, sizeof line, out))
		line[0] = 0;
	fclose(out);
	int st;
	REQUIRE(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return std::string("crashed or failed: ") + line;
	return line;
}

static void ipc_owner(void)
{
	void *p[NBUF];
	char hex[NBUF][129];
	for (int i = 0; i < NBUF; i++) {
		CK(cudaMalloc(&p[i], sizes[i]));
		put(p[i], sizes[i], 100 + i);
		cudaIpcMemHandle_t h;
		CK(cudaIpcGetMemHandle(&h, p[i]));
		to_hex(&h, hex[i]);
	}
	// The opener: this program again.
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	REQUIRE(n > 0);
	self[n] = 0;
	char *argv[3 + NBUF];
	argv[0] = self;
	argv[1] = (char *)"ipc-open";
	for (int i = 0; i < NBUF; i++)
		argv[2 + i] = hex[i];
	argv[2 + NBUF] = NULL;
	int to[2], from[2];
	REQUIRE(pipe(to) == 0 && pipe(from) == 0);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, to[0], 0);
	posix_spawn_file_actions_adddup2(&fa, from[1], 1);
	posix_spawn_file_actions_addclose(&fa, to[1]);
	posix_spawn_file_actions_addclose(&fa, from[0]);
	pid_t pid;
	REQUIRE(posix_spawn(&pid, self, &fa, NULL, argv, environ) == 0);
	close(to[0]);
	close(from[1]);
	FILE *in = fdopen(to[1], "w"), *out = fdopen(from[0], "r");
	char line[64];
	REQUIRE(fgets(line, sizeof line, out) && !strncmp(line, "opened", 6));
	for (int i = 0; i < NBUF; i++) {
		unsigned long long bad = mismatches(p[i], sizes[i], 200 + i);
		if (bad) {
			fprintf(stderr, "FAIL owner: buffer %d: %llu words differ from the opener's\n",
				i, bad);
			exit(1);
		}
	}
	// Free buffer 1 while it is open there, then allocate its size and
	// write: the opener must still see its own pattern.
	long long live0 = pool_stat(0, "live");
	CK(cudaFree(p[1]));
	void *again;
	CK(cudaMalloc(&again, sizes[1]));
	put(again, sizes[1], 999);
	if (expect_pool()) {
		REQUIRE(again != p[1]);
		REQUIRE(pool_stat(0, "live") >= live0 + (long long)sizes[1]);
	}
	fprintf(in, "go\n");
	fflush(in);
	REQUIRE(fgets(line, sizeof line, out) && !strncmp(line, "closed", 6));
	int st;
	REQUIRE(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	// Across the shim's edge.
	const char *lib = getenv("SHIM_LIB");
	if (lib && *lib) {
		if (expect_pool()) {
			std::string got = run_one(self, hex[0], NULL);
			printf("pool handle opened without the shim: %s", got.c_str());
			REQUIRE(!strncmp(got.c_str(), "refused ", 8));
		} else {
			std::string got = run_one(self, hex[0], lib);
			printf("driver handle opened under the shim: %s", got.c_str());
			REQUIRE(!strncmp(got.c_str(), "opened", 6));
		}
	}
	CK(cudaFree(again));
	for (int i = 0; i < NBUF; i++)
		if (i != 1)
			CK(cudaFree(p[i]));
	if (expect_pool()) {
		// Every buffer was the pool's, and the deferred free happened at
		// the close: nothing of them is live any more.
		long long live = pool_stat(0, "live");
		printf("pool live after close: %lld bytes\n", live);
		REQUIRE(live >= 0 && live < (long long)(4 * MiB));
	}
	printf("ipc ok\n");
}

// ---- peer ---------------------------------------------------------------------------

static void peer(void)
{
	int n = 0, can = 0;
	CK(cudaGetDeviceCount(&n));
	if (n < 2) {
		printf("SKIP peer: %d GPU\n", n);
		return;
	}
	CK(cudaDeviceCanAccessPeer(&can, 1, 0));
	if (!can) {
		printf("SKIP peer: GPU 1 cannot access GPU 0\n");
		return;
	}
	CK(cudaSetDevice(0));
	std::vector<void *> bufs(16);
	for (int i = 0; i < 16; i++) {
		CK(cudaMalloc(&bufs[i], 64 * MiB));
		put(bufs[i], 64 * MiB, 300 + i);
	}
	CK(cudaSetDevice(1));
	CK(cudaDeviceEnablePeerAccess(0, 0));
	for (int i = 0; i < 16; i++)
		REQUIRE(mismatches(bufs[i], 64 * MiB, 300 + i) == 0);
	// GPU 0 frees every other buffer and asks for more than any gap.
	CK(cudaSetDevice(0));
	long long remapped0 = pool_stat(0, "pages_remapped");
	for (int i = 0; i < 16; i += 2)
		CK(cudaFree(bufs[i]));
	void *big;
	CK(cudaMalloc(&big, 384 * MiB));
	put(big, 384 * MiB, 777);
	long long remapped = pool_stat(0, "pages_remapped");
	if (expect_pool()) {
		printf("pages remapped by the big allocation: %lld\n", remapped - remapped0);
		REQUIRE(remapped > remapped0);
	}
	CK(cudaSetDevice(1));
	REQUIRE(mismatches(big, 384 * MiB, 777) == 0);
	for (int i = 1; i < 16; i += 2)
		REQUIRE(mismatches(bufs[i], 64 * MiB, 300 + i) == 0);
	// And a kernel on GPU 1 writing into GPU 0's pool memory.
	put(big, 384 * MiB, 778);
	CK(cudaSetDevice(0));
	REQUIRE(mismatches(big, 384 * MiB, 778) == 0);
	CK(cudaFree(big));
	for (int i = 1; i < 16; i += 2)
		CK(cudaFree(bufs[i]));
	printf("peer ok\n");
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "";
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(what, "ipc")) {
		ipc_owner();
	} else if (!strcmp(what, "ipc-open")) {
		ipc_open(argc, argv);
	} else if (!strcmp(what, "ipc-one") && argc > 2) {
		ipc_one(argv[2]);
	} else if (!strcmp(what, "peer")) {
		peer();
	} else {
		fprintf(stderr, "usage: share ipc|peer\n");
		return 2;
	}
	return 0;
}
