// hold.cu — a second process that takes the device's memory, all of it but
// a chosen margin, and keeps it: the memory pressure another job (or a KV
// cache sized from free memory) puts on a program, and the only way to drive
// the driver's own out-of-memory path under an allocator. bench/pressure.py
// runs the replays of bench/replay_gpu.py under it (scripts/gpu-pressure.sh).
// Owns nothing else; calls only the CUDA runtime.
//
// Usage: hold --leave BYTES [--device N] [--settle-ms MS] [--parent PID] [--sleep]
//   BYTES are decimal with an optional K, M, G or T suffix (powers of 1024).
//   --parent PID: exit at once unless PID is still the parent (the parent
//   may die between its fork and the hold's PR_SET_PDEATHSIG).
//
// It takes memory with cudaMalloc (device memory, never managed), in chunks
// of 1 GiB, then 256, 64, 16, 4 and 2 MiB, while cudaMemGetInfo's free stays
// at least BYTES after the chunk; so free ends in [BYTES, BYTES + 2 MiB) plus
// whatever page tables the last chunk cost, and never under BYTES while the
// hold has a chunk it could give back. Then it prints one line, flushed:
//   HOLD held=<bytes> free=<bytes> total=<bytes> chunks=<n> short=<0|1>
//        settled=<0|1> waited_ms=<n>
// (one line; short=1: free is under BYTES with nothing held, the rest of the
// device is someone else's). Then it reads commands on stdin, one a line:
//   leave BYTES   gives back or takes chunks so that free is as above, and
//                 prints a HOLD line. First it waits (up to --settle-ms,
//                 default 5000) until free is back to what it was after the
//                 last adjustment, less 4 MiB: the memory of a process that
//                 just exited may reach the driver's free count a little
//                 after its parent saw it exit. settled=0: it was not, and
//                 the adjustment went on with what was free then.
//   info          prints a HOLD line.
//   quit          gives everything back and exits 0; so does the end of stdin.
// A line it cannot read gets `HOLD-ERROR <why>` and the hold carries on. An
// error of CUDA's other than out of memory prints `HOLD-ERROR <why>` and
// exits 1. --sleep ignores stdin and holds until killed.
//
// The hold never outlives its parent: PR_SET_PDEATHSIG sends it SIGKILL when
// the process that started it exits, however that exits; and the driver
// gives back a process's memory when it dies.
//
// Build: nvcc -O2 -o hold test/gpu/hold.cu
#include <cuda_runtime.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <vector>

static const size_t MiB = (size_t)1 << 20;
static const size_t CHUNKS[] = { 1024 * MiB, 256 * MiB, 64 * MiB, 16 * MiB, 4 * MiB, 2 * MiB };
static const size_t SETTLE_TOL = 4 * MiB;

struct hold {
	std::vector<void *> chunks;
	std::vector<size_t> sizes;
	size_t held = 0;
	size_t total = 0;
	size_t last_free = 0; // free after the last adjustment
};

static void die(const char *what, cudaError_t e)
{
	printf("HOLD-ERROR %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
	fflush(stdout);
	exit(1);
}

static size_t free_now(hold &h)
{
	size_t f = 0, t = 0;
	cudaError_t e = cudaMemGetInfo(&f, &t);
	if (e != cudaSuccess)
		die("cudaMemGetInfo", e);
	h.total = t;
	return f;
}

static double now_ms()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Decimal digits and an optional K/M/G/T suffix; false on anything else.
static bool parse_size(const char *s, size_t *out)
{
	if (!s || *s < '0' || *s > '9')
		return false;
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return false;
	int shift = 0;
	switch (*end) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: break;
	}
	while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')
		end++;
	if (*end)
		return false;
	if (shift && v > (~0ULL >> shift))
		return false;
	*out = (size_t)(v << shift);
	return true;
}

static void give_back_last(hold &h)
{
	cudaError_t e = cudaFree(h.chunks.back());
	if (e != cudaSuccess)
		die("cudaFree", e);
	h.held -= h.sizes.back();
	h.chunks.pop_back();
	h.sizes.pop_back();
}

static void report(hold &h, size_t leave, int settled, long waited_ms)
{
	size_t f = free_now(h);
	printf("HOLD held=%zu free=%zu total=%zu chunks=%zu short=%d settled=%d waited_ms=%ld\n",
	       h.held, f, h.total, h.chunks.size(), f < leave ? 1 : 0, settled, waited_ms);
	fflush(stdout);
}

static void adjust(hold &h, size_t leave, long settle_ms)
{
	// Wait for the memory of a process that just exited.
	double t0 = now_ms();
	int settled = 1;
	size_t f = free_now(h);
	while (f + SETTLE_TOL < h.last_free) {
		if (now_ms() - t0 >= settle_ms) {
			settled = 0;
			break;
		}
		usleep(10000);
		f = free_now(h);
	}
	long waited = (long)(now_ms() - t0);

	// Too little free: give back the newest (smallest) chunks first.
	while (f < leave && !h.chunks.empty()) {
		give_back_last(h);
		f = free_now(h);
	}
	// Take, largest chunks first, as long as the chunk leaves `leave` free.
	for (size_t c : CHUNKS) {
		while (f >= leave && f - leave >= c) {
			void *p = nullptr;
			cudaError_t e = cudaMalloc(&p, c);
			if (e == cudaErrorMemoryAllocation) {
				cudaGetLastError(); // not sticky; clear it and try smaller
				break;
			}
			if (e != cudaSuccess)
				die("cudaMalloc", e);
			h.chunks.push_back(p);
			h.sizes.push_back(c);
			h.held += c;
			f = free_now(h);
		}
	}
	// The last chunk's page tables may have taken free under `leave`.
	while (f < leave && !h.chunks.empty()) {
		give_back_last(h);
		f = free_now(h);
	}
	h.last_free = f;
	report(h, leave, settled, waited);
}

static void usage()
{
	fprintf(stderr, "usage: hold --leave BYTES [--device N] [--settle-ms MS] [--parent PID] [--sleep]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	size_t leave = 0;
	bool have_leave = false, sleep_mode = false;
	int device = 0;
	long settle_ms = 5000, parent = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--leave") && i + 1 < argc) {
			if (!parse_size(argv[++i], &leave)) {
				fprintf(stderr, "hold: --leave %s: not a size\n", argv[i]);
				usage();
			}
			have_leave = true;
		} else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
			device = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--settle-ms") && i + 1 < argc) {
			settle_ms = atol(argv[++i]);
		} else if (!strcmp(argv[i], "--parent") && i + 1 < argc) {
			parent = atol(argv[++i]);
		} else if (!strcmp(argv[i], "--sleep")) {
			sleep_mode = true;
		} else {
			usage();
		}
	}
	if (!have_leave)
		usage();
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (parent && getppid() != (pid_t)parent) {
		printf("HOLD-ERROR the parent %ld is gone\n", parent);
		return 1;
	}
	signal(SIGPIPE, SIG_DFL);

	cudaError_t e = cudaSetDevice(device);
	if (e != cudaSuccess)
		die("cudaSetDevice", e);
	e = cudaFree(nullptr); // the context
	if (e != cudaSuccess)
		die("cudaFree(0)", e);

	hold h;
	h.last_free = free_now(h);
	adjust(h, leave, 0);
	if (sleep_mode) {
		for (;;)
			pause();
	}
	char line[256];
	while (fgets(line, sizeof line, stdin)) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = '\0';
		size_t n;
		if (!strncmp(line, "leave ", 6) && parse_size(line + 6, &n)) {
			adjust(h, n, settle_ms);
		} else if (!strcmp(line, "info")) {
			report(h, 0, 1, 0);
		} else if (!strcmp(line, "quit")) {
			break;
		} else {
			printf("HOLD-ERROR unknown command \"%.100s\"\n", line);
			fflush(stdout);
		}
	}
	while (!h.chunks.empty())
		give_back_last(h);
	return 0;
}
