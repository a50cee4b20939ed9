// reliability.h — what test/gpu/oom.cu and test/gpu/soak.cu share: the
// data pattern and the kernels that write and verify it,
// the libvpmm API reached through dlsym (so both programs also run without the
// shim), outside commands (nvidia-smi, vpmm-dump) run with LD_PRELOAD removed,
// and the one line format the check results use:
//
//     check NAME: PASS|FAIL|SKIP details
//
// scripts/gpu-reliability.sh collects those lines into its summary; a program
// exits non-zero when any of its checks failed.
#ifndef VPMM_TEST_GPU_RELIABILITY_H
#define VPMM_TEST_GPU_RELIABILITY_H

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <string>

static const size_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

// ---- checks ------------------------------------------------------------------------

static int g_failed_checks;

// One result line; FAIL is counted. `status` is "PASS", "FAIL" or "SKIP".
static inline void report(const char *name, const char *status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline void report(const char *name, const char *status, const char *fmt, ...)
{
	char detail[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	if (!strcmp(status, "FAIL"))
		g_failed_checks++;
	printf("check %s: %s %s\n", name, status, detail);
	fflush(stdout);
}

#define CK(call)                                                              \
	do {                                                                  \
		cudaError_t e_ = (call);                                      \
		if (e_ != cudaSuccess) {                                      \
			printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
			       cudaGetErrorString(e_));                       \
			fflush(stdout);                                       \
			exit(1);                                              \
		}                                                             \
	} while (0)

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double mib(double bytes)
{
	return bytes / (double)MiB;
}

// A size from the environment: decimal bytes with an optional K/M/G suffix
// (powers of 1024), as the VPMM_* variables take them.
static inline size_t env_size(const char *name, size_t def)
{
	const char *v = getenv(name);
	char *end;
	if (!v || !*v)
		return def;
	unsigned long long n = strtoull(v, &end, 10);
	switch (*end) {
	case 'k': case 'K': n <<= 10; end++; break;
	case 'm': case 'M': n <<= 20; end++; break;
	case 'g': case 'G': n <<= 30; end++; break;
	default: break;
	}
	if (end == v || (*end && strcmp(end, "B") && strcmp(end, "iB"))) {
		printf("FAIL %s=%s: expected a size such as 512M\n", name, v);
		exit(2);
	}
	return (size_t)n;
}

static inline double env_double(const char *name, double def)
{
	const char *v = getenv(name);
	char *end;
	if (!v || !*v)
		return def;
	double d = strtod(v, &end);
	if (end == v || *end) {
		printf("FAIL %s=%s: expected a number\n", name, v);
		exit(2);
	}
	return d;
}

// ---- the data pattern ----------------------------------------------------------------

// Word i of the buffer whose seed is `seed`: a mix of both, so a word copied
// from another buffer or another offset is caught.
__host__ __device__ static inline uint32_t pattern(uint64_t seed, uint64_t i)
{
	uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 29;
	return (uint32_t)x;
}

// What a verification found: the number of bad words, and the first buffer
// that had any (which one of the kernels got there first).
struct mismatch {
	unsigned long long count;
	unsigned long long serial;
	unsigned long long index;
	unsigned long long bytes;
	unsigned int got, want;
	int taken;
};

__global__ void fill_k(uint32_t *p, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = pattern(seed, i);
}

__global__ void check_k(const uint32_t *p, size_t n, uint64_t seed, uint64_t serial,
			struct mismatch *m)
{
	unsigned long long bad = 0, first = 0;
	uint32_t got = 0, want = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t w = pattern(seed, i), v = p[i];
		if (v != w) {
			if (!bad) {
				first = i;
				got = v;
				want = w;
			}
			bad++;
		}
	}
	if (bad) {
		atomicAdd(&m->count, bad);
		if (atomicCAS(&m->taken, 0, 1) == 0) {
			m->serial = serial;
			m->index = first;
			m->bytes = n * 4;
			m->got = got;
			m->want = want;
		}
	}
}

static inline unsigned grid_for(size_t words)
{
	size_t g = (words + 255) / 256;
	return (unsigned)(g < 1 ? 1 : g > 2048 ? 2048 : g);
}

static inline void fill_async(void *p, size_t bytes, uint64_t seed, cudaStream_t s)
{
	fill_k<<<grid_for(bytes / 4), 256, 0, s>>>((uint32_t *)p, bytes / 4, seed);
}

static inline void check_async(const void *p, size_t bytes, uint64_t seed, uint64_t serial,
			struct mismatch *m, cudaStream_t s)
{
	check_k<<<grid_for(bytes / 4), 256, 0, s>>>((const uint32_t *)p, bytes / 4, seed,
						     serial, m);
}

// ---- libvpmm, when it is loaded ----------------------------------------------------------

// The shim's exported API (shim/api.c), looked up at run time: NULL
// without the shim.
struct shim_api {
	int (*active)(void);
	long (*stats_json)(int device, char *buf, size_t len);
};

static inline struct shim_api shim_lookup(void)
{
	struct shim_api a;
	*(void **)&a.active = dlsym(RTLD_DEFAULT, "vpmm_shim_active");
	*(void **)&a.stats_json = dlsym(RTLD_DEFAULT, "vpmm_shim_stats_json");
	return a;
}

// The pool's stats of device 0 as their JSON text; false when there is no
// shim or no pool yet.
static inline bool shim_stats(const struct shim_api *a, std::string *out)
{
	char buf[8192];
	if (!a->stats_json)
		return false;
	long n = a->stats_json(0, buf, sizeof buf);
	if (n < 0 || (size_t)n >= sizeof buf)
		return false;
	*out = buf;
	return true;
}

// The unsigned integer after "key": in a JSON text, searching from `from`
// (e.g. the stats object of a vpmm-dump document). The key is matched with
// its quotes and the colon after it, so "mapped" never matches "mapped_peak".
static inline bool json_u64(const std::string &text, const char *key, unsigned long long *out,
			    size_t from = 0)
{
	std::string k = std::string("\"") + key + "\"";
	for (size_t at = text.find(k, from); at != std::string::npos; at = text.find(k, at + 1)) {
		const char *p = text.c_str() + at + k.size();
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (*p++ != ':')
			continue;
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		char *end;
		unsigned long long v = strtoull(p, &end, 10);
		if (end == p || *p == '-')
			return false;
		*out = v;
		return true;
	}
	return false;
}

// A field of the pool's stats; exits when it is missing (the stats JSON
// changed shape: the test must be told, not pass on zeros).
static inline unsigned long long stat_field(const std::string &stats, const char *key)
{
	unsigned long long v;
	if (!json_u64(stats, key, &v)) {
		printf("FAIL the pool's stats have no \"%s\": %s\n", key, stats.c_str());
		exit(1);
	}
	return v;
}

// ---- outside commands --------------------------------------------------------------------

// Runs a shell command without our LD_PRELOAD (nvidia-smi and vpmm-dump need
// no pool, and must not get one) and returns its standard output; false when
// it exits non-zero or cannot run.
static inline bool run_capture(const std::string &cmd, std::string *out)
{
	std::string full = "env -u LD_PRELOAD " + cmd;
	FILE *f = popen(full.c_str(), "r");
	char buf[65536];
	size_t n;
	if (!f)
		return false;
	out->clear();
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		out->append(buf, n);
	int st = pclose(f);
	return st == 0;
}

// nvidia-smi's GPU id of device `dev` ("GPU-xxxxxxxx-xxxx-...").
static inline std::string device_uuid(int dev)
{
	cudaDeviceProp prop;
	char s[64];
	if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
		return "";
	const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
	snprintf(s, sizeof s,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
		 u[12], u[13], u[14], u[15]);
	return s;
}

// Device memory as nvidia-smi counts it, in MiB: this process's
// used_memory (--query-compute-apps) when nvidia-smi lists our pid, else the
// whole device's memory.used (in a container nvidia-smi often shows other
// pids or none; the machine is then assumed to run nothing else). The first
// call picks the source and later calls keep it, so that differences are
// taken within one source. -1 when nvidia-smi gives neither.
enum smi_source { SMI_UNKNOWN, SMI_PROCESS, SMI_DEVICE, SMI_NONE };
static enum smi_source g_smi_source = SMI_UNKNOWN;

static inline const char *smi_source_name(void)
{
	switch (g_smi_source) {
	case SMI_PROCESS: return "nvidia-smi used_memory of this pid";
	case SMI_DEVICE: return "nvidia-smi memory.used of the whole device (pid not listed)";
	default: return "no nvidia-smi";
	}
}

static inline long smi_used_mib(const std::string &uuid)
{
	std::string out;
	char line[512];
	long pid = (long)getpid();

	if (g_smi_source == SMI_NONE)
		return -1;
	if (g_smi_source == SMI_UNKNOWN || g_smi_source == SMI_PROCESS) {
		if (run_capture("nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory "
				"--format=csv,noheader,nounits 2>/dev/null",
				&out)) {
			FILE *f = fmemopen((void *)out.data(), out.size(), "r");
			long found = -1;
			while (f && fgets(line, sizeof line, f)) {
				long p, m;
				char id[128];
				if (sscanf(line, "%ld , %127[^,] , %ld", &p, id, &m) == 3 &&
				    p == pid && (uuid.empty() || uuid == id))
					found = m;
			}
			if (f)
				fclose(f);
			if (found >= 0) {
				g_smi_source = SMI_PROCESS;
				return found;
			}
		}
		if (g_smi_source == SMI_PROCESS)
			return -1; // listed before, not now: no silent switch
	}
	if (run_capture("nvidia-smi --query-gpu=uuid,memory.used --format=csv,noheader,nounits "
			"2>/dev/null",
			&out)) {
		FILE *f = fmemopen((void *)out.data(), out.size(), "r");
		long found = -1, only = -1;
		int lines = 0;
		while (f && fgets(line, sizeof line, f)) {
			long m;
			char id[128];
			if (sscanf(line, "%127[^,] , %ld", id, &m) == 2) {
				lines++;
				only = m;
				if (uuid == id)
					found = m;
			}
		}
		if (f)
			fclose(f);
		if (found < 0 && lines == 1)
			found = only;
		if (found >= 0) {
			g_smi_source = SMI_DEVICE;
			return found;
		}
	}
	g_smi_source = SMI_NONE;
	return -1;
}

#endif
